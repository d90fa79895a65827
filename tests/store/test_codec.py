"""The payload codec: `CodecStateStore` and the AES-GCM `AesGcmCodec`.

1. A representative subset of the state-store suite (`durably.testing.conformance`) runs
   THROUGH `CodecStateStore(inner, AesGcmCodec(key))` on memory, SQLite and PostgreSQL
   (`TestThroughCodec`), and so does a round-trip test of `test_round_trips.py`: the
   module's `store` fixture wraps the conftest's parametrized one.
2. The wrapper's own contract: what is encoded and what is not, aggregates forwarded
   untouched, the whole store contract implemented, a partial store refused.
3. Ciphertext at rest: the raw SQLite tables hold envelopes, never the cleartext.
4. `AesGcmCodec`: envelope, random nonces, key rotation, tampering, key parsing.
"""

from __future__ import annotations

import base64
import inspect
import json
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from durably import (
    AesGcmCodec,
    Codec,
    CodecStateStore,
    Engine,
    InMemoryStateStore,
    RunQuery,
    SerializationError,
    SignalWaiter,
    StateStore,
    StepError,
    StepEvent,
)
from durably._core.aggregates import CheckpointQuery
from durably._core.models import BufferedEvent, ChildWait
from durably._store.codec import CodecError, wrap_store
from durably._store.crypto import key_id
from durably._store.protocol import STORE_METHODS, missing_store_methods
from durably.testing.conformance import StateStoreSuite, StoreClock
from tests.store.conftest import FIRST_PARTY, open_first_party
from tests.store.support import T0, ConformantStore, at, make_cp, make_run, take_buffered
from tests.store.test_round_trips import test_checkpoint_stats_read_no_checkpoint_rows  # noqa: F401

KEY = bytes(range(32))
OLD_KEY = bytes(range(100, 132))


@pytest.fixture
async def store(store: Any) -> Any:
    """Overrides the conftest fixture: the same parametrized store, behind the codec."""
    return CodecStateStore(store, AesGcmCodec(KEY))


# ---------------------------------------------------------------- 1. conformance, wrapped


class TestThroughCodec:
    """A representative subset of the state-store suite on the first-party stores behind
    the codec. The cases are the suite's own functions, taken from `StateStoreSuite`; the
    codec store forwards the round-trip counter."""

    @pytest.fixture
    def store_clock(self) -> StoreClock:
        return StoreClock()

    @pytest.fixture(params=FIRST_PARTY)
    async def store(
        self, request: pytest.FixtureRequest, tmp_path: Path, store_clock: StoreClock
    ) -> AsyncIterator[Any]:
        async with open_first_party(request.param, tmp_path, store_clock) as opened:
            yield CodecStateStore(opened, AesGcmCodec(KEY))

    def round_trips(self, store: StateStore) -> int | None:
        return cast(ConformantStore, store).statement_count


