"""Precision recipes: cast kernels and weight copies worked by hand for one layer, moment dtype,
low-precision all-gather, MFU against the bf16 peak, the new datasheet fields, and the export
option names (each checked against the framework's source, ``planner/launch/precision_export.py``)."""

from __future__ import annotations

import pytest

import planner
from costmodels.assumptions import DEFAULT_ASSUMPTIONS as A
from costmodels.compute import Rates
from costmodels.convention import MEGATRON
from costmodels.layer_costs import LayerCosts, LayerKey
from costmodels.layout import Layout
from costmodels.memory import state_bytes
from costmodels.precision import RECIPES, cached_weight_copy_bytes, gathered_weight_bytes
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from autoplan_base.errors import SpecError
from planner.launch import frameworks
from planner.launch.job import framework_files
from planner.plan.plan_file import PlanFileError
from planner.search.launchable import runtime_problems
from costmodels.runtimes import FSDP2

# Llama 3 8B, one sequence of s = 4096 tokens, tp 1: h = 4096, q = 4096, kv = 2 x 1024, f = 14336 (gated).
# Weight GEMMs (m x k)(k x n), m = 4096 tokens:
#   qkv  k = 4096,  n = 6144     mk = 16,777,216   kn = 25,165,824   mn = 25,165,824
#   out  k = 4096,  n = 4096     mk = 16,777,216   kn = 16,777,216   mn = 16,777,216
#   up   k = 4096,  n = 28672    mk = 16,777,216   kn = 117,440,512  mn = 117,440,512
#   down k = 14336, n = 4096     mk = 58,720,256   kn = 58,720,256   mn = 16,777,216
SUM_MK = 3 * 16_777_216 + 58_720_256            # 109,051,904: inputs X quantised in forward
SUM_KN = 25_165_824 + 16_777_216 + 117_440_512 + 58_720_256  # 218,103,808: weights = one layer's matmul params
SUM_MN = 25_165_824 + 16_777_216 + 117_440_512 + 16_777_216  # 176,160,768: output gradients dY in backward

# (bytes per X or dY element, bytes per W element), from the module docstring of costmodels/precision.py:
# delayed 2 read + 1 + 1 written; current tensorwise an amax read first (+2); rowwise and the 1x128
# tiles one read + one write per layout (2 x 3); 128x128 weight blocks share scales with their
# transpose (2 + 1 + 1); MXFP8 2 + 2 x (1 + 1/32); NVFP4 amax 2 + 2 + 2 x (0.5 + 1/16).
CAST_BYTES = {"fp8-delayed": (4, 4), "fp8-tensorwise": (6, 6), "fp8-rowwise": (6, 6), "fp8-blockwise": (6, 4),
              "mxfp8": (4.0625, 4.0625), "nvfp4": (5.125, 5.125)}
TRAINING = {"fp8-delayed": ("fp8", "delayed"), "fp8-tensorwise": ("fp8", "tensorwise"),
            "fp8-rowwise": ("fp8", "rowwise"), "fp8-blockwise": ("fp8", "blockwise"),
            "mxfp8": ("mxfp8", None), "nvfp4": ("nvfp4", None)}


def _layer(precision: str, fp8_recipe: str | None, hardware: str = "b200"):
    m = load_model("llama3-8b")
    training = TrainingSpec(global_batch_size=1, seq_len=4096, precision=precision, fp8_recipe=fp8_recipe)
    cluster = make_cluster(load_node(hardware), 1)
    rates = Rates(cluster.hardware, precision, None, A)
    layers = LayerCosts(m, training, cluster, rates, None, A, convention=MEGATRON)
    return rates, layers.forward(LayerKey(moe=False, b=1, s_local=4096, tp=1, sp=False, cp=1, ep=1))


@pytest.mark.parametrize("name", sorted(CAST_BYTES))
def test_cast_kernels_of_one_layer_by_hand(name):
    a, w = CAST_BYTES[name]
    rates, f = _layer(*TRAINING[name])
    per_s = 1 / (A.memory_bandwidth_efficiency * 8.0e12) * A.memory_bound_scale  # B200: 8 TB/s HBM
    assert f.cast_s == pytest.approx((a * SUM_MK + w * SUM_KN) * per_s)
    assert f.cast_bwd_s == pytest.approx(a * SUM_MN * per_s)
    # e.g. tensorwise: 6 x (109,051,904 + 218,103,808) = 1,962,934,272 B forward = 0.307 ms at 0.8 x 8 TB/s
    _, bf16 = _layer("bf16", None)
    assert bf16.cast_s == bf16.cast_bwd_s == 0.0
    assert f.compute_s == pytest.approx(f.gemm_s + f.attention_core_s + f.memory_s + f.cast_s + f.host_s)


