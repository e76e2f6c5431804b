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
# The frameworks that check the exported jobs (pyproject's "frameworks" extra), without their declared
# dependencies, which would pull a CUDA torch; deepspeed's sdist builds against the torch above, no ops.
DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -c constraints.txt megatron-core torchtitan deepspeed tyro docstring-parser typeguard shtab hjson py-cpuinfo \
    msgpack einops ninja psutil tqdm pydantic pydantic-core annotated-types typing-inspection typing-extensions
