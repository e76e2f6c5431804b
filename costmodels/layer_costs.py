"""Forward-pass costs of one transformer layer on one rank, for one micro-batch.

Backward is derived from these (2× compute, same communication) by ``estimate``.
Communication per layer (forward): Megatron TP (Shoeybi et al. 2019, Sec. 3) all-reduces the
B·b·s·h block output twice (attention and MLP), or with sequence parallelism (Korthikanti et al.
2022, Sec. 4.2.2) all-gathers and reduce-scatters it twice; ring attention (Liu et al. 2023)
passes each rank's K and V blocks around the cp ring in cp - 1 steps, each overlapping one
block of the attention core and slowing it (``overlap.ring_exposed_s``),
while the all-gather variant (Llama 3, Dubey et al. 2024, Sec. 3.3.2;
``TrainingSpec.context_attention``) gathers K and V of the whole sequence before the core and
reduce-scatters their gradients after it, both exposed; MoE layers (GShard, Lepikhin et al. 2020) all-to-all the routed
tokens twice (dispatch, combine) over the ep group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hardware_specs.schema import ClusterSpec

from .activations import ActivationShape
from .assumptions import Assumptions
from .collectives import bytes_sent_per_rank, collective_time_and_source
from .collectives_tp_overlap import (RING_EXCHANGE_SM_SHARE, RS_PIPELINE_SPLITS, decomposition_s,
                                     pipelined_reduce_scatter_s, ring_exchange_all_gather_s)
from .compute import Rates, merge_source
from .convention import RuntimeConvention
from .flops import (Gemm, kv_per_rank, attention_core_flops, attention_executed_fraction,
                    attention_gemms, lora_flops, mean_window_fraction, mla_up_gemms, mlp_gemms)
from .eager_elementwise import eager_layer_extra_bytes
from .moe_costs import (expert_exchange, expert_sort_bytes, moe_permute_bytes, per_expert_kernels_s,
                        ring_steps, routed_copies)
from .moe_dispatch import dispatch, ep_group_stride
from .precision import saved_gemm_input_bytes
from .model_spec import ModelSpec
from .overlap import ring_exposed_s
from .training import TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerKey:
    """Everything a layer's forward cost depends on besides the specs."""

    moe: bool
    b: int
    s_local: int
    tp: int
    sp: bool
    cp: int
    ep: int
    """Expert-parallel degree (1 for dense layers, whose cost does not depend on it)."""
    etp: int = 0
    """Expert tensor-parallel degree (Megatron ``--expert-tensor-parallel-size``); 0 = ``tp``."""
    tp_overlap: bool = False
    """``Layout.tp_comm_overlap``: the SP collectives overlap their GEMMs (``_tp_overlapped_s``)."""
    dispatcher: str = "alltoall"
    """``Layout.moe_dispatcher`` of a MoE layer: how its tokens cross the ep group (``moe_dispatch``)."""


