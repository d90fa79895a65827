#!/usr/bin/env bash
# Creates benchmarks/peers/absurd/.venv: the pinned Absurd SDK, absurdctl (which bundles the
# schema SQL of the same release) and psutil — never durably's environment.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "absurd-sdk==0.5.1" "absurdctl==0.5.1" psutil "psycopg[binary]"