# The subset, taken from the suite's class: the cases run here exactly as the suite runs them.
SUBSET = (
    "test_run_activity_counts_starts_and_settles_per_bucket",
    "test_run_activity_filters_like_the_list_and_ignores_the_page",
    "test_aggregates_are_present_and_paired",
    "test_attributes_eq_range_and_anded",
    "test_bounded_buffer_is_fifo_and_round_trips_payloads",
    "test_buffered_events",
    "test_buffered_signals_fifo_per_token",
    "test_checkpoint_fields_round_trip",
    "test_checkpoint_stats_equal_the_reference",
    "test_checkpoint_upsert_get_and_list_by_seq",
    "test_claim_run",
    "test_claim_runs_leases_listed_pending_runs_by_id",
    "test_claims_by_priority_then_age",
    "test_claims_oldest_pending_first_up_to_the_limit",
    "test_count_checkpoints_inclusive",
    "test_count_runs",
    "test_create_runs_inserts_free_ids_and_reports_holders",
    "test_create_then_get_returns_workflow_and_json_input",
    "test_deliver_signals_takes_waiters_and_writes_rows_atomically",
    "test_engine_records_are_not_capped_but_count_in_their_namespace",
    "test_error_details_round_trip_any_json",
    "test_expired_rows_are_never_taken_nor_counted_and_purge_removes_them",
    "test_fold_checkpoints_replaces_a_seq_range_by_one_row",
    "test_get_latest_checkpoint_by_name",
    "test_list_checkpoints_by_name_prefix",
    "test_list_due_timers",
    "test_list_runs_workflow_and_status_filters",
    "test_listing_pages_oldest_first_by_exact_prefix_without_payloads",
    "test_live_leases_are_skipped_and_expired_ones_claimed",
    "test_per_namespace_cap_counts_the_text_before_the_first_colon",
    "test_per_token_cap_refuses_and_stores_nothing",
    "test_pickup_is_fifo_with_limit",
    "test_purge_by_token_prefix_and_everything_keeps_engine_records",
    "test_purge_expired_only_within_a_prefix",
    "test_query_checkpoints_decode_payloads_like_list_checkpoints",
    "test_query_checkpoints_equal_the_reference",
    "test_query_checkpoints_pages_cover_the_run_exactly_once",
    "test_reads_return_copies",
    "test_register_child_waits_upserts_waiters_and_never_overwrites_rows",
    "test_save_checkpoint_if_pending",
    "test_save_checkpoint_if_pending_rejects_non_json",
    "test_save_checkpoints_if_pending_duplicate_sees_earlier_write",
    "test_save_checkpoints_if_pending_is_atomic",
    "test_store_satisfies_protocols",
    "test_the_token_cap_is_reported_before_the_namespace_cap",
    "test_update_run_maps_every_patchable_field",
    "test_update_status_output_recovery_attempts_and_dead",
    "test_waiters_put_list_by_prefix_take_once",
)
for _name in SUBSET:
    setattr(TestThroughCodec, _name, getattr(StateStoreSuite, _name))


# ---------------------------------------------------------------- helpers


class TagCodec:
    """A visible, reversible codec that counts its calls and refuses None."""

    def __init__(self) -> None:
        self.encoded = 0
        self.decoded = 0

    def encode(self, value: Any) -> Any:
        assert value is not None, "None must never reach the codec"
        self.encoded += 1
        return {"enc": json.dumps(value)[::-1]}

    def decode(self, value: Any) -> Any:
        assert value is not None, "None must never reach the codec"
        assert isinstance(value, dict) and set(value) == {"enc"}, value
        self.decoded += 1
        return json.loads(value["enc"][::-1])


def enc(value: Any) -> Any:
    return {"enc": json.dumps(value)[::-1]}


class BareStore:
    """A third-party store with only the methods of an older, smaller contract (no
    conditional update, no claims, no bulk forms, no aggregates), delegated to memory."""

    OLD = (
        "create_run update_run get_run delete_run get_checkpoint save_checkpoint "
        "list_checkpoints list_incomplete_runs list_due_timers "
        "release_run_lock put_signal_waiter "
        "list_signal_waiters remove_signal_waiter buffer_signal "
        "buffer_signal_bounded list_buffered_signals count_buffered_signals "
        "purge_buffered_signals "
        "buffer_event list_buffered_events remove_buffered_event list_runs"
    ).split()

    def __init__(self) -> None:
        self.memory = InMemoryStateStore()
        for name in self.OLD:
            setattr(self, name, getattr(self.memory, name))


# ---------------------------------------------------------------- 2. the wrapper's contract


def test_codec_protocol_and_wrap_store() -> None:
    assert isinstance(TagCodec(), Codec)
    assert isinstance(AesGcmCodec(KEY), Codec)
    inner = InMemoryStateStore()
    assert wrap_store(inner, None) is inner
    assert isinstance(wrap_store(inner, TagCodec()), CodecStateStore)
    with pytest.raises(TypeError, match="encode"):
        wrap_store(inner, object())


def test_the_wrapper_implements_the_whole_contract_and_nothing_else() -> None:
    """Every first-party store method is part of the one contract, and the wrapper
    implements all of it: adding a store method means adding it to `StateStore`, whose
    annotations tell the derived wrapper where its payloads are (test_codec_derivation.py)."""
    from durably._store.sql import SqlStateStore

    assert missing_store_methods(CodecStateStore) == []
    for cls in (InMemoryStateStore, SqlStateStore):
        methods = {n for n, v in inspect.getmembers(cls) if callable(v) and not n.startswith("_")}
        assert methods - {"from_url"} <= set(STORE_METHODS), (cls.__name__, methods)
        assert missing_store_methods(cls) == []


