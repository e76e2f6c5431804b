"""The published-runs measuring stick: row mapping, FLOP conventions, statistics, scoring."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from costmodels.model_spec import ModelSpec
from planner.published import Unexpressible, cross_validate_by_family, load_rows, map_row, score
from costmodels.flops import reported_flops_per_token as flops_per_token
from planner.published.conventions import measured_tokens_per_s_per_gpu
from planner.published.scoring import _node
from planner.published.stats import kendall_tau, median, percentile

DATA = Path(__file__).parent.parent / "benchmarks" / "data" / "published_runs.json"


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {row["id"]: row for row in load_rows(DATA)}


def test_sc21_table1_gpt_1_7b_row(rows):
    run = map_row(rows["megatron-sc21-t1-1.7B"], _node)
    m, L = run.model, run.layout
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.vocab_size) == \
        (24, 2304, 24, 9216, 51200)
    assert not m.gated_mlp and m.tied_embeddings and m.num_kv_heads == 24
    assert (L.dp, L.tp, L.pp, L.micro_batch_size, L.num_microbatches) == (32, 1, 1, 16, 1)
    assert (L.recompute, L.zero_stage, run.precision, run.hardware_name) == ("full", 0, "fp16", "a100-sxm-80gb")
    # SC'21 eq. 3 per token with recomputation: 96·l·h²·(1 + s/6h + V/16lh); 137 TFLOP/s per GPU.
    l, h, s, V = 24, 2304, 2048, 51200
    per_token = 96 * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(137e12 / per_token, rel=1e-12)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(9288, abs=1)


def test_bloom_oom_cell_row(rows):
    run = map_row(rows["bloom-prequel-056"], _node)
    assert run.status == "oom" and run.measured_tokens_per_s_per_gpu is None
    L = run.layout
    assert (L.dp, L.tp, L.pp, L.micro_batch_size, L.num_microbatches, L.zero_stage) == (32, 2, 6, 2, 32, 1)
    assert L.recompute == "full"
    assert any("vocab" in note for note in run.assumptions)  # the sweep gives no vocabulary: the fill says so


def test_torchtitan_fsdp_row(rows):
    run = map_row(rows["torchtitan-t1-8b-8gpu-fsdp"], _node)
    m, L = run.model, run.layout
    assert m.gated_mlp and m.num_kv_heads == 8 and not m.tied_embeddings and m.ffn_hidden_size == 14336
    # "selective (op-level SAC)" is torchtitan's op-level checkpointing, not Megatron's selective
    assert (L.dp, L.zero_stage, L.micro_batch_size, L.num_microbatches, L.recompute) == (8, 3, 2, 1, "op-sac")
    assert run.runtime == "torchtitan" and run.precision == "bf16"
    # the source's 96 GB HBM2e H100 at 500 W (torchtitan docs/performance.md), its own spec
    assert run.hardware_name == "h100-hbm2e-96gb-500w" and run.node.hardware.memory_bytes == 96 * 2**30
    assert run.measured_tokens_per_s_per_gpu == 5762


@pytest.mark.parametrize("row_id, runtime", [
    ("bloom-prequel-056", "deepspeed"),  # "Megatron-DeepSpeed (BigScience fork) + DeepSpeed ZeRO-1"
    ("mtnlg-530b-2240gpu", "deepspeed"),  # "DeepSpeed + Megatron-LM (3D parallelism)"
    ("megatron-sc21-t1-1.7B", "megatron"),
    ("torchtitan-t1-8b-8gpu-fsdp", "torchtitan"),
])
def test_rows_run_the_convention_of_their_framework(rows, row_id, runtime):
    """Megatron layers under DeepSpeed's pipeline engine are costed with its convention (bf16
    gradients kept beside the fp32 ones), Megatron-LM with Megatron's, torchtitan with its own
    (FSDP2's, with the loss on vocabulary-sharded logits)."""
    assert map_row(rows[row_id], _node).runtime == runtime
    zero3 = [r for r in rows.values() if r["framework"] == "DeepSpeed ZeRO-3 (no model parallelism)"]
    assert zero3 and all(map_row(r, _node).runtime == "megatron" for r in zero3)  # no pipeline engine


@pytest.mark.parametrize("row_id, reason", [
    ("nemo-mb-25-09-nemo-container-dgx-h100-deepseekv3-1024gpu-na-tp2pp8cp1vp4ep64-gbs8192-mbs1",
     "precision not stated"),
    ("deepseek-v3-pretrain", "DualPipe schedule"),
    # the 25.11 tables state GA 2 and GA 32 where GBS / (dp x MBS) is 512 / (16 x 4) = 8 and
    # 8192 / (64 x 2) = 64: one stated figure is wrong and the row does not say which
    ("nemo-mb-25-11-nemo-container-dgx-h100-gpt-oss-120b-64gpu-bf16-tp1pp4cp1vp1ep8-gbs512-mbs4", "layout inconsistent"),
    ("nemo-mb-25-11-nemo-container-dgx-gb300-qwen3-235b-a22b-256gpu-bf16-tp1pp4cp1vp12ep16-gbs8192-mbs2",
     "layout inconsistent"),
    # 26.02.01's GB300 Llama 3 70B NVFP4 / MXFP8 rows against r0.3.0's presets (pp 4, vp 5, MBS 1)
    ("nemo-mb-26-02-01-nemo-container-dgx-gb300-llama3-70b-64gpu-nvfp4-tp1pp1cp1vpnoneepnone-gbs256-mbs2",
     "layout contradicts its recipe"),
    ("nemo-mb-26-02-01-nemo-container-dgx-gb300-llama3-70b-64gpu-mxfp8-tp1pp4cp1vpnoneepnone-gbs256-mbs2",
     "layout contradicts its recipe"),
])
def test_not_yet_expressible_rows(rows, row_id, reason):
    with pytest.raises(Unexpressible) as err:
        map_row(rows[row_id], _node)
    assert err.value.reason == reason


@pytest.mark.parametrize("row_id", [
    "nemo-mb-26-04-01-nemo-container-dgx-b200-deepseekv3-256gpu-mxfp8-tp1pp8cp1vp2ep32-gbs4096-mbs1",  # MLA + MXFP8
    "torchtitan-asynctp-8b-64gpu-float8-rowwise-vanilla",  # torchao Float8 rowwise
])
def test_rows_that_mla_and_the_precision_recipes_made_expressible(rows, row_id):
    assert map_row(rows[row_id], _node).layout.world_size == rows[row_id]["num_gpus"]


def test_llama3_405b_row_has_fewer_layers_on_the_end_stages(rows):
    run = map_row(rows["llama3-405b-16384gpu-cp1"], _node)
    assert run.layout.layers_per_chunk == (7,) + (8,) * 14 + (7,)  # 126 layers, pp 16
    assert any("Sec. 3.3.2" in note for note in run.assumptions)


def test_interleaved_row_with_uneven_chunks_is_expressed(rows):
    run = map_row(rows["nemo-mb-25-11-nemo-container-dgx-b200-llama3-1-405b-128gpu-fp8-cs-tp4pp8cp2vp8ep1-gbs64-mbs1"],
                  _node)
    L = run.layout
    # NeMo's 405B recipe counts the embedding and the loss as layers: 1 on the first and last chunk
    assert (L.pp, L.virtual_stages) == (8, 8) and L.chunk_layers(126) == (1,) + (2,) * 62 + (1,)
    assert any("embedding and the loss count" in note for note in run.assumptions)


def test_moe_row_without_expert_shape(rows):
    row = dict(rows["megatron-sc21-t1-1.7B"])
    row["model"] = {**row["model"], "moe_experts": 8, "moe_top_k": 2}  # experts but no expert FFN size
    with pytest.raises(Unexpressible, match="MoE expert FFN"):
        map_row(row, _node)


def _tiny(gated: bool) -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=2, hidden_size=4, ffn_hidden_size=8, num_attention_heads=2,
                     num_kv_heads=1, vocab_size=10, gated_mlp=gated)