@pytest.mark.parametrize("name, copy_bytes", [("fp8-tensorwise", 436_207_616), ("mxfp8", 449_839_104),
                                              ("nvfp4", 245_366_784)])
def test_cached_weight_copies_of_one_layer_by_hand(name, copy_bytes):
    # One layer's matmul weights are SUM_KN = 218,103,808 elements; Transformer Engine keeps both
    # layouts: fp8 2 B (436,207,616), MXFP8 2 x (1 + 1/32) = 2.0625 B, NVFP4 2 x (0.5 + 1/16) = 1.125 B.
    recipe = RECIPES[name]
    kw = dict(share=1.0, compute_bytes=2)
    assert cached_weight_copy_bytes(recipe, MEGATRON, SUM_KN, quantised_params=False, **kw) == pytest.approx(copy_bytes)
    # with --fp8-param-gather the quantised copy replaces the 2-byte bf16 compute parameter
    replaced = cached_weight_copy_bytes(recipe, MEGATRON, SUM_KN, quantised_params=True, **kw)
    assert replaced == pytest.approx(copy_bytes - 2 * SUM_KN)  # fp8 0; NVFP4 saves 0.875 B per weight
    assert cached_weight_copy_bytes(recipe, FSDP2, SUM_KN, quantised_params=False, **kw) == 0.0  # torchao: none


def test_fp8_weight_copies_in_a_whole_plan():
    # Llama 3 8B = 8,030,261,248 params; embedding 525,336,576 and untied head + final norm
    # 525,340,672 stay bf16, so 6,979,584,000 elements are fp8 GEMM weights. ZeRO-0 (no distributed
    # optimizer, so no --fp8-param-gather): Megatron/TE caches 2 B of fp8 copies each beside the
    # bf16 parameters = 13,959,168,000 bytes more on every rank. ZeRO-1: the fp8 parameter replaces
    # the bf16 one (2 B either way) and the all-gather moves those elements in 1 B, not 2.
    kw = dict(model="llama3-8b", hardware="h100", gpus=8, global_batch=64, seq_len=4096)
    for zero, extra in ((0, 13_959_168_000), (1, 0)):
        layout = Layout(dp=8, zero_stage=zero, micro_batch_size=1, num_microbatches=8)
        fp8 = planner.evaluate(precision="fp8", layout=layout, **kw)
        bf16 = planner.evaluate(precision="bf16", layout=layout, **kw)
        assert fp8.peak_stage.params_bytes - bf16.peak_stage.params_bytes == pytest.approx(extra, abs=1)
    gathered = fp8.comm_bytes_per_gpu["dp_all_gather"] / bf16.comm_bytes_per_gpu["dp_all_gather"]
    assert gathered == pytest.approx((6_979_584_000 * 1 + 1_050_677_248 * 2) / (8_030_261_248 * 2))


def test_moment_dtype_and_low_precision_gather_per_runtime():
    share = 0.9
    block = TrainingSpec(global_batch_size=1, seq_len=8, precision="fp8", fp8_recipe="blockwise")
    tensor = TrainingSpec(global_batch_size=1, seq_len=8, precision="fp8")
    # DeepSeek-V3 bf16 moments: K = 4 (fp32 master) + 2 + 2 = 8 against 12; FSDP2 (master = param): 4 against 8
    assert state_bytes(block, MEGATRON).optimizer == 8 and state_bytes(tensor, MEGATRON).optimizer == 12
    assert state_bytes(block, FSDP2).optimizer == 4 and state_bytes(tensor, FSDP2).optimizer == 8
    # torchao gathers fp8 under FSDP2 for tensorwise only; Megatron's --fp8-param-gather for every TE recipe
    assert gathered_weight_bytes(RECIPES["fp8-tensorwise"], FSDP2, 2, share) == pytest.approx(0.9 * 1 + 0.1 * 2)
    assert gathered_weight_bytes(RECIPES["fp8-rowwise"], FSDP2, 2, share) == 2.0
    assert gathered_weight_bytes(RECIPES["fp8-delayed"], MEGATRON, 2, share) == pytest.approx(1.1)
    assert gathered_weight_bytes(RECIPES["bf16"], MEGATRON, 2, share) == 2.0


