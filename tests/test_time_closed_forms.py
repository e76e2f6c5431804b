"""Time side against closed forms: Megatron's FLOPs per step, PaLM's MFU, one layer's forward
time worked by hand in a GEMM-bound and in a memory-bound case."""

from __future__ import annotations

import pytest

import planner
from costmodels.assumptions import DEFAULT_ASSUMPTIONS as A
from costmodels.compute import Rates
from costmodels.convention import MEGATRON
from costmodels.layer_costs import LayerCosts, LayerKey
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster


def test_flops_per_step_with_full_recompute_match_megatron_closed_form():
    # Narayanan et al. SC'21 eq. 3: with full recomputation a step costs
    # F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) FLOPs. GPT-3 175B: l = 96, h = 12288, V = 50257,
    # B = 8 sequences of s = 2048. Our count differs by terms eq. 3 leaves out: biases and norms
    # (~13h per layer vs 12h², 1e-4) and the output head's recomputed forward (2hV per token,
    # ~2V/(96·l·h) ≈ 9e-4 of the total), so the two agree within 0.2%.
    B, s, l, h, V = 8, 2048, 96, 12288, 50257
    b = planner.evaluate(model="gpt3-175b", hardware="a100-sxm-80gb", gpus=64, global_batch=B, seq_len=s,
                         layout=planner.Layout(tp=8, pp=8, num_microbatches=8, recompute="full"))
    megatron = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert b.hardware_flops_per_step == pytest.approx(megatron, rel=2e-3)
    assert b.hardware_flops_per_step > megatron  # the head recompute is in ours, not in eq. 3
    # Without recomputation the hardware FLOPs are the model FLOPs: 3/4 of eq. 3's layer terms.
    none = planner.evaluate(model="gpt3-175b", hardware="a100-sxm-80gb", gpus=64, global_batch=B, seq_len=s,
                            layout=planner.Layout(tp=8, pp=8, num_microbatches=8))
    assert none.hardware_flops_per_step == none.model_flops_per_step
    assert none.model_flops_per_step == pytest.approx(72 * B * s * l * h**2 * (1 + s / (6 * h)) + 6 * B * s * h * V,
                                                      rel=2e-3)


def test_mfu_is_palm_formula():
    # Chowdhery et al. 2022 App. B: MFU = (6N + 12·L·H·Q·T)·tokens/s / (GPUs · peak), N the
    # non-embedding parameters. Llama 2 7B: 6,738,415,616 parameters, minus the 32000 x 4096 input
    # embedding = 6,607,343,616 (the untied output head is a matmul and stays). L = 32, H = 32,
    # Q = 128, T = 4096. Peak: H100 SXM dense bf16 from the datasheet.
    n, L, H, Q, T = 6_738_415_616 - 32000 * 4096, 32, 32, 128, 4096
    gpus, batch = 8, 64
    b = planner.evaluate(model="llama2-7b", hardware="h100-sxm-80gb", gpus=gpus, global_batch=batch, seq_len=T,
                         layout=planner.Layout(dp=4, tp=2, sequence_parallel=True, num_microbatches=16))
    peak = load_node("h100-sxm-80gb").hardware.peak_flops("bf16")
    tokens_per_s = batch * T / b.step_time_s
    assert b.mfu == pytest.approx((6 * n + 12 * L * H * Q * T) * tokens_per_s / (gpus * peak), rel=1e-9)


def _layer(model: str, hardware: str, b: int, s: int):
    m = load_model(model)
    training = TrainingSpec(global_batch_size=b, seq_len=s)
    cluster = make_cluster(load_node(hardware), 1)
    rates = Rates(cluster.hardware, "bf16", None, A)
    layers = LayerCosts(m, training, cluster, rates, None, A, convention=MEGATRON)
    return m, cluster.hardware, layers.forward(LayerKey(moe=False, b=b, s_local=s, tp=1, sp=False, cp=1, ep=1))