def test_flops_per_token_by_hand():
    # h=4, a=2 heads of d=2 (q_dim 4), 1 kv head (kv_dim 2), f=8, V=10, s=3, L=2.
    # Matrices per layer: q 16 + k 8 + v 8 + o 16 = 48; SwiGLU 3·4·8 = 96 -> P = 144.
    # Forward per layer 2·144 + 4·3·4 = 336; logits 2·10·4 = 80. Model: 3·(2·336 + 80) = 2256.
    model = _tiny(gated=True)
    assert flops_per_token(model, 3, "none", "model") == 2256
    assert flops_per_token(model, 3, "full", "model") == 2256           # model FLOPs ignore recompute
    assert flops_per_token(model, 3, "full", "hardware") == 2256 + 672  # + one forward of the layers
    assert flops_per_token(model, 3, "selective", "hardware") == 2256 + 2 * 48
    assert flops_per_token(_tiny(gated=False), 3, "none", "model") == 2256 - 3 * 2 * 2 * 32  # 2 MLP mats


def test_measured_rate_prefers_tokens_then_converts_tflops():
    model = _tiny(gated=True)
    common = dict(family="torchtitan", num_gpus=4, global_batch=8, model=model, seq_len=3, recompute="full",
                  datasheet_peak_tflops=100.0)
    assert measured_tokens_per_s_per_gpu({"tokens_per_sec_per_gpu": 7, "tflops_per_gpu": 1}, **common) == \
        (7.0, "tokens/s per GPU")
    assert measured_tokens_per_s_per_gpu({"iteration_time_s": 2.0}, **common)[0] == 8 * 3 / 2 / 4
    rate, basis = measured_tokens_per_s_per_gpu({"tflops_per_gpu": 1, "tflops_counts_recompute": True}, **common)
    assert rate == pytest.approx(1e12 / (2256 + 672)) and "hardware" in basis
    rate, _ = measured_tokens_per_s_per_gpu({"tflops_per_gpu": 1}, **common)  # torchtitan: model FLOPs
    assert rate == pytest.approx(1e12 / 2256)
    rate, _ = measured_tokens_per_s_per_gpu({"mfu_pct": 50}, **common)
    assert rate == pytest.approx(0.5 * 100e12 / 2256)
    assert measured_tokens_per_s_per_gpu({}, **common) is None


