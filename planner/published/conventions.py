"""Each source's throughput figure as tokens/s per GPU, through the FLOP count that source used.

Sources report throughput differently: tokens/s, samples/s, seconds per iteration, or TFLOP/s per
GPU. TFLOP/s follow one of two conventions (see the development set's README):

* hardware FLOPs, counting recomputation (Narayanan et al. SC'21 eq. 3, used by SC'21, BLOOM and
  MT-NLG): ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` per iteration with full recomputation;
* model FLOPs, without recomputation (NeMo, Megatron-Core, torchtitan, Llama 3):
  ``72·B·s·l·h²·(1 + s/6h + V/12lh)``.

``costmodels.flops.reported_flops_per_token`` writes both as one sum over matrices, so GQA, SwiGLU and MoE layers use the
same rule: 2 FLOPs per multiply-add, backward = 2x forward, attention scores and values over the
full s x s square (Megatron counts no causal saving), logits once forward and twice backward.
"""

from __future__ import annotations

from costmodels.flops import FlopConvention, reported_flops_per_token
from costmodels.model_spec import ModelSpec

HARDWARE_FLOP_FAMILIES: frozenset[str] = frozenset({
    "megatron_sc21_table1", "megatron_sc21_table2", "bloom_tr11", "bloom_prequel_sweep", "mtnlg_530b"})
"""Families whose TFLOP/s count recomputation when the row does not say (the development set's
README, ``shared/published_runs/README.md``, Caveats)."""


def tflops_convention(family: str, counts_recompute: bool | None) -> FlopConvention:
    """Which FLOP count a row's TFLOP/s uses: the row's own flag, else its family's habit."""
    if counts_recompute is not None:
        return "hardware" if counts_recompute else "model"
    return "hardware" if family in HARDWARE_FLOP_FAMILIES else "model"


def measured_tokens_per_s_per_gpu(throughput: dict, *, family: str, num_gpus: int, global_batch: int,
                                  model: ModelSpec, seq_len: int, recompute: str,
                                  datasheet_peak_tflops: float) -> tuple[float, str] | None:
    """The measured rate in tokens/s per GPU and which figure it came from; None if none is given.

    Direct counts come first (tokens/s, samples/s, iteration time); TFLOP/s are converted only
    when nothing else is given, and MFU x peak last (the source's assumed peak, else
    ``datasheet_peak_tflops``, the 16-bit dense peak of the GPU preset).
    """
    t = throughput
    if t.get("tokens_per_sec_per_gpu"):
        return float(t["tokens_per_sec_per_gpu"]), "tokens/s per GPU"
    if t.get("tokens_per_sec_total"):
        return t["tokens_per_sec_total"] / num_gpus, "tokens/s total"
    if t.get("samples_per_sec"):
        return t["samples_per_sec"] * seq_len / num_gpus, "samples/s"
    if t.get("iteration_time_s"):
        return global_batch * seq_len / t["iteration_time_s"] / num_gpus, "iteration time"
    if t.get("tflops_per_gpu"):
        convention = tflops_convention(family, t.get("tflops_counts_recompute"))
        per_token = reported_flops_per_token(model, seq_len, recompute, convention)
        return t["tflops_per_gpu"] * 1e12 / per_token, f"TFLOP/s ({convention} FLOPs)"
    if t.get("mfu_pct"):
        peak = t.get("peak_tflops_assumed") or datasheet_peak_tflops
        basis = "MFU x source peak" if t.get("peak_tflops_assumed") else "MFU x datasheet peak"
        per_token = reported_flops_per_token(model, seq_len, recompute, "model")
        return t["mfu_pct"] / 100 * peak * 1e12 / per_token, f"{basis} (model FLOPs)"
    return None
