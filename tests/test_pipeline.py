"""Pipeline schedules: in-flight micro-batches and bubble against the published formulas."""

import pytest

from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layout import Layout
from costmodels.pipeline import in_flight_microbatches, uniform_bubble_fraction
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster


def test_in_flight_counts():
    assert in_flight_microbatches("gpipe", 4, 0, 16, 1) == 16
    assert [in_flight_microbatches("1f1b", 4, i, 16, 1) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches("1f1b", 4, 0, 2, 1) == 2
    # Interleaved, rank 0: 2(p-1) + (v-1)p + 1 chunk-micro-batches = pv + p - 1, i.e. L/p layers
    # x (1 + (p-1)/(pv)) micro-batches' worth (Narayanan et al. SC'21).
    p, v = 4, 2
    chunks = in_flight_microbatches("interleaved", p, 0, 64, v)
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


def _cost(layout, layers=32):
    model = load_model("llama2-7b")
    cm = CostModel(Job(model=model, training=TrainingSpec(global_batch_size=64, seq_len=2048), cluster=make_cluster(load_node("a100-sxm-80gb"), 8)))
    return cm.estimate(layout)


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)])
@pytest.mark.parametrize("m", [8, 16, 64])
def test_bubble_is_p_minus_1_over_vm_of_ideal_time(schedule, v, m):
    # Equal stages need no embedding/head imbalance: compare the bubble with m·t over stages.
    layout = Layout(pp=8, micro_batch_size=64 // m, num_microbatches=m,
                    schedule=schedule, virtual_stages=v)
    b = _cost(layout)
    ideal = b.step_time_s - b.bubble_s - b.dp_comm_s - b.optimizer_s
    # With unequal first/last stages the bubble is (Σ t_i − max t)/v, which is at most (p−1)/(vm)·ideal.
    assert b.bubble_s <= uniform_bubble_fraction(8, m, v) * ideal * (1 + 1e-9)
    assert b.bubble_s >= 0.8 * uniform_bubble_fraction(8, m, v) * ideal


def test_gpipe_holds_more_activations_than_1f1b():
    g = _cost(Layout(pp=8, num_microbatches=64, schedule="gpipe"))
    f = _cost(Layout(pp=8, num_microbatches=64, schedule="1f1b"))
    assert g.peak_stage.activations_bytes > 4 * f.peak_stage.activations_bytes
    assert g.step_time_s == pytest.approx(f.step_time_s)


def test_the_last_stage_holds_one_micro_batch_of_logits_unless_gpipe():
    """The last chunk runs each micro-batch's backward right after its forward under 1F1B and
    interleaving (so its logits are held once), GPipe after all m forwards (m times)."""
    from costmodels.pipeline import head_microbatches

    assert head_microbatches("1f1b", 4, 16) == 1
    assert head_microbatches("interleaved", 4, 16) == 1
    assert head_microbatches("gpipe", 4, 16) == 16
    assert head_microbatches("gpipe", 1, 16) == 1  # no pipeline: micro-batches run one after another


def test_interleaving_does_not_multiply_the_last_stage_logits():
    """Llama 3 8B, pp 2, 8 micro-batches of 4096 tokens: 1024 more vocabulary entries add
    4 bytes x 4096 x 1024 = 16,777,216 bytes of kept fp32 logits to the last rank, once, with v = 1
    and with v = 2 (the interleaved last rank has 3 chunk-micro-batches in flight; before this fix the
    logits were counted for each), plus the loss's transient 16-bit logits and fp32 copy, (2 + 4)
    bytes each, once (``activations.loss_working_bytes``)."""
    from dataclasses import replace

    import planner
    from costmodels.presets import PRESETS

    def last_rank(vocab, v):
        model = replace(PRESETS["llama3-8b"], vocab_size=vocab)
        b = planner.evaluate(model=model, hardware="h100-sxm-80gb", gpus=2, global_batch=8, seq_len=4096,
                             layout=planner.Layout(pp=2, num_microbatches=8, virtual_stages=v,
                                                   schedule="interleaved" if v > 1 else "1f1b"))
        return b.stages[-1].activations_bytes

    for v in (1, 2):
        assert last_rank(128256 + 1024, v) - last_rank(128256, v) == pytest.approx((4 + 2 + 4) * 4096 * 1024)


def test_the_generated_job_keeps_no_micro_batch_outputs_on_the_last_stage():
    # The model holds one micro-batch of logits on the last stage (above), so the job must not let
    # torch.distributed.pipelining keep every micro-batch's output until the next step: its
    # schedules save each last-stage output unless step(..., return_outputs=False).
    from types import SimpleNamespace

    import torch

    from planner.launch.torchjob.pipelining import pipeline_step

    calls = []

    class Schedule:
        def step(self, *args, target=None, losses=None, return_outputs=True):
            calls.append((len(args), return_outputs))
            if target is not None:
                losses += [torch.tensor(2.0), torch.tensor(4.0)]

    for first, last in ((True, False), (False, False), (False, True), (True, True)):
        job = SimpleNamespace(schedule=Schedule(), has_first=first, has_last=last)
        loss = pipeline_step(job, torch.zeros(2, 3), torch.zeros(2, 3))
        assert (loss is None) == (not last) and (loss is None or loss.item() == 3.0)
    assert calls == [(1, False), (0, False), (0, False), (1, False)]
