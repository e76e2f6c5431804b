#!/usr/bin/env bash
# Create .venv and install autoplan with everything its tests need.
# torch is installed first and pinned: a CPU wheel of torch 2.13.0 is on this machine's disk,
# and an unpinned torch would make pip download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
