"""Training data: deterministic synthetic sequences, or a memory-mapped token file.

Both are addressed by (step, sequence index in the global batch), so every layout and every
resumed run sees exactly the same tokens at the same step, whatever the data-parallel split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class SyntheticTokens:
    """Arithmetic sequences x_i = (start + i · stride) mod V with random start and stride.

    Learnable (the stride can be read from two tokens), so the loss visibly falls in a short run.
    """

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.seed = seed

    def sequences(self, step: int, first: int, count: int, global_batch: int, length: int) -> torch.Tensor:
        """Sequences [first, first + count) of the global batch of ``step``: int64 [count, length]."""
        rng = np.random.default_rng([self.seed, step])
        start = rng.integers(0, self.vocab_size, size=global_batch)[first:first + count]
        stride = rng.integers(1, max(2, self.vocab_size // 8), size=global_batch)[first:first + count]
        tokens = (start[:, None] + stride[:, None] * np.arange(length)[None, :]) % self.vocab_size
        return torch.from_numpy(tokens.astype(np.int64))


class TokenFile:
    """A flat file of token ids (uint16 or uint32, as written by nanoGPT-style prepare scripts)."""

    def __init__(self, path: str | Path, dtype: str) -> None:
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")

    def sequences(self, step: int, first: int, count: int, global_batch: int, length: int) -> torch.Tensor:
        """Consecutive windows of ``length`` tokens; the stream wraps around at the end of the file."""
        usable = len(self.tokens) - length
        if usable <= 0:
            raise ValueError(f"--data: the file holds {len(self.tokens)} tokens, fewer than one sequence "
                             f"of {length}")
        rows = []
        for j in range(first, first + count):
            offset = ((step * global_batch + j) * (length - 1)) % usable
            rows.append(np.asarray(self.tokens[offset:offset + length], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


def open_source(path: str | None, vocab_size: int, seed: int, dtype: str = "auto"):
    """A ``TokenFile`` for ``path``, else ``SyntheticTokens``; dtype auto = uint16 if V <= 65536."""
    if not path:
        return SyntheticTokens(vocab_size, seed)
    if dtype == "auto":
        dtype = "uint16" if vocab_size <= 65536 else "uint32"
    return TokenFile(path, dtype)
