"""`durably demo`: the bundled order workflow on the embedded SQLite default."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.cli.support import durably, ok, sqlite_url


def test_demo_completes_and_prints_the_timeline(tmp_path: Path) -> None:
    began = time.monotonic()
    result = ok(durably("demo", cwd=tmp_path, timeout=60))
    elapsed = time.monotonic() - began
    out = result.stdout
    assert (tmp_path / "durably-demo.db").exists()
    assert "timeline of order-1001" in out
    for name in (
        "orders.reserve-inventory",
        "signal:approve:order-1001",
        "payments.charge-card",
        "sleep",
        "signal:child:order-1001.shipping",
        "orders.send-receipt",
        "shipping.book-carrier",
        "shipping.print-label",
    ):
        assert name in out, name
    header = next(line for line in out.splitlines() if "SEQ" in line and "ATTEMPTS" in line)
    assert all(col in header for col in ("NAME", "KIND", "STATUS", "DURATION"))
    charge = next(
        line
        for line in out.splitlines()
        if "payments.charge-card" in line and "in-process step" in line
    )
    assert " 2 " in charge  # failed once, retried: two attempts
    assert "attempt 1 failed" in out  # the live progress showed the failure
    assert '"approved_by": "durably demo"' in out
    assert "run completed" in out
    assert elapsed < 15, f"the demo took {elapsed:.1f}s"


def test_demo_reruns_on_a_fresh_file(tmp_path: Path) -> None:
    ok(durably("demo", "--json", cwd=tmp_path, timeout=60))
    again = json.loads(ok(durably("demo", "--json", cwd=tmp_path, timeout=60)).stdout)
    assert again["run"]["id"] == "order-1001"
    assert again["run"]["status"] == "completed"


def test_demo_json_on_a_custom_store(tmp_path: Path) -> None:
    store = sqlite_url(tmp_path / "custom.db")
    report = json.loads(ok(durably("demo", "--store", store, "--json", cwd=tmp_path)).stdout)
    run = report["run"]
    assert run["status"] == "completed"
    assert run["id"].startswith("order-")
    assert run["output"]["carrier"] == "ParcelCo"
    by_name = {cp["name"]: cp for cp in report["checkpoints"]}
    assert by_name["payments.charge-card"]["attempts"] == 2
    assert by_name["payments.charge-card"]["status"] == "completed"
    assert [c["run"]["workflow"] for c in report["children"]] == ["orders.shipping"]
    assert not (tmp_path / "durably-demo.db").exists()
    # The run is in the custom store, visible to `runs show`.
    shown = json.loads(
        ok(durably("runs", "show", run["id"], "--store", store, "--json", cwd=tmp_path)).stdout
    )
    assert shown["run"]["status"] == "completed"
