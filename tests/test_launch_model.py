"""The runtime model matches the cost model's parameter counts and builds a 70B model on meta."""

from __future__ import annotations

import pytest
import torch

from costmodels.params import total_params
from costmodels.presets import load_model
from planner.launch.torchjob.init import init_weights
from planner.launch.torchjob.model import build_model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt", "tiny-mixtral", "llama3-70b", "gpt3-1.3b"])
def test_parameter_count_equals_cost_model(name):
    model = build_model(load_model(name), device="meta")
    assert sum(p.numel() for p in model.parameters()) == total_params(load_model(name))
    assert all(p.is_meta for p in model.parameters())


def test_forward_and_names():
    spec = load_model("tiny-mixtral")
    model = build_model(spec, device="cpu")
    logits = model(torch.randint(0, spec.vocab_size, (2, 8)))
    assert logits.shape == (2, 8, spec.vocab_size)
    names = {n for n, _ in model.named_parameters()}
    assert {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.moe.router.weight",
            "layers.0.moe.experts.w1", "norm.weight", "output.weight"} <= names


def test_init_is_independent_of_recompute_wrappers():
    from planner.launch.torchjob.parallel import apply_recompute
    from costmodels.layout import Layout

    spec = load_model("tiny-llama")
    plain, wrapped = build_model(spec, device="cpu"), build_model(spec, device="cpu")
    apply_recompute(wrapped, Layout(recompute="full"))
    init_weights(wrapped, seed=0)
    for (name, a), (_, b) in zip(plain.named_parameters(), wrapped.named_parameters()):
        assert torch.equal(a, b), name
