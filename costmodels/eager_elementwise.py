"""Extra HBM traffic of a transformer layer's elementwise work when PyTorch runs it eagerly.

The memory-bound term of ``layer_costs`` counts fused kernels (Megatron-LM and Transformer Engine
ship them; ``torch.compile`` generates them): each norm, activation and rotary embedding reads its
input once and writes its output once. Eager PyTorch runs every operator as its own kernel, each
reading and writing a whole tensor, some of them in fp32. The ops are those of the Llama reference
model as torchtitan writes it (``torchtitan/models/llama3/model.py``: ``RMSNorm._norm`` on
``x.float()``, ``FeedForward`` as ``F.silu(w1(x)) * w3(x)``, ``apply_rotary_emb`` through
``torch.view_as_complex``); ``autoplan launch``'s model (``planner/launch/torchjob/model.py``) runs the same
kinds of ops, its rotary embedding with more of them.
"""

from __future__ import annotations

FP32_BYTES = 4


def _cast_bytes(elem_bytes: int) -> int:
    """Bytes one element's cast to fp32 and back moves (read B, write 4; read 4, write B); 0 in fp32
    training, where ``x.float()`` and ``type_as`` return their input without a kernel."""
    return 0 if elem_bytes >= FP32_BYTES else 2 * (elem_bytes + FP32_BYTES)


def eager_norm_bytes_per_element(elem_bytes: int) -> int:
    """Bytes an eager RMSNorm moves per element beyond a fused one's read and write (2B).

    x.float() reads B, writes 4; pow reads 4, writes 4; mean reads 4; x * rsqrt reads 4, writes 4;
    type_as reads 4, writes B; * weight reads B, writes B: 28 + 4B in all, 32 extra at B = 2 (in
    fp32 the two casts are no kernels: 28 + 8 - 8 = 20 extra).
    """
    B, F = elem_bytes, FP32_BYTES
    eager = _cast_bytes(B) + (F + F) + F + (F + F) + (B + B)
    return eager - 2 * B


def eager_swiglu_bytes_per_element(elem_bytes: int) -> int:
    """Bytes an eager SwiGLU moves per element of f beyond a fused one's (read 2f, write f: 3B).

    silu(a) reads and writes f; silu(a) * b reads 2f and writes f: 5B per element, 2B extra.
    """
    return 5 * elem_bytes - 3 * elem_bytes


def eager_rotary_bytes_per_element(elem_bytes: int) -> int:
    """Bytes an eager complex rotary embedding moves per q or k element beyond a fused one's (2B).

    x.float() reads B, writes 4; the complex product with the frequencies reads 4, writes 4;
    type_as reads 4, writes B: 16 + 2B, 16 extra (fp32: the product alone, 0 extra).
    """
    B, F = elem_bytes, FP32_BYTES
    return _cast_bytes(B) + (F + F) - 2 * B


def eager_layer_extra_bytes(*, tokens: float, norm_width: float, ffn_width: float, qk_width: float,
                            gated: bool, rotary: bool, elem_bytes: int, fused_norm: bool) -> float:
    """Extra bytes one layer's forward moves on one rank when its elementwise ops run eagerly.

    ``tokens`` rows; ``norm_width`` the elements per token each of the two norms sees (h, or h/t
    under sequence parallelism); ``ffn_width`` the activation's elements per token (f/t);
    ``qk_width`` the rotary elements per token (q and k heads on this rank x head dim). A GELU MLP
    is one kernel either way. ``fused_norm``: the norms run as one kernel each, as LayerNorm always
    does (``aten::native_layer_norm``) and RMSNorm does on a GPU (``nn.RMSNorm`` -> ``F.rms_norm``
    -> ``aten::_fused_rms_norm``, and its backward ``_fused_rms_norm_backward``); they then move
    no more than a fused layer's. The backward's memory-bound time is counted as twice the
    forward's (``rank_time``), so it follows.
    """
    extra = 0.0 if fused_norm else 2 * norm_width * eager_norm_bytes_per_element(elem_bytes)
    if gated:
        extra += ffn_width * eager_swiglu_bytes_per_element(elem_bytes)
    if rotary:
        extra += qk_width * eager_rotary_bytes_per_element(elem_bytes)
    return tokens * extra
