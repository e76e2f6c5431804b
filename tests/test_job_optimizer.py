"""The generated job's optimizer step is one multi-tensor pass, not a loop over tensors.

The 2026-11-26 H100 sweep (``benchmarks/data/gpu/superseded/h100-2026-11-26-loop-adamw.md``) measured every small
layout 50-60 ms slower than predicted; the job's AdamW ran ``foreach=False``: about ten kernels
per parameter tensor and 80 bytes of memory traffic per parameter, against the single 28-byte
pass ``costmodels.rank_time.add_optimizer`` costs (torchtitan's fused default). These tests run
on CPU, where torch has the same fused kernel.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from costmodels.layout import Layout
from costmodels.presets import load_model
from planner.launch.torchjob import trainer
from planner.launch.torchjob.data import SyntheticTokens

SEQ_LEN = 16


class _CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched while active (each is at least one kernel launch on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _job(optimizer: str = "adamw"):
    torch.manual_seed(0)
    return trainer.setup_job(load_model("tiny-llama"), Layout(), device=torch.device("cpu"), optimizer=optimizer)


def _step_ops(job) -> int:
    """aten ops of one optimizer step after a backward (the second step: states exist)."""
    source = SyntheticTokens(job.vocab_size, 0)
    trainer.train_step(job, source, 0, seq_len=SEQ_LEN, max_norm=1.0)
    inputs, labels = trainer.replica_batch(job, source, 1, SEQ_LEN)
    trainer.forward_backward(job, inputs, labels)
    with _CountOps() as ops:
        for optimizer in job.optimizers:
            optimizer.step()
    return ops.count


def test_job_adamw_is_fused_in_one_group_per_mesh():
    job = _job()
    (optimizer,) = job.optimizers
    assert optimizer.defaults["fused"] is True
    assert len(optimizer.param_groups) == 1  # plain tensors only: one group
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(job.params)


def test_adamw_step_issues_a_constant_number_of_ops_not_ten_per_tensor():
    job = _job()
    num_tensors = len(job.params)
    ops = _step_ops(job)
    # the old per-tensor loop: >= 8 ops per tensor (mul_, lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_)
    assert num_tensors >= 20 and ops < num_tensors, (ops, num_tensors)


def test_fused_adamw_matches_the_per_tensor_loop():
    """Same update as torch's reference loop (``foreach=False``) to float rounding, after 3 steps."""
    fused, loop = _job(), _job()
    loop.optimizers = [torch.optim.AdamW(trainer.mesh_groups(loop.params), lr=3e-4, weight_decay=0.1,
                                         foreach=False)]
    source = SyntheticTokens(fused.vocab_size, 0)
    for step in range(3):
        a = trainer.train_step(fused, source, step, seq_len=SEQ_LEN, max_norm=1.0)
        b = trainer.train_step(loop, source, step, seq_len=SEQ_LEN, max_norm=1.0)
        assert abs(a["loss"] - b["loss"]) < 1e-4
    for p, q in zip(fused.params, loop.params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_sgd_is_foreach():
    (optimizer,) = _job("sgd").optimizers
    assert optimizer.defaults["foreach"] is True
