"""The generated job builds multi-head latent attention, shared experts and sliding-window
attention: parameter counts equal the cost model's, a local layer ignores keys beyond its window,
and a tiny MLA + shared-expert MoE model (and a Gemma-style windowed one) train under torchrun
with data parallelism exactly like a single process (one 2-process launch for all cases, shared
with the other loss-parity files: ``case_results``, tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from costmodels.params import main_model_params
from costmodels.presets import load_model
from planner.search.launchable import launch_problems
from costmodels.layout import Layout
from costmodels.training import TrainingSpec
from planner.launch.torchjob.model import attend, build_model

STEPS, SEQ_LEN = 3, 32  # 32 > tiny-gemma's window of 16, so the window masks something


@pytest.mark.parametrize("name", ["tiny-deepseek", "tiny-gemma", "deepseek-v3", "qwen1.5-moe-a2.7b", "gemma3-27b",
                                  "gpt-oss-120b"])
def test_parameter_count_equals_cost_model(name):
    # gpt-oss's expert biases are not built (the job's experts have none): it must differ by them.
    spec = load_model(name)
    built = sum(p.numel() for p in build_model(spec, device="meta").parameters())
    missing = 0
    if name == "gpt-oss-120b":
        moe = spec.moe
        missing = spec.num_layers * moe.num_experts * (2 * moe.expert_ffn_hidden_size + spec.hidden_size)
    assert built + missing == main_model_params(spec)  # the job builds no MTP module


def test_sliding_window_hides_keys_beyond_the_window():
    # Window 3: the output at position 5 depends on keys 3, 4, 5 only; changing key/value 2 leaves it.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 4) for _ in range(3))
    out = attend(q, k, v, window=3, dropout_p=0.0)
    k2, v2 = k.clone(), v.clone()
    k2[:, 2], v2[:, 2] = 5.0, -5.0
    changed = attend(q, k2, v2, window=3, dropout_p=0.0)
    assert torch.equal(out[:, 5:], changed[:, 5:])
    assert not torch.equal(out[:, 2:5], changed[:, 2:5])
    assert torch.equal(attend(q, k, v, window=8, dropout_p=0.0), attend(q, k, v, window=0, dropout_p=0.0))


def test_launch_refuses_what_the_job_cannot_split():
    training = TrainingSpec(global_batch_size=8, seq_len=32)
    problems = launch_problems(load_model("tiny-gemma"), training, Layout(tp=2, num_microbatches=8))
    assert any("q/k norms and sandwich norms are not tensor-parallel" in p for p in problems)
    assert any("multi-token prediction" in p for p in launch_problems(load_model("deepseek-v3"), training, Layout()))


REFERENCES = {"tiny-deepseek": {"num_microbatches": 2, "micro_batch_size": 4},
              "tiny-gemma": {"num_microbatches": 2, "micro_batch_size": 4}}
LAYOUTS = {
    "deepseek-dp2-zero1-selective": ("tiny-deepseek", {"dp": 2, "zero_stage": 1, "recompute": "selective",
                                                      "num_microbatches": 2, "micro_batch_size": 2}),
    "deepseek-dp2-zero3-full": ("tiny-deepseek", {"dp": 2, "zero_stage": 3, "recompute": "full",
                                                 "num_microbatches": 2, "micro_batch_size": 2}),
    "deepseek-pp2-1f1b": ("tiny-deepseek", {"pp": 2, "schedule": "1f1b", "num_microbatches": 4,
                                           "micro_batch_size": 2}),
    "gemma-dp2-zero2": ("tiny-gemma", {"dp": 2, "zero_stage": 2, "num_microbatches": 2, "micro_batch_size": 2}),
}


def launch_cases() -> list[dict]:
    cases = [{"name": f"ref-{m}", "model": m, "layout": lay, "seq_len": SEQ_LEN, "steps": STEPS}
             for m, lay in REFERENCES.items()]
    return cases + [{"name": n, "model": m, "layout": lay, "seq_len": SEQ_LEN, "steps": STEPS}
                    for n, (m, lay) in LAYOUTS.items()]


@pytest.fixture(scope="module")
def results(case_results) -> dict:
    return case_results.of(launch_cases())


@pytest.mark.torchrun
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process_reference(results, name):
    reference, got = results[f"ref-{LAYOUTS[name][0]}"], results[name]
    assert len(got) == STEPS
    for step, (ref, run) in enumerate(zip(reference, got)):
        assert run["loss"] == pytest.approx(ref["loss"], rel=2e-5), f"{name} step {step + 1} loss"
        assert run["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), f"{name} step {step + 1} norm"


@pytest.mark.torchrun
def test_references_train(results):
    for model in REFERENCES:
        assert len({round(s["loss"], 6) for s in results[f"ref-{model}"]}) == STEPS
