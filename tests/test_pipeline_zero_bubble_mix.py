"""What zero-bubble schedules hold at the peak, by chunk: rank 0's first chunk (no receive buffer)
and the last rank's head (kept to the weight pass), counted on torch's op orders
(``planner.validate.schedule.step_orders``, checked equal to torch 2.13 in test_schedule_sim.py),
and the bytes they give for the ``plan --launchable`` candidate of test_validate.py."""

from __future__ import annotations

import pytest

import planner
from costmodels.layout import Layout
from costmodels.pipeline import first_chunk_microbatches, head_microbatches, in_flight_microbatches
from planner.validate.schedule import step_orders


def _peak_mix(steps, chunk: int) -> tuple[int, int]:
    """(most chunk-micro-batches alive from F to W, most of them on ``chunk`` at such an instant)."""
    alive: set[tuple[int, int]] = set()
    best = (0, 0)
    for step in steps:
        for a in step:
            if a.kind == "F":
                alive.add((a.chunk, a.mb))
            elif a.kind in ("W", "BW"):
                alive.discard((a.chunk, a.mb))
            best = max(best, (len(alive), sum(1 for c, _ in alive if c == chunk)))
    return best


GRID = [(p, v, m) for p in (2, 4) for v in (2, 3) for m in (p, 2 * p, 4 * p)]


@pytest.mark.parametrize("p,v,m", GRID)
def test_rank0_first_chunk_share_at_the_peak_is_the_orders(p, v, m):
    held, first = _peak_mix(step_orders("interleaved-zb", p, m, v)[0], chunk=0)
    assert held == in_flight_microbatches("interleaved-zb", p, 0, m, v)
    assert first == first_chunk_microbatches("interleaved-zb", p, 0, m, held)


@pytest.mark.parametrize("p,v,m", GRID + [(p, 1, m) for p in (2, 4) for m in (p, 2 * p)])
def test_last_rank_holds_its_head_for_min_p_m_micro_batches(p, v, m):
    schedule = "zb-h1" if v == 1 else "interleaved-zb"
    _, last = _peak_mix(step_orders(schedule, p, m, v)[p - 1], chunk=v - 1)
    assert last == head_microbatches(schedule, p, m) == min(p, m)


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("p,m", [(p, k * p) for p in (2, 4) for k in (2, 3, 4)])
def test_v_schedules_hold_one_head_at_the_peak(schedule, p, m):
    # V placement: rank 0's second local chunk is the model's last (costmodels.stage_split.rank_chunks),
    # and at rank 0's peak it holds one micro-batch's head, as head_microbatches says (1: neither
    # schedule is in ZERO_BUBBLE, whose last rank defers p − 1 weight passes of its head)
    held, head = _peak_mix(step_orders(schedule, p, m, 2)[0], chunk=1)
    assert held == in_flight_microbatches(schedule, p, 0, m, 2)
    assert head == head_microbatches(schedule, p, m) == 1


def test_tiny_llama_interleaved_zb_saved_bytes_hand_worked():
    """tiny-llama (h 256, f 768, 8 heads of 32, 4 kv heads, V 1024, 4 layers), fp32, s 32, b 1,
    pp 2 · v 2 (one layer a chunk), 4 micro-batches, torch runtime. One layer saves, tensor by
    tensor (elements × 4 bytes): two RMSNorms 2·2·s·h = 32768 → 131072; q/k/v input and MLP input
    2·s·h → 65536; Q, K, V s·(256 + 2·128) → 65536; rotary cos/sin 2·s·32 → 8192; fused core's
    log-sum-exp 8·s → 1024; out-projection input s·h → 32768; gated MLP 4·s·f → 393216;
    total 697,344. A receiving chunk's first norm input is its receive buffer (a buffer): −32768.

    Rank 0 at its peak: 4 micro-batches of its first chunk (``first_chunk_microbatches``), none
    receiving: 4 · 697,344 = 2,789,376 (before: the average over chunks, 2 · (2 · 697,344 − 32,768)
    = 2,723,840). Rank 1: 2 · (2 · 697,344 − 2 · 32,768) = 2,658,304, plus the head's norm and
    input (2·4·s·h + 4·s·h = 98,304) for min(p, m) = 2 micro-batches and one micro-batch's fp32 logits
    4·s·V = 131,072: 2,985,984 (before: one head, 2,887,680). The probe measured 2,791,424 and
    2,988,292 on the real two-process job (autoplan validate, torch 2.13, CPU; the differences
    are the norms' s-sized fp32 rstd and the int64 token ids and targets)."""
    layout = Layout(dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule="interleaved-zb",
                    virtual_stages=2, sequence_parallel=False)
    cost = planner.evaluate(model="tiny-llama", hardware="cpu", gpus=2, gpus_per_node=2, global_batch=4, seq_len=32,
                            precision="fp32", runtime="torch", layout=layout)
    loss_backward = 2 * 4 * 32 * 1024  # the loss's backward working set, beside the saved tensors
    assert cost.stages[0].schedule_activations_bytes == 2_789_376
    assert cost.stages[1].schedule_activations_bytes - loss_backward == 2_985_984