def test_gemm_bound_layer_forward_by_hand():
    # Llama 2 7B, one sequence of 4096 tokens, one H100, bf16, no parallelism. h = 4096,
    # f = 11008 (gated), MHA. Weight GEMMs: qkv 4096x12288, out 4096x4096, gate+up 4096x22016,
    # down 11008x4096: 2·T·m·n·k FLOPs each, far above the ridge point, so time = FLOPs / (η · 989
    # TFLOP/s · σ · shape), σ the H100's sustained share (0.914), shape = quantisation ×
    # k/(k + k₀) on 132 SMs (k₀ the fitted prologue; best tile 64x128): qkv
    # 64·96 = 6144 tiles in 47 waves (6204 slots), out and down 64·32 = 2048 in 16 (2112), gate+up
    # 64·172 = 11008 in 84 (11088). Attention core (fused, causal): half of 4·T²·h FLOPs at
    # 989 TFLOP/s · η_attn · 4096/(4096 + 256) (key blocks of 4096, head dim 128).
    # Memory-bound: 10 block passes (2 norms, 2 residuals) of 2·T·h bytes, SwiGLU reads 2f writes f
    # (2·T·3f bytes), rotary reads+writes q and k (2·2·T·2h bytes), no dropout; at 0.8 · 3.35 TB/s.
    m, hw, f = _layer("llama2-7b", "h100-sxm-80gb", 1, 4096)
    T, h, ffn = 4096, 4096, 11008
    peak, bw = hw.peak_flops("bf16"), hw.memory_bandwidth_bytes_per_s
    gemm_flops = 2 * T * (h * 3 * h + h * h + h * 2 * ffn + ffn * h)
    k0, eta = A.gemm_k_overhead, A.gemm_efficiency * peak * hw.sustained_rate_share
    gemm_s = (2 * T * h * 3 * h / (6144 / 6204 * h / (h + k0)) + 2 * T * h * h / (2048 / 2112 * h / (h + k0))
              + 2 * T * h * 2 * ffn / (11008 / 11088 * h / (h + k0)) + 2 * T * ffn * h / (2048 / 2112 * ffn / (ffn + k0))) / eta
    assert f.gemm_s == pytest.approx(gemm_s, rel=1e-12)
    # Causal fused attention executes half the score tiles (FlashAttention-2, Sec. 3.1.1) and its
    # backward is 2.5x its forward (5 matmuls against 2, recomputing the scores; Sec. 4.1).
    attention_rate = peak * A.attention_efficiency * hw.sustained_rate_share * T / (T + A.attention_block_half_tokens)
    assert f.attention_core_s == pytest.approx(0.5 * 4 * T * T * h / attention_rate, rel=1e-12)
    # ... at attention_backward_efficiency of the forward's rate: 2.5 / that times the forward time.
    assert f.attention_core_bwd_s == pytest.approx(2.5 / A.attention_backward_efficiency * f.attention_core_s, rel=1e-12)
    assert f.flops == pytest.approx(gemm_flops + 4 * T * T * h, rel=1e-12)  # model FLOPs: Megatron's full s²
    moved = 10 * 2 * T * h + 2 * T * 3 * ffn + 2 * 2 * T * 2 * h
    assert f.memory_s == pytest.approx(moved / (0.8 * bw), rel=1e-12)
    assert f.compute_s == pytest.approx(f.gemm_s + f.attention_core_s + f.memory_s, rel=1e-12)
    # GEMM-bound: the bytes the GEMMs move (2·(mk + kn + mn) each) would take far less time.
    shapes = [(h, 3 * h), (h, h), (h, 2 * ffn), (ffn, h)]
    gemm_bytes = sum(2 * (T * k + k * n + T * n) for k, n in shapes)
    assert gemm_bytes / (0.8 * bw) < 0.2 * f.gemm_s


