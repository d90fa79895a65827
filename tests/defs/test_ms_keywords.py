"""A keyword named `*_ms` means milliseconds when given a bare number (`backoff_ms=200` is
200 ms, not 200 seconds); a string or timedelta is a duration as everywhere else."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durably


def test_backoff_ms_numbers_are_milliseconds(uid: str) -> None:
    @durably.step(f"{uid}.a", retries=3, backoff_ms=200, backoff_max_ms=1500)
    def a(x: int) -> int:
        return x

    @durably.step(f"{uid}.b", retries=3, backoff_ms="2s", backoff_max_ms=timedelta(seconds=3))
    def b(x: int) -> int:
        return x

    assert (a.policy.backoff_ms, a.policy.backoff_max_ms) == (200, 1500)
    assert (b.policy.backoff_ms, b.policy.backoff_max_ms) == (2000, 3000)


@pytest.mark.parametrize("bad", [-1, float("nan"), True])
def test_a_bad_millisecond_value_is_refused(uid: str, bad: object) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        durably.step(f"{uid}.c", backoff_ms=bad)(lambda x: x)  # type: ignore[arg-type]
