"""Model-state memory against the ZeRO paper's closed forms, and its monotonicity."""

import itertools

import pytest

from costmodels.assignment import rank_layers, rank_params
from costmodels.convention import MEGATRON
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layout import Layout
from costmodels.memory import ShardedParams, held_state_bytes, state_bytes, zero_closed_form_bytes, zero_state_bytes
from costmodels.presets import load_model
from costmodels.rank_memory import rank_buffer_bytes
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from costmodels.runtimes import FSDP2


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n_d", [1, 8, 64])
def test_zero_stages_match_paper_closed_forms(stage, n_d):
    # Rajbhandari et al. SC'20, Fig. 1: 7.5B params, N_d = 64, K = 12 gives 120 / 31.4 / 16.6 / 1.9 GB.
    psi = 7.5e9
    sb = state_bytes(TrainingSpec(global_batch_size=1, seq_len=1, precision="fp16"), MEGATRON)  # the paper's fp16 Adam
    p, g, o = zero_state_bytes(ShardedParams(dense=psi, expert=0, trainable_dense=psi, trainable_expert=0), sb,
                               zero_stage=stage, shard_degree=n_d, expert_shard_degree=n_d, offload=False,
                               lora_param_bytes=2)
    assert p + g + o == pytest.approx(zero_closed_form_bytes(psi, n_d, stage))


def test_zero_paper_figure_1_numbers():
    figures_gb = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in figures_gb.items():
        assert zero_closed_form_bytes(7.5e9, 64, stage) / 1e9 == pytest.approx(gb, abs=0.06)


def _states(layout, model="llama2-7b", gpus=8):
    cm = CostModel(Job(model=load_model(model), training=TrainingSpec(global_batch_size=64, seq_len=2048),
                   cluster=make_cluster(load_node("a100-sxm-80gb"), gpus)))
    stage = cm.estimate(layout).peak_stage
    return stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes


def test_more_tp_or_zero_never_raises_model_state_memory():
    for tp, zero in itertools.product((1, 2, 4, 8), (0, 1, 2, 3)):
        dp = 8 // tp
        here = _states(Layout(dp=dp, tp=tp, zero_stage=zero if dp > 1 else 0, num_microbatches=64 // dp))
        if tp < 8:
            dp2 = 8 // (2 * tp)
            more_tp = _states(Layout(dp=dp2, tp=2 * tp, zero_stage=zero if dp2 > 1 else 0,
                                     num_microbatches=64 // dp2))
            assert more_tp <= here * (1 + 1e-9)
        if zero < 3 and dp > 1:
            assert _states(Layout(dp=dp, tp=tp, zero_stage=zero + 1, num_microbatches=64 // dp)) <= here


def test_lora_keeps_no_grads_or_optimizer_for_frozen_weights():
    model = load_model("llama2-7b")
    full = CostModel(Job(model=model, training=TrainingSpec(global_batch_size=8, seq_len=512), cluster=make_cluster(load_node("a100-sxm-80gb"), 1)))
    lora = CostModel(Job(model=model, training=TrainingSpec(global_batch_size=8, seq_len=512, lora_rank=16),
                     cluster=make_cluster(load_node("a100-sxm-80gb"), 1)))
    layout = Layout(num_microbatches=8)
    f, l = full.estimate(layout).peak_stage, lora.estimate(layout).peak_stage
    # LoRA on q, k, v, o with r = 16: 32 layers x 16 x (4096+4096) x 4 = 16.8M trainable params.
    trainable = 32 * 16 * (4096 + 4096) * 4
    assert l.grads_bytes == pytest.approx(4 * trainable)  # bf16: fp32 main_grad
    assert l.optimizer_bytes == pytest.approx(12 * trainable)
    assert l.params_bytes == pytest.approx(f.params_bytes + 2 * trainable)


def test_offload_moves_optimizer_states_off_the_device():
    layout = Layout(dp=8, zero_stage=1, num_microbatches=8, optimizer_offload=True)
    cm = CostModel(Job(model=load_model("llama2-7b"), training=TrainingSpec(global_batch_size=64, seq_len=2048),
                   cluster=make_cluster(load_node("a100-sxm-80gb"), 8)))
    breakdown = cm.estimate(layout)
    assert breakdown.peak_stage.optimizer_bytes == 0
    assert breakdown.offload_s > 0 and breakdown.optimizer_s == 0


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_torch_runtime_holds_fp32_shards_from_zero_1_on(precision):
    """FSDP2 (the torch runtime) keeps 4 B params + 4 B grads + 8 B AdamW per element, sharded by
    N_d at every ZeRO stage >= 1 and not at all at stage 0; the ZeRO paper's split differs."""
    psi, n_d = 7.5e9, 8
    params = ShardedParams(dense=psi, expert=0, trainable_dense=psi, trainable_expert=0)
    torch_run = TrainingSpec(global_batch_size=1, seq_len=1, precision=precision, runtime="torch")
    for stage in (0, 1, 2, 3):
        held = held_state_bytes(params, torch_run, FSDP2, zero_stage=stage, shard_degree=n_d, expert_shard_degree=n_d,
                                offload=False)
        divisor = n_d if stage else 1
        assert held == pytest.approx((4 * psi / divisor, 4 * psi / divisor, 8 * psi / divisor))
    megatron = TrainingSpec(global_batch_size=1, seq_len=1, precision="bf16")
    assert held_state_bytes(params, megatron, MEGATRON, zero_stage=1, shard_degree=n_d, expert_shard_degree=n_d,
                            offload=False) == pytest.approx((2 * psi, 4 * psi, 12 * psi / n_d))


def test_megatron_bf16_distributed_optimizer_holds_6_plus_12_over_d_bytes():
    # Megatron-Core distributed optimizer docs: bf16 params + fp32 main_grad = 6 + 12/d bytes per
    # parameter; fp16 params + fp16 grads keep 2 + 2 + 12/d here (ZeRO-1).
    psi, d = 1e9, 8
    params = ShardedParams(dense=psi, expert=0, trainable_dense=psi, trainable_expert=0)
    for precision, expected in (("bf16", 6 + 12 / d), ("fp8", 6 + 12 / d), ("fp16", 4 + 12 / d)):
        training = TrainingSpec(global_batch_size=1, seq_len=1, precision=precision)
        held = held_state_bytes(params, training, MEGATRON, zero_stage=1, shard_degree=d, expert_shard_degree=d,
                                offload=False)
        assert sum(held) / psi == pytest.approx(expected)
    assert state_bytes(TrainingSpec(global_batch_size=1, seq_len=1), MEGATRON).reduced == 4  # reduced in fp32 too


def _torch_cost_model():
    training = TrainingSpec(global_batch_size=16, seq_len=1024, runtime="torch")
    return CostModel(Job(model=load_model("llama2-7b"), training=training, cluster=make_cluster(load_node("h100-sxm-80gb"), 8),
                         convention=FSDP2))


@pytest.mark.parametrize("stage, pp, expected", [
    (1, 1, (0, False)), (2, 1, (1, True)), (3, 1, (2, True)),
    (1, 2, (0, False)), (2, 2, (0, False)), (3, 2, (2, False)),
])
def test_fsdp2_traffic_per_step_follows_the_launched_syncs(stage, pp, expected):
    """The cost model's data-parallel traffic per step under FSDP2 grows with the micro-batch
    count exactly as the launched job syncs: (all-gathers per micro-batch, 0 = one per step;
    reduce-scatter after every micro-batch?). ZeRO-1 reduces and reshards only after the last
    micro-batch, ZeRO-2 gathers once and reduces every micro-batch, ZeRO-3 gathers for forward and
    again for backward; with pp > 1 ``torch.distributed.pipelining`` defers every reduction (and
    the reshard after backward) to the step's end."""
    gathers_per_mb, reduce_per_mb = expected
    cm = _torch_cost_model()
    many, few = (cm.estimate(Layout(dp=2, tp=1, pp=pp, zero_stage=stage, num_microbatches=m, micro_batch_size=8 // m))
                 for m in (8, 4))
    gathered = many.comm_bytes_per_gpu["dp_all_gather"] / few.comm_bytes_per_gpu["dp_all_gather"]
    reduced = many.comm_bytes_per_gpu["dp_reduce_scatter"] / few.comm_bytes_per_gpu["dp_reduce_scatter"]
    assert gathered == pytest.approx(2.0 if gathers_per_mb else 1.0)
    assert reduced == pytest.approx(2.0 if reduce_per_mb else 1.0)
    if gathers_per_mb:
        once = cm.estimate(Layout(dp=2, tp=1, pp=pp, zero_stage=1, num_microbatches=8, micro_batch_size=1))
        assert many.comm_bytes_per_gpu["dp_all_gather"] == pytest.approx(
            gathers_per_mb * 8 * once.comm_bytes_per_gpu["dp_all_gather"])


@pytest.mark.parametrize("stage, per_microbatch", [(1, False), (2, True)])
def test_torch_runtime_reduce_scatters_zero_2_every_micro_batch(stage, per_microbatch):
    cm = _torch_cost_model()
    many = cm.estimate(Layout(dp=4, tp=1, pp=1, zero_stage=stage, num_microbatches=4, micro_batch_size=1))
    one = cm.estimate(Layout(dp=4, tp=1, pp=1, zero_stage=stage, num_microbatches=1, micro_batch_size=4))
    ratio = many.comm_bytes_per_gpu["dp_reduce_scatter"] / one.comm_bytes_per_gpu["dp_reduce_scatter"]
    assert ratio == pytest.approx(4.0 if per_microbatch else 1.0)


def test_torch_runtime_pipelined_stage_keeps_gathered_params_and_its_gradients():
    """With pp > 1 a ZeRO-2 stage holds its gathered bf16 params, its unsharded fp32 gradients and
    one receive buffer per micro-batch plus a send buffer (the first stage receives nothing)."""
    cm = _torch_cost_model()
    layout = Layout(dp=2, tp=1, pp=2, zero_stage=2, num_microbatches=8)
    ranks = rank_layers(cm, layout)
    received = 2 * 1024 * cm.model.hidden_size  # bf16 residual of one micro-batch
    for index, rank in enumerate(ranks):
        params = rank_params(cm, layout, rank)
        expected = 2 * params.dense + 4 * params.trainable_dense + (8 * index + 1) * received
        assert rank_buffer_bytes(cm, layout, rank, params) == pytest.approx(expected)


def test_job_takes_the_convention_of_its_runtime():
    """A torch-runtime job costed with the default (Megatron) convention is refused where it is
    built, naming the field and the fix; ``planner`` picks FSDP2 for ``runtime="torch"``, and the
    two conventions hold different model-state bytes for the same layout."""
    from autoplan_base.errors import SpecError
    from planner.api import resolve_job

    training = TrainingSpec(global_batch_size=16, seq_len=1024, runtime="torch")
    with pytest.raises(SpecError, match="training.runtime is 'torch'"):
        Job(model=load_model("llama2-7b"), training=training, cluster=make_cluster(load_node("h100-sxm-80gb"), 8))
    args = dict(model="llama2-7b", hardware="h100-sxm-80gb", gpus=8, global_batch=16, seq_len=1024)
    torch_job, megatron_job = resolve_job(**args, runtime="torch"), resolve_job(**args)
    assert torch_job.cost_job().convention is FSDP2 and megatron_job.cost_job().convention is MEGATRON
    layout = Layout(dp=8, tp=1, pp=1, zero_stage=1, num_microbatches=2, micro_batch_size=1)
    fsdp2_states = torch_job.cost_model().estimate(layout).peak_stage
    megatron_states = megatron_job.cost_model().estimate(layout).peak_stage
    assert fsdp2_states.params_bytes == pytest.approx(megatron_states.params_bytes / 8 * 2)  # fp32 shards vs bf16 whole


def test_megatron_deepspeed_keeps_bf16_grads_beside_the_fp32_accumulation():
    # DeepSpeed's pipeline engine copies each backward's bf16 grads into the fp32 buffer with
    # update_hp_grads(clear_lp_grads=False): bf16 params 2 + fp32 grads 4 + bf16 grads 2 = 8 bytes
    # per parameter before the optimizer (Megatron-LM: 6); only the fp32 copy is reduced.
    from costmodels.convention import DEEPSPEED

    bf16 = TrainingSpec(global_batch_size=1, seq_len=1, precision="bf16")
    ds, mg = state_bytes(bf16, DEEPSPEED), state_bytes(bf16, MEGATRON)
    assert (ds.param, ds.grad, ds.reduced, ds.optimizer) == (2, 6, 4, 12)
    assert (mg.param, mg.grad, mg.reduced) == (2, 4, 4)
    fp16 = TrainingSpec(global_batch_size=1, seq_len=1, precision="fp16")  # fp16: the ZeRO paper's 2 + 2 + 12
    assert state_bytes(fp16, DEEPSPEED) == state_bytes(fp16, MEGATRON)
    # ZeRO-1 over d = 4 on 1e9 parameters: 2 + 6 + 12/4 = 11 bytes each, against Megatron's 9.
    psi, d = 10**9, 4
    params = ShardedParams(dense=psi, expert=0, trainable_dense=psi, trainable_expert=0)
    held = held_state_bytes(params, bf16, DEEPSPEED, zero_stage=1, shard_degree=d, expert_shard_degree=d, offload=False)
    assert sum(held) == pytest.approx(11 * psi)


def test_megatron_deepspeed_adds_each_micro_batch_of_bf16_grads_into_fp32():
    # Llama 2 7B on one A100, bf16, 2 micro-batches, no data parallelism: the deepspeed step is
    # longer by 2 x 12 bytes x 6,738,415,616 parameters at 0.8 x 2.039 TB/s (read bf16, read and
    # write fp32, zero bf16 after each micro-batch's backward), and nothing else changes. (On an
    # A100 both runtimes' attention kernels are written for the part; on an H100 Megatron-DeepSpeed's
    # FlashAttention-2 would differ too.)
    import planner

    def step(runtime: str) -> float:
        return planner.evaluate(model="llama2-7b", hardware="a100-sxm-80gb", gpus=1, global_batch=2, seq_len=1024,
                                runtime=runtime, layout=planner.Layout(num_microbatches=2)).step_time_s

    psi = 6_738_415_616
    assert step("deepspeed") - step("megatron") == pytest.approx(2 * 12 * psi / (0.8 * 2.039e12), rel=1e-9)


def test_megatron_bridge_recipes_keep_a_bf16_gradient_buffer():
    # NeMo / Megatron-Bridge performance recipes set ddp.grad_reduce_in_fp32 = False: the
    # distributed optimizer holds bf16 params 2 + bf16 grads 2 + 12/d, reduced in bf16. On 1e9
    # parameters at d = 8: (4 + 1.5) GB, against Megatron's default (6 + 1.5) GB.
    from costmodels.convention import MEGATRON_BRIDGE

    bf16 = TrainingSpec(global_batch_size=1, seq_len=1, precision="bf16", runtime="megatron-bridge")
    sb = state_bytes(bf16, MEGATRON_BRIDGE)
    assert (sb.param, sb.grad, sb.reduced, sb.optimizer) == (2, 2, 2, 12)
    psi, d = 10**9, 8
    params = ShardedParams(dense=psi, expert=0, trainable_dense=psi, trainable_expert=0)
    held = held_state_bytes(params, bf16, MEGATRON_BRIDGE, zero_stage=1, shard_degree=d, expert_shard_degree=d,
                            offload=False)
    assert sum(held) == pytest.approx(5.5 * psi)


@pytest.mark.parametrize("model", ["llama2-7b", "tiny-llama"])
def test_one_micro_batch_under_set_to_none_holds_the_larger_of_activations_and_gradients(model):
    """costmodels.backward_peak: the torch job zeroes gradients with set_to_none, so a step of one
    micro-batch holds no gradient beside its activations at the loss backward, and every gradient
    at the optimizer step: at least params + optimizer + max(A, G) (+ buffers, overhead), and
    exactly G + the clip's fp32 square of the largest gradient (4 bytes per element) where the clip
    sets the peak. With two micro-batches the first one's gradients are held while the second runs:
    at least A + G. Megatron's persistent gradient buffer is held in both, A + G exactly."""
    cluster = make_cluster(load_node("a100-sxm-80gb"), 1)
    for convention, runtime in ((FSDP2, "torch"), (MEGATRON, "megatron")):
        for seq_len in (128, 2048):  # activations below and above the gradients
            training = TrainingSpec(global_batch_size=2, seq_len=seq_len, runtime=runtime)
            spec = load_model(model)
            cm = CostModel(Job(model=spec, training=training, cluster=cluster, convention=convention))
            for m in (1, 2):
                stage = cm.estimate(Layout(num_microbatches=m)).peak_stage
                grads = stage.grads_bytes + stage.grads_freed_bytes
                assert grads > 0
                rest = stage.total_bytes - stage.params_bytes - stage.optimizer_bytes - stage.buffers_bytes \
                    - stage.overhead_bytes
                activations = stage.schedule_activations_bytes
                if runtime == "torch" and m == 1:
                    assert rest >= max(activations, grads) * (1 - 1e-12)
                    if stage.peak_phase == "clip":
                        largest = max(spec.vocab_size, spec.ffn_hidden_size, spec.q_dim) * spec.hidden_size
                        assert rest == pytest.approx(grads + 4 * largest)
                elif runtime == "torch":
                    assert stage.grads_freed_bytes == 0
                    assert rest >= (activations + grads) * (1 - 1e-12)
                else:
                    assert stage.grads_freed_bytes == 0
                    assert rest == pytest.approx(activations + grads)


def test_buffers_are_split_by_parallelism_and_the_table_names_the_split():
    """``buffers`` sums its named parts (data parallel, tensor parallel, pipeline), which the plan
    JSON carries as ``buffers_gib`` and the table prints under the memory column. Under torchtitan
    with pp, FSDP defers the gradient reduce-scatter to the last micro-batch, so the unsharded
    gradients and parameters are the data-parallel part, and send/receive buffers the pipeline part."""
    import json as _json

    from click.testing import CliRunner

    import planner
    from planner.cli import main

    kwargs = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=16, seq_len=4096)
    L = planner.Layout(dp=2, tp=2, pp=2, zero_stage=2, sequence_parallel=True, num_microbatches=8)
    b = planner.evaluate(layout=L, runtime="torchtitan", **kwargs)
    stage = b.peak_stage
    parts = dict(stage.buffer_parts)
    assert set(parts) == {"data_parallel", "tensor_parallel", "pipeline"}
    assert sum(parts.values()) == pytest.approx(stage.buffers_bytes)
    assert min(parts.values()) > 0
    doc = b.predicted_dict()
    assert doc["buffers_gib"] == {k: pytest.approx(v / 2**30, rel=1e-5) for k, v in parts.items()}
    plain = planner.evaluate(layout=planner.Layout(dp=8, num_microbatches=2), **kwargs).predicted_dict()
    assert set(plain["buffers_gib"]) == {"data_parallel"}  # dp 8 ZeRO-0: its gradient buckets only
    args = ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "16",
            "--seq-len", "4096", "--dp", "2", "--tp", "2", "--pp", "2", "--zero", "2", "--runtime", "torchtitan"]
    table = CliRunner().invoke(main, args).output
    assert "  buffers: data parallel " in table and " GiB" in table.split("  buffers: ")[1].splitlines()[0]
    assert _json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)["predicted"]["buffers_gib"]
