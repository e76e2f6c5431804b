"""A PyTorch profiler trace of one training step -> measured rates, collective curves, overlap. Pure.

``trace_events`` classifies the step's ops; here they become what a profile holds:
- GEMM: one point per (dtype, m, n, k), the mean time of that shape's calls in the step (the mean,
  not the median, so the points keep the step's total), and the roofline-with-overhead fit through
  them (``build.fit_compute_table``); achieved FLOP/s per shape is the "GEMM efficiency by shape";
- attention: one point per (dtype, query shape), mean forward + mean backward time, in the
  profile's causal forward + backward convention (``work.attention_flops``);
- collectives: one curve per (op, group size, dtype) over the message sizes the step sent, each
  size's mean time, source ``trace`` (``build.fit_collective``);
- the overlap actually achieved: of the time some collective ran, the fraction during which some
  compute op (GEMM, attention or another arithmetic op, on another thread or stream) ran too.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from . import work
from .build import fit_collective, fit_compute_table
from .schema import AttentionPoint, ComputeTable, GemmPoint, HardwareProfile, ThroughputFit
from .trace_events import Op, TraceError, cpu_ops, gpu_ops, load_trace

KINDS = ("gemm", "attention", "memory", "collective")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceImport:
    """What one trace gave: the profile, and the figures ``import-trace`` prints."""

    profile: HardwareProfile
    trace_time_s: dict[str, float]
    """Sum of the step's op times per kind (``KINDS``; collectives by op as ``collective:OP``)."""
    reproduced_time_s: dict[str, float]
    """The same sums recomputed from the imported rates (points and curves) at the step's ops;
    no ``memory`` entry, since memory-bound ops give no rate."""
    gemm_rates: list[dict[str, Any]] = field(default_factory=list)
    """Per shape: dtype, m, n, k, calls, mean time, achieved FLOP/s."""
    overlap: dict[str, float] = field(default_factory=dict)
    """comm_s (union of collective time), overlapped_s, fraction."""
    skipped: list[str] = field(default_factory=list)
    """Ops that could not become rates, and why."""