def test_percentile_and_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)  # position 0.9·3 = 2.7
    assert percentile([5], 90) == 5


def test_kendall_tau():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(2 * 3))  # tau-b with a tie in x
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None


def test_score_sc21_table1_family(rows):
    family_rows = [r for r in rows.values() if r["source_family"] == "megatron_sc21_table1"]
    (table,) = score(family_rows)
    assert table.num_rows == 10 and table.num_evaluated == 10 and not table.not_expressible
    errors = sorted(abs(r.signed_error) for r in table.results)
    assert table.abs_median == pytest.approx((errors[4] + errors[5]) / 2)
    for r in table.results:
        assert r.signed_error == pytest.approx(r.predicted_tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1)


def test_nemo_repeats_are_scored_once(rows):
    nemo = [r for r in rows.values() if r["source_family"] == "nemo_megatron_bridge_perf"]
    (table,) = score(nemo)
    merged = [r for r in table.results if len(r.row_ids) > 1]
    assert merged, "the NeMo tables repeat configurations across containers"
    assert sum(len(r.row_ids) for r in table.results) + sum(table.not_expressible.values()) == len(nemo)


def test_cross_validation_driver_with_a_fit_of_nothing(rows):
    subset = [r for r in rows.values() if r["source_family"] in ("megatron_sc21_table1", "korthikanti_2022")]
    seen: list[set[str]] = []

    def fit(train):
        seen.append({r["source_family"] for r in train})
        from planner.published import default_evaluate
        return default_evaluate

    held_out = cross_validate_by_family(subset, fit)
    assert seen == [{"megatron_sc21_table1"}, {"korthikanti_2022"}]  # each fit never sees its held-out family
    plain = score(subset)
    assert [s.abs_median for s in held_out] == [s.abs_median for s in plain]


def test_sc21_table2_ptdp_row_derives_tp_and_pp(rows):
    run = map_row(rows["megatron-sc21-t2-ptdp-175b-384gpu"], _node)
    L = run.layout
    assert (L.dp, L.tp, L.pp, L.num_microbatches) == (4, 8, 12, 384)  # 384 / (4 x 8) = 12; 1536 / 4 sequences
    assert any("tp 8" in note for note in run.assumptions)  # the derivation is recorded, not silent


def test_nemo_qwen3_moe_row_takes_the_vendored_shape(rows):
    run = map_row(rows["nemo-mb-26-04-nemo-container-dgx-h100-qwen3-30b-a3b-16gpu-fp8-tp1pp1cp1vpnoneep16-gbs1024-mbs1"],
                  _node)
    m, L = run.model, run.layout
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (128, 8, 768)
    assert (m.num_layers, m.hidden_size, m.q_dim, m.kv_dim) == (48, 2048, 4096, 512)  # head_dim 128, 4 kv heads
    assert (L.dp, L.ep, L.micro_batch_size, L.num_microbatches) == (16, 16, 1, 64)  # ep carved out of dp
    assert run.precision == "fp8" and any("PRESET_SHAPES" in note for note in run.assumptions)


