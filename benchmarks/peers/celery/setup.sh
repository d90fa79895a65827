#!/usr/bin/env bash
# Celery 5 with the Redis extra (broker and result backend) in this directory's own virtualenv
# (not committed), for benchmarks/remote.py. psutil counts the worker's CPU.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/pip install -q "celery[redis]==5.*" psutil
.venv/bin/python run.py --describe
