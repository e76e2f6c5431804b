"""The torch side of ``gpu_step_trace.py``: build one planned job, time its step under variants, trace it.

The job is built as ``planner.validate.measure.run_case`` builds it (``setup_job`` from the plan
file, one-rank process group) and ``time_variant`` times ``train_step`` as ``measure._timed_step``
does (synchronize, barrier, step, synchronize).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

import gpu_step_trace_summary as summary
from planner.launch.torchjob import trainer
from planner.launch.torchjob.clip import clip_grads
from planner.launch.torchjob.data import SyntheticTokens
from planner.plan.plan_file import read_plan_file
from planner.validate import measure
from planner.validate.probe import MemoryProbe

MAX_NORM = 1.0
"""Gradient clipping of the measured step (``measure.run_case``)."""


def start(kind: str) -> tuple[torch.device, str]:
    """(device, its name) with the process group joined."""
    device = measure.pick_device() if kind == "cuda" else torch.device("cpu")
    if kind == "cuda" and device.type != "cuda":
        raise RuntimeError("--device cuda: torch sees no CUDA device")
    measure.init_distributed(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return device, name


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def settings() -> dict:
    """The float32 matmul settings the job runs under (TF32 on or off) and the SDPA backends enabled."""
    b = torch.backends
    return {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
            "matmul_allow_tf32": b.cuda.matmul.allow_tf32, "cudnn_allow_tf32": b.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "matmul_allow_bf16_reduced_precision_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "sdpa_enabled": {"flash": b.cuda.flash_sdp_enabled(), "mem_efficient": b.cuda.mem_efficient_sdp_enabled(),
                             "cudnn": b.cuda.cudnn_sdp_enabled(), "math": b.cuda.math_sdp_enabled()}}


def _sync(job) -> None:
    if job.device.type == "cuda":
        torch.cuda.synchronize(job.device)


def _adamw(job, **implementation) -> list:
    return [torch.optim.AdamW(trainer.mesh_groups(trainer.trainable(part)), lr=3e-4, weight_decay=0.1,
                              **implementation) for _, part in job.parts]


@contextmanager
def _no_clip():
    original = trainer.clip_grads
    trainer.clip_grads = lambda *a, **k: 0.0
    try:
        yield
    finally:
        trainer.clip_grads = original


def _fwd_bwd_step(job, source, step: int, seq_len: int) -> None:
    inputs, labels = trainer.replica_batch(job, source, step, seq_len)
    trainer.forward_backward(job, inputs, labels)
    for _, part in job.parts:
        part.zero_grad(set_to_none=True)


def time_variant(job, source, seq_len: int, *, steps: int, warmup: int, kind: str, first: int) -> list[float]:
    """Step times (s) of one variant; ``first`` numbers the steps so each variant sees fresh data."""
    out = []
    for i in range(warmup + steps):
        _sync(job)
        dist.barrier()
        began = time.perf_counter()
        if kind == "fwd_bwd_only":
            _fwd_bwd_step(job, source, first + i, seq_len)
        elif kind == "no_clip":
            with _no_clip():
                trainer.train_step(job, source, first + i, seq_len=seq_len, max_norm=MAX_NORM)
        elif kind == "memory_probe":
            with MemoryProbe(job):
                trainer.train_step(job, source, first + i, seq_len=seq_len, max_norm=MAX_NORM)
        else:
            trainer.train_step(job, source, first + i, seq_len=seq_len, max_norm=MAX_NORM)
        _sync(job)
        if i >= warmup:
            out.append(time.perf_counter() - began)
    return out


def traced_step(job, source, step: int, seq_len: int) -> None:
    """``trainer.train_step`` for one stage without pipelining, each phase in a ``record_function``
    (``summary.PHASES``); the same calls in the same order."""
    with record_function("step"):
        with record_function("step/data"):
            inputs, labels = trainer.replica_batch(job, source, step, seq_len)
        m, model = job.layout.num_microbatches, job.parts[0][1]
        for i, (x, y) in enumerate(zip(inputs.chunk(m), labels.chunk(m))):
            trainer._set_grad_sync(job, i == m - 1)
            with trainer._autocast(job):
                with record_function("step/forward"):
                    logits = model(x)
                with record_function("step/loss"):
                    loss = trainer.loss_fn(logits, y) / m
            with record_function("step/backward"):
                loss.backward()
        with record_function("step/clip_grads"):
            clip_grads(job.params, MAX_NORM, stage_ranks=1, device=job.device)
        with record_function("step/optimizer"):
            for optimizer in job.optimizers:
                optimizer.step()
        with record_function("step/zero_grad"):
            for optimizer in job.optimizers:
                optimizer.zero_grad(set_to_none=True)
        with record_function("step/loss_item"):
            trainer._global_mean(job, loss.detach())
        _sync(job)


def trace(job, source, seq_len: int, *, first: int, num_steps: int, chrome_path: Path | None) -> dict:
    """Profile ``num_steps`` traced steps (after one untraced) and summarise them."""
    traced_step(job, source, first, seq_len)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(num_steps):
            traced_step(job, source, first + 1 + i, seq_len)
    if chrome_path is not None:
        prof.export_chrome_trace(str(chrome_path))
    return summary.summarize(prof.events(), num_steps=num_steps)


VARIANTS = ("job", "adamw_for_loop", "adamw_foreach", "no_clip", "fwd_bwd_only", "memory_probe")
"""A/B of one process: the job now (fused AdamW), the per-tensor loop the 2026-11-26 sweep ran,
foreach AdamW, the job without gradient clipping, forward + backward only, the job under the probe."""


def _variant(job, source, seq_len: int, kind: str, out: dict, *, steps: int, warmup: int, first: int,
             job_optimizers: list, trace_dir: Path | None, say) -> int:
    """Time (and for two variants trace) one variant into ``out``; returns the next step number."""
    job.optimizers = {"adamw_for_loop": lambda: _adamw(job, foreach=False),
                      "adamw_foreach": lambda: _adamw(job, foreach=True)}.get(kind, lambda: job_optimizers)()
    times = time_variant(job, source, seq_len, steps=steps, warmup=warmup, kind=kind, first=first)
    first += steps + warmup
    out["step_ms"][kind] = {"median": 1e3 * statistics.median(times), "all": [1e3 * t for t in times]}
    say(f"  {kind}: {out['step_ms'][kind]['median']:.1f} ms")
    if kind in ("job", "adamw_for_loop") and job.layout.pp == 1:
        chrome = trace_dir / f"trace-{kind}.json" if trace_dir is not None else None
        out["traces"][kind] = trace(job, source, seq_len, first=first, num_steps=2, chrome_path=chrome)
        first += 3
        t = out["traces"][kind]
        say(f"  {kind} traced: wall {t['wall_ms_per_step']:.1f} ms, device busy {t['device_busy_ms_per_step']:.1f} ms, "
            f"{t['num_kernels_per_step']:.0f} kernels")
    job.optimizers = job_optimizers
    return first


def run_case(plan_file: Path, device: torch.device, *, steps: int, warmup: int, trace_dir: Path | None, say) -> dict:
    plan = read_plan_file(plan_file)
    spec, layout, training = plan.inputs.model_spec, plan.best.layout, plan.inputs.training
    seq_len = training.seq_len
    job = trainer.setup_job(spec, layout, device=device, precision=training.precision, optimizer=training.optimizer)
    source = SyntheticTokens(spec.vocab_size, 0)
    job_optimizers = job.optimizers
    out = {"num_param_tensors": len(job.params), "num_params": sum(p.numel() for p in job.params),
           "optimizer_defaults": {k: job_optimizers[0].defaults.get(k) for k in ("fused", "foreach")},
           "step_ms": {}, "traces": {}}
    first = 0
    for kind in VARIANTS:
        try:
            first = _variant(job, source, seq_len, kind, out, steps=steps, warmup=warmup, first=first,
                             job_optimizers=job_optimizers, trace_dir=trace_dir, say=say)
        except torch.OutOfMemoryError as err:  # one variant's extra optimizer states must not lose the rest
            out["step_ms"][kind] = {"error": " ".join(str(err).split())[:200]}
            say(f"  {kind}: out of memory")
            job.optimizers = job_optimizers
            torch.cuda.empty_cache()
    job.optimizers = job_optimizers
    if device.type == "cuda":
        out["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    del job
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return out
