"""An order-fulfilment workflow — the example `durably demo` runs.

Read it top to bottom as a tour of durably:

* **Typed inputs and outputs.** `Order`, `Shipment` and `Receipt` are pydantic models. `start`
  validates the input against `Order` before any run exists; the store keeps JSON; the body
  receives real `Order` objects (also after a crash and a replay).
* **Steps.** Each `@durably.step` is checkpointed: once it has completed, a resumed run reads
  its recorded output instead of running it again.
* **Retries.** `charge_card` is declared with `retries=3`. Here it fails on its first attempt
  (the simulated payment gateway is unreachable once per order), the engine records the failure,
  waits the backoff and runs it again; the timeline shows `attempts=2`.
* **Signals.** The run parks on `ctx.wait_for_signal(...)` until someone calls
  `engine.signal("approve:<order id>", {...})` — from this process or any other one sharing the
  store (`durably runs signal approve:<order id> --payload '{"approvedBy": "ops"}'`).
* **Durable sleep.** `ctx.sleep("1s")` survives restarts: the deadline is stored, and a new
  process resumes the run when it is due.
* **Child workflows.** Shipping is its own workflow (`ship_order`), started and awaited with
  `ctx.child(...)`; it has its own run, history and retries.

Run it:

    durably demo                        # embedded SQLite file ./durably-demo.db

or drive it yourself:

    import asyncio, durably
    from durably.examples.orders import Order, process_order

    async def main() -> None:
        async with durably.Engine("sqlite:///orders.db") as engine:
            handle = await engine.start(process_order, Order.example(), run_id="order-1001")
            ...                          # later, from anywhere:
            await engine.signal("approve:order-1001", {"approvedBy": "ops"})
            print(await handle.result(timeout=30))

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

from pydantic import BaseModel, Field

import durably
from durably import FatalError, WorkflowCtx

# ------------------------------------------------------------------ data


class OrderLine(BaseModel):
    sku: str
    quantity: int = Field(gt=0)
    unit_price_cents: int = Field(ge=0)


class Order(BaseModel):
    """The workflow's input: validated by `engine.start` before a run is created."""

    order_id: str
    customer: str
    email: str
    lines: list[OrderLine] = Field(min_length=1)
    address: str

    @property
    def total_cents(self) -> int:
        return sum(line.quantity * line.unit_price_cents for line in self.lines)

    @classmethod
    def example(cls, order_id: str = "order-1001") -> Order:
        return cls(
            order_id=order_id,
            customer="Ada Lovelace",
            email="ada@example.com",
            lines=[
                OrderLine(sku="KB-42", quantity=1, unit_price_cents=12_900),
                OrderLine(sku="MOUSE-7", quantity=2, unit_price_cents=2_450),
            ],
            address="12 Analytical Row, London",
        )


class Reservation(BaseModel):
    reservation_id: str
    skus: list[str]


class Charge(BaseModel):
    charge_id: str
    amount_cents: int


class ShipmentRequest(BaseModel):
    order_id: str
    address: str
    parcels: int


class Shipment(BaseModel):
    carrier: str
    tracking_number: str


class Receipt(BaseModel):
    """The workflow's output."""

    order_id: str
    charge_id: str
    amount_cents: int
    approved_by: str
    tracking_number: str
    carrier: str


