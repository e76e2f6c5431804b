"""Measure plans under torchrun with the generated job's own code (``planner.launch.torchjob``).

    torchrun --standalone --nproc-per-node P -m planner.validate.measure cases.json results.jsonl

``cases.json``: a list of {"name", "plan_file", "log_dir", "steps", "warmup"}; cases whose world
size differs from the launch are skipped, so one launch (the costly part on a small machine)
covers every plan of that size. Per case, every rank builds the job (``setup_job``), runs
``warmup`` untimed steps and ``steps`` timed steps (``train_step``, the step ``train.py`` runs),
then one more step under ``MemoryProbe``. Rank 0 writes the step log the generated job writes
(``log_dir/metrics.jsonl``) and appends one JSON line per case to ``results.jsonl``:
{"name", "world_size", "step_time_s": [...], "ranks": [{"rank", "pp_rank", "params", "grads",
"optimizer", "states", "activations", "rss_bytes", "peak_bytes", "memory_kind"}, ...]}.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from planner.launch.torchjob.data import SyntheticTokens
from planner.plan.plan_file import read_plan_file
from planner.launch.torchjob.trainer import init_distributed, pick_device, setup_job, train_step

from .probe import MemoryProbe


def _rss_bytes() -> int:
    """Resident set size now (Linux /proc), for reference; 0 where unavailable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max_rss_process"


def _timed_step(job, source, step: int, seq_len: int) -> tuple[dict, float]:
    if job.device.type == "cuda":
        torch.cuda.synchronize(job.device)
    dist.barrier()
    began = time.perf_counter()
    metrics = train_step(job, source, step, seq_len=seq_len, max_norm=1.0)
    if job.device.type == "cuda":
        torch.cuda.synchronize(job.device)
    return metrics, time.perf_counter() - began


def run_case(case: dict, device: torch.device) -> dict:
    """Train one plan: warm-up, timed steps (step log written), one probed step; per-rank memory."""
    plan = read_plan_file(case["plan_file"])
    spec, layout, training = plan.inputs.model_spec, plan.best.layout, plan.inputs.training
    seq_len = training.seq_len
    job = setup_job(spec, layout, device=device, precision=training.precision, optimizer=training.optimizer)
    source = SyntheticTokens(spec.vocab_size, 0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, records = [], []
    total = case["warmup"] + case["steps"]
    for step in range(total):
        metrics, elapsed = _timed_step(job, source, step, seq_len)
        if step >= case["warmup"]:
            times.append(elapsed)
            records.append({"step": step + 1, **metrics, "step_time_s": elapsed,
                            "tokens_per_s": job.global_batch * seq_len / elapsed})
    with MemoryProbe(job) as probe:
        train_step(job, source, total, seq_len=seq_len, max_norm=1.0)
    peak, kind = _peak(device)
    pp_rank = job.meshes.world.get_local_rank("pp") if job.meshes is not None else 0
    mine = {"rank": dist.get_rank(), "pp_rank": pp_rank, **probe.peak, "rss_bytes": _rss_bytes(),
            "peak_bytes": peak, "memory_kind": kind}
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    times_all: list = [None] * dist.get_world_size()
    dist.all_gather_object(times_all, times)
    step_times = [max(column) for column in zip(*times_all)]
    _write_step_log(case["log_dir"], records, step_times)
    del job, probe
    gc.collect()
    return {"name": case["name"], "world_size": dist.get_world_size(), "step_time_s": step_times,
            "tokens_per_step": layout.micro_batch_size * layout.num_microbatches * layout.dp * seq_len,
            "ranks": ranks}


def _write_step_log(log_dir: str, records: list[dict], step_times: list[float]) -> None:
    """The step log of the generated job (``metrics.jsonl``), step time = slowest rank."""
    if dist.get_rank() != 0:
        return
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(log_dir) / "metrics.jsonl", "w", encoding="utf-8") as handle:
        for record, slowest in zip(records, step_times):
            record = {**record, "step_time_s": slowest, "tokens_per_s": record["tokens_per_s"]
                      * record["step_time_s"] / slowest}
            handle.write(json.dumps(record, sort_keys=True) + "\n")


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    cases_path, out_path = argv
    device = pick_device()
    init_distributed(device)
    with open(cases_path, encoding="utf-8") as handle:
        cases = json.load(handle)
    for case in cases:
        if case["world_size"] != dist.get_world_size():
            continue
        result = run_case(case, device)
        if dist.get_rank() == 0:
            with open(out_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result, sort_keys=True) + "\n")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