def test_mla_and_windowed_moe_rows_take_their_presets(rows):
    # DeepSeek-V3 (MLA, DeepSeekMoE) and gpt-oss (alternating 128-token windows) rows name the model
    # and give layers, width, heads and expert counts at most: the preset must agree with each.
    run = map_row(rows["nemo-mb-25-11-nemo-container-dgx-gb200-deepseekv3-256gpu-bf16-tp1pp4cp1vp4ep64-gbs4096-mbs1"],
                  _node)
    assert run.model.name == "deepseek-v3" and run.model.mla is not None and run.model.moe.num_shared_experts == 1
    assert any("PRESET_SHAPES" in note for note in run.assumptions)
    # NeMo's DeepSeek-V3 performance recipe recomputes selectively (MLA up-projections); the runs
    # of other models in the same tables do not recompute unless the row says so
    assert run.layout.recompute == "selective" and run.runtime == "megatron-bridge"
    assert oss_recompute(rows) == "none"
    oss = map_row(rows["nemo-mb-26-04-nemo-container-dgx-h100-gpt-oss-120b-64gpu-bf16-tp1pp4cp1vpnoneep8-gbs1280-mbs1"],
                  _node)
    assert oss.model.name == "gpt-oss-120b" and oss.model.sliding_window == 128 and oss.layout.ep == 8


def oss_recompute(rows):
    return map_row(rows["nemo-mb-26-04-nemo-container-dgx-h100-gpt-oss-120b-64gpu-bf16-tp1pp4cp1vpnoneep8-gbs1280-mbs1"],
                   _node).layout.recompute


def test_a_row_contradicting_the_preset_is_refused(rows):
    import copy

    row = copy.deepcopy(rows["nemo-mb-25-11-nemo-container-dgx-gb200-deepseekv3-256gpu-bf16-tp1pp4cp1vp4ep64-gbs4096-mbs1"])
    row["model"]["moe_experts"] = 160  # DeepSeek-V2's count
    with pytest.raises(Unexpressible, match="moe_experts 160 != preset deepseek-v3's 256"):
        map_row(row, _node)


def test_gb200_row_runs_on_four_gpu_trays_in_nvl72_domains(rows):
    run = map_row(rows["nemo-mb-25-11-nemo-container-dgx-gb200-llama3-70b-64gpu-fp8-cs-tp1pp1cp1vp1ep1-gbs256-mbs2"],
                  _node)
    assert run.hardware_name == "gb200-nvl72" and run.precision == "fp8"
    assert run.gpus_per_node == 4  # a compute tray; the NVLink domain is the 72-GPU rack
    assert not any("NVLink domains of 64" in note for note in run.assumptions)  # no trimmed racks any more
    big = map_row(rows["nemo-mb-25-11-nemo-container-dgx-gb200-llama3-1-405b-256gpu-fp8-cs-tp4pp16cp1vp4ep1-"
                       "gbs1536-mbs1"], _node)
    from hardware_specs import make_cluster
    cluster = make_cluster(big.node, big.num_gpus, big.gpus_per_node)  # refused before: 256 % 72 != 0
    assert (cluster.num_nodes, cluster.nvlink_domain_gpus) == (64, 72)


def test_nemo_405b_rows_count_the_embedding_and_loss_in_the_pipeline_split(rows):
    # Megatron-Bridge's Llama 3.1 405B recipe sets account_for_embedding/loss_in_pipeline_split:
    # 126 layers + 2 over pp 16 x v 4 = 64 chunks: 2 per chunk, 1 on the first and the last.
    run = map_row(rows["nemo-mb-25-11-nemo-container-dgx-gb200-llama3-1-405b-256gpu-fp8-cs-tp4pp16cp1vp4ep1-"
                       "gbs1536-mbs1"], _node)
    assert run.layout.layers_per_chunk == (1,) + (2,) * 62 + (1,)


def _row(rows, row_id):
    return rows[row_id]


