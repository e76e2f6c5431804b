#!/usr/bin/env bash
# Create .venv and install autoplan with everything its tests need, at the exact versions in
# constraints.txt (the lock the suite last passed with; scripts/refresh-lock.sh updates it).
# torch is installed first and pinned: a CPU wheel of torch 2.13.0 is on this machine's disk,
# and an unpinned torch would make pip download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