def test_memory_bound_layer_forward_by_hand():
    # tiny-llama (h = 256, f = 768 gated, 8 heads of 32, 4 kv heads: kv width 128) with a single
    # token: every weight GEMM is below the ridge point, so its time is the bytes it moves,
    # 2·(mk + kn + mn) in bf16, at 0.8 · 3.35 TB/s. qkv: m=1, k=256, n=256+2·128=512;
    # out: k=256, n=256; gate+up: k=256, n=1536; down: k=768, n=256.
    m, hw, f = _layer("tiny-llama", "h100-sxm-80gb", 1, 1)
    bw = 0.8 * hw.memory_bandwidth_bytes_per_s
    shapes = [(256, 512), (256, 256), (256, 1536), (768, 256)]
    moved = sum(2 * (1 * k + k * n + 1 * n) for k, n in shapes)
    assert f.gemm_s == pytest.approx(moved / bw, rel=1e-12)
    flops_time = sum(2 * k * n for k, n in shapes) / (0.75 * hw.peak_flops("bf16"))
    assert f.gemm_s > 100 * flops_time  # memory-bound: the FLOPs alone would take < 1%


def test_eager_attention_runs_every_score_and_2x_backward():
    from costmodels.flops import attention_backward_ratio, attention_executed_fraction

    assert (attention_executed_fraction(False), attention_backward_ratio(False)) == (1.0, 2.0)
    assert (attention_executed_fraction(True), attention_backward_ratio(True)) == (0.5, 2.5)


def test_fp8_gemms_run_at_the_fp8_rate_lm_head_stays_bf16_and_mfu_uses_the_bf16_peak():
    # H100: fp8 1979 TFLOP/s, bf16 989. A 4096^3 fp8 GEMM: 2mnk / (fp8 efficiency * fp8 peak); its
    # cast kernels are the recipe's and are costed per layer (tests/test_precision.py).
    hw = load_node("h100-sxm-80gb").hardware
    rates = Rates(hw, "fp8", None, A)
    from costmodels.flops import Gemm

    # Shape factor of 4096^3 on 132 SMs: 512 tiles of 128x256 in 4 waves (512/528, the best tile), times the
    # depth factor 4096 / (4096 + 128); both precisions pay it.
    m = n = k = 4096
    shape = (512 / 528) * (4096 / (4096 + A.gemm_k_overhead))
    sigma = hw.sustained_rate_share  # the H100's sustained share slows both precisions alike
    assert rates.gemm_time_s(Gemm(m=m, n=n, k=k)) == pytest.approx(
        2 * m * n * k / (A.fp8_gemm_efficiency * shape * hw.peak_flops("fp8") * sigma))
    head, _ = rates.gemm_time_and_source(Gemm(m=m, n=n, k=k), high_precision=True)
    assert head == pytest.approx(2 * m * n * k / (A.gemm_efficiency * shape * hw.peak_flops("bf16") * sigma))
    assert rates.mfu_peak == hw.peak_flops("bf16")
    assert rates.low_precision_peak == hw.peak_flops("fp8")


def test_the_shipped_calibration_is_the_default_and_matches_its_record():
    import json
    from pathlib import Path

    import costmodels
    from costmodels.assumptions import UNCALIBRATED
    from costmodels.calibration_data import CONSTANTS

    record = Path(costmodels.__file__).parent / "data" / "calibration.json"
    doc = json.loads(record.read_text())
    assert doc["provenance"]["command"].startswith(".venv/bin/python benchmarks/calibrate.py")
    assert "lofo_median_abs_error" in doc["provenance"]
    assert doc["constants"] == CONSTANTS  # the module and its provenance record were written together
    for name, value in CONSTANTS.items():
        assert getattr(A, name) == value
    residuals = doc["lofo_residuals"]
    assert residuals == sorted(residuals, key=lambda d: (d["family"], d["run_id"]))
    for r in residuals:  # step time error = 1 / (1 + tokens/s error) - 1, each rounded to 4 places (so a large error keeps 1e-3 of itself)
        assert r["step_time_error"] == pytest.approx(1 / (1 + r["tokens_per_s_error"]) - 1, rel=1e-3, abs=2e-4)
    assert UNCALIBRATED.with_calibration({"gemm_efficiency": 0.5}).gemm_efficiency == 0.5