def test_mfu_is_against_the_bf16_peak_with_the_fp8_figure_beside_it():
    b = planner.evaluate(model="llama3-8b", hardware="h100", gpus=8, global_batch=64, seq_len=4096, precision="fp8",
                         layout=Layout(dp=8, zero_stage=1, micro_batch_size=1, num_microbatches=8))
    per_gpu = b.model_flops_per_step / b.step_time_s / 8
    assert b.mfu == pytest.approx(per_gpu / 989e12)  # H100 SXM bf16 dense
    assert b.mfu_low_precision == pytest.approx(per_gpu / 1979e12)  # fp8 dense
    assert b.predicted_dict()["mfu_low_precision_peak"] == pytest.approx(b.mfu_low_precision, rel=1e-5)
    bf16 = planner.evaluate(model="llama3-8b", hardware="h100", gpus=8, global_batch=64, seq_len=4096,
                            layout=Layout(dp=8, zero_stage=1, micro_batch_size=1, num_microbatches=8))
    assert "mfu_low_precision_peak" not in bf16.predicted_dict() and bf16.mfu_low_precision == 0.0


def test_datasheet_fields_load_and_need_a_source(tmp_path):
    b300, gb300 = load_node("b300").hardware, load_node("gb300-nvl72").hardware
    assert (b300.peak_flops("bf16"), b300.peak_flops("mxfp8"), b300.peak_flops("nvfp4")) == (2.25e15, 4.5e15, 1.35e16)
    assert (gb300.peak_flops("fp8"), gb300.peak_flops("nvfp4")) == (5e15, 1.5e16)
    assert load_node("b200").hardware.peak_flops("nvfp4") == 9e15
    assert load_node("gb200-nvl72").hardware.peak_flops("nvfp4") == 1e16
    h100 = load_node("h100").hardware
    assert h100.peak_flops("fp8") == 1979e12 and not h100.supports("mxfp8") and not h100.supports("nvfp4")
    from hardware_specs.loader import DATA_DIR
    text = (DATA_DIR / "b300.toml").read_text()
    unsourced = "\n".join(line for line in text.splitlines() if not line.startswith('"device.nvfp4_tflops"'))
    (tmp_path / "x.toml").write_text(unsourced)
    with pytest.raises(SpecError, match="device.nvfp4_tflops.*no entry in \\[sources\\]"):
        load_node(str(tmp_path / "x.toml"))


def test_recipe_inputs_are_checked():
    with pytest.raises(SpecError, match="fp8_recipe 'rowwise' needs precision fp8"):
        TrainingSpec(global_batch_size=1, seq_len=8, precision="bf16", fp8_recipe="rowwise")
    with pytest.raises(SpecError, match="fp8_recipe must be one of"):
        TrainingSpec(global_batch_size=1, seq_len=8, precision="fp8", fp8_recipe="per-channel")
    with pytest.raises(SpecError, match="a100-sxm-80gb has no fp8 rate"):  # no silent bf16 fallback
        planner.evaluate(model="llama3-8b", hardware="a100-sxm-80gb", gpus=8, global_batch=8, seq_len=4096,
                         precision="fp8", layout=Layout(dp=8, micro_batch_size=1, num_microbatches=1))
    with pytest.raises(SpecError, match="no mxfp8 rate .*Blackwell"):
        planner.evaluate(model="llama3-8b", hardware="h100", gpus=8, global_batch=8, seq_len=4096, precision="mxfp8",
                         layout=Layout(dp=8, micro_batch_size=1, num_microbatches=1))


MEGATRON_FP8_RECIPES = {"tensorwise", "delayed", "mxfp8", "blockwise"}
"""Megatron-LM arguments.py: --fp8-recipe choices; --fp8-format takes e4m3 or hybrid."""