@dataclass(slots=True, kw_only=True)
class LayerForward:
    """Forward-pass cost of one layer on one rank for one micro-batch."""

    gemm_s: float = 0.0
    """Weight GEMMs (projections, MLP, experts) and LoRA adapters."""
    gemm_dgrad_s: float = 0.0
    """Their backward's input-gradient GEMMs (``compute.backward_gemms``)."""
    gemm_wgrad_s: float = 0.0
    """Their backward's weight-gradient GEMMs, for the weights that train (under LoRA the adapters
    only: the frozen weights need no gradient)."""
    attention_core_s: float = 0.0
    attention_core_bwd_s: float = 0.0
    """Backward of the attention core (``compute.Rates.attention_backward_s``)."""
    mla_up_s: float = 0.0
    """Of ``gemm_s``, MLA's up-projections (rerun in backward under selective recomputation)."""
    memory_s: float = 0.0
    """Memory-bound kernels (norms, residuals, activations, rotary, softmax if eager)."""
    cast_s: float = 0.0
    """Low-precision recipes: forward cast kernels quantising GEMM inputs and weights
    (``PrecisionRecipe.cast_bytes``)."""
    cast_bwd_s: float = 0.0
    """Low-precision recipes: backward cast kernels quantising the output gradients."""
    attention_core_memory_s: float = 0.0
    """Of ``memory_s``, the eager softmax/dropout traffic (recomputed by selective recompute)."""
    tp_s: float = 0.0
    cp_s: float = 0.0
    """Forward K/V exchange left exposed (ring: after overlapping with the attention core,
    ``overlap.ring_exposed_s``; all-gather: all of it)."""
    cp_bwd_s: float = 0.0
    """Backward K/V (and K/V gradient) exchange left exposed."""
    cp_total_s: float = 0.0
    ep_s: float = 0.0
    host_s: float = 0.0
    """Host time to issue the layer's forward (``Assumptions.layer_overhead_s``; ``tp_layer_overhead_s`` for a
    DTensor-parallel layer, ``RuntimeConvention.dtensor_tensor_parallel``)."""
    host_runs_ahead: bool = True
    """The device queues kernels while the host issues the next ones (CUDA/ROCm streams): the layer
    takes the longer of its kernels and its host time, a launch-bound floor. False on a CPU, where
    the host runs the kernels itself and the two add."""
    sync_s: float = 0.0
    """Host time a device-to-host sync in the forward leaves the device idle (``moe_sync_s``); the
    backward reuses the counts it fetched, so it pays none."""
    comm_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes sent per rank in forward, by collective."""
    bwd_comm_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes sent per rank in backward where they differ from forward (absent: the same)."""
    flops: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)
    """Where each term's rate came from: ``compute``, ``attention`` and ``<axis>_comm``."""

    @property
    def device_s(self) -> float:
        """Kernel time of the forward: GEMMs, attention core, memory-bound kernels and casts."""
        return self.gemm_s + self.attention_core_s + self.memory_s + self.cast_s

    @property
    def compute_s(self) -> float:
        return issue_bound_s(self.device_s, self.host_s, self.host_runs_ahead) + self.sync_s


_COMPUTE_FIELDS = ("flops", "gemm_s", "gemm_dgrad_s", "gemm_wgrad_s", "cast_s", "cast_bwd_s", "mla_up_s",
                   "attention_core_s", "attention_core_bwd_s", "attention_core_memory_s")
"""The ``LayerForward`` fields ``LayerCosts._compute`` sets: the GEMMs and the attention core."""


def issue_bound_s(device_s: float, host_s: float, host_runs_ahead: bool) -> float:
    """Seconds of a pass whose kernels take ``device_s`` and whose host issue takes ``host_s``.

    With asynchronous launches the host enqueues kernels ahead of the device, so the pass lasts
    max(device, host): small layers are launch-bound, large ones hide the host entirely (the
    CPU-launch-overhead regime of PyTorch eager mode, Paszke et al., NeurIPS 2019, Sec. 5.3; it is
    what CUDA graphs remove). Where host and device are one (a CPU), they add."""
    return max(device_s, host_s) if host_runs_ahead else device_s + host_s


def moe_sync_s(assumptions: Assumptions) -> float:
    """Seconds one MoE layer's forward leaves the device idle at its host sync.

    The training token dispatchers copy the per-expert token counts to the host, which needs
    them as the all-to-all split sizes and the grouped GEMM's row splits (Megatron-LM
    ``megatron/core/transformer/moe/token_dispatcher.py``; its inference dispatchers keep them on
    the device precisely to avoid that sync). The host waits for the device there, so the
    kernels of the rest of the layer are issued with the device already drained: the host's
    issue time up to the point where it runs ahead again is exposed, once per MoE layer forward
    (and its recomputation). ``Assumptions.moe_sync_overhead_s``, fitted on the published runs.
    """
    return assumptions.moe_sync_overhead_s


