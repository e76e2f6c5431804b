"""Record a PyTorch profiler trace of the generated job's own training step.

    torchrun --standalone --nproc-per-node 2 -m planner.launch.torchjob.trace_step --plan plan.json --out step.json

Builds the job of ``plan.json`` exactly as ``train.py`` does (``trainer.setup_job``), runs
``--warmup`` untimed steps, then one step of ``trainer.train_step`` under ``torch.profiler`` with
``record_shapes=True`` (CPU activities, plus CUDA on a GPU) and writes rank 0's Chrome trace
(``export_chrome_trace``), the file ``autoplan profile import-trace`` reads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from .data import open_source
from .main import job_from_args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m planner.launch.torchjob.trace_step", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True, help="plan file (autoplan plan/evaluate --out)")
    parser.add_argument("--out", required=True, help="Chrome trace JSON to write (rank 0)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before the traced one")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from torch.profiler import ProfilerActivity, profile

    from .trainer import train_step

    args = parse_args(argv)
    job_args = argparse.Namespace(plan=args.plan, seed=args.seed, lr=3e-4, weight_decay=0.1)
    job, seq_len = job_from_args(job_args)
    source = open_source(None, job.vocab_size, args.seed)
    for step in range(args.warmup):
        train_step(job, source, step, seq_len=seq_len, max_norm=1.0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.device.type == "cuda" else [])
    dist.barrier()
    with profile(activities=activities, record_shapes=True) as prof:
        train_step(job, source, args.warmup, seq_len=seq_len, max_norm=1.0)
        if job.device.type == "cuda":
            torch.cuda.synchronize()
    if dist.get_rank() == 0:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        prof.export_chrome_trace(str(tmp))
        trace = json.loads(tmp.read_text())
        trace["autoplan"] = {"plan": str(args.plan), "world_size": dist.get_world_size(), "warmup": args.warmup}
        tmp.write_text(json.dumps(trace))
        tmp.replace(out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
