"""TP communication overlap (``Layout.tp_comm_overlap``): its cost terms against hand-worked values,
its place in the layout rules, the search (equal to brute force), the exports and ``launch``."""

import pytest

import planner
from costmodels.collectives_tp_overlap import (RING_EXCHANGE_SM_SHARE, RS_PIPELINE_SPLITS, decomposition_s,
                                               overlapped_steps_s,
                                               pipelined_reduce_scatter_s, ring_exchange_all_gather_s,
                                               userbuffer_bytes)
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layout import Layout, LayoutError, check_layout
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from hardware_specs.units import MIB
from planner.search.brute_force import solve_brute_force
from planner.launch.frameworks import megatron_args, torchtitan_config
from planner.plan.plan_file import PlanFileError
from planner.search.launchable import launch_problems
from planner.search.solve import solve
from planner.search.space import SearchOptions

JOB = dict(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192)


def test_overlapped_steps_expose_the_excess_and_slow_the_rest():
    # 7 steps of c = 0.1 ms beside chunks of g = 0.08 ms, σ = 0.1:
    # each exposes 0.1 − 0.08 = 0.02 ms and slows its chunk by 0.1 x 0.08 = 0.008 ms -> 7 x 0.028 = 0.196 ms.
    assert overlapped_steps_s(1e-4, 8e-5, 7, 0.1) == pytest.approx(1.96e-4)
    # a transfer shorter than its chunk only slows it: 3 x 0.1 x 0.05 ms
    assert overlapped_steps_s(5e-5, 8e-5, 3, 0.1) == pytest.approx(1.5e-5)
    assert overlapped_steps_s(0.0, 8e-5, 3, 0.1) == 0.0


def test_ring_exchange_all_gather_hides_every_step_behind_a_chunk():
    # all-gather of 0.7 ms over tp 8: 7 ring steps of 0.1 ms, chunks (m/8 rows) of 0.08 ms: as above.
    assert ring_exchange_all_gather_s(7e-4, 8e-5, 8, 0.1) == pytest.approx(1.96e-4)
    # with chunks longer than the steps, nothing is exposed; only σ of the hidden 0.7 ms remains
    assert ring_exchange_all_gather_s(7e-4, 2e-4, 8, 0.1) == pytest.approx(7e-5)
    assert ring_exchange_all_gather_s(7e-4, 2e-4, 1, 0.1) == 0.0
    # TE runs the ring exchange on copy engines with 1 SM, the pipelined reduce-scatter with 16
    assert RING_EXCHANGE_SM_SHARE == 1 / 16


def test_pipelined_reduce_scatter_exposes_its_last_chunk():
    # TE's pipeline method, 4 splits: the last chunk's reduce-scatter (0.1 ms) is exposed whole, the
    # other 3 run beside GEMM chunks of 0.08 ms: 0.1 + 3 x (0.02 + 0.008) = 0.184 ms.
    assert RS_PIPELINE_SPLITS == 4
    assert pipelined_reduce_scatter_s(1e-4, 8e-5, 4, 0.1) == pytest.approx(1.84e-4)


def test_decomposition_costs_the_lost_gemm_rate_and_never_credits_a_gain():
    assert decomposition_s(3e-5, 8, 2e-4) == pytest.approx(4e-5)  # 8 x 0.03 − 0.2 ms
    assert decomposition_s(2e-5, 8, 2e-4) == 0.0  # 0.16 < 0.2: no credit


def test_userbuffers_hold_ten_gathered_blocks():
    # Llama 3 70B, b 1, s 8192, h 8192, bf16: one block is 2 x 8192 x 8192 B = 128 MiB; TE registers
    # 10 userbuffer communicators (4 ring exchange, 2 pipeline, 4 bulk), 1280 MiB.
    block = 2 * 8192 * 8192
    assert block == 128 * MIB
    assert userbuffer_bytes(block) == 1280 * MIB


