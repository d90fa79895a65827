"""Checked by `mypy --strict` in test_options_typing.py: every option of `Engine(...)`,
`Client(...)` and `EngineOptions(...)` is typed. A line ending in a "mypy-error" comment
must be reported by mypy with a message containing the comment's text; no other line may
be reported."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import assert_type

from durably import AesGcmCodec, Client, Engine, EngineOptions


def accepted() -> None:
    Engine("memory", lease_ms=5_000, timer_poll_ms=100, max_recovery_attempts=None)
    Engine("memory", options=EngineOptions(lease_ms=5_000), always_replay=True)
    Engine("memory", signal_buffer_ttl="24h", codec=AesGcmCodec(b"k" * 32))
    Engine("memory", signal_buffer_ttl=timedelta(minutes=5), instance_wait_ms=None)
    Engine(None, signal_buffer_ttl=90.5, fan_window=10, track_step_start=False)
    Client("memory", options=EngineOptions(signal_buffer_per_token=3), signal_buffer_ttl="1h")
    options = EngineOptions(instance_wait_ms=None, signal_buffer_ttl="10s")
    assert_type(options.lease_ms, int)
    assert_type(options.max_recovery_attempts, int | None)
    assert_type(dataclasses.replace(options, lease_ms=1), EngineOptions)
    assert_type(Engine("memory").options, EngineOptions)


def refused(options: EngineOptions) -> None:
    Engine("memory", retention="30d")  # mypy-error: "retention" to "Engine"
    Engine("memory", lease_mss=1)  # mypy-error: "lease_mss"
    Engine("memory", lease_ms="5s")  # mypy-error: "lease_ms"
    Engine("memory", lease_ms=1.5)  # mypy-error: "lease_ms"
    Engine("memory", always_replay=1)  # mypy-error: "always_replay"
    Engine("memory", signal_buffer_ttl=[1])  # mypy-error: "signal_buffer_ttl"
    Engine("memory", options={"lease_ms": 1})  # mypy-error: "options"
    Engine("memory", codec="aes")  # mypy-error: "codec"
    Engine(42)  # mypy-error: Argument 1 to "Engine"
    Engine("memory", 42)  # mypy-error: Argument 2 to "Engine"
    EngineOptions(lease_mss=1)  # mypy-error: "lease_mss"
    EngineOptions(timer_poll_ms=None)  # mypy-error: "timer_poll_ms"
    EngineOptions(30_000)  # mypy-error: Too many positional arguments
    Client("memory", lease_ms=1)  # mypy-error: "lease_ms"
    options.lease_ms = 3  # mypy-error: read-only
