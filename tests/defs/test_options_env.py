"""Engine options from `DURABLY_*` environment variables: every option has one, values are
parsed by the option's type, a bad one is refused naming the variable, and the one
precedence holds — a value written in code (keyword, or a field of `options=`) > the
environment > the default — for `Engine`, `Client` and `EngineOptions` alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import durably
from durably import AdaptiveConcurrency, Client, Engine, EngineOptions, WorkflowCtx

FIELDS = [f.name for f in dataclasses.fields(EngineOptions)]

# For every option: a text for its variable and the value it must give.
PARSED: dict[str, list[tuple[str, Any]]] = {
    "lease_ms": [("5000", 5_000), (" 7000 ", 7_000)],
    "timer_poll_ms": [("50", 50)],
    "reconcile_ms": [("60000", 60_000)],
    "remote_redispatch_ms": [("5000", 5_000), ("none", None)],
    "remote_redispatch_max": [("3", 3)],
    "max_recovery_attempts": [("3", 3), ("none", None), ("None", None)],
    "drain_timeout_ms": [("0", 0)],
    "instance_wait_ms": [("250", 250), ("none", None)],
    "max_concurrent_runs": [("8", 8)],
    "claim_batch": [("4", 4)],
    "pending_batch": [("10", 10)],
    "max_resident_runs": [("0", 0)],
    "step_threads": [("2", 2)],
    "concurrency": [("4", 4), ("none", None), ("adaptive", "adaptive")],
    "fan_window": [("10", 10)],
    "fold_fans_over": [("20", 20)],
    "event_scan_limit": [("5", 5)],
    "compensation_retries": [("2", 2)],
    "max_payload_bytes": [("2048", 2_048)],
    "track_step_start": [("0", False), ("false", False), ("1", True), ("TRUE", True)],
    "always_replay": [("1", True), ("true", True), ("0", False), ("False", False)],
    "signal_buffer_ttl": [("90", 90.0), ("1.5", 1.5), ("2h", "2h")],
    "signal_buffer_per_token": [("3", 3)],
    "signal_buffer_per_namespace": [("30", 30)],
    "retention_sweep_ms": [("0", 0), ("5000", 5_000)],
    "retention_batch_size": [("250", 250)],
    "retention_max_batches": [("7", 7)],
}

BAD_ENV: list[tuple[str, str]] = [
    ("DURABLY_LEASE_MS", "abc"),
    ("DURABLY_LEASE_MS", "1.5"),
    ("DURABLY_LEASE_MS", "0"),
    ("DURABLY_LEASE_MS", ""),
    ("DURABLY_LEASE_MS", "none"),  # lease_ms takes no None
    ("DURABLY_MAX_RECOVERY_ATTEMPTS", "-1"),
    ("DURABLY_ALWAYS_REPLAY", "yes"),
    ("DURABLY_TRACK_STEP_START", "2"),
    ("DURABLY_SIGNAL_BUFFER_TTL", "30 fortnights"),
    ("DURABLY_SIGNAL_BUFFER_TTL", "-5"),
    ("DURABLY_CONCURRENCY", "0"),
    ("DURABLY_REMOTE_REDISPATCH_MS", "0"),
    ("DURABLY_REMOTE_REDISPATCH_MAX", "0"),
    ("DURABLY_CONCURRENCY", "lots"),
    ("DURABLY_RETENTION_SWEEP_MS", "-1"),
    ("DURABLY_RETENTION_SWEEP_MS", "1m"),
    ("DURABLY_RETENTION_BATCH_SIZE", "0"),
    ("DURABLY_RETENTION_MAX_BATCHES", "0"),
    ("DURABLY_RETENTION_MAX_BATCHES", "none"),
]


def test_every_option_has_a_variable_named_after_it() -> None:
    assert sorted(PARSED) == sorted(FIELDS)
    assert durably.EngineOptions is EngineOptions
    from durably._engine.defs.options import env_name

    assert [env_name(name) for name in FIELDS] == ["DURABLY_" + n.upper() for n in FIELDS]


@pytest.mark.parametrize(
    ("option", "text", "value"),
    [(option, text, value) for option, cases in PARSED.items() for text, value in cases],
)
def test_each_variable_sets_its_option_parsed_by_its_type(
    monkeypatch: pytest.MonkeyPatch, option: str, text: str, value: Any
) -> None:
    monkeypatch.setenv("DURABLY_" + option.upper(), text)
    assert getattr(EngineOptions(), option) == value
    assert getattr(Engine("memory").options, option) == value
    # only that field moved
    others = [n for n in FIELDS if n != option]
    monkeypatch.delenv("DURABLY_" + option.upper())
    assert [getattr(EngineOptions(), n) for n in others] == [
        getattr(Engine("memory").options, n) for n in others
    ]


@pytest.mark.parametrize(("var", "text"), BAD_ENV)
def test_a_bad_value_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, text: str
) -> None:
    monkeypatch.setenv(var, text)
    pattern = rf"^{var}={text!r}: ".replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=pattern):
        EngineOptions()
    with pytest.raises(ValueError, match=pattern):
        Engine("memory")
    # a client reads the same environment: a deployment's typo fails every process early
    with pytest.raises(ValueError, match=pattern):
        Client("memory")


def test_code_wins_over_the_environment_which_wins_over_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLY_LEASE_MS", "5000")
    monkeypatch.setenv("DURABLY_CLAIM_BATCH", "4")
    monkeypatch.setenv("DURABLY_TIMER_POLL_MS", "50")
    # the environment over the defaults
    assert (Engine("memory").options.lease_ms, Engine("memory").options.claim_batch) == (5_000, 4)
    # a keyword over the environment
    assert Engine("memory", lease_ms=9_000).options.lease_ms == 9_000
    # a field written in an options value over the environment; its other fields from it
    shared = EngineOptions(lease_ms=7_000)
    engine = Engine("memory", options=shared, claim_batch=2)
    assert (engine.options.lease_ms, engine.options.claim_batch) == (7_000, 2)
    assert engine.options.timer_poll_ms == 50
    # a default value written in code is still written in code
    assert EngineOptions(lease_ms=30_000).lease_ms == 30_000
    # not set: the default
    assert Engine("memory").options.reconcile_ms == 300_000


def test_a_keyword_is_not_shadowed_by_a_bad_variable_of_the_same_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The variable is read only for the options the code leaves out."""
    monkeypatch.setenv("DURABLY_LEASE_MS", "abc")
    assert Engine("memory", lease_ms=1_000).options.lease_ms == 1_000
    assert EngineOptions(lease_ms=1_000).lease_ms == 1_000