def _pair(**extra):
    base = dict(dp=1, tp=8, pp=8, zero_stage=1, num_microbatches=512, sequence_parallel=True)
    plain = planner.evaluate(layout=Layout(**base), **JOB, **extra)
    overlapped = planner.evaluate(layout=Layout(**base, tp_comm_overlap=True), **JOB, **extra)
    return plain, overlapped


def test_overlap_cuts_exposed_tp_time_and_holds_userbuffers():
    plain, overlapped = _pair()
    assert overlapped.compute_s == plain.compute_s  # GEMMs are costed whole; decomposition goes to TP
    assert overlapped.tp_comm_s < 0.6 * plain.tp_comm_s
    assert overlapped.step_time_s < plain.step_time_s
    # buffers: the 10 userbuffers replace the one gathered TP block, + 9 x 128 MiB on every stage
    for a, b in zip(plain.stages, overlapped.stages):
        assert b.buffers_bytes - a.buffers_bytes == pytest.approx(9 * 128 * MIB)
    assert overlapped.comm_bytes_per_gpu == plain.comm_bytes_per_gpu  # same traffic, hidden


def test_overlap_needs_sequence_parallelism_and_a_gpu():
    model, training = load_model("llama3-70b"), TrainingSpec(global_batch_size=512, seq_len=8192)
    with pytest.raises(LayoutError, match="needs sequence parallelism"):
        check_layout(Layout(dp=8, tp=8, num_microbatches=64, tp_comm_overlap=True), model, training, 64, 8)
    with pytest.raises(LayoutError, match="tp_comm_overlap: cpu is a CPU"):
        planner.evaluate(model="tiny-llama", hardware="cpu", gpus=2, global_batch=4, seq_len=64,
                         layout=Layout(tp=2, sequence_parallel=True, num_microbatches=4, tp_comm_overlap=True))


def test_search_offers_overlap_only_with_sp_on_gpus_and_equals_brute_force():
    model, training = load_model("llama2-7b"), TrainingSpec(global_batch_size=16, seq_len=4096)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)

    def cm():
        return CostModel(Job(model=model, training=training, cluster=cluster))

    options = SearchOptions(recompute_modes=("none",), schedules=("1f1b",), zero_stages=(0, 1))
    fast = solve(cm(), 8, 8, options, top_k=4)
    slow = solve_brute_force(cm(), 8, 8, options, top_k=4)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert [b.step_time_s for b in fast.ranked] == [b.step_time_s for b in slow.ranked]
    assert any(b.layout.tp_comm_overlap for b in fast.ranked)  # the option is live in this space
    assert all(b.layout.sequence_parallel for b in fast.ranked if b.layout.tp_comm_overlap)
    off = solve(cm(), 8, 8, SearchOptions(recompute_modes=("none",), schedules=("1f1b",), zero_stages=(0, 1),
                                          tp_comm_overlap=False), top_k=4)
    assert not any(b.layout.tp_comm_overlap for b in off.ranked)


def test_plan_on_cpu_hardware_never_picks_overlap():
    report = planner.plan(model="tiny-llama", hardware="cpu", gpus=4, global_batch=8, seq_len=64)
    assert not any(b.layout.tp_comm_overlap for b in (report.best, *report.candidates))


def test_exports_enable_it_and_launch_refuses_it():
    model, training = load_model("llama3-70b"), TrainingSpec(global_batch_size=512, seq_len=8192)
    layout = Layout(dp=1, tp=8, pp=8, num_microbatches=512, sequence_parallel=True, tp_comm_overlap=True)
    args, _ = megatron_args(model, training, layout, 8192)
    assert "--tp-comm-overlap" in args and "--sequence-parallel" in args
    # torchtitan's async TP is an inductor pass: a compiled plan gets it with compile on; an eager plan
    # is refused (turning compile on would change what was costed)
    compiled = TrainingSpec(global_batch_size=512, seq_len=8192, compiled=True)
    config, _ = torchtitan_config("llama3-70b", model, compiled, layout, 8192)
    assert config["parallelism"]["enable_async_tensor_parallel"] is True
    assert config["compile"]["enable"] is True and "model" in config["compile"]["components"]
    with pytest.raises(PlanFileError, match=r"^layout\.tp_comm_overlap: torchtitan's async TP needs torch\.compile"
                                            r".*\(the torchtitan job cannot run it as costed\)$"):
        torchtitan_config("llama3-70b", model, training, layout, 8192)
    problems = launch_problems(model, training, layout)  # autoplan's own (torch) job
    assert len(problems) == 1 and problems[0].startswith("layout.tp_comm_overlap = true")
    assert "--no-tp-comm-overlap" in problems[0]