def test_a_partial_store_is_refused_naming_what_it_lacks() -> None:
    bare = BareStore()
    lacking = missing_store_methods(bare)
    assert "update_run_if_status" in lacking and "claim_run" in lacking
    assert "checkpoint_stats" in lacking and "create_run" not in lacking
    with pytest.raises(TypeError, match="BareStore is not a complete durably StateStore") as err:
        CodecStateStore(bare, TagCodec())
    for name in lacking:
        assert name in str(err.value)
    # and the roles the missing methods belong to, with how many of each are missing
    assert "RunStore: 2" in str(err.value)  # create_runs, update_run_if_status
    assert "AdmissionStore: 4" in str(err.value) and "ReadStore:" in str(err.value)
    with pytest.raises(TypeError, match="lacks ensure_schema, close, create_runs"):
        Engine(bare)
    with pytest.raises(TypeError, match="update_run_if_status"):
        Engine(bare, codec=TagCodec())


def test_data_attributes_read_through_and_unknown_methods_do_not() -> None:
    inner = InMemoryStateStore()
    wrapped: Any = CodecStateStore(inner, TagCodec())
    assert wrapped.statement_count == inner.statement_count
    inner.brand_new_method = lambda: None  # type: ignore[attr-defined]
    assert not hasattr(wrapped, "brand_new_method")
    with pytest.raises(AttributeError, match="does not forward 'brand_new_method'"):
        wrapped.brand_new_method  # noqa: B018


async def test_run_payloads_encoded_at_rest_metadata_not() -> None:
    inner, codec = InMemoryStateStore(), TagCodec()
    wrapped = CodecStateStore(inner, codec)
    err = StepError("boom", code="E1", details={"field": "x"})
    await wrapped.create_run(
        make_run(
            "r1",
            input={"card": "4111"},
            tags=("vip",),
            search_attributes={"tier": "gold"},
            error=err,
        )
    )
    raw = await inner.get_run("r1")
    assert raw is not None
    assert raw.input == enc({"card": "4111"}) and raw.output is None
    assert raw.tags == ("vip",) and raw.search_attributes == {"tier": "gold"}
    assert raw.error == err and raw.workflow == "checkout" and raw.status == "running"

    await wrapped.update_run("r1", {"status": "suspended", "wake_at": 5})  # no payload keys
    raw = await inner.get_run("r1")
    assert raw is not None and raw.input == enc({"card": "4111"})
    await wrapped.update_run("r1", {"status": "completed", "output": [1, 2]})
    raw = await inner.get_run("r1")
    assert raw is not None and raw.output == enc([1, 2])
    await wrapped.update_run("r1", {"output": None})  # None stays None, codec not called
    raw = await inner.get_run("r1")
    assert raw is not None and raw.output is None

    run = await wrapped.get_run("r1")
    assert run is not None and run.input == {"card": "4111"} and run.output is None
    (listed,) = await wrapped.list_runs(RunQuery())
    assert listed.input == {"card": "4111"}
    assert await wrapped.get_run("missing") is None


async def test_checkpoint_payloads_encoded_error_and_events_not() -> None:
    inner, codec = InMemoryStateStore(), TagCodec()
    wrapped = CodecStateStore(inner, codec)
    await wrapped.create_run(make_run("r1"))
    events = (StepEvent(at=1, level="info", message="hi", data={"k": 1}),)
    cp = make_cp(
        "r1",
        0,
        input={"a": 1},
        output="secret",
        error=StepError("e", details=[1]),
        events=events,
        parallel_group="g",
        enqueued_at=T0,
    )
    await wrapped.save_checkpoint(cp)
    raw = await inner.get_checkpoint("r1", 0)
    assert raw is not None
    assert raw.input == enc({"a": 1}) and raw.output == enc("secret")
    assert raw.error == StepError("e", details=[1]) and raw.events == events
    assert raw.name == cp.name and raw.parallel_group == "g"
    assert await wrapped.get_checkpoint("r1", 0) == cp
    assert await wrapped.list_checkpoints("r1") == [cp]
    assert await wrapped.query_checkpoints("r1", CheckpointQuery()) == [cp]


