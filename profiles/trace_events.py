"""Read a PyTorch profiler (Kineto) Chrome trace into classified ops. Pure: json only, no torch.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes ``{"traceEvents": [...]}``: complete
events (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds, CPU ops (``cat`` ``cpu_op``, with
``args["Input Dims"]``/``["Input type"]`` under ``record_shapes=True``), ``user_annotation`` ranges
(gloo runs each collective on its own thread as ``gloo:all_reduce`` ...; NCCL traces carry
``nccl:*``/``record_param_comms`` ranges with ``Collective name``, ``In msg nelems``,
``Out msg nelems``, ``Group size`` and ``dtype``), and on GPU ``kernel`` events with
``args["stream"]`` and ``args["correlation"]``, the id of the ``cuda_runtime`` launch on the CPU.

Each op is classified once (``Op.kind``): ``gemm``, ``attention``, ``collective``, ``memory`` (any
other kernel or leaf CPU op that does arithmetic). On CPU the innermost op of a nest counts
(``aten::linear`` -> ``aten::matmul`` -> ``aten::mm``: the mm), so no time is counted twice.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan_base.dtypes import ELEMENT_BYTES

from .schema import ProfileError

US = 1e-6
"""Seconds per trace time unit (Chrome trace ``ts``/``dur`` are microseconds)."""

CPU_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
CPU_ATTENTION = re.compile(r"^aten::_(scaled_dot_product_\w*attention\w*|flash_attention_\w+|efficient_attention_\w+)$")
GPU_GEMM = re.compile(r"gemm|cutlass|xmma|cublas|Kernel2|gemv|wgmma", re.IGNORECASE)
GPU_ATTENTION = re.compile(r"flash|fmha|sdpa|attention|attn", re.IGNORECASE)
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
GLOO_RANGE = re.compile(r"^gloo:(\w+)$")
NO_WORK = {"aten::view", "aten::as_strided", "aten::t", "aten::transpose", "aten::reshape", "aten::empty",
           "aten::empty_strided", "aten::slice", "aten::narrow", "aten::detach", "aten::unsqueeze", "aten::expand",
           "aten::permute", "aten::select", "aten::_unsafe_view", "aten::view_as", "aten::split", "aten::chunk",
           "aten::resolve_conj", "aten::resolve_neg", "aten::alias", "aten::lift_fresh", "aten::result_type",
           "aten::squeeze", "aten::split_with_sizes", "aten::unbind", "aten::as_strided_", "aten::contiguous",
           "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"}
"""CPU ops that only make views or allocate: no arithmetic, not memory-bound work."""

COLLECTIVE_NAMES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allgather": "all_gather", "all_gather": "all_gather",
    "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all", "broadcast": "broadcast", "send": "send_recv", "recv": "send_recv",
    "sendrecv": "send_recv", "allgather_coalesced": "all_gather",
}
"""Collective names as gloo ranges, NCCL kernels (lower-cased) and ``record_param_comms`` give them."""

DTYPE_NAMES = {"float": "fp32", "float32": "fp32", "bfloat16": "bf16", "c10::bfloat16": "bf16", "half": "fp16",
               "c10::half": "fp16", "float16": "fp16", "float8_e4m3fn": "fp8", "c10::float8_e4m3fn": "fp8"}


class TraceError(ProfileError):
    """A file is not a PyTorch profiler Chrome trace, or holds nothing to import."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One timed op of the step."""

    kind: str
    """``gemm``, ``attention``, ``collective`` or ``memory``."""
    name: str
    start_s: float
    dur_s: float
    lane: str
    """Thread (``tid N``) or CUDA stream (``stream N``) it ran on."""
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    """gemm: (m, n, k); attention: (batch, heads, seq_len, head_dim) of the query, forward or backward."""
    backward: bool = False
    """attention: the backward kernel."""
    collective: str | None = None
    """collective: the profile's op name (``all_reduce`` ...)."""
    size_bytes: int = 0
    """collective: the full buffer S (nccl-tests convention); 0 when the trace does not say."""
    group_size: int = 0
    """collective: ranks in the group; 0 when the trace does not say."""

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


