"""The stored form of a step call, pinned: one argument is stored exactly as a single input
always was, several (or keyword) arguments as `{"$durably.args": [...], "$durably.kwargs":
{...}}` with each argument in its parameter's JSON form; and what reads as that form."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypedDict

import pytest
from pydantic import BaseModel

from durably import Args
from durably._engine.defs.registry import RetryPolicy, Step, step_input_json
from durably._engine.defs.typed_io import (
    ArgCodecs,
    ArgumentValidationError,
    ValueCodec,
    is_args_envelope,
)


@dataclasses.dataclass
class Order:
    id: str
    amount: int


class Money(BaseModel):
    cents: int
    currency: str


class Line(TypedDict):
    sku: str
    qty: int


def charge(order: Order, price: Money, *lines: Line, note: str = "", **tags: int) -> None:
    raise AssertionError("not called")


ORDER, PRICE = Order("o1", 3), Money(cents=250, currency="EUR")


def _step(fn: Any) -> Step[Any, Any]:
    # a Step built directly: not registered, so other tests' names are untouched
    return Step(fn, f"pinned.{fn.__name__}", RetryPolicy(), None, None, frozenset())


def test_several_arguments_are_stored_in_one_pinned_object() -> None:
    stored = step_input_json(
        _step(charge),
        "pinned.charge",
        Args(ORDER, PRICE, {"sku": "a", "qty": 2}, note="gift", rush=1),
    )
    assert json.dumps(stored) == (
        '{"$durably.args": [{"id": "o1", "amount": 3}, {"cents": 250, "currency": "EUR"}, '
        '{"sku": "a", "qty": 2}], "$durably.kwargs": {"note": "gift", "rush": 1}}'
    )
    assert is_args_envelope(stored)
    rebuilt = ArgCodecs(charge).from_json(stored)
    assert rebuilt == Args(ORDER, PRICE, {"sku": "a", "qty": 2}, note="gift", rush=1)
    assert isinstance(rebuilt.args[0], Order) and isinstance(rebuilt.args[1], Money)


@pytest.mark.parametrize(
    ("fn", "value"),
    [
        (lambda order: None, {"a": [1, 2]}),
        (lambda order: None, (1, "x")),
        (lambda order: None, None),
        (lambda order: None, 7),
    ],
)
def test_one_argument_is_stored_as_a_single_input_always_was(fn: Any, value: Any) -> None:
    assert step_input_json(_step(fn), "pinned.one", value) == ValueCodec(None).to_json(value)


def test_one_typed_argument_is_stored_as_its_codec_writes_it() -> None:
    def typed(order: Order) -> None: ...

    assert step_input_json(_step(typed), "pinned.typed", ORDER) == {"id": "o1", "amount": 3}
    assert step_input_json(_step(typed), "pinned.typed", Args(ORDER)) == {
        "$durably.args": [{"id": "o1", "amount": 3}],
        "$durably.kwargs": {},
    }


@pytest.mark.parametrize(
    "value",
    [
        {"$durably.args": [], "$durably.kwargs": {}, "extra": 1},
        {"$durably.args": [], "$durably.kwargs": []},
        {"$durably.args": {}, "$durably.kwargs": {}},
        {"$durably.args": []},
        [["$durably.args"], {}],
        "$durably.args",
    ],
)
def test_only_the_exact_two_key_object_reads_as_arguments(value: Any) -> None:
    assert not is_args_envelope(value)


@pytest.mark.parametrize("key", ["$durably.args", "$durably.kwargs"])
def test_a_single_input_holding_a_reserved_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="reserved for calls with several arguments"):
        step_input_json(None, "pinned.by-name", {key: 1, "other": 2})


def test_an_argument_failing_validation_names_its_parameter() -> None:
    stored = {
        "$durably.args": [{"id": "o1", "amount": 3}, {"cents": "many"}],
        "$durably.kwargs": {},
    }
    with pytest.raises(ArgumentValidationError) as info:
        ArgCodecs(charge).from_json(stored)
    assert info.value.parameter == "price"
    assert str(info.value).startswith("argument 'price': ")


def test_a_step_known_only_by_name_stores_plain_json_arguments() -> None:
    assert step_input_json(None, "pinned.by-name", Args((1, 2), k={"a": (3,)})) == {
        "$durably.args": [[1, 2]],
        "$durably.kwargs": {"k": {"a": [3]}},
    }
