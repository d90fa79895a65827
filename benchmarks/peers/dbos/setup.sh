#!/usr/bin/env bash
# Creates benchmarks/peers/dbos/.venv with DBOS Transact 3.4.0 (never touches durably's env).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "dbos==3.4.0" psutil
.venv/bin/python -c 'import importlib.metadata as m; print("dbos", m.version("dbos"))'
