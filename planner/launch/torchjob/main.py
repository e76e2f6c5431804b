"""Entry point of a generated job: ``python train.py [--steps N] [--data PATH] ...`` under torchrun.

Reads the plan (model spec, layout, sequence length, precision), builds the parallel job,
resumes from the newest complete checkpoint, trains, logs every step to stdout (rank 0) and to
``LOG_DIR/metrics.jsonl``, and saves a distributed checkpoint every K steps and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from autoplan_base.errors import AutoplanError

from . import checkpoint
from .data import open_source
from planner.plan.plan_file import PlanFile, PlanFileError, read_plan_file
from .trainer import init_distributed, pick_device, setup_job, train_step

GIB = 2**30


def parse_args(argv: list[str] | None, job_dir: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the model of an autoplan plan with its layout.")
    parser.add_argument("--plan", default=str(job_dir / "plan.json"), help="plan file (default: the copy here)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to reach (counting resumed ones)")
    parser.add_argument("--data", default=None, help="token file (flat uint16/uint32); default synthetic tokens")
    parser.add_argument("--data-dtype", default="auto", choices=("auto", "uint16", "uint32"))
    parser.add_argument("--checkpoint-dir", default=str(job_dir / "checkpoints"))
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save every K steps (0: only at the end)")
    parser.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints")
    parser.add_argument("--log-dir", default=str(job_dir / "logs"))
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping (0: off)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate-failure-at-step", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _memory(job) -> dict:
    """Peak memory of the busiest rank: CUDA allocator peak on GPU; max RSS on CPU; plus tensor bytes."""
    tensors = 0
    for p in job.params:
        local = p.to_local() if hasattr(p, "to_local") else p
        tensors += local.numel() * local.element_size()
    for optimizer in job.optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value = value.to_local() if hasattr(value, "to_local") else value
                    tensors += value.numel() * value.element_size()
    if job.device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(job.device), "cuda_max_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max_rss"
    values = torch.tensor([peak, tensors], dtype=torch.float64, device=job.device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return {"peak_memory_bytes": int(values[0]), "memory_kind": kind, "tensor_bytes": int(values[1])}


def _log(record: dict, log_file, total_steps: int) -> None:
    if dist.get_rank() != 0:
        return
    log_file.write(json.dumps(record, sort_keys=True) + "\n")
    log_file.flush()
    print(f"step {record['step']}/{total_steps} | loss {record['loss']:.4f} | grad_norm {record['grad_norm']:.3f}"
          f" | {record['step_time_s']:.3f} s | {record['tokens_per_s']:.0f} tokens/s"
          f" | peak {record['peak_memory_bytes'] / GIB:.2f} GiB ({record['memory_kind']})"
          f" | states {record['tensor_bytes'] / GIB:.3f} GiB", flush=True)


def _resume(job, args) -> int:
    if args.no_resume:
        return 0
    found = checkpoint.latest_complete(args.checkpoint_dir)
    if found is None:
        return 0
    step = checkpoint.load(job, found[1])
    if dist.get_rank() == 0:
        print(f"resumed from {found[1]} (step {step})", flush=True)
    return step


def _load_plan(path: str) -> PlanFile:
    """The plan file with a best layout; anything else is one ``error:`` line and exit 2 (rank 0 prints)."""
    try:
        plan = read_plan_file(path)
        if plan.best is None:
            raise PlanFileError(f"plan file {path}: best is null (no layout fits); nothing to train")
    except PlanFileError as err:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return plan


def job_from_args(args):
    """(job, sequence length) of the plan on this rank; a plan the job cannot apply is one ``error:`` line, exit 2."""
    plan = _load_plan(args.plan)
    spec, layout, training = plan.inputs.model_spec, plan.best.layout, plan.inputs.training
    seq_len = training.seq_len
    device = pick_device()
    init_distributed(device)
    if dist.get_world_size() != layout.world_size:
        raise SystemExit(f"error: the plan needs {layout.world_size} processes (dp {layout.dp} x tp {layout.tp}"
                         f" x pp {layout.pp} x cp {layout.cp}); torchrun started {dist.get_world_size()}")
    try:
        job = setup_job(spec, layout, device=device, seed=args.seed, lr=args.lr, weight_decay=args.weight_decay,
                        precision=training.precision, optimizer=training.optimizer, module=plan.inputs.module,
                        tp_plan=plan.best.tp_plan, seq_len=seq_len, lora_rank=training.lora_rank,
                        lora_targets=training.lora_targets)
    except AutoplanError as err:
        if dist.get_rank() == 0:
            print(f"error: {err}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        raise SystemExit(2) from None
    return job, seq_len


def main(argv: list[str] | None = None, job_dir: str | Path = ".") -> None:
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    args = parse_args(argv, Path(job_dir))
    job, seq_len = job_from_args(args)
    source = open_source(args.data, job.vocab_size, args.seed, args.data_dtype)
    start = _resume(job, args)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(args.log_dir) / "metrics.jsonl", "a", encoding="utf-8") as log_file:
        for step in range(start, args.steps):
            began = time.perf_counter()
            metrics = train_step(job, source, step, seq_len=seq_len, max_norm=args.max_grad_norm)
            elapsed = time.perf_counter() - began
            record = {"step": step + 1, **metrics, "step_time_s": elapsed,
                      "tokens_per_s": job.global_batch * seq_len / elapsed, **_memory(job)}
            _log(record, log_file, args.steps)
            done = step + 1
            if done == args.steps or (args.checkpoint_every and done % args.checkpoint_every == 0):
                checkpoint.save(job, args.checkpoint_dir, done)
            if done == args.simulate_failure_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # no rank tears gloo down while another still has a collective in flight
    dist.destroy_process_group()
