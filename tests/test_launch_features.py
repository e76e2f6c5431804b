"""Loss parity of issue 13's runtime features (CPU, gloo, torchrun): tied embeddings under tp 2 x
pp 2 and under tp 2 x dp 2 with SP, LoRA under FSDP (and under tp 2 with SP: column- and
row-parallel adapters), and FSDP2 CPU offload (sharded and replicated), each against a single-process run of the same model from the same seed.

All distributed cases run in one 4-process launch (``planner.launch.torchjob.case_runner``), the
references in one plain process, both shared with the other loss-parity files (``case_results``,
tests/conftest.py): a launch costs far more than the steps of a tiny model.
"""

from __future__ import annotations

import pytest

STEPS = 3
LOSS_RTOL = 2e-5
NORM_RTOL = 1e-4
LORA = {"lora_rank": 8, "lora_targets": ["q", "v", "o", "down"]}
ONE = {"num_microbatches": 2, "micro_batch_size": 4}
"""The reference layout: one process, global batch 8 = 2 micro-batches of 4."""

REFERENCES = {"tiny-gpt": ("tiny-gpt", {}), "tiny-llama": ("tiny-llama", {}), "tiny-llama-lora": ("tiny-llama", LORA)}
CASES = {  # name: (reference, layout); every layout is global batch 8 on 4 processes
    "tied-tp2-pp2-1f1b": ("tiny-gpt", {"tp": 2, "pp": 2, "schedule": "1f1b", "num_microbatches": 4,
                                       "micro_batch_size": 2}),
    "tied-tp2-dp2-sp-zero3": ("tiny-gpt", {"tp": 2, "dp": 2, "zero_stage": 3, "sequence_parallel": True,
                                           "num_microbatches": 2, "micro_batch_size": 2}),
    "lora-dp4-zero3": ("tiny-llama-lora", {"dp": 4, "zero_stage": 3, "num_microbatches": 2, "micro_batch_size": 1}),
    "lora-tp2-dp2-sp-zero2": ("tiny-llama-lora", {"tp": 2, "dp": 2, "zero_stage": 2, "sequence_parallel": True,
                                                  "num_microbatches": 2, "micro_batch_size": 2}),
    "offload-dp4-zero2": ("tiny-llama", {"dp": 4, "zero_stage": 2, "optimizer_offload": True,
                                         "num_microbatches": 2, "micro_batch_size": 1}),
    "offload-dp2-tp2-zero0": ("tiny-llama", {"dp": 2, "tp": 2, "zero_stage": 0, "optimizer_offload": True,
                                             "num_microbatches": 2, "micro_batch_size": 2}),
}


def _case(name: str, reference: str, layout: dict) -> dict:
    model, extra = REFERENCES[reference]
    return {"name": name, "model": model, "layout": layout, "seq_len": 32, "steps": STEPS, **extra}


def launch_cases() -> list[dict]:
    refs = [_case(f"ref-{ref}", ref, ONE) for ref in REFERENCES]
    return refs + [_case(name, ref, layout) for name, (ref, layout) in CASES.items()]


@pytest.fixture(scope="module")
def results(case_results) -> dict:
    return case_results.of(launch_cases())


@pytest.mark.torchrun
@pytest.mark.parametrize("name", list(CASES))
def test_feature_matches_single_process_reference(results, name):
    reference, got = results[f"ref-{CASES[name][0]}"], results[name]
    assert len(got) == STEPS
    series = {key: ([r[key] for r in reference], [g[key] for g in got]) for key in ("loss", "grad_norm")}
    assert series["loss"][1] == pytest.approx(series["loss"][0], rel=LOSS_RTOL)
    assert series["grad_norm"][1] == pytest.approx(series["grad_norm"][0], rel=NORM_RTOL)


@pytest.mark.torchrun
def test_lora_reference_trains_only_the_adapters(results):
    """LoRA starts at the base model (B = 0: same first loss as full training) and its gradient is
    far smaller (only the adapters' exists; at B = 0 even A's is zero, Hu et al. Sec. 4.1)."""
    full, lora = results["ref-tiny-llama"], results["ref-tiny-llama-lora"]
    assert lora[0]["loss"] == pytest.approx(full[0]["loss"], rel=1e-6)
    assert all(lo["grad_norm"] < fu["grad_norm"] / 5 for lo, fu in zip(lora, full))
