"""Bytes per element of each dtype name the project uses: the one table (no torch here).

Names are the short ones profiles, hardware specs and the Alpa tracer write (``bf16``, not
``torch.bfloat16``); each size is the element size of the dtype (``torch.<dtype>.itemsize``).
"""

ELEMENT_BYTES: dict[str, int] = {
    "fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1,
    "int64": 8, "int32": 4, "bool": 1, "complex64": 8,
}
"""Bytes per element of a dtype name (fp8 is the 1-byte e4m3/e5m2 format)."""
