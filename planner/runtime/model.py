"""A Llama/GPT-style decoder built from a ``ModelSpec``, with torchtitan-style module names.

Names: ``tok_embeddings``, ``pos_embeddings`` (learned positions only), ``layers.{i}`` (an
``nn.ModuleDict`` keyed "0".."L-1", so a pipeline stage can drop layers and keep the names),
``layers.{i}.attention.{wq,wk,wv,wo}``, ``layers.{i}.feed_forward.{w1,w2,w3}`` (w1 = gate or up,
w3 = up of a gated MLP, w2 = down), ``layers.{i}.moe.{router,experts,shared_experts}``,
``norm`` and ``output`` (absent when the embeddings are tied).

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


class Attention(nn.Module):
    """Causal multi-head attention with grouped key/value heads (GQA/MQA when kv < a)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.d_head
        self.n_rep = spec.num_attention_heads // spec.num_kv_heads
        self.rotary = spec.positions == "rotary"
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        qkv_bias = spec.linear_bias or spec.qkv_bias
        self.wq = nn.Linear(spec.hidden_size, spec.q_dim, bias=qkv_bias)
        self.wk = nn.Linear(spec.hidden_size, spec.kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(spec.hidden_size, spec.kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(spec.q_dim, spec.hidden_size, bias=spec.linear_bias)
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
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        # enable_gqa lets the kernel read each K/V head for its query group, without the
        # repeated copies of K and V that autograd would otherwise keep for backward.
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                              enable_gqa=self.n_rep > 1).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.recompute_core:
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
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
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=False)
        self.experts = GroupedExperts(spec)
        shared = moe.num_shared_experts * moe.expert_ffn_hidden_size
        self.shared_experts = FeedForward(spec, shared) if shared else None
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
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        if spec.is_moe_layer(index):
            self.moe = MoE(spec)
        else:
            self.feed_forward = FeedForward(spec, spec.ffn_hidden_size)
        self.dropout = nn.Dropout(DROPOUT_P if spec.dropout else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.dropout(self.attention(self.attention_norm(x)))
        mlp = self.moe if hasattr(self, "moe") else self.feed_forward
        return h + self.dropout(mlp(self.ffn_norm(h)))


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
        if self.norm is not None:  # tied embeddings: logits from the input table
            return F.linear(h, self.tok_embeddings.weight)
        return h


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
