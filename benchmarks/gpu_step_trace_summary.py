"""Reduce a ``torch.profiler`` run of a few training steps to the numbers ``gpu_step_trace.py`` reports.

Pure functions over the profiler's event list (``prof.events()``): each event has a name, a
device type (CPU op or device kernel) and a [start, end) interval in microseconds on one clock.
The step's phases are ``record_function`` ranges named ``step/<phase>`` (``PHASES``).
"""

from __future__ import annotations

from collections import defaultdict

PHASES = ("data", "forward", "loss", "backward", "clip_grads", "optimizer", "zero_grad", "loss_item")
"""The phases of one traced step, in order (``gpu_step_trace.traced_step``)."""
GAP_S = 1e-3
"""Device idle intervals longer than this are listed one by one."""
SDPA_OPS = {"_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_efficient_attention": "mem_efficient",
            "_scaled_dot_product_cudnn_attention": "cudnn", "_scaled_dot_product_attention_math": "math",
            "_scaled_dot_product_flash_attention_for_cpu": "flash_cpu", "_scaled_dot_product_fused_attention_overrideable":
            "overrideable"}
"""aten op of each ``F.scaled_dot_product_attention`` backend (the dispatcher picks one per call)."""
_KERNEL_TYPES = ("CUDA", "PrivateUse1", "MTIA", "XPU", "HPU")


def _is_kernel(event) -> bool:
    return str(event.device_type).rsplit(".", 1)[-1] in _KERNEL_TYPES


def _interval(event) -> tuple[float, float]:
    return event.time_range.start * 1e-6, event.time_range.end * 1e-6


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as sorted disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _busy_within(busy: list[tuple[float, float]], window: tuple[float, float]) -> float:
    return sum(_overlap(span, window) for span in busy)


def _innermost_cpu_op(cpu_ops: list, gap: tuple[float, float]) -> str:
    """The shortest non-phase CPU op covering at least half the gap (the host work the device waits on)."""
    covering = [e for e in cpu_ops if not e.name.startswith("step")
                and _overlap(_interval(e), gap) >= 0.5 * (gap[1] - gap[0])]
    if not covering:
        return "(no CPU op: host idle or outside the profiler)"
    return min(covering, key=lambda e: e.time_range.end - e.time_range.start).name


def _phase_at(phases: list, t: float) -> str:
    inside = [e.name for e in phases if e.time_range.start * 1e-6 <= t < e.time_range.end * 1e-6]
    return inside[-1] if inside else "(between steps)"


def _top(totals: dict[str, float], counts: dict[str, int], steps: int, n: int = 15) -> list[dict]:
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:n]
    return [{"name": name[:160], "ms_per_step": 1e3 * total / steps, "calls_per_step": counts[name] / steps}
            for name, total in ranked]


def summarize(events, *, num_steps: int) -> dict:
    """Per-step wall, device busy time, kernel count, phases, idle gaps and the top kernels and CPU ops."""
    kernels = [e for e in events if _is_kernel(e)]
    cpu_ops = [e for e in events if not _is_kernel(e)]
    steps = sorted((e for e in cpu_ops if e.name == "step"), key=lambda e: e.time_range.start)
    phases = [e for e in cpu_ops if e.name.startswith("step/")]
    window = (_interval(steps[0])[0], _interval(steps[-1])[1]) if steps else (0.0, 0.0)
    busy = merged([_interval(k) for k in kernels if _overlap(_interval(k), window) > 0])
    n = max(1, num_steps)
    out = {"num_steps": num_steps,
           "wall_ms_per_step": 1e3 * sum(e.time_range.elapsed_us() for e in steps) * 1e-6 / n,
           "device_busy_ms_per_step": 1e3 * _busy_within(busy, window) / n,
           "num_kernels_per_step": sum(1 for k in kernels if _overlap(_interval(k), window) > 0) / n,
           "phases": _phases(phases, busy, n), "gaps": _gaps(busy, window, cpu_ops, phases),
           "sdpa_backends": sorted({SDPA_OPS[e.name.removeprefix("aten::")] for e in cpu_ops
                                    if e.name.removeprefix("aten::") in SDPA_OPS}),
           "attention_kernels": sorted({k.name[:120] for k in kernels if _looks_like_attention(k.name)})}
    k_total, k_count, c_total, c_count = defaultdict(float), defaultdict(int), defaultdict(float), defaultdict(int)
    for k in kernels:
        k_total[k.name] += (k.time_range.end - k.time_range.start) * 1e-6
        k_count[k.name] += 1
    for e in cpu_ops:
        if not e.name.startswith("step"):
            c_total[e.name] += e.self_cpu_time_total * 1e-6
            c_count[e.name] += 1
    out["top_kernels"], out["top_cpu_ops"] = _top(k_total, k_count, n), _top(c_total, c_count, n)
    out["device_idle_ms_per_step"] = out["wall_ms_per_step"] - out["device_busy_ms_per_step"] if kernels else None
    return out


def _looks_like_attention(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in ("flash", "fmha", "attention", "cudnn_sdpa", "sdpa"))


def _phases(phases: list, busy: list[tuple[float, float]], n: int) -> dict:
    """Per phase: host (CPU) ms, device busy ms and device idle ms inside its ranges, per step."""
    out: dict = {}
    for name in PHASES:
        spans = [_interval(e) for e in phases if e.name == f"step/{name}"]
        host = sum(b - a for a, b in spans)
        on_device = sum(_busy_within(busy, span) for span in spans)
        out[name] = {"host_ms": 1e3 * host / n, "device_busy_ms": 1e3 * on_device / n,
                     "device_idle_ms": 1e3 * (host - on_device) / n if busy else None, "calls": len(spans) / n}
    return out


def _gaps(busy: list[tuple[float, float]], window: tuple[float, float], cpu_ops: list, phases: list) -> dict:
    """Device idle intervals > ``GAP_S`` inside the traced steps, with the phase and CPU op during each."""
    if not busy:
        return {"total_ms": None, "count": 0, "largest": []}
    edges = [(window[0], busy[0][0])] + [(a[1], b[0]) for a, b in zip(busy, busy[1:])] + [(busy[-1][1], window[1])]
    gaps = [g for g in edges if g[1] - g[0] > GAP_S]
    listed = sorted(gaps, key=lambda g: g[0] - g[1])[:20]
    return {"total_ms": 1e3 * sum(b - a for a, b in gaps), "count": len(gaps),
            "largest": [{"ms": 1e3 * (b - a), "at_ms": 1e3 * (a - window[0]), "phase": _phase_at(phases, a),
                         "cpu_op": _innermost_cpu_op(cpu_ops, (a, b))} for a, b in listed]}