async def test_aggregates_forwarded_without_touching_payloads() -> None:
    inner, codec = InMemoryStateStore(), TagCodec()
    wrapped = CodecStateStore(inner, codec)
    await wrapped.create_run(make_run("r1", input=1))
    for seq in range(4):
        await wrapped.save_checkpoint(
            make_cp("r1", seq, output=seq, parallel_group="g", status="completed")
        )
    decoded_before = codec.decoded
    stats = await wrapped.checkpoint_stats("r1")
    assert stats == await inner.checkpoint_stats("r1")
    assert await wrapped.count_runs(RunQuery()) == 1
    assert await wrapped.count_checkpoints("r1", 0, 3, ["completed"]) == 4
    assert codec.decoded == decoded_before


async def test_bulk_methods_encode_every_entry() -> None:
    inner, codec = InMemoryStateStore(), TagCodec()
    wrapped: Any = CodecStateStore(inner, codec)
    assert await wrapped.create_runs(
        [make_run("a", input="x"), make_run("b", input="y", status="pending")]
    ) == [
        None,
        None,
    ]
    raw_a = await inner.get_run("a")
    assert raw_a is not None and raw_a.input == enc("x")

    waiter = SignalWaiter(token="child:c1", run_id="a", seq=0)
    placeholder = make_cp(
        "a", 0, name="signal:child:c1", kind="signal", status="running", input={"child": "c1"}
    )
    await wrapped.register_child_waits([ChildWait(waiter=waiter, placeholder=placeholder)])
    raw_cp = await inner.get_checkpoint("a", 0)
    assert raw_cp is not None and raw_cp.input == enc({"child": "c1"})

    rows = await wrapped.deliver_signals([("child:c1", {"ok": True, "value": 7})], at(1))
    assert [r.output for r in rows] == [{"ok": True, "value": 7}]
    raw_cp = await inner.get_checkpoint("a", 0)
    assert raw_cp is not None and raw_cp.output == enc({"ok": True, "value": 7})

    await wrapped.save_checkpoint(make_cp("a", 1, status="pending", output=None))
    assert await wrapped.save_checkpoints_if_pending(
        [make_cp("a", 1, status="completed", output="done")]
    ) == [True]
    raw_cp = await inner.get_checkpoint("a", 1)
    assert raw_cp is not None and raw_cp.output == enc("done")

    folded = make_cp("a", 1, name="fan:g", output=[1, 2], status="completed", enqueued_at=T0)
    await wrapped.fold_checkpoints("a", 1, 1, folded)
    raw_cp = await inner.get_checkpoint("a", 1)
    assert raw_cp is not None and raw_cp.output == enc([1, 2])
    assert await wrapped.get_checkpoint("a", 1) == folded

    claimed = await wrapped.claim_pending_runs("me", 10_000, 0, 10)
    assert [(r.id, r.input) for r in claimed] == [("b", "y")]
    run = await wrapped.claim_run("a", "other", 10_000, 0)
    assert run is not None and run.input == "x"
    assert await wrapped.update_run_if_status("a", {"output": "o"}, ["running"])
    raw_a = await inner.get_run("a")
    assert raw_a is not None and raw_a.output == enc("o")


async def test_buffered_signals_and_events_encoded() -> None:
    inner, codec = InMemoryStateStore(), TagCodec()
    wrapped = CodecStateStore(inner, codec)
    await wrapped.buffer_signal("tok", {"approved": True})
    await wrapped.buffer_signal("tok", None)
    await wrapped.buffer_event(BufferedEvent(id="e1", name="paid", payload=[9], published_at=1))
    assert (await inner.list_buffered_events("paid", 10))[0].payload == enc([9])
    assert [e.payload for e in await wrapped.list_buffered_events("paid", 10)] == [[9]]
    first = await take_buffered(wrapped, "tok")
    second = await take_buffered(wrapped, "tok")
    assert first is not None and first.payload == {"approved": True}
    assert second is not None and second.payload is None
    assert await take_buffered(wrapped, "tok") is None