def union_s(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted union of (start, end) spans."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def intersection_s(left: list[tuple[float, float]], right: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two disjoint sorted span lists (two-pointer sweep)."""
    i = j = 0
    total = 0.0
    while i < len(left) and j < len(right):
        lo, hi = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        total += max(0.0, hi - lo)
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return total


def achieved_overlap(ops: list[Op]) -> dict[str, float]:
    """Collective time covered by compute: |C ∩ K| / |C|, C and K the unions of the spans of the
    collective ops and of the compute ops that ran on other lanes (threads or streams)."""
    comm_lanes = {o.lane for o in ops if o.kind == "collective"}
    comm = union_s([(o.start_s, o.end_s) for o in ops if o.kind == "collective"])
    compute = union_s([(o.start_s, o.end_s) for o in ops if o.kind != "collective" and o.lane not in comm_lanes])
    comm_s = sum(b - a for a, b in comm)
    overlapped = intersection_s(comm, compute)
    return {"comm_s": comm_s, "overlapped_s": overlapped, "fraction": overlapped / comm_s if comm_s else 0.0}


def _group(ops: list[Op], key) -> dict[Any, list[Op]]:
    out: dict[Any, list[Op]] = {}
    for o in ops:
        out.setdefault(key(o), []).append(o)
    return out


def _mean_s(ops: list[Op]) -> float:
    return statistics.fmean(o.dur_s for o in ops)


def gemm_tables(ops: list[Op]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """GEMM tables by dtype (mean time per shape, then the fit) and the per-shape rates."""
    shapes = _group([o for o in ops if o.kind == "gemm" and o.dtype], lambda o: (o.dtype, *o.shape))
    rates = [{"dtype": d, "m": m, "n": n, "k": k, "calls": len(g), "mean_time_s": _mean_s(g),
              "flops_per_s": work.gemm_flops(m, n, k) / _mean_s(g)} for (d, m, n, k), g in sorted(shapes.items())]
    tables = {}
    for dtype in sorted({r["dtype"] for r in rates}):
        points = tuple(GemmPoint(m=r["m"], n=r["n"], k=r["k"], time_s=r["mean_time_s"])
                       for r in rates if r["dtype"] == dtype)
        tables[dtype] = rate_table(dtype, points)
    return tables, rates


def rate_table(dtype: str, points: tuple[GemmPoint, ...] | tuple[AttentionPoint, ...]) -> ComputeTable:
    """``build.fit_compute_table``; when the points are too few for it to find a rate (one shape:
    all overhead), the one rate that keeps their total time, ΣFLOPs / Σt, with no overhead."""
    table = fit_compute_table(dtype, points)
    if table.fit.flops_per_s is not None or table.fit.bytes_per_s is not None:
        return table
    flops = sum(p.work(dtype)[0] for p in points)
    rate = flops / sum(p.time_s for p in points)
    errors = [p.work(dtype)[0] / rate / p.time_s - 1.0 for p in points]
    rms = (sum(e * e for e in errors) / len(errors)) ** 0.5
    return ComputeTable(dtype=dtype, points=points,
                        fit=ThroughputFit(overhead_s=0.0, flops_per_s=rate, bytes_per_s=None, rms_relative_error=rms))


def attention_tables(ops: list[Op]) -> dict[str, Any]:
    """Attention tables by dtype: per query shape (b, heads, s, d), mean forward + mean backward."""
    shapes = _group([o for o in ops if o.kind == "attention" and o.dtype and len(o.shape) == 4],
                    lambda o: (o.dtype, *o.shape))
    points: dict[str, list[AttentionPoint]] = {}
    for (dtype, b, a, s, d), group in sorted(shapes.items()):
        fwd = [o for o in group if not o.backward]
        bwd = [o for o in group if o.backward]
        time_s = (_mean_s(fwd) if fwd else 0.0) + (_mean_s(bwd) if bwd else 0.0)
        points.setdefault(dtype, []).append(AttentionPoint(batch=b, seq_len=s, num_heads=a, head_dim=d, time_s=time_s))
    return {dtype: rate_table(dtype, tuple(p)) for dtype, p in points.items()}


def collective_curves(ops: list[Op], spans_nodes: bool) -> tuple[tuple[Any, ...], list[str]]:
    """One curve per (op, group size) over the sizes the step sent (the commonest dtype). The trace
    does not say how the group sat on nodes: one node of ``n`` ranks, or with ``spans_nodes`` one
    rank on each of ``n`` nodes (every message crosses the network)."""
    usable = [o for o in ops if o.kind == "collective" and o.size_bytes > 0 and o.group_size >= 2 and o.dtype]
    skipped = [f"{o.name} at {o.start_s:.6f} s: " + ("size unknown" if o.size_bytes <= 0 else "group size unknown")
               for o in ops if o.kind == "collective" and o not in usable]
    curves = []
    for (op, n), group in sorted(_group(usable, lambda o: (o.collective, o.group_size)).items()):
        dtype = max({o.dtype for o in group}, key=lambda d: sum(o.dtype == d for o in group))
        sizes = _group([o for o in group if o.dtype == dtype], lambda o: o.size_bytes)
        order = sorted(sizes)
        per_node, nodes = (1, n) if spans_nodes else (n, 1)
        curves.append(fit_collective(op=op, num_ranks=n, ranks_per_node=per_node, num_nodes=nodes, dtype=dtype,
                                     sizes_bytes=tuple(order), median_time_s=tuple(_mean_s(sizes[s]) for s in order),
                                     source="trace"))
    return tuple(curves), skipped


def reproduce(ops: list[Op], rates: list[dict[str, Any]], attention: dict[str, Any],
              curves: tuple[Any, ...]) -> dict[str, float]:
    """Each kind's step time recomputed from the imported rates: a GEMM's FLOPs over its shape's
    achieved rate, an attention call's share of its shape's point, a collective's curve measurement
    at its size. GEMMs of unknown dtype or shape give no rate and count 0 here, so a missed op
    shows as a gap; a collective without a curve counts its measured time (listed as skipped)."""
    rate = {(r["dtype"], r["m"], r["n"], r["k"]): r["flops_per_s"] for r in rates}
    out = {k: 0.0 for k in KINDS}
    for o in ops:
        key = (o.dtype, *o.shape)
        if o.kind == "gemm" and key in rate:
            out["gemm"] += work.gemm_flops(*o.shape) / rate[key]
        elif o.kind == "collective":
            curve = next((c for c in curves if (c.op, c.num_ranks, c.dtype) == (o.collective, o.group_size, o.dtype)
                          and o.size_bytes in c.sizes_bytes), None)
            t = curve.median_time_s[curve.sizes_bytes.index(o.size_bytes)] if curve else o.dur_s
            out["collective"] += t
            out[f"collective:{o.collective}"] = out.get(f"collective:{o.collective}", 0.0) + t
        elif o.kind == "attention":
            out["attention"] += _attention_share(o, ops, attention)
    del out["memory"]  # memory-bound ops become no rate: nothing to reproduce them from
    return out


def _attention_share(o: Op, ops: list[Op], attention: dict[str, Any]) -> float:
    """An attention call's time from its shape's point: the point is mean fwd + mean bwd, so each
    call of a direction gets that direction's mean."""
    same = [x for x in ops if x.kind == "attention" and x.shape == o.shape and x.dtype == o.dtype
            and x.backward == o.backward]
    return _mean_s(same) if o.dtype in attention else o.dur_s


def trace_totals(ops: list[Op]) -> dict[str, float]:
    """Each kind's summed op time in the step, collectives also by op."""
    out = {k: sum(o.dur_s for o in ops if o.kind == k) for k in KINDS}
    for o in ops:
        if o.kind == "collective":
            out[f"collective:{o.collective}"] = out.get(f"collective:{o.collective}", 0.0) + o.dur_s
    return out


def group_size_of(doc: dict[str, Any], degrees: dict[str, int]) -> int:
    """Ranks per collective group: the one process-group size above 1 the trace lists
    (``distributedInfo.pg_config``), else the one layout degree above 1; 0 if ambiguous."""
    info = doc.get("distributedInfo") or {}
    sizes = {int(pg.get("pg_size", 0)) for pg in info.get("pg_config", []) if isinstance(pg, dict)} - {0, 1}
    if len(sizes) == 1:
        return sizes.pop()
    above = {d for d in degrees.values() if d > 1}
    return above.pop() if len(above) == 1 else 0


AXES = ("dp", "tp", "pp", "cp", "ep")


def parse_degrees(text: str) -> dict[str, int]:
    """``'dp=2,tp=4'`` -> {"dp": 2, "tp": 4}; a bad entry is one ``TraceError`` naming it."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        axis, _, value = part.partition("=")
        if axis not in AXES or not value.isdigit() or int(value) < 1:
            raise TraceError(f"--layout {text!r}: {part!r} is not AXIS=DEGREE with AXIS one of {', '.join(AXES)} "
                             "and DEGREE a positive integer, e.g. 'dp=2,tp=4'")
        out[axis] = int(value)
    return out


def import_trace(path: str, *, degrees: dict[str, int], spans_nodes: bool = False,
                 provenance: dict[str, Any] | None = None) -> TraceImport:
    """Read the trace at ``path`` and build the profile and report (see the module docstring)."""
    doc = load_trace(path)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and isinstance(e.get("name"), str)]
    cuda = any(e.get("cat") == "kernel" for e in events)
    ops = gpu_ops(events) if cuda else cpu_ops(events, group_size_of(doc, degrees))
    if not any(o.kind in ("gemm", "attention", "collective") for o in ops):
        raise TraceError(f"{path}: no GEMM, attention or collective op in the trace; record the training step "
                         "with torch.profiler (record_shapes=True) around it")
    gemm, rates = gemm_tables(ops)
    attention = attention_tables(ops)
    curves, skipped = collective_curves(ops, spans_nodes)
    info = doc.get("distributedInfo") or {}
    devices = doc.get("deviceProperties") or []
    prov = {"source": "trace", "trace": str(path), "backend": info.get("backend"), "rank": info.get("rank"),
            "num_devices": info.get("world_size"), "device_name": devices[0].get("name") if cuda and devices else
            "cpu", **(provenance or {})}
    profile = HardwareProfile(device_type="cuda" if cuda else "cpu", provenance=prov, gemm=gemm,
                              attention=attention, collectives=curves)
    return TraceImport(profile=profile, trace_time_s=trace_totals(ops),
                       reproduced_time_s=reproduce(ops, rates, attention, curves), gemm_rates=rates,
                       overlap=achieved_overlap(ops), skipped=skipped)