def test_launchable_search_leaves_overlap_out():
    report = planner.plan(**{**JOB, "gpus": 8, "global_batch": 16, "seq_len": 4096, "model": "llama2-7b"},
                          launchable=True)
    assert not any(b.layout.tp_comm_overlap for b in (report.best, *report.candidates))


def _mapped(run_id: str):
    from pathlib import Path

    from planner.published import load_rows, map_row
    from planner.published.scoring import _node

    data = Path(__file__).parent.parent / "benchmarks" / "data" / "published_runs.json"
    return map_row(next(r for r in load_rows(data) if r["id"] == run_id), _node)


def test_published_rows_with_overlap_map_to_it():
    assert _mapped("torchtitan-asynctp-8b-64gpu-bf16-async").layout.tp_comm_overlap
    assert not _mapped("torchtitan-asynctp-8b-64gpu-bf16-vanilla").layout.tp_comm_overlap
    assert not _mapped("megascale-175b-ablation-3").layout.tp_comm_overlap
    assert _mapped("megascale-175b-ablation-4").layout.tp_comm_overlap


def test_megascale_tp_overlap_ablation_step():
    # MegaScale (Jiang et al. NSDI'24) Table 3: "+ TP overlap" takes 175B on 256 GPUs from 53.3% to
    # 55.5% MFU, +4.1%; steps 3 and 4 differ in nothing else. Predicted within 2 points of it.
    before, after = _mapped("megascale-175b-ablation-3"), _mapped("megascale-175b-ablation-4")
    t_before = planner.evaluate(**before.evaluate_kwargs()).step_time_s
    t_after = planner.evaluate(**after.evaluate_kwargs()).step_time_s
    assert t_before / t_after - 1 == pytest.approx(55.5 / 53.3 - 1, abs=0.02)


def test_cli_evaluates_it_and_launch_refuses_it_in_one_line(tmp_path):
    """The torch job refuses TP overlap in one line; a Megatron plan's job enables it."""
    from click.testing import CliRunner

    from planner.cli import main

    plan, megatron_plan = tmp_path / "plan.json", tmp_path / "megatron-plan.json"
    args = ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "4096", "--dp", "1", "--tp", "8", "--pp", "1"]
    on = CliRunner().invoke(main, [*args, "--tp-comm-overlap", "--format", "json"])
    off = CliRunner().invoke(main, [*args, "--format", "json"])
    assert on.exit_code == 0 and off.exit_code == 0
    import json

    on_json, off_json = json.loads(on.stdout), json.loads(off.stdout)
    assert on_json["layout"]["tp_comm_overlap"] is True and off_json["layout"]["tp_comm_overlap"] is False
    assert on_json["predicted"]["time_s"]["tp_comm"] < off_json["predicted"]["time_s"]["tp_comm"]
    on = CliRunner().invoke(main, [*args, "--tp-comm-overlap", "--runtime", "torch", "--out", str(plan)])
    assert on.exit_code == 0, on.output
    refused = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job")])
    assert refused.exit_code == 2
    assert refused.stderr.count("\n") == 1 and "layout.tp_comm_overlap = true" in refused.stderr
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").iterdir())
    on = CliRunner().invoke(main, [*args, "--tp-comm-overlap", "--runtime", "megatron", "--out", str(megatron_plan)])
    assert on.exit_code == 0, on.output
    launched = CliRunner().invoke(main, ["launch", str(megatron_plan), "--out", str(tmp_path / "mjob")])
    assert launched.exit_code == 0, launched.output
    assert "--tp-comm-overlap" in (tmp_path / "mjob" / "megatron_args.sh").read_text()