async def test_targeted_lookups_decode_only_matches() -> None:
    inner, codec = InMemoryStateStore(), TagCodec()
    wrapped = CodecStateStore(inner, codec)
    await wrapped.create_run(make_run("r1"))
    names = ["reserve", "spawn:0", "signal:child:c2", "event:progress", "spawn:1", "event:progress"]
    for seq, name in enumerate(names):
        await wrapped.save_checkpoint(make_cp("r1", seq, name=name, output={"seq": seq}))
    codec.decoded = 0
    latest = await wrapped.get_latest_checkpoint_by_name("r1", "event:progress")
    assert latest is not None and latest.seq == 5 and latest.output == {"seq": 5}
    assert codec.decoded == 1
    assert await wrapped.get_latest_checkpoint_by_name("r1", "nope") is None
    codec.decoded = 0
    hits = await wrapped.list_checkpoints_by_name_prefix("r1", ["signal:child:", "spawn:"])
    assert [cp.name for cp in hits] == ["spawn:0", "signal:child:c2", "spawn:1"]
    assert [cp.output for cp in hits] == [{"seq": 1}, {"seq": 2}, {"seq": 4}]
    assert codec.decoded == 3
    assert await wrapped.list_checkpoints_by_name_prefix("r1", []) == []
    await wrapped.ensure_schema()


# ---------------------------------------------------------------- 3. ciphertext at rest (SQLite)


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    from durably._store.sql import SqlStateStore

    path = tmp_path / "codec.db"
    sql = SqlStateStore.from_url(f"sqlite:///{path}")
    await sql.ensure_schema()
    try:
        yield sql, path
    finally:
        await sql.close()


def raw_dump(path: Path, tables: list[str]) -> str:
    conn = sqlite3.connect(path)
    try:
        return "\n".join(
            repr(row) for table in tables for row in conn.execute(f"SELECT * FROM {table}")
        )
    finally:
        conn.close()


async def test_sqlite_rows_hold_ciphertext_only(sqlite_store: tuple[Any, Path]) -> None:
    sql, path = sqlite_store
    wrapped = CodecStateStore(sql, AesGcmCodec(KEY))
    await wrapped.create_run(
        make_run("r1", input={"ssn": "SECRET-IN"}, tags=("vip",), search_attributes={"a": 1})
    )
    await wrapped.update_run("r1", {"output": "SECRET-OUT"})
    await wrapped.save_checkpoint(
        make_cp("r1", 0, input="SECRET-CP-IN", output={"v": "SECRET-CP-OUT"}, error=StepError("x"))
    )
    await wrapped.buffer_signal("tok", "SECRET-SIGNAL")
    await wrapped.buffer_event(
        BufferedEvent(id="e1", name="paid", payload="SECRET-EVENT", published_at=1)
    )
    dump = raw_dump(
        path,
        [
            "durable_workflow_runs",
            "durable_step_checkpoints",
            "durable_buffered_signals",
            "durable_buffered_events",
        ],
    )
    assert "SECRET" not in dump
    assert dump.count("aesgcm:v1:") == 6
    assert "vip" in dump and "reserve" in dump and "paid" in dump  # metadata stays readable

    run = await wrapped.get_run("r1")
    assert run is not None and run.input == {"ssn": "SECRET-IN"} and run.output == "SECRET-OUT"
    cp = await wrapped.get_checkpoint("r1", 0)
    assert cp is not None and cp.output == {"v": "SECRET-CP-OUT"} and cp.error == StepError("x")
    signal = await take_buffered(wrapped, "tok")
    assert signal is not None and signal.payload == "SECRET-SIGNAL"
    # the plain store sees envelopes, and a codec without the key cannot read them
    raw = await sql.get_run("r1")
    assert isinstance(raw.input, str) and raw.input.startswith("aesgcm:v1:")
    with pytest.raises(CodecError, match="not among the configured keys"):
        await CodecStateStore(sql, AesGcmCodec(OLD_KEY)).get_run("r1")


# ---------------------------------------------------------------- 4. AesGcmCodec


