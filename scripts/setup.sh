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
# torchtitan 0.3.0, the release the torchtitan export targets by default, with the spmd-types it imports, in a
# folder of its own beside the venv's 0.2.2 (which --runtime-version v0.2.2 jobs and their tests read): both
# are the package "torchtitan". tests/torchtitan030_build.py puts the folder first on its path. Its
# llama3 config registry also imports triton (models/common/moe.py -> distributed/minimal_async_ep/kernels.py),
# which a CUDA torch brings; on this CPU machine the build script stands it in, as for 0.2.2.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
    --target .venv/torchtitan-0.3.0 "torchtitan==0.3.0" "spmd-types==0.3.1"