def load_trace(path: str | Path) -> dict[str, Any]:
    """The trace document (``.json`` or ``.json.gz``); one ``TraceError`` line for anything else."""
    try:
        raw = Path(path).read_bytes()
        text = gzip.decompress(raw).decode("utf-8") if raw[:2] == b"\x1f\x8b" else raw.decode("utf-8")
        doc = json.loads(text)
    except OSError as err:
        raise TraceError(f"{path}: cannot read the trace ({err.strerror})") from None
    except (ValueError, EOFError) as err:
        raise TraceError(f"{path}: not a JSON Chrome trace ({str(err).splitlines()[0][:80]}); export one with "
                         "torch.profiler's prof.export_chrome_trace(PATH)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: has no 'traceEvents' list; export the trace with "
                         "torch.profiler's prof.export_chrome_trace(PATH)")
    return doc


def _dims(event: dict[str, Any]) -> list[Any]:
    dims = event.get("args", {}).get("Input Dims")
    return dims if isinstance(dims, list) else []


def _dtype(event: dict[str, Any]) -> str | None:
    types = event.get("args", {}).get("Input type") or [event.get("args", {}).get("dtype")]
    for t in types:
        if isinstance(t, str) and t.lower() in DTYPE_NAMES:
            return DTYPE_NAMES[t.lower()]
    return None


def gemm_shape(name: str, dims: list[Any]) -> tuple[int, int, int] | None:
    """(m, n, k) of a CPU GEMM op from its input dims; a batched matmul counts its batch into m."""
    try:
        if name == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            return m, n, k
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return m, n, k
        b, m, k = dims[-2 if name == "aten::bmm" else 1]
        n = (dims[1] if name == "aten::bmm" else dims[2])[2]
        return b * m, n, k
    except (IndexError, TypeError, ValueError):
        return None


def _innermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events (of any threads) with no other of them nested inside on the same thread."""
    by_tid: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        by_tid.setdefault(e.get("tid"), []).append(e)
    out = []
    for evs in by_tid.values():
        evs.sort(key=lambda x: (x["ts"], -x["dur"]))
        stack: list[dict[str, Any]] = []
        parents: set[int] = set()
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack and e["ts"] + e["dur"] <= stack[-1]["ts"] + stack[-1]["dur"]:
                parents.add(id(stack[-1]))
            stack.append(e)
        out += [e for e in evs if id(e) not in parents]
    return sorted(out, key=lambda x: x["ts"])


def _overlaps(e: dict[str, Any], spans: dict[Any, list[tuple[float, float]]]) -> bool:
    """Whether ``e`` overlaps any of the (start, end) spans of its thread (sorted by start)."""
    lo, hi = e["ts"], e["ts"] + e["dur"]
    return any(a < hi and lo < b for a, b in spans.get(e.get("tid"), ()))


def _op(e: dict[str, Any], kind: str, **extra: Any) -> Op:
    return Op(kind=kind, name=e["name"], start_s=e["ts"] * US, dur_s=e["dur"] * US, lane=f"tid {e.get('tid')}",
              dtype=_dtype(e), **extra)


def cpu_ops(events: list[dict[str, Any]], group_size: int) -> list[Op]:
    """Ops of a CPU trace: innermost GEMM and attention ops (what they call inside is theirs),
    innermost other arithmetic ops outside them, and gloo collectives."""
    ops: list[Op] = []
    heavy, light = [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        gloo = GLOO_RANGE.match(e["name"])
        if gloo:
            ops.append(_gloo_op(e, gloo.group(1), group_size))
        elif e.get("cat") == "cpu_op" and (e["name"] in CPU_GEMM_OPS or CPU_ATTENTION.match(e["name"])):
            heavy.append(e)
        elif e.get("cat") == "cpu_op" and e["name"].startswith("aten::") and e["name"] not in NO_WORK:
            light.append(e)
    spans: dict[Any, list[tuple[float, float]]] = {}
    for e in _innermost(heavy):
        spans.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"]))
        dims = _dims(e)
        if e["name"] in CPU_GEMM_OPS:
            shape = gemm_shape(e["name"], dims)
            if shape:
                ops.append(_op(e, "gemm", shape=shape))
        elif dims and isinstance(dims[0], list) and len(dims[0]) == 4:
            ops.append(_op(e, "attention", shape=tuple(dims[0]), backward="backward" in e["name"]))
    ops += [_op(e, "memory") for e in _innermost([e for e in light if not _overlaps(e, spans)])]
    return sorted(ops, key=lambda o: o.start_s)


def gpu_ops(events: list[dict[str, Any]]) -> list[Op]:
    """Ops of a CUDA trace: every kernel, classified by name; GEMM and attention shapes and
    collective sizes come from the CPU op that launched the kernel (``correlation``)."""
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    cpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
                  and "dur" in e), key=lambda x: x["ts"])
    ops = []
    for k in events:
        if k.get("cat") != "kernel" or "dur" not in k:
            continue
        lane = f"stream {k.get('args', {}).get('stream')}"
        launch = launches.get(k.get("args", {}).get("correlation"))
        nccl = NCCL_KERNEL.match(k["name"])
        if nccl:
            ops.append(_nccl_op(k, nccl.group(1), _enclosing(cpu, launch, _is_comm), lane))
            continue
        kind = "gemm" if GPU_GEMM.search(k["name"]) else "attention" if GPU_ATTENTION.search(k["name"]) else "memory"
        parent = _enclosing(cpu, launch, lambda e: e["name"] in CPU_GEMM_OPS if kind == "gemm"
                            else bool(CPU_ATTENTION.match(e["name"])))
        shape: tuple[int, ...] = ()
        if parent is not None and kind == "gemm":
            shape = gemm_shape(parent["name"], _dims(parent)) or ()
        elif parent is not None and kind == "attention" and _dims(parent) and len(_dims(parent)[0]) == 4:
            shape = tuple(_dims(parent)[0])
        ops.append(Op(kind=kind, name=k["name"], start_s=k["ts"] * US, dur_s=k["dur"] * US, lane=lane,
                      dtype=_dtype(parent) if parent else None, shape=shape,
                      backward=parent is not None and "backward" in parent["name"]))
    return sorted(ops, key=lambda o: o.start_s)


def _is_comm(e: dict[str, Any]) -> bool:
    return e["name"] == "record_param_comms" or e["name"].startswith("nccl:")


def _enclosing(cpu: list[dict[str, Any]], launch: dict[str, Any] | None, wanted) -> dict[str, Any] | None:
    """The innermost CPU event on the launch's thread that contains the launch and is ``wanted``."""
    if launch is None:
        return None
    best = None
    for e in cpu:
        if e["ts"] > launch["ts"]:
            break
        if e.get("tid") == launch.get("tid") and e["ts"] + e["dur"] >= launch["ts"] and wanted(e):
            best = e if best is None or e["dur"] <= best["dur"] else best
    return best