def test_the_mapping_reads_no_measured_figure(rows):
    """Blanking every measured figure of a row changes nothing of what is costed."""
    import copy
    from planner.published.scoring import _node
    for row_id in ("mtnlg-530b-2240gpu", "torchtitan-t5-405b-512gpu-1f1b", "bloom-prequel-001"):
        row = _row(rows, row_id)
        blank = copy.deepcopy(row)
        blank["throughput"] = {k: None for k in row["throughput"]} | {"tokens_per_sec_per_gpu": 1.0}
        blank["memory"] = {k: None for k in row["memory"]}
        a, b = map_row(row, _node), map_row(blank, _node)
        assert (a.layout, a.precision, a.assumed) == (b.layout, b.precision, b.assumed)


def test_the_interleaved_torchtitan_row_runs_interleaved(rows):
    """torchtitan Table 5's two 405B rows differ in pp_schedule only; the interleaved one runs 2 stages
    per rank and pp·v micro-batches (torchtitan's defaults), and is predicted differently."""
    from planner.published.scoring import _node
    plain = map_row(_row(rows, "torchtitan-t5-405b-512gpu-1f1b"), _node)
    looped = map_row(_row(rows, "torchtitan-t5-405b-512gpu-interleaved-1f1b"), _node)
    assert (plain.layout.virtual_stages, plain.layout.micro_batch_size, plain.layout.num_microbatches) == (1, 4, 8)
    assert (looped.layout.virtual_stages, looped.layout.micro_batch_size, looped.layout.num_microbatches) == (2, 2, 16)
    assert looped.layout.schedule == "interleaved"
    assert "virtual_stages=2 (torchtitan default)" in looped.assumed
    scores = score([_row(rows, "torchtitan-t5-405b-512gpu-1f1b"), _row(rows, "torchtitan-t5-405b-512gpu-interleaved-1f1b")])
    predicted = {r.row_ids[0]: r.predicted_tokens_per_s_per_gpu for r in scores[0].results}
    assert len(set(predicted.values())) == 2


def test_silent_fields_are_recorded_and_counted(rows):
    from planner.published.scoring import assumption_counts
    from planner.published.scoring import _node
    mt = map_row(_row(rows, "mtnlg-530b-2240gpu"), _node)
    assert {"micro_batch_size=1", "virtual_stages=1", "recompute=full (family)"} <= set(mt.assumed)
    counts = assumption_counts(list(rows.values()))
    assert counts["micro_batch_size=1"][0] >= 3 and counts["virtual_stages=1"][0] >= 3


def test_bloom_rows_before_the_bf16_optimizer_keep_16_bit_gradients(rows):
    """The BLOOM prequel's runs before 02-28 kept 16-bit gradients (its chronicle: the BF16_Optimizer
    that accumulates in fp32 came then, at 4 bytes per parameter more); from 02-28 they are fp32."""
    import planner
    from hardware_specs.units import GIB
    before, after = map_row(rows["bloom-prequel-087"], _node), map_row(rows["bloom-prequel-089"], _node)
    early_bf16 = map_row(rows["bloom-prequel-112"], _node)  # 02-17, stated bf16
    assert (before.precision, early_bf16.precision, after.precision) == ("fp16", "fp16", "bf16")
    assert before.layout == after.layout
    assert any("BF16_Optimizer" in note for note in before.assumptions)
    stage = {run.row_id: planner.evaluate(**run.evaluate_kwargs()).peak_stage for run in (before, after)}
    a, b = stage["bloom-prequel-087"], stage["bloom-prequel-089"]
    assert a.grads_bytes == pytest.approx(a.params_bytes)          # 2 bytes a parameter
    assert b.grads_bytes == pytest.approx(3 * b.params_bytes)      # 4 (fp32) + 2 (bf16 kept by the engine)
    assert (b.grads_bytes - a.grads_bytes) / GIB == pytest.approx(2 * b.params_bytes / GIB)


def test_rows_on_omni_path_take_the_network_they_state(rows):
    """Jean Zay's A100 nodes have four 100 Gb/s Omni-Path links, not a DGX A100's eight 200 Gb/s NICs."""
    bloom = map_row(rows["bloom-prequel-001"], _node)
    dgx = map_row(rows["megatron-sc21-t1-1.7B"], _node)
    assert bloom.hardware_name == dgx.hardware_name == "a100-sxm-80gb"
    assert (bloom.node.inter_node.nics_per_node, bloom.node.inter_node.nic_bandwidth_bytes_per_s) == (4, 12.5e9)
    assert (dgx.node.inter_node.nics_per_node, dgx.node.inter_node.nic_bandwidth_bytes_per_s) == (8, 25e9)
    assert any("OPA" in note for note in bloom.assumptions)
