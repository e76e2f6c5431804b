"""Dim correspondences of shape-preserving ops (pure): which input dim each output dim follows.

For an op with output rank n, ``follow[i][d]`` is the dim of tensor input i that output dim d
follows (sharding one shards the other), ``-1`` when input i is broadcast along d (it stays
replicated), or ``None`` when d cannot be sharded consistently.
"""

from __future__ import annotations

from math import prod

from autoplan_base.dtypes import ELEMENT_BYTES


def broadcast_map(in_shape, out_shape) -> list:
    """Elementwise ops: inputs right-aligned with the output (NumPy broadcasting)."""
    n, k = len(out_shape), len(in_shape)
    out = []
    for d in range(n):
        j = d - (n - k)
        if j < 0 or (in_shape[j] == 1 and out_shape[d] != 1):
            out.append(-1)
        elif in_shape[j] == out_shape[d]:
            out.append(j)
        else:
            out.append(None)
    return out


def reshape_map(in_shape, out_shape) -> list:
    """view/reshape: dims grouped by equal running products; the leading dim of each group
    follows the leading dim of the matching input group, other dims of a merged or split group
    cannot be sharded without moving data."""
    out = [None] * len(out_shape)
    i = j = 0
    while i < len(in_shape) and j < len(out_shape):
        i0, j0 = i, j
        pi, pj = in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi *= in_shape[i]
                i += 1
            else:
                pj *= out_shape[j]
                j += 1
        out[j0] = i0
    return out


def permute_map(perm, ndim: int) -> list:
    return [p % ndim for p in perm]


def insert_map(ndim_in: int, dim: int) -> list:
    """unsqueeze: output dim ``dim`` is new (size 1)."""
    dim = dim % (ndim_in + 1)
    return [None if d == dim else (d if d < dim else d - 1) for d in range(ndim_in + 1)]


def remove_map(ndim_in: int, dims) -> list:
    """select / squeeze: input dims ``dims`` disappear."""
    dims = {d % ndim_in for d in dims}
    return [d for d in range(ndim_in) if d not in dims]


def identity_map(ndim: int, blocked=()) -> list:
    blocked = {b % ndim for b in blocked} if ndim else set()
    return [None if d in blocked else d for d in range(ndim)]


def numel(shape) -> int:
    return prod(shape) if shape else 1


def tensor_bytes(shape, dtype: str) -> int:
    """Bytes of a tensor of ``shape`` and dtype name ``dtype`` (``autoplan_base.dtypes``); a name
    the table lacks (the graph output's empty one) counts 4 bytes an element, as fp32."""
    return numel(shape) * ELEMENT_BYTES.get(dtype, 4)
