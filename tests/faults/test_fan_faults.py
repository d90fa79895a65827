"""SIGKILL inside fans, between an onError handoff and its handler, and inside a saga unwind;
recovery by a second process (fan waves, onError handoff, saga unwind). Each
scenario runs on a fresh SQLite file and on a fresh PostgreSQL schema, with real subprocesses
(tests/faults/fan_app.py) and a real SIGKILL; the recovering process has a new instance id and
takes the dead worker's runs once its short lease (1.5 s) lapsed.

Checked from the O_APPEND side-effect log (one write per line, survives the kill), from the
store's tables read with plain sqlite3/asyncpg, and from the recovered run:

1. child-workflow fan, 60 members in waves of 20 (`concurrency=20`), killed while member 25
   (wave 1, the second wave) blocks inside its step: the parent completes with the outputs in
   input order and their sum; a member whose step checkpoint had committed before the kill ran
   exactly once, a member in flight at the kill at most twice, every other member exactly once
   (by the recovering process); no member of wave k+1 started before every member of wave k
   had finished (log order); the dead worker never started wave 2; every run is terminal; the
   children are exactly the windowed member ids `<runId>.all.0.w<k>.<i>`. Three kill points:
   `rest-done` (the rest of wave 1 settled and reached the parent: 1 member in flight),
   `wave-busy` (most of wave 1 in flight) and `child-settled` (the process dies right after a
   child's `completed` settle committed, before the parent is notified: it used to strand the
   parent for good; now the parent's replay asks its waiting children for their outcome,
   children.recover_completions).
2. the same for a step fan (`ctx.all(step, …, concurrency=20)`), `rest-done` and `wave-busy`.
3. onError: the process dies when the engine's store is asked to create the handler run
   (`<runId>.onError.1`), after the handoff row and the `suspended` write: the recovering
   process starts the handler (exactly once), and the routed run completes with its output.
4. saga: three steps with `compensate=`, the body fails; the undo of step 2 kills the process
   (once): undo 3 (committed) is not re-run, undo 2 runs again exactly once, undo 1 runs once,
   in reverse order, and the run fails with the ORIGINAL error.
"""

from __future__ import annotations

import asyncio
import collections
import re
import signal
import time
from pathlib import Path

import pytest

from durably._core.models import HANDOFF_SEQ_BASE
from tests.faults.fan_app import HANDLER_ID, RUN_ID, member_output
from tests.faults.fan_support import (
    BACKENDS,
    TERMINAL,
    Backend,
    Line,
    Proc,
    backend,
    read_log,
    reaping,
    wait_until,
)