def test_an_options_value_reads_the_environment_when_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = EngineOptions()
    monkeypatch.setenv("DURABLY_LEASE_MS", "5000")
    assert Engine("memory", options=before).options.lease_ms == 30_000
    # deriving a variant keeps every value it had
    assert dataclasses.replace(before, claim_batch=3).lease_ms == 30_000


def test_concurrency_from_the_environment_takes_every_spelling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLY_CONCURRENCY", "adaptive")
    assert Engine("memory").options.concurrency == "adaptive"
    assert Engine("memory", concurrency=AdaptiveConcurrency()).options.concurrency == (
        AdaptiveConcurrency()
    )


async def test_the_engine_runs_on_the_environment_s_lease(
    monkeypatch: pytest.MonkeyPatch, uid: str
) -> None:
    """Not only `engine.options`: the lease taken on a run is the variable's."""

    @durably.workflow(f"{uid}.waits")
    async def waits(ctx: WorkflowCtx) -> None:
        await ctx.wait_for_signal(f"{uid}.go")

    monkeypatch.setenv("DURABLY_LEASE_MS", "4321")
    now = 1_700_000_000_000
    async with Engine("memory", workflows=[waits], clock=lambda: now) as engine:
        handle = await engine.start(waits)
        await handle.wait(timeout=10)
        run = await engine.get_run(handle.run_id)
    assert run is not None and run.status == "suspended"
    assert run.locked_until == now + 4_321


async def test_a_client_takes_the_signal_buffer_bounds_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, uid: str
) -> None:
    monkeypatch.setenv("DURABLY_SIGNAL_BUFFER_PER_TOKEN", "2")
    async with Client("memory") as client:
        await client.signal(f"{uid}.t", 1)
        await client.signal(f"{uid}.t", 2)
        with pytest.raises(durably.SignalBufferFullError, match="signal_buffer_per_token"):
            await client.signal(f"{uid}.t", 3)
    async with Client("memory", signal_buffer_per_token=3) as client:  # the keyword wins
        for n in range(3):
            await client.signal(f"{uid}.u", n)


def test_the_instance_id_comes_from_the_environment_when_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Engine("memory").instance_id.startswith("durably-")  # a fresh one per process
    monkeypatch.setenv("DURABLY_INSTANCE_ID", "box:app")
    assert Engine("memory").instance_id == "box:app"
    assert Engine("memory", instance_id="given").instance_id == "given"
    monkeypatch.setenv("DURABLY_INSTANCE_ID", "  ")
    assert Engine("memory").instance_id.startswith("durably-")
