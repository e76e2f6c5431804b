"""The measuring process of ``gpu_truth.py``: several generated jobs in one torchrun process.

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/gpu_truth_runner.py \
        cases.json results.jsonl

``cases.json``: {"deadline_unix_s": float, "cases": [{"name", "plan_file", "log_dir", "steps", "warmup",
"world_size"}, ...]}, the case format of ``planner.validate.measure``, whose ``run_case`` (the
generated job's own ``setup_job`` / ``train_step``, step log, ``MemoryProbe``) measures each case.
This file only adds what the GPU record needs around it: one unrecorded run of the first case to
warm the process (``warm_process``), the allocator's reserved peak, one failing case (an OOM)
written as an error line instead of ending the process, and the deadline.
Starting torch and CUDA costs far more than a small case, hence one process for all of them.

One JSON line per case is appended to ``results.jsonl`` as soon as it is known (a crash loses
only the case that crashed; ``gpu_truth.py`` restarts the rest): {"name", "status":
"measured" | "error" | "skipped", ...}; the first line is {"environment": {...}}.
"""

from __future__ import annotations

import gc
import json
import platform
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from planner.validate import measure


def environment(device: torch.device) -> dict:
    """What this process runs on: device name, capability, memory, torch, CUDA and cuDNN versions."""
    out = {"device_type": device.type, "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "python_version": platform.python_version(), "num_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(device_name=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)),
                   memory_bytes=props.total_memory, num_sms=props.multi_processor_count,
                   cudnn_version=torch.backends.cudnn.version())
    else:
        out["device_name"] = platform.processor() or platform.machine()
    return out


def _append(path: str, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        handle.flush()


def _fresh(device: torch.device) -> None:
    """Free what the last case left cached, so this case's reserved peak is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def measure_one(case: dict, device: torch.device) -> dict:
    """``measure.run_case`` plus the allocator peaks; an exception becomes an error record."""
    _fresh(device)
    began = time.perf_counter()
    try:
        result = measure.run_case(case, device)
    except Exception as err:  # noqa: BLE001 - one failing layout (an OOM) must not end the sweep
        kind = "oom" if isinstance(err, torch.OutOfMemoryError) else type(err).__name__
        text = " ".join(str(err).split())[:400]
        print(f"[runner] {case['name']}: {kind}: {text}", file=sys.stderr, flush=True)
        traceback.print_exc(limit=3)
        del err
        _fresh(device)
        return {"name": case["name"], "status": "error", "error_kind": kind, "error": text,
                "wall_s": time.perf_counter() - began}
    out = {"name": case["name"], "status": "measured", "wall_s": time.perf_counter() - began, **result}
    if device.type == "cuda":
        out["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return out


def warm_process(case: dict, device: torch.device) -> None:
    """Run ``case`` once, unrecorded (one warm-up and one step), before the sweep: the process's
    first job pays CUDA, cuBLAS and cuDNN initialisation and the allocator's first growth, which
    made the first layout of the 2026-11-26 H100 sweep measure 151 ms against 103 ms in a warm
    process (``benchmarks/data/gpu/README.md``)."""
    throwaway = {**case, "steps": 1, "warmup": 1, "log_dir": case["log_dir"] + "-process-warmup"}
    measure_one(throwaway, device)


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    cases_path, out_path = argv
    with open(cases_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    device = measure.pick_device()
    measure.init_distributed(device)
    _append(out_path, {"environment": environment(device)})
    if spec["cases"] and time.time() < spec["deadline_unix_s"]:
        warm_process(spec["cases"][0], device)
    for case in spec["cases"]:
        if time.time() > spec["deadline_unix_s"]:
            _append(out_path, {"name": case["name"], "status": "skipped", "error": "time budget spent"})
            continue
        print(f"[runner] {case['name']}: running", file=sys.stderr, flush=True)
        record = measure_one(case, device)
        _append(out_path, record)
        if record["status"] == "measured":
            times = sorted(record["step_time_s"])
            peak = record.get("max_memory_reserved_bytes") or record["ranks"][0]["peak_bytes"]
            print(f"[runner] {case['name']}: median step {times[len(times) // 2] * 1e3:.1f} ms, "
                  f"peak {peak / 2**30:.2f} GiB, {record['wall_s']:.1f} s", file=sys.stderr, flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