def _nccl_op(k: dict[str, Any], kernel_op: str, comm: dict[str, Any] | None, lane: str) -> Op:
    """An NCCL kernel: collective from its name, size and group from the launching comm range
    (``Out msg nelems`` for an all-gather, ``In msg nelems`` otherwise: the full buffer S)."""
    op = COLLECTIVE_NAMES.get(kernel_op.lower(), kernel_op.lower())
    args = comm.get("args", {}) if comm else {}
    dtype = _dtype(comm) if comm else None
    nelems = args.get("Out msg nelems" if op == "all_gather" else "In msg nelems", 0)
    size = int(nelems) * ELEMENT_BYTES.get(dtype or "", 0) if isinstance(nelems, int) else 0
    group = args.get("Group size", 0)
    return Op(kind="collective", name=k["name"], start_s=k["ts"] * US, dur_s=k["dur"] * US, lane=lane, dtype=dtype,
              collective=op, size_bytes=size, group_size=int(group) if isinstance(group, int) else 0)


def _gloo_op(e: dict[str, Any], name: str, group_size: int) -> Op:
    """A gloo collective range: its input is this rank's buffer; an all-gather's full buffer is
    the group's (input × group size), the other collectives' the input itself."""
    op = COLLECTIVE_NAMES.get(name.lower(), name.lower())
    dtype = _dtype(e)
    dims = _dims(e)
    numel = 0
    if dims and isinstance(dims[0], list):
        numel = 1                                   # [] is a 0-d tensor: one element
        for d in dims[0]:
            numel *= int(d)
    size = numel * ELEMENT_BYTES.get(dtype or "", 0)
    if op == "all_gather":
        size *= max(group_size, 1)
    return Op(kind="collective", name=e["name"], start_s=e["ts"] * US, dur_s=e["dur"] * US,
              lane=f"tid {e.get('tid')}", dtype=dtype, collective=op, size_bytes=size, group_size=group_size)
