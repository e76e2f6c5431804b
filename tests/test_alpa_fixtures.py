"""Small user models for the Alpa tests (factories importable as ``test_alpa_fixtures:NAME``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Mlp(nn.Module):
    def __init__(self, hidden: int = 64, ffn: int = 256, vocab: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.head(x + self.down(F.gelu(self.up(x))))


class Cell(nn.Module):
    """A pre-norm residual MLP cell; a stack of these is the 'repeated block'."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.inner = nn.Linear(hidden, ffn)
        self.outer = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(F.relu(self.inner(self.norm(x))))


class Tower(nn.Module):
    """Blocks under an unusual name ('trunk'), so detection cannot rely on 'layers'."""

    def __init__(self, depth: int = 3, hidden: int = 32, ffn: int = 64, vocab: int = 64) -> None:
        super().__init__()
        self.lookup = nn.Embedding(vocab, hidden)
        self.trunk = nn.ModuleList(Cell(hidden, ffn) for _ in range(depth))
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.lookup(tokens)
        for cell in self.trunk:
            x = cell(x)
        return self.proj(x)


class FusedQKV(nn.Module):
    """One projection split into q, k, v (GPT-2 style), then attention."""

    def __init__(self, hidden: int = 32, heads: int = 4, vocab: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(h, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        return self.proj(out)


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if x.sum() > 0:  # branches on tensor values: not traceable on the meta device
            return x * 2
        return x


def mlp() -> nn.Module:
    return Mlp()


def tower() -> nn.Module:
    return Tower()


def raising() -> nn.Module:
    raise RuntimeError("checkpoint not found")


def data_dependent() -> nn.Module:
    return DataDependent()


def not_a_module():
    return 42


def tower_wide() -> nn.Module:
    return Tower(depth=2, hidden=128, ffn=512, vocab=256)


def tiny_llama() -> nn.Module:
    """autoplan's own Llama-style model (the one ``launch`` trains) at the tiny-llama preset."""
    from costmodels.presets import load_model
    from planner.launch.torchjob.model import build_model

    return build_model(load_model("tiny-llama"), device="cpu")


def fused_qkv() -> nn.Module:
    return FusedQKV(hidden=128, heads=4, vocab=256)


class WithBuffer(nn.Module):
    """A causal-mask buffer: the job cannot give it a value after building on the meta device."""

    def __init__(self, vocab: int = 32, hidden: int = 16, seq: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)
        self.register_buffer("mask", torch.ones(seq, seq).tril())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        s = tokens.shape[1]
        return self.head(self.mask[:s, :s] @ x / s)


def with_buffer() -> nn.Module:
    return WithBuffer()
