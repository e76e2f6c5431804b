"""A Llama/GPT-style decoder built from a ``ModelSpec``, with torchtitan-style module names.

Names: ``tok_embeddings``, ``pos_embeddings`` (learned positions only), ``layers.{i}`` (an
``nn.ModuleDict`` keyed "0".."L-1", so a pipeline stage can drop layers and keep the names),
``layers.{i}.attention.{wq,wk,wv,wo}`` (with ``q_norm``/``k_norm`` under qk-norm), or with
multi-head latent attention ``layers.{i}.attention.{wq_a,q_norm,wq_b,wkv_a,kv_norm,wkv_b,wo}``
(``wq`` instead of the query latent when there is none; torchtitan's DeepSeek-V3 names),
``layers.{i}.feed_forward.{w1,w2,w3}`` (w1 = gate or up, w3 = up of a gated MLP, w2 = down),
``layers.{i}.moe.{router,experts,shared_experts,shared_expert_gate}``, ``post_attention_norm``
and ``post_ffn_norm`` with sandwich norms, ``norm`` and ``output`` (absent when the embeddings
are tied; a last pipeline stage without the input table then holds ``tied_output``, a copy whose
gradient ``tied.py`` keeps in step). Local layers of a sliding-window model mask keys more than ``window`` - 1 positions back.

Every module reads its local head count from the weight it holds, so the same code runs whole
and split by tensor parallelism. Rotary angles are computed in the forward pass (no buffers),
so a model built on the meta device needs no buffer initialisation after ``to_empty``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from costmodels.model_spec import ModelSpec

DROPOUT_P = 0.1
"""Dropout rate used when ``ModelSpec.dropout`` is true (GPT-2/3 use 0.1)."""
ROPE_THETA = 10000.0
"""Rotary base (Su et al. 2021, RoFormer, eq. 15)."""


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


def rotary(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate ``x`` of shape [b, s, heads, d] by position (RoFormer, Su et al. 2021, eq. 34);
    ``positions`` (int64 [s]) are the global positions of a context-parallel shard, default 0..s-1."""
    s, d = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    pos = torch.arange(s, device=x.device) if positions is None else positions
    angles = torch.outer(pos.to(torch.float32), inv_freq)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def window_mask(s: int, window: int, device: torch.device) -> torch.Tensor | None:
    """Boolean [s, s] mask letting query i see keys i - window + 1 .. i; None for full causal."""
    if not window or window >= s:
        return None
    i = torch.arange(s, device=device)
    back = i[:, None] - i[None, :]
    return (back >= 0) & (back < window)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, dropout_p: float,
           gqa: bool = False) -> torch.Tensor:
    """Causal (or sliding-window) attention of [b, s, heads, d] tensors, returned as [b, s, heads, d_v]."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    mask = window_mask(q.shape[2], window, q.device)
    # enable_gqa lets the kernel read each K/V head for its query group, without the
    # repeated copies of K and V that autograd would otherwise keep for backward.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None,
                                          enable_gqa=gqa).transpose(1, 2)


class Attention(nn.Module):
    """Causal multi-head attention with grouped key/value heads (GQA/MQA when kv < a)."""

    def __init__(self, spec: ModelSpec, window: int = 0) -> None:
        super().__init__()
        self.head_dim = spec.d_head
        self.n_rep = spec.num_attention_heads // spec.num_kv_heads
        self.rotary = spec.positions == "rotary"
        self.window = window
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        qkv_bias = spec.linear_bias or spec.qkv_bias
        self.wq = nn.Linear(spec.hidden_size, spec.q_dim, bias=qkv_bias)
        self.wk = nn.Linear(spec.hidden_size, spec.kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(spec.hidden_size, spec.kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(spec.q_dim, spec.hidden_size, bias=spec.linear_bias)
        self.q_norm = nn.RMSNorm(spec.d_head, eps=1e-6) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(spec.d_head, eps=1e-6) if spec.qk_norm else None
        self.recompute_core = False
        """Selective recomputation: recompute the attention core in backward (Korthikanti et al. 2022)."""
        self.context = None
        """Context parallelism: the ``context_parallel.ContextGroup`` of this rank, or None."""

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cp = self.context
        if self.rotary:
            positions = None if cp is None else cp.positions(q.shape[1], q.device)
            q, k = rotary(q, positions), rotary(k, positions)
        p = self.dropout_p if self.training else 0.0
        if cp is not None and cp.variant == "all_gather":
            from .context_parallel import gathered_attention

            return gathered_attention(q, k, v, cp, dropout_p=p, enable_gqa=self.n_rep > 1)
        return attend(q, k, v, window=self.window, dropout_p=p, gqa=self.n_rep > 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.recompute_core:
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out.reshape(b, s, -1))


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, Sec. 2.1): queries from a normalised low-rank
    latent (or straight from x), keys and values up-projected from a shared normalised KV latent,
    each key's rotary part shared by all heads (decoupled RoPE). Selective recomputation reruns the
    latent norms, the up-projections and the core in backward (DeepSeek-V3 Sec. 3.2.3)."""

    def __init__(self, spec: ModelSpec, window: int = 0) -> None:
        super().__init__()
        m, h, a = spec.mla, spec.hidden_size, spec.num_attention_heads
        self.nope, self.rope, self.v_dim, self.kv_rank = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        self.window = window
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        if m.q_lora_rank:
            self.wq_a = nn.Linear(h, m.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(m.q_lora_rank, eps=1e-6)
            self.wq_b = nn.Linear(m.q_lora_rank, a * m.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(h, a * m.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(m.kv_lora_rank, eps=1e-6)
        self.wkv_b = nn.Linear(m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.wo = nn.Linear(a * m.v_head_dim, h, bias=False)
        self.recompute_core = False

    def _up_and_core(self, q_in: torch.Tensor, kv_latent: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        b, s = q_in.shape[0], q_in.shape[1]
        q = self.wq_b(self.q_norm(q_in)) if hasattr(self, "wq_b") else self.wq(q_in)
        q = q.view(b, s, -1, self.nope + self.rope)
        kv = self.wkv_b(self.kv_norm(kv_latent)).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q = torch.cat([q_nope, rotary(q_pe)], dim=-1)
        k = torch.cat([k_nope, rotary(k_pe.unsqueeze(2)).expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        p = self.dropout_p if self.training else 0.0
        return attend(q, k, v, window=self.window, dropout_p=p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q_in = self.wq_a(x) if hasattr(self, "wq_a") else x
        kv_latent, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope], dim=-1)
        if self.recompute_core:
            out = checkpoint(self._up_and_core, q_in, kv_latent, k_pe, use_reentrant=False)
        else:
            out = self._up_and_core(q_in, kv_latent, k_pe)
        return self.wo(out.reshape(b, s, -1))


class FeedForward(nn.Module):
    """Plain (w2·act(w1·x)) or gated (w2·(act(w1·x) ⊙ w3·x), Shazeer 2020) MLP."""

    def __init__(self, spec: ModelSpec, hidden: int) -> None:
        super().__init__()
        self.act = F.silu if spec.activation == "silu" else F.gelu
        self.w1 = nn.Linear(spec.hidden_size, hidden, bias=spec.linear_bias)
        self.w2 = nn.Linear(hidden, spec.hidden_size, bias=spec.linear_bias)
        self.w3 = nn.Linear(spec.hidden_size, hidden, bias=spec.linear_bias) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)


class GroupedExperts(nn.Module):
    """``num_experts`` MLPs stored as stacked weights [E, out, in] (torchtitan's layout)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        e, f, h = spec.moe.num_experts, spec.moe.expert_ffn_hidden_size, spec.hidden_size
        self.act = F.silu if spec.activation == "silu" else F.gelu
        self.w1 = nn.Parameter(torch.empty(e, f, h))
        self.w2 = nn.Parameter(torch.empty(e, h, f))
        self.w3 = nn.Parameter(torch.empty(e, f, h)) if spec.gated_mlp else None

    def expert(self, index: int, x: torch.Tensor) -> torch.Tensor:
        h = self.act(x @ self.w1[index].t())
        if self.w3 is not None:
            h = h * (x @ self.w3[index].t())
        return h @ self.w2[index].t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert on its own rows, x [E, N, h] -> [E, N, h], as batched matmuls (a module
        call, so FSDP gathers the weights when the experts are their own unit)."""
        h = self.act(x @ self.w1.transpose(1, 2))
        if self.w3 is not None:
            h = h * (x @ self.w3.transpose(1, 2))
        return h @ self.w2.transpose(1, 2)


class MoE(nn.Module):
    """Token-choice top-k routing with a capacity factor and the load-balancing loss (``experts.py``)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        self.top_k = moe.top_k
        self.capacity_factor = moe.capacity_factor
        """Slots per expert and sequence, ceil(cf·k·s/E); 0 = dropless (``costmodels.moe_costs.expert_capacity``)."""
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=spec.linear_bias)
        self.experts = GroupedExperts(spec)
        shared = moe.shared_ffn_hidden_size
        self.shared_experts = FeedForward(spec, shared) if shared else None
        self.shared_expert_gate = nn.Linear(spec.hidden_size, 1, bias=False) if moe.shared_expert_gate else None
        self.ep_group = None
        """Expert parallelism: the process group of the ep ranks (``experts`` holds E/ep of them)."""
        self.experts_tp_group = None
        """Tensor parallelism: the tp group over which ``experts`` is split by FFN width."""
        self.aux_loss_scale = 0.0
        """Weight of the load-balancing loss in the differentiated loss (set by the trainer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .experts import moe_forward

        return moe_forward(self, x)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)); with sandwich norms (Gemma 2)
    each branch's output is normalised again before the residual add."""

    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        window = spec.attention_window(index)
        self.attention = LatentAttention(spec, window) if spec.mla is not None else Attention(spec, window)
        self.ffn_norm = _norm(spec)
        if spec.sandwich_norm:
            self.post_attention_norm, self.post_ffn_norm = _norm(spec), _norm(spec)
        if spec.is_moe_layer(index):
            self.moe = MoE(spec)
        else:
            self.feed_forward = FeedForward(spec, spec.ffn_hidden_size)
        self.dropout = nn.Dropout(DROPOUT_P if spec.dropout else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(self.attention_norm(x))
        if hasattr(self, "post_attention_norm"):
            a = self.post_attention_norm(a)
        h = x + self.dropout(a)
        mlp = self.moe if hasattr(self, "moe") else self.feed_forward
        m = mlp(self.ffn_norm(h))
        if hasattr(self, "post_ffn_norm"):
            m = self.post_ffn_norm(m)
        return h + self.dropout(m)


class Transformer(nn.Module):
    """The decoder; a pipeline stage is the same class with some parts set to ``None``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos_embeddings = (nn.Embedding(spec.max_position_embeddings, spec.hidden_size)
                               if spec.positions == "learned" else None)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i) for i in range(spec.num_layers)})
        self.norm = _norm(spec)
        self.output = None if spec.tied_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tied_output: nn.Linear | None = None
        """The last stage's copy of the tied table, when the first stage holds the table itself."""
        self.context = None
        """Context parallelism: the ``ContextGroup`` whose global positions index ``pos_embeddings``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens [b, s] (first stage) or hidden states (later stages) -> logits or hidden states."""
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if self.tok_embeddings is not None and self.pos_embeddings is not None:
            positions = (torch.arange(x.shape[1], device=x.device) if self.context is None
                         else self.context.positions(x.shape[1], x.device))
            h = h + self.pos_embeddings(positions)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        if self.tied_output is not None:
            return self.tied_output(h)
        if self.norm is not None:  # tied embeddings: logits from the input table
            return tied_logits(h, self.tok_embeddings.weight)
        return h


def tied_logits(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits h·Eᵀ from the input table E. Under tensor parallelism E is split over the vocabulary
    (a DTensor ``Shard(0)``, the vocab-parallel embedding), so the product is the vocab-parallel
    head: each rank computes its vocabulary slice from the replicated h, and the slices are
    gathered for the loss, as ``ColwiseParallel(output_layouts=Replicate())`` does for an untied head."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(weight, DTensor):
        return F.linear(h, weight)
    mesh = weight.device_mesh
    if isinstance(h, DTensor):
        h = h.redistribute(mesh, [Replicate()])
    else:
        h = DTensor.from_local(h, mesh, [Replicate()], run_check=False)
    return F.linear(h, weight).redistribute(mesh, [Replicate()]).to_local()


def build_model(spec: ModelSpec, *, device: str | torch.device = "meta",
                dtype: torch.dtype = torch.float32) -> Transformer:
    """The decoder of ``spec`` on ``device`` (default meta: no memory until ``to_empty``).

    Weights on a real device are initialised with ``init_weights(model, seed=0)``.
    """
    with torch.device(device):
        model = Transformer(spec)
    model = model.to(dtype=dtype)
    if str(device) != "meta":
        from .init import init_weights

        init_weights(model, seed=0)
    return model
