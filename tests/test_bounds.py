"""The shared boundary checks: every way an untrusted JSON value can be unusable is refused
with `PayloadRejectedError`, and ordinary values pass."""

from __future__ import annotations

import pytest

from durably import PayloadRejectedError, PayloadTooLargeError
from durably._core.bounds import (
    MAX_JSON_DEPTH,
    check_json_value,
    check_text,
    check_wire_int,
    loads_untrusted,
)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("[" * 200_000, "nested deeper"),
        ('{"a": NaN}', "not JSON"),
        ('{"a": Infinity}', "not JSON"),
        ('{"a": -Infinity}', "not JSON"),
        ('"\\ud800"', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested deeper"),
        ("{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_unusable_json_is_refused(raw: str | bytes, problem: str) -> None:
    with pytest.raises(PayloadRejectedError) as info:
        loads_untrusted(raw, what="step result")
    assert problem in str(info.value)
    assert "step result" in str(info.value)


def test_size_is_bounded_in_bytes_not_characters() -> None:
    text = '"' + "é" * 600 + '"'  # 602 characters, 1,202 bytes
    with pytest.raises(PayloadTooLargeError) as info:
        loads_untrusted(text, what="signal payload", max_bytes=1_000)
    assert info.value.size == 1_202 and info.value.limit == 1_000
    assert loads_untrusted(text, what="signal payload", max_bytes=2_000) == "é" * 600


def test_ordinary_values_pass() -> None:
    value = {"a": [1, 2.5, None, True, "x\u00e9"], "b": {"c": "\U0001f600"}}
    nested: object = "leaf"
    for _ in range(MAX_JSON_DEPTH - 1):
        nested = [nested]
    check_json_value("v", value)
    check_json_value("v", nested)
    assert loads_untrusted('{"a": [1, 2.5]}', what="v") == {"a": [1, 2.5]}


@pytest.mark.parametrize("value", [float("nan"), {1: "x"}, {"a": object()}, ["\ud800"]])
def test_python_values_that_are_not_storable_json_are_refused(value: object) -> None:
    with pytest.raises(PayloadRejectedError):
        check_json_value("v", value)


def test_text_and_integers() -> None:
    assert check_text("tag", "ok") == "ok"
    for bad in ("a\x00b", "\udc00"):
        with pytest.raises(PayloadRejectedError):
            check_text("tag", bad)
    with pytest.raises(PayloadRejectedError):
        check_text("tag", "x" * 11, max_len=10)
    assert check_wire_int("seq", 2**53 - 1) == 2**53 - 1
    with pytest.raises(PayloadRejectedError):
        check_wire_int("seq", 10**20)