N, C = 60, 20
BLOCKED = 25  # in wave 1 (inputs 20..39), the second wave
WAVES = [range(k * C, min(N, (k + 1) * C)) for k in range((N + C - 1) // C)]
FANS = {"child_fan": "fanfault.child_leaf", "step_fan": "fanfault.leaf"}
KILLED = -signal.SIGKILL
# rest-done: the rest of wave 1 settled and reached the parent: only BLOCKED is in flight;
# wave-busy: every other member sleeps 300 ms, the kill lands as soon as BLOCKED blocks, so
# most of wave 1 is in flight (for a child fan, a kill that lands right after some child's
# settle used to strand the parent);
# child-settled: the process kills itself right after the store write that settles child
# KILL_AFTER_SETTLE `completed` returned (the deterministic form of that former bug).
KILL_AFTER_SETTLE = 22
FAN_CASES = [
    pytest.param("child_fan", "rest-done", id="child_fan-rest-done"),
    pytest.param("child_fan", "child-settled", id="child_fan-child-settled"),
    pytest.param("child_fan", "wave-busy", id="child_fan-wave-busy"),
    pytest.param("step_fan", "rest-done", id="step_fan-rest-done"),
    pytest.param("step_fan", "wave-busy", id="step_fan-wave-busy"),
]


def _child_id(i: int) -> str:
    # member ids with `concurrency`: `<runId>.all.<firstSeq>.w<k>.<i>`, k = i // c.
    return f"{RUN_ID}.all.0.w{i // C}.{i}"


async def _committed_members(b: Backend, fan: str) -> set[int]:
    """Members whose step checkpoint is committed (completed) in the store right now."""
    rows = await b.completed_step_rows(FANS[fan])
    done: set[int] = set()
    for row in rows:
        if row["name"].startswith("fan:"):  # a folded record covers `count` members
            out = row["output"] or {}
            if row["run_id"] == RUN_ID and fan == "step_fan":
                done.update(range(int(out["first"]), int(out["first"]) + int(out["count"])))
            continue
        if fan == "step_fan" and row["run_id"] == RUN_ID:
            done.add(int(row["seq"]))  # the fan is the first call: member i at seq i
        elif fan == "child_fan":
            m = re.fullmatch(rf"{re.escape(RUN_ID)}\.all\.0\.w\d+\.(\d+)", row["run_id"])
            if m:
                done.add(int(m.group(1)))
    return done


async def _settled_members(b: Backend, fan: str) -> set[int]:
    """Members whose row in the parent is completed (a step result, or a delivered child
    completion), folded `fan:` records included."""
    done: set[int] = set()
    for cp in await b.checkpoints(RUN_ID):
        if cp["status"] != "completed" or cp["seq"] < 0 or cp["seq"] >= N:
            continue
        if cp["name"].startswith("fan:"):
            out = cp["output"]
            done.update(range(int(out["first"]), int(out["first"]) + int(out["count"])))
        else:
            done.add(int(cp["seq"]))  # the fan is the first call: member i at seq i
    return done


def _wave_order_violations(lines: list[Line]) -> list[str]:
    """Every `start` of wave k+1 must come after every `end` of wave k (log order)."""
    bad = []
    for k in range(1, len(WAVES)):
        ends = [n for n, ln in enumerate(lines) if ln.kind == "end" and ln.i in WAVES[k - 1]]
        starts = [n for n, ln in enumerate(lines) if ln.kind == "start" and ln.i in WAVES[k]]
        if ends and starts and min(starts) < max(ends):
            early = lines[min(starts)]
            bad.append(
                f"wave {k} member {early.i} started at line {min(starts)} before wave {k - 1} "
                f"finished (last end at line {max(ends)})"
            )
    return bad


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("fan", "kill_at"), FAN_CASES)
@pytest.mark.parametrize("store", BACKENDS)
async def test_sigkill_mid_wave_then_recover(
    tmp_path: Path, store: str, fan: str, kill_at: str
) -> None:
    log = tmp_path / "effects.log"
    t0 = time.monotonic()
    busy = kill_at == "wave-busy"
    env = {"FAN_INSTANCE_ID": "worker-a", "FAN_BLOCK": str(BLOCKED), "FAN_N": str(N)}
    env |= {"FAN_C": str(C), "FAN_SLOW_MS": "300" if busy else "0"}
    if kill_at == "child-settled":
        env["FAN_KILL_AFTER_SETTLE"] = _child_id(KILL_AFTER_SETTLE)
    async with backend(store, tmp_path) as b:
        with reaping() as procs:
            first = Proc(b, log, fan, "start", env)
            procs.append(first)
            if kill_at == "child-settled":
                rc = await first.wait_exit(timeout=30)
                assert rc == KILLED, f"exit {rc}, not SIGKILL:\n{first.stderr()}"
                assert any(ln.kind == "kill" for ln in read_log(log)), read_log(log)
                first.killed_at_ms = int(time.time() * 1000)
            else:
                await wait_until(
                    f"member {BLOCKED} to block",
                    lambda: any(ln.kind == "blocked" for ln in read_log(log)),
                    first,
                    timeout=30,
                )
                if not busy:
                    # The rest of wave 1 settled AND reached the parent (its member rows are
                    # completed), so exactly one member is in flight at the kill.
                    others = set(WAVES[1]) - {BLOCKED}
                    deadline = time.monotonic() + 15
                    while not others <= await _settled_members(b, fan):
                        assert first.alive(), f"the worker died:\n{first.stderr()}"
                        assert time.monotonic() < deadline, "the rest of wave 1 never settled"
                        await asyncio.sleep(0.05)
                first.kill()  # SIGKILL while member BLOCKED sleeps inside its step
            before = read_log(log)
            committed = await _committed_members(b, fan)

            t_recover = time.monotonic()
            second = Proc(b, log, fan, "recover", {"FAN_INSTANCE_ID": "worker-b"})
            procs.append(second)
            result = await second.result(
                timeout=45,
                b=b,
                context=f"(first worker pid {first.pid} SIGKILLed at {first.killed_at_ms} ms)",
            )
            recovered_in = time.monotonic() - t_recover
            after = read_log(log)
            runs = await b.runs()
            parent_cps = await b.checkpoints(RUN_ID)

    # ---- the kill landed mid-wave 1
    started_first = {ln.i for ln in before if ln.kind == "start"}
    assert started_first <= set(WAVES[0]) | set(WAVES[1]), (
        f"the dead worker started members beyond wave 1: {sorted(started_first - set(range(40)))}"
    )
    assert set(WAVES[0]) <= committed, f"wave 0 not committed: {set(WAVES[0]) - committed}"
    in_flight = started_first - committed
    assert in_flight <= set(WAVES[1]), sorted(in_flight)
    if kill_at != "child-settled":
        assert BLOCKED in in_flight, (sorted(in_flight), BLOCKED)

    # ---- the parent's outcome: outputs in input order
    outputs = [member_output(i) for i in range(N)]
    assert result == {
        "status": "completed",
        "output": {"outputs": outputs, "sum": sum(outputs)},
        "error": None,
    }, result

    # ---- each member's step: once; in flight at the kill: at most twice
    starts = collections.Counter(ln.i for ln in after if ln.kind == "start")
    ends = collections.Counter(ln.i for ln in after if ln.kind == "end")
    by_second = {ln.i for ln in after if ln.kind == "start" and ln.pid == second.pid}
    for i in range(N):
        if i in in_flight:
            assert 1 <= starts[i] <= 2, (i, "in flight", starts[i])
        else:
            assert starts[i] == 1, (i, "committed" if i in committed else "not started", starts[i])
        if i not in started_first:
            assert i in by_second, (i, "never started by the recovering process")
        assert ends[i] >= 1, (i, "never finished")
    assert BLOCKED in by_second, "the blocked member was not run by the recovery"
    assert not _wave_order_violations(after), _wave_order_violations(after)
    with_keys = {(ln.key, ln.i) for ln in after if ln.kind == "start"}
    if fan == "child_fan":
        assert with_keys == {(_child_id(i), i) for i in range(N)}, "unexpected member ids"

    # ---- the store: nothing left behind, no duplicate member
    stuck = {rid: r["status"] for rid, r in runs.items() if r["status"] not in TERMINAL}
    assert not stuck, f"runs left non-terminal: {stuck}"
    if fan == "child_fan":
        assert set(runs) == {RUN_ID} | {_child_id(i) for i in range(N)}, sorted(runs)[:10]
        for i in range(N):
            child = runs[_child_id(i)]
            assert (child["status"], child["output"]) == ("completed", member_output(i)), child
    else:
        assert set(runs) == {RUN_ID}, sorted(runs)
        covered = set()
        for cp in parent_cps:
            if cp["name"] == FANS[fan] and cp["status"] == "completed":
                covered.add(int(cp["seq"]))
            elif cp["name"].startswith("fan:") and cp["status"] == "completed":
                out = cp["output"]
                covered.update(range(int(out["first"]), int(out["first"]) + int(out["count"])))
        assert covered == set(range(N)), sorted(set(range(N)) - covered)
    reruns = sum(1 for i in in_flight if starts[i] == 2)
    print(
        f"{store}/{fan}/{kill_at}: checked {N} members in {len(WAVES)} waves of {C}, "
        f"{len(in_flight)} in flight at the kill ({reruns} re-run), {len(committed)} committed; "
        f"recovered in {recovered_in:.1f}s, {time.monotonic() - t0:.1f}s total"
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("store", BACKENDS)
async def test_sigkill_between_handoff_and_handler_start(tmp_path: Path, store: str) -> None:
    log = tmp_path / "effects.log"
    t0 = time.monotonic()
    async with backend(store, tmp_path) as b:
        with reaping() as procs:
            first = Proc(
                b,
                log,
                "on_error",
                "start",
                {
                    "FAN_INSTANCE_ID": "worker-a",
                    "FAN_KILL_HANDLER_START": "1",
                    "FAN_RECONCILE_MS": "1000",  # the routed run's fallback wake
                },
            )
            procs.append(first)
            rc = await first.wait_exit(timeout=30)
            assert rc == KILLED, f"exit {rc}, not SIGKILL:\n{first.stderr()}"
            before = read_log(log)
            runs_at_kill = await b.runs()
            cps_at_kill = await b.checkpoints(RUN_ID)

            t_recover = time.monotonic()
            second = Proc(b, log, "on_error", "recover", {"FAN_INSTANCE_ID": "worker-b"})
            procs.append(second)
            result = await second.result(timeout=45, b=b)
            recovered_in = time.monotonic() - t_recover
            after = read_log(log)
            runs = await b.runs()
            cps = await b.checkpoints(RUN_ID)

    # ---- the kill landed between the handoff and the handler's start
    assert [(ln.pid, ln.kind, ln.key) for ln in before] == [
        (first.pid, "start", "body"),
        (first.pid, "kill", "handler-start"),
    ], before
    assert HANDLER_ID not in runs_at_kill, "the handler run was inserted before the kill"
    assert runs_at_kill[RUN_ID]["status"] == "suspended", runs_at_kill[RUN_ID]
    assert (runs_at_kill[RUN_ID]["error"] or {}).get("code") == "declined", runs_at_kill[RUN_ID]
    handoff = [(cp["seq"], cp["name"], cp["status"]) for cp in cps_at_kill if cp["seq"] >= 0]
    assert (HANDOFF_SEQ_BASE, f"signal:child:{HANDLER_ID}", "running") in handoff, handoff

    # ---- the recovery started the handler, once; the routed run settled with its outcome
    assert result == {
        "status": "completed",
        "output": {"handled": f"handled declined of {RUN_ID}", "input": 7},
        "error": None,
    }, result
    body = [ln for ln in after if ln.key == "body"]
    handler = [ln for ln in after if ln.key == "handler"]
    assert [ln.pid for ln in body] == [first.pid], f"the body re-ran: {body}"
    assert [ln.pid for ln in handler] == [second.pid], f"the handler ran {len(handler)} times"
    assert set(runs) == {RUN_ID, HANDLER_ID}, sorted(runs)
    assert runs[HANDLER_ID]["status"] == "completed", runs[HANDLER_ID]
    assert runs[HANDLER_ID]["output"] == result["output"], runs[HANDLER_ID]
    stuck = {rid: r["status"] for rid, r in runs.items() if r["status"] not in TERMINAL}
    assert not stuck, f"runs left non-terminal: {stuck}"
    handoff = [(cp["seq"], cp["name"], cp["status"]) for cp in cps if cp["seq"] >= HANDOFF_SEQ_BASE]
    assert handoff == [(HANDOFF_SEQ_BASE, f"signal:child:{HANDLER_ID}", "completed")], handoff
    print(
        f"{store}/on_error: killed before inserting {HANDLER_ID}; handler ran once, body once, "
        f"run completed with the handler's output; recovered in {recovered_in:.1f}s, "
        f"{time.monotonic() - t0:.1f}s total"
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("store", BACKENDS)
async def test_sigkill_mid_saga_unwind(tmp_path: Path, store: str) -> None:
    log = tmp_path / "effects.log"
    marker = tmp_path / "undo-2.killed"
    t0 = time.monotonic()
    async with backend(store, tmp_path) as b:
        with reaping() as procs:
            env = {"FAN_MARKER": str(marker)}
            first = Proc(b, log, "saga", "start", {"FAN_INSTANCE_ID": "worker-a"} | env)
            procs.append(first)
            rc = await first.wait_exit(timeout=30)
            assert rc == KILLED, f"exit {rc}, not SIGKILL:\n{first.stderr()}"
            before = read_log(log)
            runs_at_kill = await b.runs()
            cps_at_kill = await b.checkpoints(RUN_ID)

            t_recover = time.monotonic()
            second = Proc(b, log, "saga", "recover", {"FAN_INSTANCE_ID": "worker-b"} | env)
            procs.append(second)
            result = await second.result(timeout=45, b=b)
            recovered_in = time.monotonic() - t_recover
            after = read_log(log)
            runs = await b.runs()
            cps = await b.checkpoints(RUN_ID)

    # ---- the kill landed inside the second undo, after the first one committed
    assert [(ln.kind, ln.key, ln.i) for ln in before] == [
        ("do", "saga", 1),
        ("do", "saga", 2),
        ("do", "saga", 3),
        ("start", "undo", 3),
        ("end", "undo", 3),
        ("start", "undo", 2),
        ("kill", "undo", 2),
    ], before
    undo_rows = {cp["seq"]: (cp["name"], cp["status"]) for cp in cps_at_kill if cp["seq"] < 0}
    assert undo_rows == {-1: ("compensate:fanfault.reserve", "completed")}, undo_rows
    assert runs_at_kill[RUN_ID]["status"] not in TERMINAL, runs_at_kill[RUN_ID]

    # ---- the recovery finished the unwind and failed the run with the ORIGINAL error
    assert result["status"] == "failed", result
    assert result["error"]["message"] == "the body failed after 3 steps", result
    assert result["error"].get("code") == "saga_failed", result
    does = collections.Counter(ln.i for ln in after if ln.kind == "do")
    assert does == {1: 1, 2: 1, 3: 1}, f"a compensated step re-ran: {does}"
    undo_starts = [(ln.pid, ln.i) for ln in after if ln.kind == "start" and ln.key == "undo"]
    assert undo_starts == [
        (first.pid, 3),
        (first.pid, 2),
        (second.pid, 2),  # the in-flight undo: re-run once
        (second.pid, 1),
    ], undo_starts
    undo_ends = [ln.i for ln in after if ln.kind == "end" and ln.key == "undo"]
    assert undo_ends == [3, 2, 1], f"undos not each completed once in reverse order: {undo_ends}"
    undo_rows = {cp["seq"]: (cp["name"], cp["status"]) for cp in cps if cp["seq"] < 0}
    assert undo_rows == {s: ("compensate:fanfault.reserve", "completed") for s in (-1, -2, -3)}, (
        undo_rows
    )
    assert set(runs) == {RUN_ID}, sorted(runs)
    print(
        f"{store}/saga: killed inside undo 2 of 3; undo 3 not re-run, undo 2 re-run once, "
        f"undo 1 once, run failed with the original error; recovered in {recovered_in:.1f}s, "
        f"{time.monotonic() - t0:.1f}s total"
    )
