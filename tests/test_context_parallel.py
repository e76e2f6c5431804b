"""Load-balanced causal chunks of context parallelism (Llama 3, Sec. 3.3.2) and the all-gather
attention, checked in one process: the cp ranks' shares are computed one after another and the
all-gather is replaced by the concatenation it performs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from planner.launch.torchjob import context_parallel as cpm


def test_chunks_pair_early_with_late():
    # cp 4: 8 chunks; rank i holds chunks i and 7 - i
    assert [cpm.chunk_indices(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


def test_positions_of_seq_16_cp_2():
    # s = 16, cp = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert cpm.local_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cpm.local_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shares_partition_the_sequence(cp):
    seq = 24 * cp
    held = torch.cat([cpm.local_positions(seq, cp, r) for r in range(cp)])
    assert sorted(held.tolist()) == list(range(seq))


@pytest.mark.parametrize("cp", [2, 4])
def test_causal_work_is_balanced(cp):
    """Query at position p attends p + 1 keys; every rank's sum is the same:
    chunk c of length n holds sum (c·n + j + 1) over j, so chunks c and 2cp-1-c add to a constant."""
    seq = 16 * cp
    work = [int((cpm.local_positions(seq, cp, r) + 1).sum()) for r in range(cp)]
    assert len(set(work)) == 1
    assert sum(work) == seq * (seq + 1) // 2


def test_shard_sequence_takes_the_rank_tokens():
    tokens = torch.arange(32).view(2, 16)
    share = cpm.shard_sequence(tokens, 2, 1)
    assert share[0].tolist() == list(range(4, 12))
    assert share[1].tolist() == list(range(20, 28))


def test_variant_by_device_type():
    assert cpm.variant_for("cuda") == "ring"
    assert cpm.variant_for("cpu") == "all_gather"


def test_gathered_attention_equals_full_causal_attention(monkeypatch):
    """Each rank's queries over the gathered K/V with the position mask give exactly the rows of
    full causal attention at that rank's positions (GQA: 4 query heads, 2 K/V heads)."""
    torch.manual_seed(0)
    b, s, d, cp = 2, 16, 8, 2
    q, k, v = torch.randn(b, s, 4, d), torch.randn(b, s, 2, d), torch.randn(b, s, 2, d)
    full = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True, enable_gqa=True).transpose(1, 2)

    def gather_from_all(t, ctx):  # what the all-gather returns: every rank's share, in global order
        whole = k if t is held["k"] else v
        pieces = [cpm.shard_sequence(whole, cp, r) for r in range(cp)]
        chunks: list = [None] * (2 * cp)
        for r, piece in enumerate(pieces):
            first, second = cpm.chunk_indices(cp, r)
            chunks[first], chunks[second] = piece.chunk(2, dim=1)
        return torch.cat(chunks, dim=1)

    monkeypatch.setattr(cpm, "_gather_sequence", gather_from_all)
    for rank in range(cp):
        ctx = cpm.ContextGroup(mesh=None, rank=rank, degree=cp, variant="all_gather")
        ql, kl, vl = (cpm.shard_sequence(t, cp, rank) for t in (q, k, v))
        held = {"k": kl}
        out = cpm.gathered_attention(ql, kl, vl, ctx, dropout_p=0.0, enable_gqa=True)
        torch.testing.assert_close(out, cpm.shard_sequence(full, cp, rank), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seq, cp", [(16, 2), (48, 3), (64, 4)])
def test_same_placement_as_torch_ring_load_balancer(seq, cp):
    """The ring variant relies on torch's head-tail load balancer placing tokens as
    ``local_positions`` does (the data is sharded once, by us): its rank-major order split in cp."""
    balancer = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    order = balancer._HeadTailLoadBalancer(seq, cp, "cpu")._generate_indices().view(cp, -1)
    for rank in range(cp):
        assert order[rank].tolist() == cpm.local_positions(seq, cp, rank).tolist()


def test_ring_context_enters_torch_context_parallel(monkeypatch):
    """Ring variant: the step runs inside ``context_parallel(mesh, buffers=[positions 0..s-1],
    buffer_seq_dims=[1])``; the all-gather variant and cp = 1 enter nothing."""
    import contextlib

    import torch.distributed.tensor.experimental as experimental

    calls = []

    @contextlib.contextmanager
    def fake(mesh, *, buffers, buffer_seq_dims, no_restore_buffers):
        calls.append((mesh, buffers[0].tolist(), buffer_seq_dims, len(no_restore_buffers)))
        yield

    monkeypatch.setattr(experimental, "context_parallel", fake)
    ring = cpm.ContextGroup(mesh="cp-mesh", rank=0, degree=2, variant="ring")
    with cpm.ring_context(ring, 8, torch.device("cpu")):
        pass
    assert calls == [("cp-mesh", [list(range(8))], [1], 1)]
    gather = cpm.ContextGroup(mesh="cp-mesh", rank=0, degree=2, variant="all_gather")
    with cpm.ring_context(gather, 8, torch.device("cpu")), cpm.ring_context(None, 8, torch.device("cpu")):
        pass
    assert len(calls) == 1