class LayerCosts:
    """Memoised per-layer forward costs for one (model, training, cluster, profile).

    The memos map inputs to values (and their sources); nothing else survives a call."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, rates: Rates,
                 profile: object, assumptions: Assumptions, *, convention: RuntimeConvention) -> None:
        self.model, self.training, self.cluster = model, training, cluster
        self.convention = convention
        self.rates, self.profile, self.assumptions = rates, profile, assumptions
        self.on_accelerator = cluster.hardware.device_type != "cpu"
        """A GPU: fused kernels as CUDA runs them, and a host that queues kernels ahead of the device."""
        self._memo: dict[LayerKey, LayerForward] = {}
        self._compute_memo: dict[tuple, LayerForward] = {}
        """``_add_compute``'s parts, by what they read."""
        self._collective_memo: dict[tuple, tuple[float, float]] = {}

    def shape(self, key: LayerKey) -> ActivationShape:
        fused = self.training.attention == "fused"
        gathered = key.s_local * (key.cp - 1) if self.training.context_attention == "all_gather" else 0
        return ActivationShape(b=key.b, s=key.s_local, s_kv=key.s_local if fused else key.s_local * key.cp,
                               gathered_kv=gathered,
                               tp=key.tp, sequence_parallel=key.sp, elem_bytes=self.rates.elem_bytes,
                               fused_attention=fused, eager=self.convention.eager_activations, expert_tp=key.etp,
                               loss_parallel=self.convention.loss_parallel,
                               fused_loss=self.convention.fused_cross_entropy and not self.convention.eager_activations,
                               fused_rms_norm=self.on_accelerator,
                               gemm_input_bytes=0.0 if self.convention.eager_activations else saved_gemm_input_bytes(
                                   self.training.recipe, self.convention, self.rates.elem_bytes))

    def forward(self, key: LayerKey) -> LayerForward:
        cached = self._memo.get(key)
        if cached is None:
            cached = self._forward(key)
            self._memo[key] = cached
        return cached

    def tp_s(self, key: LayerKey) -> float:
        """``forward(key).tp_s`` without the rest of the forward: the TP time alone (``_add_tp``
        reads nothing else of the layer), for a caller that only compares it."""
        cached = self._memo.get(key)
        if cached is not None:
            return cached.tp_s
        out = LayerForward()
        self._add_tp(out, key, key.b * key.s_local)
        return out.tp_s

    def collective(self, op: str, size_bytes: float, degree: int, stride: int) -> tuple[float, float, str]:
        """(seconds, bytes sent per rank, source of the rate) of one collective."""
        key = (op, size_bytes, degree, stride)
        cached = self._collective_memo.get(key)
        if cached is None:
            seconds, source = collective_time_and_source(op, size_bytes, degree, stride, self.cluster,
                                                         self.profile, self.assumptions)  # type: ignore[arg-type]
            cached = (seconds, bytes_sent_per_rank(op, size_bytes, degree), source)
            self._collective_memo[key] = cached
        return cached

    def _forward(self, key: LayerKey) -> LayerForward:
        model, rates = self.model, self.rates
        out = LayerForward()
        tokens = key.b * key.s_local
        self._add_compute(out, key, tokens)
        out.memory_s = rates.memory_time_s(self._memory_bound_bytes(key) + self._eager_bytes(key)) \
            + out.attention_core_memory_s
        dtensor = key.tp > 1 and self.convention.dtensor_tensor_parallel
        out.host_runs_ahead = self.on_accelerator
        out.host_s = self._host_s(dtensor, out.host_runs_ahead)
        self._add_tp(out, key, tokens)
        self._add_cp(out, key)
        if key.moe and (key.ep > 1 or key.tp > 1):
            self._add_ep(out, key, tokens)
        if key.moe:
            out.sync_s = moe_sync_s(self.assumptions)
        return out

    def _add_compute(self, out: LayerForward, key: LayerKey, tokens: int) -> None:
        """The layer's GEMMs and attention core (``_COMPUTE_FIELDS``, with their sources), kept by what
        they read: not TP overlap, the dispatcher or sequence parallelism (but under MLA, whose
        down-projections run on the 1/tp sequence share), so twins that differ only in those (the
        search bounds SP on and off and the overlap twins side by side) share them."""
        compute_key = (key.moe, key.b, key.s_local, key.tp, key.cp, key.ep, key.etp,
                       key.sp and self.model.mla is not None)
        part = self._compute_memo.get(compute_key)
        if part is None:
            part = self._compute_memo[compute_key] = self._compute(key, tokens)
        for name in _COMPUTE_FIELDS:
            setattr(out, name, getattr(part, name))
        out.sources.update(part.sources)

    def _compute(self, key: LayerKey, tokens: int) -> LayerForward:
        """``_COMPUTE_FIELDS`` of the layer, and the sources of their rates (``compute``, ``attention``)."""
        model, rates = self.model, self.rates
        out = LayerForward()
        gemms = attention_gemms(model, tokens, key.tp, key.sp) + self._mlp_gemms(key, tokens)
        experts = self._expert_gemms(key, tokens)
        high = self._router_gemms(key, tokens)
        out.flops = sum(g.flops for g in gemms + experts + high)
        frozen = self.training.is_lora
        adapters = []
        if frozen:
            out.flops += lora_flops(model, tokens, self.training.lora_rank, self.training.lora_targets, key.tp)
            adapters.append(Gemm(m=tokens, n=self.training.lora_rank, k=model.hidden_size,
                                 count=2 * len(self.training.lora_targets)))
        self._add_gemms(out, gemms, high_precision=False, trains=not frozen)
        self._add_gemms(out, experts, high_precision=False, trains=not frozen,
                        expert_kernels=self.convention.kernel_per_expert)
        self._add_gemms(out, high, high_precision=True, trains=not frozen)
        self._add_gemms(out, adapters, high_precision=True, trains=True)
        if model.mla is not None:
            out.mla_up_s = sum(rates.gemm_time_and_source(g)[0] for g in mla_up_gemms(model, tokens, key.tp))
        window = mean_window_fraction(model, key.s_local * key.cp)
        core_flops = attention_core_flops(model, key.b, key.s_local, key.s_local * key.cp, key.tp) * window
        fused = self.training.attention == "fused"
        # a fused kernel skips the tiles outside the window; eager attention computes every score
        executed = attention_executed_fraction(fused) if fused else attention_executed_fraction(fused) / window
        out.attention_core_s, out.sources["attention"] = rates.attention_time_and_source(
            core_flops, b=key.b, s=key.s_local, heads=model.num_attention_heads // key.tp, head_dim=model.d_head,
            s_kv_block=key.s_local, executed_fraction=executed)
        out.attention_core_bwd_s = rates.attention_backward_s(out.attention_core_s, out.sources["attention"], fused=fused)
        out.flops += core_flops
        out.attention_core_memory_s = rates.memory_time_s(self._eager_core_bytes(key))
        return out

    def _add_gemms(self, out: LayerForward, gemms: list[Gemm], *, high_precision: bool, trains: bool,
                   expert_kernels: bool = False) -> None:
        """GEMM time forward and backward (input gradient; weight gradient where ``trains``) and,
        for the low-precision ones, the recipe's cast kernels (memory-bound); ``expert_kernels``:
        each of a GEMM's ``count`` copies is its own kernel, costing at least
        ``Assumptions.expert_gemm_min_s`` (``moe_costs.per_expert_kernels_s``)."""
        rates, recipe = self.rates, self.training.recipe
        floor = self.assumptions.expert_gemm_min_s
        for g in gemms:
            seconds, source = rates.gemm_time_and_source(g, high_precision=high_precision)
            dgrad_s, wgrad_s, _ = rates.backward_time_and_source(g, high_precision=high_precision)
            if expert_kernels:
                seconds, dgrad_s, wgrad_s = (per_expert_kernels_s(t, g.count, floor) for t in (seconds, dgrad_s, wgrad_s))
            out.gemm_s += seconds
            out.gemm_dgrad_s += dgrad_s
            out.gemm_wgrad_s += wgrad_s if trains else 0.0
            merge_source(out.sources, "compute", source)
            if rates.low_precision and not high_precision:
                fwd, bwd = recipe.cast_bytes(g.m, g.n, g.k)
                out.cast_s += rates.memory_time_s(fwd * g.count)
                out.cast_bwd_s += rates.memory_time_s(bwd * g.count)

    def _router_gemms(self, key: LayerKey, tokens: int) -> list[Gemm]:
        """The MoE router's logits GEMM, kept in 16 bits by every low-precision recipe."""
        moe = self.model.moe
        if not key.moe or moe is None:
            return []
        return [Gemm(m=tokens, n=moe.num_experts, k=self.model.hidden_size)]

    def _mlp_gemms(self, key: LayerKey, tokens: int) -> list[Gemm]:
        """The dense MLP, or a MoE layer's shared experts (tp-split like a dense MLP)."""
        model = self.model
        if not key.moe:
            return mlp_gemms(model, tokens, model.ffn_hidden_size, key.tp)
        moe = model.moe
        assert moe is not None
        return mlp_gemms(model, tokens, moe.shared_ffn_hidden_size, key.tp) if moe.num_shared_experts else []

    def _routed_copies(self, key: LayerKey) -> float:
        """Expert-input rows per token (``moe_costs.routed_copies``); with fixed slots a routing
        group is a sequence as the rank holds it (gathered over tp): s/cp tokens."""
        return routed_copies(self.model, key.s_local, fixed_slots=self.convention.moe_fixed_slots)

    def _expert_gemms(self, key: LayerKey, tokens: int) -> list[Gemm]:
        """A MoE layer's routed experts: E/ep local experts, each on its share of the routed rows."""
        moe = self.model.moe
        if not key.moe or moe is None:
            return []
        local_experts = moe.num_experts // key.ep
        etp = key.etp or key.tp
        # an expert tp group of etp ranks serves the tokens of etp of the tp ranks (each routes its
        # own sequence shard under SP), so per rank: tokens · k · etp/tp rows, f/etp columns
        routed_tokens = tokens * self._routed_copies(key) * etp / key.tp
        per_expert = max(1, round(routed_tokens / local_experts))
        return [Gemm(m=g.m, n=g.n, k=g.k, count=local_experts)
                for g in mlp_gemms(self.model, per_expert, moe.expert_ffn_hidden_size, etp)]

    def _memory_bound_bytes(self, key: LayerKey) -> float:
        """Reads + writes of one layer's memory-bound kernels in forward (bytes).

        Two norms (read, write) = 4, two residual adds (2 reads, 1 write) = 6, in units of
        B·tokens·h·r; the activation function reads 2f (gated) or f and writes f per token;
        rotary reads and writes q and k; each of 3 dropouts reads, writes and stores a mask.
        """
        model, B = self.model, self.rates.elem_bytes
        tokens = key.b * key.s_local
        r = 1 / key.tp if key.sp else 1.0
        block = B * tokens * model.hidden_size * r
        ffn = model.ffn_hidden_size
        permute = 0.0
        if key.moe and model.moe is not None:
            copies = self._routed_copies(key)
            ffn = model.moe.expert_ffn_hidden_size * copies
            routed = tokens if self.convention.moe_gathers_sequence else tokens * r  # expert_exchange
            permute = moe_permute_bytes(model, routed, B, copies) + expert_sort_bytes(
                model, routed, B, local_experts=model.moe.num_experts // key.ep, ep=key.ep, copies=copies)
        act = B * tokens * ffn / key.tp * (3 if model.gated_mlp else 2)
        return 10 * block + act + self._rotary_bytes(key) + (3 * 2.5 * block if model.dropout else 0.0) + permute

    def _host_s(self, dtensor: bool, host_runs_ahead: bool) -> float:
        """Host time to issue one layer's forward (``LayerForward.host_s``). On a GPU it is charged
        to eager PyTorch layers only (``RuntimeConvention.fused_elementwise`` false, not compiled:
        an operator a kernel, about 200 kernels per layer per step in the H100 trace of the
        generated job, ``benchmarks/data/gpu/trace``); Megatron's fused Transformer Engine layers
        issue a few kernels each, and its published runs fit no such floor
        (``benchmarks/calibrate.py``). On a CPU every runtime's host time adds."""
        eager = not self.convention.fused_elementwise and not self.training.compiled
        if host_runs_ahead and not eager:
            return 0.0
        return self.assumptions.layer_overhead_s + (self.assumptions.tp_layer_overhead_s if dtensor else 0.0)

    def _eager_bytes(self, key: LayerKey) -> float:
        """Extra traffic of eager elementwise ops (``eager_elementwise.eager_layer_extra_bytes``) when
        the runtime runs them eagerly (``RuntimeConvention.fused_elementwise`` false) and the job is
        not compiled (``TrainingSpec.compiled``); 0 otherwise."""
        if self.convention.fused_elementwise or self.training.compiled:
            return 0.0
        model, B = self.model, self.rates.elem_bytes
        tokens = key.b * key.s_local
        ffn = model.ffn_hidden_size
        if key.moe and model.moe is not None:
            ffn = model.moe.expert_ffn_hidden_size * model.moe.top_k * model.moe.busiest_token_factor
        return eager_layer_extra_bytes(
            tokens=tokens, norm_width=model.hidden_size / (key.tp if key.sp else 1), ffn_width=ffn / key.tp,
            qk_width=self._rotary_bytes(key) / (2 * B * tokens), gated=model.gated_mlp,
            rotary=model.positions == "rotary", elem_bytes=B,
            fused_norm=model.norm == "layernorm" or self.on_accelerator)

    def _rotary_bytes(self, key: LayerKey) -> float:
        """Rotary embedding reads and writes q and k (MLA: the a/t·d_h^R rotary query part and
        the one shared d_h^R rotary key)."""
        model, tokens = self.model, key.b * key.s_local
        if model.positions != "rotary":
            return 0.0
        if model.mla is not None:
            rope = model.mla.qk_rope_head_dim
            return 2 * self.rates.elem_bytes * tokens * rope * (model.num_attention_heads / key.tp + 1)
        return 2 * self.rates.elem_bytes * tokens * (model.q_dim / key.tp + kv_per_rank(model, key.tp))

    def _eager_core_bytes(self, key: LayerKey) -> float:
        """Eager attention: the softmax reads and writes the b·(a/t)·s·s_kv scores (and dropout)."""
        if self.training.attention == "fused":
            return 0.0
        x = self.shape(key)
        scores = x.b * self.model.num_attention_heads / x.tp * x.s * x.s_kv * x.elem_bytes
        return scores * (4 if self.model.dropout else 2)

    def _add_tp(self, out: LayerForward, key: LayerKey, tokens: int) -> None:
        """Two all-reduces of the block output, or with SP two all-gathers and two reduce-scatters;
        MLA under SP gathers its latents (d_c' + d_c + d_h^R wide) after the down-projections
        instead of the attention input (Megatron-Core's MLA). A MoE block's pair is
        ``_moe_block_tp_collectives``."""
        if key.tp == 1:
            return
        size = self.rates.elem_bytes * tokens * self.model.hidden_size
        gathers, scatters = self._moe_block_tp_collectives(key) if key.moe else (1, 1)
        if key.sp:
            ag_s, ag_b, ag_source = self.collective("all_gather", size, key.tp, 1)
            rs_s, rs_b, rs_source = self.collective("reduce_scatter", size, key.tp, 1)
            merge_source(out.sources, "tp_comm", ag_source)
            merge_source(out.sources, "tp_comm", rs_source)
            attn_s, attn_b = ag_s, ag_b
            m = self.model.mla
            if m is not None:
                latent = self.rates.elem_bytes * tokens * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
                attn_s, attn_b, _ = self.collective("all_gather", latent, key.tp, 1)
            out.tp_s = attn_s + gathers * ag_s + (1 + scatters) * rs_s
            if key.tp_overlap:
                out.tp_s = self._tp_overlapped_s(key, tokens, size, ag_s, attn_s, rs_s, gathers, scatters)
            out.comm_bytes = {"tp_all_gather": attn_b + gathers * ag_b, "tp_reduce_scatter": (1 + scatters) * rs_b}
        else:
            ar_s, ar_b, out.sources["tp_comm"] = self.collective("all_reduce", size, key.tp, 1)
            out.tp_s = (1 + scatters) * ar_s
            out.comm_bytes = {"tp_all_reduce": (1 + scatters) * ar_b}

    def _moe_block_tp_collectives(self, key: LayerKey) -> tuple[int, int]:
        """(all-gathers, reduce-scatters or all-reduces) of the B·tokens·h block activation a MoE
        block adds to its attention's tp pair. Megatron-Core under SP: none, as the dispatcher
        all-to-alls each rank's own sequence shard (``moe_costs.expert_exchange``), but a shared
        expert gathers its input and reduce-scatters its output like a dense MLP
        (``SharedExpertMLP``); without SP the dense count is kept. The generated job
        (``RuntimeConvention.moe_gathers_sequence``): under SP the input gather, and the output is
        sliced back locally; without SP nothing, as the experts' all-reduce (counted with ep)
        leaves every tp rank the whole output."""
        moe = self.model.moe
        assert moe is not None
        if self.convention.moe_gathers_sequence:
            return (1 if key.sp else 0), 0
        if not key.sp or moe.num_shared_experts:
            return 1, 1
        return 0, 0

    def _tp_overlapped_s(self, key: LayerKey, tokens: int, size: float, ag_s: float, latent_s: float,
                         rs_s: float, moe_gathers: int, moe_scatters: int) -> float:
        """Forward TP time of a layer whose SP collectives overlap their GEMMs
        (``collectives_tp_overlap``): each block's all-gather by ring exchange with the
        column-parallel GEMM on its output (QKV, FC1; slowing it by ``RING_EXCHANGE_SM_SHARE`` of
        ``overlap_slowdown``, its copy-engine transfers taking one SM), each reduce-scatter pipelined
        with the row-parallel GEMM producing it (output projection, FC2; ``overlap_slowdown``), plus
        the decomposition's cost.
        Overlapped where Transformer Engine's linear layers carry the block: the attention block
        without MLA (Megatron-Core's MLA gathers latents, ``latent_s``, outside those layers) and the
        MLP of a dense layer (MoE layers route through the token dispatcher); the rest stays
        exposed: a MoE block's ``moe_gathers`` all-gathers and ``moe_scatters`` reduce-scatters
        (``_moe_block_tp_collectives``). Backward repeats it, as it repeats the plain collectives (TE overlaps the
        backward's all-gathers by ring exchange and its dgrad/wgrad pairs in bulk)."""
        model, tp, sigma = self.model, key.tp, self.assumptions.overlap_slowdown
        pairs, plain_s = [], 0.0
        if model.mla is None:
            pairs.append(attention_gemms(model, tokens, tp))
        else:
            plain_s += latent_s + rs_s
        if not key.moe:
            pairs.append(mlp_gemms(model, tokens, model.ffn_hidden_size, tp))
        else:
            plain_s += moe_gathers * ag_s + moe_scatters * rs_s
        rs_chunk_s = self.collective("reduce_scatter", size / RS_PIPELINE_SPLITS, tp, 1)[0]
        for column, row in pairs:
            col_whole, col_chunk = self._gemm_s(column, 1), self._gemm_s(column, tp)
            row_whole, row_chunk = self._gemm_s(row, 1), self._gemm_s(row, RS_PIPELINE_SPLITS)
            plain_s += (ring_exchange_all_gather_s(ag_s, col_chunk, tp, RING_EXCHANGE_SM_SHARE * sigma)
                        + decomposition_s(col_chunk, tp, col_whole)
                        + pipelined_reduce_scatter_s(rs_chunk_s, row_chunk, RS_PIPELINE_SPLITS, sigma)
                        + decomposition_s(row_chunk, RS_PIPELINE_SPLITS, row_whole))
        return plain_s

    def _gemm_s(self, gemm: Gemm, chunks: int) -> float:
        """Seconds of one of ``chunks`` row chunks of ``gemm`` (m/chunks rows, at least one)."""
        part = Gemm(m=max(1, gemm.m // chunks), n=gemm.n, k=gemm.k, count=gemm.count)
        return self.rates.gemm_time_and_source(part)[0]

    def _cp_block_bytes(self, key: LayerKey) -> float:
        """The K and V a context-parallel rank holds of one micro-batch (bytes)."""
        return 2 * self.rates.elem_bytes * key.b * key.s_local * kv_per_rank(self.model, key.tp)

    def cp_floor_s(self, key: LayerKey) -> float:
        """At most the layer's attention core plus its exposed CP exchange, forward and backward
        (seconds), from the exchange's collectives alone, without the attention core.

        Ring: with c one transfer, C = core/(steps + 1) one block's compute and h = min(c, C), the
        forward's exposed time is steps·(c − h + σ·h) (``overlap.ring_exposed_s``) and its core is
        (steps + 1)·C >= steps·h, so the two add to at least steps·c; backward, with transfers of
        2c, to at least 2·steps·c. All-gather: both collectives are exposed whole. ``_add_layers``
        adds the core to the pass's device time (never below it) and the exposed time to the
        rank's CP time, so a rank's core per micro-batch is at least this for every layer it holds."""
        if key.cp == 1:
            return 0.0
        block = self._cp_block_bytes(key)
        if self.training.context_attention == "all_gather":
            return (self.collective("all_gather", key.cp * block, key.cp, key.tp)[0]
                    + self.collective("reduce_scatter", key.cp * block, key.cp, key.tp)[0])
        step_s = self.collective("send_recv", block, key.cp, key.tp)[0]
        return 3 * ring_steps(self.model, key.cp, key.s_local) * step_s

    def _add_cp(self, out: LayerForward, key: LayerKey) -> None:
        if key.cp == 1:
            return
        block = self._cp_block_bytes(key)
        if self.training.context_attention == "all_gather":
            self._add_cp_all_gather(out, key, block)
            return
        step_s, step_b, out.sources["cp_comm"] = self.collective("send_recv", block, key.cp, key.tp)
        steps, a = ring_steps(self.model, key.cp, key.s_local), self.assumptions
        blocks = steps + 1  # the local block and one per ring step (fewer under a sliding window)
        out.cp_total_s = steps * step_s
        out.cp_s = ring_exposed_s(step_s, out.attention_core_s / blocks, steps, a)
        out.cp_bwd_s = ring_exposed_s(2 * step_s, out.attention_core_bwd_s / blocks, steps, a)
        out.comm_bytes["cp_send_recv"] = steps * step_b
        out.bwd_comm_bytes["cp_send_recv"] = 2 * steps * step_b

    def _add_cp_all_gather(self, out: LayerForward, key: LayerKey, block: float) -> None:
        """Llama 3 (Dubey et al. 2024, Sec. 3.3.2): forward all-gathers the K/V blocks of all cp ranks
        (a cp·block buffer, of which each rank sends its own block to cp - 1 peers: (cp-1)/cp of
        the sequence), backward reduce-scatters the K/V gradients of the same size. Neither
        overlaps the attention core, which waits for the gathered K/V (and its backward produces
        the gradients to scatter), so both are exposed."""
        size = key.cp * block
        ag_s, ag_b, ag_source = self.collective("all_gather", size, key.cp, key.tp)
        rs_s, rs_b, rs_source = self.collective("reduce_scatter", size, key.cp, key.tp)
        merge_source(out.sources, "cp_comm", ag_source)
        merge_source(out.sources, "cp_comm", rs_source)
        out.cp_total_s = out.cp_s = ag_s
        out.cp_bwd_s = rs_s
        out.comm_bytes["cp_all_gather"] = ag_b
        out.bwd_comm_bytes |= {"cp_all_gather": 0.0, "cp_reduce_scatter": rs_b}

    def _add_ep(self, out: LayerForward, key: LayerKey, tokens: int) -> None:
        """Dispatch and combine all-to-alls over the ep group and the expert-tp collectives around
        the experts, sized as the runtime runs them (``moe_costs.expert_exchange``)."""
        moe = self.model.moe
        if moe is None:
            return
        etp = key.etp or key.tp
        gathered = self.convention.moe_gathers_sequence
        x = expert_exchange(self.model, tokens, self.rates.elem_bytes, tp=key.tp, sp=key.sp, etp=etp,
                            gathers_sequence=gathered, copies=self._routed_copies(key))
        if key.ep > 1:
            stride = ep_group_stride(tp=key.tp, cp=key.cp, etp=etp, gathers_sequence=gathered)
            a2a_s, a2a_b, out.sources["ep_comm"] = dispatch(
                key.dispatcher, x.all_to_all_bytes, self._routed_copies(key), key.ep, stride, self.cluster,
                self.assumptions, self.collective)
            out.ep_s += 2 * a2a_s
            out.comm_bytes["ep_all_to_all"] = 2 * a2a_b
        if x.expert_tp_gather_bytes:
            ag_s, ag_b, ag_source = self.collective("all_gather", x.expert_tp_gather_bytes, etp, 1)
            rs_s, rs_b, rs_source = self.collective("reduce_scatter", x.expert_tp_gather_bytes, etp, 1)
            merge_source(out.sources, "ep_comm", ag_source)
            merge_source(out.sources, "ep_comm", rs_source)
            out.ep_s += ag_s + rs_s
            out.comm_bytes |= {"ep_all_gather": ag_b, "ep_reduce_scatter": rs_b}
        if x.expert_tp_all_reduce_bytes:
            ar_s, ar_b, ar_source = self.collective("all_reduce", x.expert_tp_all_reduce_bytes, key.tp, 1)
            merge_source(out.sources, "ep_comm", ar_source)
            out.ep_s += ar_s
            out.comm_bytes["ep_all_reduce"] = ar_b
