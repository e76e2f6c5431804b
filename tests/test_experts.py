"""Router, capacity and load-balancing loss of the generated job's MoE layers (``experts.py``),
worked by hand on small routings."""

from __future__ import annotations

import math

import pytest
import torch

from planner.launch.torchjob import experts


def test_capacity_is_gshard_ceiling():
    # C = ceil(cf · k · S / E): 1.0 · 2 · 32 / 4 = 16; 1.25 · 2 · 10 / 4 = 6.25 -> 7
    assert experts.expert_capacity(32, 4, 2, 1.0) == 16
    assert experts.expert_capacity(10, 4, 2, 1.25) == 7


def test_first_choices_fill_capacity_before_second_choices():
    """S = 3 tokens, k = 2, E = 2, C = 2. Choices (first, second): t0 (0, 1), t1 (0, 1), t2 (0, 1).
    Expert 0 takes first choices t0, t1 and drops t2's; expert 1 takes the second choices of
    t0, t1 and drops t2's (slots in order: all first choices, then all second, in token order)."""
    expert = torch.tensor([[[0, 1], [0, 1], [0, 1]]])
    keep = experts.capacity_mask(expert, 2, 2)
    assert keep.tolist() == [[[True, True], [True, True], [False, False]]]


def test_second_choice_yields_to_a_later_first_choice():
    """E = 2, C = 1. t0 chooses (1, 0), t1 chooses (0, 1). Expert 0's one slot goes to t1's first
    choice, not to t0's second choice, though t0 comes first (GShard Algorithm 1)."""
    expert = torch.tensor([[[1, 0], [0, 1]]])
    keep = experts.capacity_mask(expert, 2, 1)
    assert keep.tolist() == [[[True, False], [True, False]]]


def test_groups_are_independent():
    expert = torch.tensor([[[0], [0]], [[0], [0]]])  # two sequences, each sends both tokens to expert 0
    keep = experts.capacity_mask(expert, 2, 1)
    assert keep.tolist() == [[[True], [False]], [[True], [False]]]


def test_balanced_routing_has_unit_aux_loss():
    """Uniform probabilities and an even split: f_i = P_i = 1/E, E · Σ f_i P_i = E · E / E² = 1."""
    probs = torch.full((1, 4, 4), 0.25)
    expert = torch.tensor([[[0], [1], [2], [3]]])
    assert float(experts.load_balancing_loss(probs, expert)) == pytest.approx(1.0)


def test_collapsed_routing_aux_loss_by_hand():
    """E = 2, k = 1, every token to expert 0 with probability 0.9: f = (1, 0), P = (0.9, 0.1),
    loss = 2 · (1 · 0.9 + 0 · 0.1) = 1.8."""
    probs = torch.tensor([[[0.9, 0.1]] * 3])
    expert = torch.zeros(1, 3, 1, dtype=torch.long)
    assert float(experts.load_balancing_loss(probs, expert)) == pytest.approx(1.8)


def test_route_weights_are_softmax_of_chosen_logits():
    """Logits (2, 0, 1), k = 2: experts 0 and 2, weights softmax(2, 1) = (e/(e+1), 1/(e+1))."""
    logits = torch.tensor([[[2.0, 0.0, 1.0]]])
    r = experts.route(logits, 2, 1.0)
    assert r.expert.tolist() == [[[0, 2]]]
    e = math.e
    assert r.weight[0, 0].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)])
    # capacity ceil(1.0 · 2 · 1 / 3) = 1: both assignments kept (different experts)
    assert r.keep.all()


def test_aux_loss_gradient_reaches_the_router():
    """The aux term adds scale · d(aux)/d(logits) to the router's gradient and leaves the forward
    value unchanged."""
    torch.manual_seed(0)
    logits = torch.randn(1, 8, 4, requires_grad=True)
    out = torch.zeros(1, 8, 2, requires_grad=True)
    r = experts.route(logits, 2, 1.0)
    y = experts.add_aux_loss(out, r.aux_loss, 0.5)
    assert torch.equal(y, out)
    y.sum().backward()
    expected = torch.autograd.grad(0.5 * experts.route(logits, 2, 1.0).aux_loss, logits)[0]
    torch.testing.assert_close(logits.grad, expected)


def test_moe_layer_drops_over_capacity_tokens():
    """A router that sends every token to expert 0 first and expert 1 second: with C = ceil(1 · 2 ·
    8 / 4) = 4 slots per expert, the first 4 tokens fill expert 0's slots and (first choices before
    second choices) expert 1's too, so the last 4 tokens are dropped by both and get no output."""
    from costmodels.presets import load_model
    from planner.launch.torchjob.model import MoE

    torch.manual_seed(0)
    moe = MoE(load_model("tiny-mixtral"))
    moe.capacity_factor = 1.0  # the preset routes dropless (capacity factor 0); this test needs a cap
    with torch.no_grad():
        for param in moe.parameters():  # GroupedExperts allocates with torch.empty; the job's init.py fills it
            torch.nn.init.normal_(param, std=0.02)
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 10.0  # expert 0 first for any token with x[..., 0] > 0
        moe.router.weight[1, 0] = 5.0   # expert 1 second
    x = torch.randn(1, 8, 256).abs()
    out = moe(x)
    tokens = x[0]
    first = moe.experts.expert(0, tokens)
    second = moe.experts.expert(1, tokens)
    logits = moe.router(tokens)[:, :2]
    w = logits.softmax(dim=-1)
    kept = w[:4, :1] * first[:4] + w[:4, 1:] * second[:4]
    dropped = torch.zeros_like(kept)
    assert kept.abs().sum() > 0  # the experts are initialised, so a kept token has an output
    torch.testing.assert_close(out[0], torch.cat([kept, dropped]), rtol=1e-5, atol=1e-6)


def test_ep_and_tp_pieces_tile_the_expert_table():
    """E = 4 experts of f = 6 over ep 2 x tp 3: ep rank 1, tp rank 2 holds experts 2..3 and FFN
    columns 4..5 of w1 [E, f, h] (dim 1) and of w2 [E, h, f] (dim 2); the pieces of all six ranks
    put back together are the whole table."""
    from torch import nn

    full = {"w1": torch.randn(4, 6, 5), "w2": torch.randn(4, 5, 6)}

    def piece(ep_rank, tp_rank):
        module = nn.Module()
        module.w1, module.w2 = (nn.Parameter(t.clone()) for t in (full["w1"], full["w2"]))
        module.expert_rows = experts._keep_slice(module, {"w1": 0, "w2": 0}, ep_rank, 2)
        module.expert_cols = experts._keep_slice(module, {"w1": 1, "w2": 2}, tp_rank, 3)
        return module

    m = piece(1, 2)
    assert m.expert_rows == (2, 2, 4) and m.expert_cols == (4, 2, 6)
    assert experts.global_shape(m, "w1", tuple(m.w1.shape)) == (4, 6, 5)
    assert experts.global_shape(m, "w2", tuple(m.w2.shape)) == (4, 5, 6)
    torch.testing.assert_close(m.w1.data, full["w1"][2:4, 4:6])
    torch.testing.assert_close(experts.owned_piece(m, "w2", full["w2"]), full["w2"][2:4, :, 4:6])
    rows = [torch.cat([piece(e, t).w1.data for t in range(3)], dim=1) for e in range(2)]
    torch.testing.assert_close(torch.cat(rows), full["w1"])
