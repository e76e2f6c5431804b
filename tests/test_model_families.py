"""Recent families: HF ``config.json`` fixtures (written from each release's config facts) load to
the shipped presets, and totals and active counts match the published figures.

Publishers round or truncate: Qwen3-30B-A3B's card says "30.5B in total and 3.3B activated" for
the 30,532,122,624 and 3,353,032,704 we count, Qwen3-8B's says 8.2B for 8,190,735,360. So each
check asks the count to lie within [published − unit/2, published + unit), unit the published
figure's last digit, and, where that unit is within 1%, within 1% as well.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from costmodels.hf_config import spec_from_hf_dict
from costmodels.params import active_params, embedding_params, main_model_params, mtp_params, total_params
from costmodels.presets import PRESETS, load_model
from hardware_specs import SpecError

CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# preset, fixture, published total and active (billions), their last digit's unit, source
PUBLISHED = [
    ("deepseek-v3", "deepseek-v3", 671, 37, 1, "DeepSeek-V3 report, abstract: 671B total, 37B activated"),
    ("qwen3-235b-a22b", "qwen3-235b-a22b", 235, 22, 1, "Qwen/Qwen3-235B-A22B model card"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", 30.5, 3.3, 0.1, "Qwen/Qwen3-30B-A3B model card"),
    ("qwen3-8b", "qwen3-8b", 8.2, 8.2, 0.1, "Qwen/Qwen3-8B model card (8.2B)"),
    ("qwen1.5-moe-a2.7b", "qwen1.5-moe-a2.7b", 14.3, 2.7, 0.1, "Qwen1.5-MoE-A2.7B blog: 14.3B total, 2.7B activated"),
    ("gemma2-9b", "gemma-2-9b", 9.24, 9.24, 0.01, "Gemma 2 report Table 1 / model card: 9.24B"),
    ("gemma3-27b", "gemma-3-27b", 27.0, 27.0, 0.1, "Gemma 3 report Table 1: 1,416M embedding + 25,600M other"),
    ("phi3-mini", "phi-3-mini-4k", 3.8, 3.8, 0.1, "Phi-3 report: phi-3-mini 3.8B"),
    ("mixtral-8x22b", "mixtral-8x22b", 141, 39, 1, "Mixtral 8x22B announcement: 141B total, 39B active"),
]


@pytest.mark.parametrize("preset,fixture,total,active,unit,source", PUBLISHED)
def test_fixture_loads_to_the_preset_and_counts_match(preset, fixture, total, active, unit, source):
    spec = load_model(str(CONFIGS / f"{fixture}.json"))
    ours = PRESETS[preset]
    assert replace(spec, name=preset, max_position_embeddings=ours.max_position_embeddings) == ours
    for count, published in ((main_model_params(ours), total), (active_params(ours), active)):
        billions = count / 1e9
        assert published - unit / 2 <= billions < published + unit, source
        if unit / published <= 0.01:
            assert billions == pytest.approx(published, rel=0.01), source


def test_deepseek_v3_exact_counts():
    # Main model 671,026,404,352: 61 MLA layers of 187,107,328, 3 dense MLPs 3·7168·18432, 58 MoE
    # layers of 256 + 1 shared experts 3·7168·2048 and a router 7168·256, 2·61 + 1 norms of 7168,
    # untied 129280 x 7168 embedding and head. The MTP module adds two norms, the 2h -> h
    # projection, one MoE layer and its head norm: 11,610,067,968.
    m = PRESETS["deepseek-v3"]
    h, expert = 7168, 3 * 7168 * 2048
    layers = 61 * 187_107_328 + 3 * 3 * h * 18432 + 58 * (257 * expert + h * 256) + 2 * 61 * h
    assert main_model_params(m) == layers + 2 * 129280 * h + h == 671_026_404_352
    moe_layer = 187_107_328 + 2 * h + 257 * expert + h * 256
    assert mtp_params(m) == 3 * h + 2 * h * h + moe_layer == 11_610_067_968
    assert total_params(m) == main_model_params(m) + mtp_params(m)
    # Active: 8 of the 256 routed experts per MoE layer.
    assert active_params(m) == main_model_params(m) - 58 * 248 * expert


def test_gpt_oss_counts_match_the_model_card_without_the_embedding():
    # openai/gpt-oss-120b card: 116.83B total, 5.13B active, the latter without the embedding
    # table (201088 x 2880); the attention-sink logits (64 per layer) are not counted here.
    m = load_model(str(CONFIGS / "gpt-oss-120b.json"))
    assert replace(m, name="gpt-oss-120b") == PRESETS["gpt-oss-120b"]
    assert total_params(m) / 1e9 == pytest.approx(116.83, rel=1e-3)
    assert (active_params(m) - embedding_params(m)) / 1e9 == pytest.approx(5.13, rel=2e-3)
    assert [m.attention_window(i) for i in range(4)] == [128, 0, 128, 0]


def test_window_patterns_by_family():
    gemma2, gemma3 = PRESETS["gemma2-9b"], PRESETS["gemma3-27b"]
    assert [gemma2.attention_window(i) for i in range(4)] == [4096, 0, 4096, 0]  # HF: (i + 1) % 2 -> global
    assert [gemma3.attention_window(i) for i in range(6)] == [1024] * 5 + [0]  # 5 local : 1 global
    assert PRESETS["phi3-mini"].attention_window(5) == 2047
    assert PRESETS["qwen3-8b"].attention_window(0) == 0  # use_sliding_window false


@pytest.mark.parametrize("change,needle", [
    ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ({"mlp_only_layers": [0]}, "mlp_only_layers"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size"),
])
def test_unsupported_configs_name_the_field(change, needle):
    import json

    raw = {**json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()), "sliding_window": 64, **change}
    with pytest.raises(SpecError, match=needle):
        spec_from_hf_dict(raw, "x")


def test_irregular_layer_types_are_refused():
    import json

    raw = json.loads((CONFIGS / "gpt-oss-120b.json").read_text())
    raw["layer_types"] = ["sliding_attention"] * 2 + ["full_attention"] * 34
    with pytest.raises(SpecError, match="layer_types.*periodic"):
        spec_from_hf_dict(raw, "x")


def test_expert_tp_folds_experts_into_tp_ranks():
    # Qwen3-235B-A22B on 256 GPUs, tp 2 x pp 8 x dp 16, ep 32: 32 expert ranks exceed dp 16, so
    # Megatron folds them into tp x dp = 32 ranks with expert tp 1. Each rank then holds
    # 128 / 32 = 4 whole experts of every MoE layer on its stage, where expert tp 2 with ep 16
    # would hold 8 half experts: the same expert parameters per rank.
    import planner
    from costmodels.layout import LayoutError

    kw = dict(model="qwen3-235b-a22b", hardware="h100-sxm-80gb", gpus=256, global_batch=1024, seq_len=4096)
    folded = planner.evaluate(**kw, layout=planner.Layout(dp=16, tp=2, pp=8, ep=32, expert_tp=1, zero_stage=1,
                                                          sequence_parallel=True, num_microbatches=64))
    plain = planner.evaluate(**kw, layout=planner.Layout(dp=16, tp=2, pp=8, ep=16, zero_stage=1,
                                                         sequence_parallel=True, num_microbatches=64))
    assert folded.stages[0].params_bytes == pytest.approx(plain.stages[0].params_bytes)
    with pytest.raises(LayoutError, match="ep 32 must divide dp 16"):
        planner.evaluate(**kw, layout=planner.Layout(dp=16, tp=2, pp=8, ep=32, zero_stage=1,
                                                     sequence_parallel=True, num_microbatches=64))
    with pytest.raises(LayoutError, match="needs sequence parallelism"):
        planner.evaluate(**kw, layout=planner.Layout(dp=16, tp=2, pp=8, ep=32, expert_tp=1, zero_stage=1,
                                                     num_microbatches=64))


def test_megatron_export_carries_mla_and_deepseek_moe():
    # Megatron-LM's DeepSeek-V3 options: the MLA dims, 3 dense layers then MoE, one shared expert of
    # 2048, one MTP layer, expert tp, and selective recomputation of the core and MLA up-projections.
    from costmodels.layout import Layout
    from costmodels.training import TrainingSpec
    from planner.launch import frameworks

    args, _ = frameworks.megatron_args(PRESETS["deepseek-v3"], TrainingSpec(global_batch_size=64, seq_len=4096),
                                       Layout(dp=8, ep=8, expert_tp=1, recompute="selective", num_microbatches=8), 4096)
    text = " ".join(args)
    for part in ("--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
                 "--qk-pos-emb-head-dim 64 --v-head-dim 128", "--moe-layer-freq ([0]*3+[1]*58)",
                 "--moe-shared-expert-intermediate-size 2048", "--mtp-num-layers 1",
                 "--expert-tensor-parallel-size 1", "--recompute-modules core_attn mla_up_proj"):
        assert part in text
    assert {a for a in args if a.startswith("--")} <= frameworks.MEGATRON_OPTIONS


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen1.5-moe-a2.7b", "gemma3-27b", "gpt-oss-120b"])
def test_model_spec_round_trips_through_its_plan_file_form(name):
    import json

    from costmodels.model_spec import model_from_dict, model_to_dict

    spec = PRESETS[name]
    assert model_from_dict(json.loads(json.dumps(model_to_dict(spec)))) == spec


def test_bad_mla_field_in_a_plan_file_is_named():
    from costmodels.model_spec import model_from_dict, model_to_dict

    raw = model_to_dict(PRESETS["deepseek-v3"])
    raw["mla"]["kv_lora_rank"] = 0
    with pytest.raises(SpecError, match="mla.kv_lora_rank"):
        model_from_dict(raw)
