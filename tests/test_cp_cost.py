"""The all-gather context-parallel term (Llama 3, Dubey et al. 2024, Sec. 3.3.2) beside the ring,
worked by hand on llama3-8b, seq 8192, cp 2 (one micro-batch of one sequence, bf16, tp 1).

Per layer: s/cp = 4096 local tokens, K/V width kv = 8 heads x 128 = 1024, so one rank's K and V
block is 2 tensors x 2 B x 4096 x 1024 = 16 MiB.
  ring:       forward cp - 1 = 1 send of 16 MiB, backward twice that (K/V and their gradients):
              48 MiB per layer.
  all-gather: the gathered buffer is cp x 16 = 32 MiB; each rank sends (cp-1)/cp of it = 16 MiB
              forward (all-gather) and 16 MiB backward (reduce-scatter): 32 MiB per layer.
32 layers: ring 32 x 48 MiB = 1.5 GiB, all-gather 0.5 + 0.5 GiB.
Memory: the all-gather keeps the other rank's 4096 K/V tokens (16 MiB) and the 4096 x 8192 causal
mask (1 B each, 32 MiB) per layer beyond what the ring keeps: 48 MiB x 32 layers = 1.5 GiB.
"""

from __future__ import annotations

import pytest

import planner
from costmodels.layout import Layout
from costmodels.training import TrainingSpec
from autoplan_base.errors import SpecError

MIB, GIB = 2**20, 2**30
LAYERS = 32
REQUEST = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=2, global_batch=1, seq_len=8192)
LAYOUT = Layout(cp=2)


def _cost(variant: str | None):
    options = {} if variant is None else {"context_attention": variant}
    return planner.evaluate(layout=LAYOUT, **REQUEST, **options)


def test_ring_traffic_by_hand():
    comm = _cost("ring").comm_bytes_per_gpu
    assert comm["cp_send_recv"] == pytest.approx(LAYERS * 48 * MIB)
    assert "cp_all_gather" not in comm


def test_all_gather_traffic_by_hand():
    comm = _cost("all_gather").comm_bytes_per_gpu
    assert comm["cp_all_gather"] == pytest.approx(LAYERS * 16 * MIB)
    assert comm["cp_reduce_scatter"] == pytest.approx(LAYERS * 16 * MIB)
    assert "cp_send_recv" not in comm


def test_all_gather_keeps_the_gathered_kv_and_mask():
    ring, gather = _cost("ring"), _cost("all_gather")
    extra = gather.peak_stage.activations_bytes - ring.peak_stage.activations_bytes
    assert extra == pytest.approx(LAYERS * (16 + 32) * MIB)


def test_all_gather_time_is_exposed_collectives():
    """Forward all-gather plus backward reduce-scatter of the 32 MiB buffer over the 2 cp ranks,
    neither hidden: the cp term is 32 layers x (t_ag + t_rs), priced by the same collective model."""
    from costmodels.collectives import collective_time_s
    from planner.api import resolve_job

    job = resolve_job(**REQUEST, context_attention="all_gather")
    ag = collective_time_s("all_gather", 32 * MIB, 2, 1, job.cluster)
    rs = collective_time_s("reduce_scatter", 32 * MIB, 2, 1, job.cluster)
    assert _cost("all_gather").cp_comm_s == pytest.approx(LAYERS * (ag + rs), rel=1e-9)


def test_default_is_ring_unless_the_launched_job_runs_on_cpu():
    assert _cost(None).cp_comm_s == _cost("ring").cp_comm_s
    torch_gpu = planner.evaluate(layout=LAYOUT, runtime="torch", **REQUEST)
    assert torch_gpu.cp_comm_s == planner.evaluate(layout=LAYOUT, runtime="torch", context_attention="ring",
                                                   **REQUEST).cp_comm_s
    cpu = dict(model="tiny-llama", hardware="cpu", gpus=2, global_batch=2, seq_len=64, precision="fp32")
    torch_cpu = planner.evaluate(layout=Layout(cp=2, num_microbatches=2), runtime="torch", **cpu)
    assert "cp_all_gather" in torch_cpu.comm_bytes_per_gpu


def test_bad_variant_is_a_spec_error():
    with pytest.raises(SpecError, match="context_attention"):
        TrainingSpec(global_batch_size=1, seq_len=8, context_attention="ulysses")


def test_plan_file_and_explain_say_which(tmp_path):
    """``evaluate --cp-attention all_gather --out`` records the variant in the plan's inputs and
    ``explain`` names it; a ring plan's file leaves the default out (ring plans read as before)."""
    from click.testing import CliRunner

    from planner.cli import main

    args = ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "2",
            "--global-batch", "1", "--seq-len", "8192", "--dp", "1", "--tp", "1", "--pp", "1", "--cp", "2"]
    for variant, words in (("all_gather", "all-gather attention (Llama 3)"), ("ring", "ring attention")):
        path = tmp_path / f"{variant}.json"
        result = CliRunner().invoke(main, [*args, "--cp-attention", variant, "--out", str(path)])
        assert result.exit_code == 0, result.output
        training = __import__("json").loads(path.read_text())["inputs"]["training"]
        assert training.get("context_attention", "ring") == variant
        assert ("context_attention" in training) == (variant != "ring")
        explained = CliRunner().invoke(main, ["explain", str(path)])
        assert explained.exit_code == 0, explained.output
        assert f"context parallelism costed as {words}" in explained.output