def test_optimizer_term_is_adamw_plus_clipping_by_global_norm_at_hbm_rate():
    # Llama 2 7B on one H100, ZeRO-0, bf16 with fp32 master weights (Megatron: K = 12 bytes of
    # states per parameter read and written, the fp32 gradient read, the bf16 weight written):
    # (2·12 + 4 + 2) bytes per parameter, and clipping to a global norm reads the fp32 gradient
    # once for the norm and once more to scale it, writing it back: 3·4 bytes per parameter.
    from costmodels.rank_time import clipping_bytes

    b = planner.evaluate(model="llama2-7b", hardware="h100-sxm-80gb", gpus=1, global_batch=1, seq_len=512,
                         layout=planner.Layout(recompute="full"), runtime="megatron")
    n = 6_738_415_616
    rates = Rates(load_node("h100-sxm-80gb").hardware, "bf16", None, A)
    assert clipping_bytes(4, n) == 12 * n
    assert b.optimizer_s == pytest.approx(rates.memory_time_s(30 * n) + rates.memory_time_s(12 * n), rel=1e-6)


def test_host_issue_is_a_floor_under_an_eager_layer_on_a_gpu_and_adds_on_a_cpu():
    """A GPU queues kernels while the host issues more: an eager PyTorch layer lasts the longer of
    its kernels and its host time (1x forward, 2x backward); Megatron's fused layers are charged
    none; on a CPU host time adds to every runtime's layer."""
    from dataclasses import replace

    from costmodels.estimate import CostModel
    from costmodels.job import Job
    from costmodels.layer_costs import LayerForward, issue_bound_s
    from costmodels.layout import Layout
    from costmodels.runtimes import CONVENTIONS

    assert issue_bound_s(1e-3, 3e-3, True) == 3e-3 and issue_bound_s(4e-3, 3e-3, True) == 4e-3
    assert issue_bound_s(1e-3, 3e-3, False) == pytest.approx(4e-3)
    assert LayerForward(gemm_s=1e-3, host_s=3e-3, sync_s=1e-4).compute_s == pytest.approx(3.1e-3)
    model = load_model("tiny-llama")
    layout = Layout(num_microbatches=2)
    host = 1.0  # seconds: far above any kernel of this model, so the floor binds on every layer
    steps = {}
    for hardware in ("h100-sxm-80gb", "cpu"):
        for runtime in ("torch", "megatron"):
            training = TrainingSpec(global_batch_size=2, seq_len=64, precision="fp32", runtime=runtime)
            job = dict(model=model, training=training, cluster=make_cluster(load_node(hardware), 1),
                       convention=CONVENTIONS[runtime])
            base = CostModel(Job(**job, assumptions=replace(A, layer_overhead_s=0.0))).estimate(layout)
            charged = CostModel(Job(**job, assumptions=replace(A, layer_overhead_s=host))).estimate(layout)
            steps[hardware, runtime] = (base.step_time_s, charged.step_time_s)
    per_step = 2 * model.num_layers * (1 + A.backward_host_ratio) * host  # micro-batches x layers x (fwd + bwd)
    gpu_base, gpu_charged = steps["h100-sxm-80gb", "torch"]
    assert gpu_charged - gpu_base == pytest.approx(per_step, rel=1e-3)  # the kernels hide under it
    assert gpu_charged - gpu_base < per_step  # ... floor, not sum
    assert steps["h100-sxm-80gb", "megatron"][0] == steps["h100-sxm-80gb", "megatron"][1]
    for runtime in ("torch", "megatron"):
        cpu_base, cpu_charged = steps["cpu", runtime]
        assert cpu_charged - cpu_base == pytest.approx(per_step, rel=1e-9)