def _value(args: list[str], option: str) -> str | None:
    return args[args.index(option) + 1] if option in args else None


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_exports_use_the_frameworks_option_names(name):
    """Each runtime's job states the recipe in its own option names, or refuses in one line a recipe
    it has no option for (nothing is exported in another recipe)."""
    precision, recipe = TRAINING[name]
    model = load_model("llama3-8b")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, precision=precision, fp8_recipe=recipe)
    layout = Layout(dp=8, zero_stage=1, micro_batch_size=1, num_microbatches=8)
    if name == "fp8-rowwise":  # Megatron's --fp8-recipe has no rowwise choice
        with pytest.raises(PlanFileError, match=r"^training\.precision: recipe fp8-rowwise has no Megatron "
                                                r"--fp8-recipe .*\(the megatron job cannot run it as costed\)$"):
            frameworks.megatron_args(model, training, layout, 4096)
    else:
        args, _ = frameworks.megatron_args(model, training, layout, 4096)
        assert {a for a in args if a.startswith("--")} <= frameworks.MEGATRON_OPTIONS
    if name == "fp8-rowwise":
        pass  # refused above
    elif name == "nvfp4":
        assert (_value(args, "--fp4-format"), _value(args, "--fp4-recipe")) == ("e2m1", "nvfp4")
        assert "--fp4-param-gather" in args
    else:
        assert _value(args, "--fp8-recipe") in MEGATRON_FP8_RECIPES and _value(args, "--fp8-format") in ("e4m3", "hybrid")
        assert "--fp8-param-gather" in args  # the plan costs the gather in fp8 (ZeRO-1: distributed optimizer)
    if name == "fp8-blockwise":
        assert _value(args, "--exp-avg-dtype") == _value(args, "--exp-avg-sq-dtype") == "bf16"
    fsdp = Layout(dp=8, zero_stage=3, micro_batch_size=1, num_microbatches=8)  # torchtitan runs no ZeRO-1
    if name not in ("fp8-tensorwise", "fp8-rowwise", "mxfp8"):  # torchao's float8 / mx converters have no equivalent
        with pytest.raises(PlanFileError, match=rf"^training\.precision: recipe {name}: torchtitan runs "
                                                r"fp8-tensorwise, fp8-rowwise, mxfp8 only \(the torchtitan job"):
            frameworks.torchtitan_config("llama3-8b", model, training, fsdp, 4096)
        return
    config, _ = frameworks.torchtitan_config("llama3-8b", model, training, fsdp, 4096)
    fields = {f"{section}.{key}" for section, values in config.items() for key in values}
    assert fields <= frameworks.TORCHTITAN_KEYS
    converters = config["model"].get("converters")
    if name in ("fp8-tensorwise", "fp8-rowwise"):
        float8 = config["quantize.linear.float8"]
        assert converters == ["quantize.linear.float8"] and float8["recipe_name"] == name.removeprefix("fp8-")
        assert "output" in float8["filter_fqns"]  # the LM head stays bf16
        assert float8.get("enable_fsdp_float8_all_gather", False) == (name == "fp8-tensorwise")
    else:
        assert converters == ["quantize.linear.mx"] and config["quantize.linear.mx"]["recipe_name"] == "mxfp8"


def test_low_precision_plans_are_exported_not_launched():
    """The torch job refuses a low-precision recipe, naming the runtimes whose jobs run it; those jobs do."""
    training = TrainingSpec(global_batch_size=8, seq_len=64, precision="fp8")
    layout = Layout(dp=1, micro_batch_size=1, num_microbatches=8)
    problems = runtime_problems(training, layout)
    assert len(problems) == 1 and problems[0].startswith("training.precision = fp8 (fp8-tensorwise)")
    assert "--runtime megatron or torchtitan" in problems[0] and "\n" not in problems[0]
    with pytest.raises(planner.PlanError, match="precision=fp8 with runtime=torch"):
        planner.plan(model="llama3-8b", hardware="h100", gpus=8, global_batch=64, seq_len=4096, precision="fp8",
                     launchable=True)
    model = load_model("llama3-8b")
    megatron = framework_files("megatron", "llama3-8b", model, training, layout)["megatron_args.sh"]
    assert "--fp8-recipe tensorwise" in megatron
    toml = framework_files("torchtitan", "llama3-8b", model, training, layout, version="v0.2.2")["torchtitan.toml"]
    assert 'converters = ["quantize.linear.float8"]' in toml and 'recipe_name = "tensorwise"' in toml


def test_transformer_engine_keeps_quantised_gemm_inputs_and_torchao_does_not():
    """TE saves the cast input of a low-precision GEMM: e4m3 1 byte, MXFP8 1 + 1/32, NVFP4 0.5 + 1/16;
    torchao (the torch runtimes) and 16-bit training keep the 2-byte input."""
    from costmodels.convention import MEGATRON
    from costmodels.precision import precision_recipe, saved_gemm_input_bytes
    from costmodels.runtimes import FSDP2

    assert saved_gemm_input_bytes(precision_recipe("fp8", "delayed"), MEGATRON, 2) == 1.0
    assert saved_gemm_input_bytes(precision_recipe("mxfp8"), MEGATRON, 2) == 1 + 1 / 32
    assert saved_gemm_input_bytes(precision_recipe("nvfp4"), MEGATRON, 2) == 0.5 + 1 / 16
    assert saved_gemm_input_bytes(precision_recipe("fp8", "tensorwise"), FSDP2, 2) == 2.0
    assert saved_gemm_input_bytes(precision_recipe("bf16"), MEGATRON, 2) == 2.0