def _digest(*parts: str) -> str:
    """Deterministic ids, so re-running a step after a crash yields the same value."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]


# ------------------------------------------------------------------ steps

# Each step takes ONE input and returns one output (the store carries one JSON value each way).
# They are plain callables too: `await reserve_inventory(order)` runs the function directly.


@durably.step("orders.reserve-inventory")
async def reserve_inventory(order: Order) -> Reservation:
    await asyncio.sleep(0.05)  # pretend to call the inventory service
    return Reservation(
        reservation_id="res-" + _digest(order.order_id),
        skus=[line.sku for line in order.lines],
    )


# The simulated payment gateway is unreachable on the first call for each order, then works.
# (A real step would call a payment API with an idempotency key derived from the order id, so a
# retry can never charge twice.)
_gateway_calls: dict[str, int] = {}
_gateway_lock = threading.Lock()


@durably.step("payments.charge-card", retries=3, backoff="exponential", backoff_ms="250ms")
async def charge_card(order: Order) -> Charge:
    with _gateway_lock:
        calls = _gateway_calls[order.order_id] = _gateway_calls.get(order.order_id, 0) + 1
    await asyncio.sleep(0.05)
    if calls == 1:
        raise ConnectionError("payment gateway unreachable (simulated; the engine retries)")
    if order.total_cents > 1_000_000:
        # A FatalError is never retried: the run fails with this code.
        raise FatalError("card declined: amount over limit", code="declined")
    charge_id = "ch-" + _digest(order.order_id, "charge")
    return Charge(charge_id=charge_id, amount_cents=order.total_cents)


@durably.step("shipping.book-carrier")
def book_carrier(request: ShipmentRequest) -> str:
    # A sync step runs on the engine's own thread pool.
    return "ParcelCo" if request.parcels <= 2 else "FreightCo"


@durably.step("shipping.print-label")
async def print_label(request: ShipmentRequest) -> str:
    await asyncio.sleep(0.05)
    return "TRK-" + _digest(request.order_id, request.address).upper()


@durably.step("orders.send-receipt")
async def send_receipt(receipt: Receipt) -> str:
    await asyncio.sleep(0.02)  # pretend to send an email
    return f"receipt for {receipt.order_id} sent"


# ------------------------------------------------------------------ workflows


@durably.workflow("orders.shipping")
async def ship_order(ctx: WorkflowCtx, request: ShipmentRequest) -> Shipment:
    """Child workflow: book a carrier, then print the label."""
    carrier = await ctx.step(book_carrier, request)
    tracking = await ctx.step(print_label, request)
    return Shipment(carrier=carrier, tracking_number=tracking)


def approval_token(order_id: str) -> str:
    """The signal token `process_order` waits on for a human approval."""
    return f"approve:{order_id}"


@durably.workflow("orders.process")
async def process_order(ctx: WorkflowCtx, order: Order) -> Receipt:
    """Reserve stock, wait for approval, charge, cool off, ship (child), send the receipt."""
    reservation = await ctx.step(reserve_inventory, order)
    ctx.logger.info("reserved %s", reservation.reservation_id)

    # Park until an operator approves (the run is suspended in the store meanwhile; no process
    # needs to stay up). A payload like {"approvedBy": "ops"} comes back here.
    approval = await ctx.wait_for_signal(approval_token(order.order_id), timeout="1h")
    approved_by = str((approval or {}).get("approvedBy", "unknown"))

    charge = await ctx.step(charge_card, order)  # fails once, retried by the engine

    # A durable timer: e.g. a short fraud-screening window before handing over to shipping.
    await ctx.sleep("1s")

    shipment = await ctx.child(
        ship_order,
        ShipmentRequest(order_id=order.order_id, address=order.address, parcels=len(order.lines)),
        id=f"{ctx.run_id}.shipping",
    )

    receipt = Receipt(
        order_id=order.order_id,
        charge_id=charge.charge_id,
        amount_cents=charge.amount_cents,
        approved_by=approved_by,
        tracking_number=shipment.tracking_number,
        carrier=shipment.carrier,
    )
    await ctx.step(send_receipt, receipt)
    return receipt


WORKFLOWS: list[durably.Workflow[Any, Any]] = [process_order, ship_order]
STEPS: list[durably.Step[Any, Any]] = [
    reserve_inventory,
    charge_card,
    book_carrier,
    print_label,
    send_receipt,
]


def make_engine(store: str = "sqlite:///durably-demo.db", **options: Any) -> durably.Engine:
    """An engine serving just this example's workflows and steps.

    A worker app is one line in your own module, `engine = make_engine("sqlite:///orders.db")`,
    then `durably worker yourmodule:engine`.
    """
    return durably.Engine(store, workflows=WORKFLOWS, steps=STEPS, **options)


__all__ = [
    "STEPS",
    "WORKFLOWS",
    "Charge",
    "Order",
    "OrderLine",
    "Receipt",
    "Reservation",
    "Shipment",
    "ShipmentRequest",
    "approval_token",
    "book_carrier",
    "charge_card",
    "make_engine",
    "print_label",
    "process_order",
    "reserve_inventory",
    "send_receipt",
    "ship_order",
]