@pytest.mark.parametrize(
    "value",
    [0, 1.5, "text", "ünïcödé ✓", True, False, [], {}, [1, {"a": [None, 2]}], {"k": None}],
)
def test_aes_round_trips_json(value: Any) -> None:
    codec = AesGcmCodec(KEY)
    sealed = codec.encode(value)
    assert isinstance(sealed, str) and sealed.startswith(f"aesgcm:v1:{key_id(KEY)}:")
    assert json.loads(json.dumps(sealed)) == sealed  # the envelope is itself JSON
    assert codec.decode(sealed) == value


def test_aes_nonce_is_random_per_value() -> None:
    codec = AesGcmCodec(KEY)
    envelopes = {codec.encode({"same": 1}) for _ in range(50)}
    assert len(envelopes) == 50
    blob = base64.urlsafe_b64decode(next(iter(envelopes)).split(":")[3] + "==")
    assert len(blob) == 12 + len(b'{"same":1}') + 16  # nonce ‖ ciphertext ‖ tag


def test_aes_key_rotation() -> None:
    old = AesGcmCodec(OLD_KEY)
    rotated = AesGcmCodec(KEY, OLD_KEY)
    sealed_old = old.encode({"v": 1})
    assert rotated.decode(sealed_old) == {"v": 1}  # old values still readable
    sealed_new = rotated.encode({"v": 2})
    assert sealed_new.split(":")[2] == key_id(KEY)  # new values use the first key
    with pytest.raises(CodecError, match=key_id(KEY)):
        old.decode(sealed_new)
    assert rotated.key_ids == (key_id(KEY), key_id(OLD_KEY))
    with pytest.raises(ValueError, match="twice"):
        AesGcmCodec(KEY, KEY)


def test_aes_detects_tampering_and_relabelling() -> None:
    codec = AesGcmCodec(KEY, OLD_KEY)
    sealed = codec.encode("pay 10")
    prefix, data = sealed.rsplit(":", 1)
    blob = bytearray(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
    blob[14] ^= 1
    flipped = base64.urlsafe_b64encode(bytes(blob)).rstrip(b"=").decode()
    with pytest.raises(CodecError, match="altered or the key is wrong"):
        codec.decode(f"{prefix}:{flipped}")
    relabelled = sealed.replace(key_id(KEY), key_id(OLD_KEY))
    with pytest.raises(CodecError, match="altered or the key is wrong"):
        codec.decode(relabelled)  # the key id is authenticated (associated data)
    for bad in ("aesgcm:v2:x:y", "aesgcm:v1:only-three", f"aesgcm:v1:{key_id(KEY)}:AAAA"):
        with pytest.raises(CodecError):
            codec.decode(bad)
    with pytest.raises(CodecError, match="not an AesGcmCodec envelope"):
        codec.decode({"plain": "json"})


def test_aes_accept_plaintext_for_migration() -> None:
    codec = AesGcmCodec(KEY, accept_plaintext=True)
    assert codec.decode({"legacy": 1}) == {"legacy": 1}
    assert codec.decode(codec.encode("new")) == "new"


def test_aes_key_forms_and_secrecy() -> None:
    text = base64.b64encode(KEY).decode()
    for form in (KEY, bytearray(KEY), text, base64.urlsafe_b64encode(KEY).decode(), KEY.hex()):
        assert AesGcmCodec(form).key_ids == (key_id(KEY),)
    generated = AesGcmCodec.generate_key()
    assert len(base64.urlsafe_b64decode(generated + "=")) == 32
    for bad in (b"short", "not base64 !!", bytes(31)):
        with pytest.raises(ValueError):
            AesGcmCodec(bad)
    codec = AesGcmCodec(KEY)
    assert text not in repr(codec) and key_id(KEY) in repr(codec)


def test_aes_rejects_non_json() -> None:
    codec = AesGcmCodec(KEY)
    for bad in (float("nan"), float("inf"), object()):
        with pytest.raises(SerializationError):
            codec.encode(bad)


def test_aes_names_the_extra_when_cryptography_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "cryptography" or name.startswith("cryptography."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(ImportError, match=r"durably\[crypto\]"):
        AesGcmCodec(KEY)
