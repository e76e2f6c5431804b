"""The GPU truth record: each measurement beside its predictions, their errors, a markdown summary.

Pure Python (no torch). Errors are ``predicted / measured - 1`` (positive: the model predicts
more time or more memory than was measured). Memory is compared three ways:

- by component: params, grads, optimizer, activations, the exact tensor bytes
  ``planner.validate.probe.MemoryProbe`` counts in one step against the cost model's terms (its
  activations also hold the recomputation / loss-backward working set, which saved-tensor
  hooks do not see: a known positive bias where recomputation is on);
- ``peak_allocated``: the model's tensor terms live at its peak (params + grads + optimizer +
  activations + buffers; a step of one micro-batch under a runtime that frees gradients every
  step holds only the gradients beyond its activations, ``rank_memory.grads_live_at_peak``)
  against ``torch.cuda.max_memory_allocated``;
- ``peak_reserved``: the model's peak less the runtime reserve (the CUDA context, outside
  the allocator), that is the tensor terms plus its fragmentation allowance, against
  ``torch.cuda.max_memory_reserved``. On CPU ``peak_rss``: the whole predicted peak against the
  process's max RSS (interpreter and torch libraries included, as the 'cpu' preset's reserve assumes).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

GIB = 2**30
SCHEMA_VERSION = 1
COMPONENTS = ("params", "grads", "optimizer", "activations")
TENSOR_TERMS = ("params", "grads", "optimizer", "activations", "buffers")


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1; None where either is missing or nothing was measured."""
    if predicted is None or not measured:
        return None
    return predicted / measured - 1


def prediction(evaluate_json: dict, runtime_reserved_bytes: float) -> dict[str, Any]:
    """The parts of ``autoplan evaluate --format json`` the record keeps, memory in bytes."""
    p = evaluate_json["predicted"]
    memory = {k: v * GIB for k, v in p["memory_gib"].items()}
    tensors = sum(memory.get(k, 0.0) for k in TENSOR_TERMS)  # live at the peak
    memory["grads"] = memory.get("grads", 0.0) + p.get("grads_freed_gib", 0.0) * GIB  # as allocated, as probed
    peak = p["peak_memory_gib"] * GIB
    return {"step_time_s": p["step_time_s"], "time_s": p["time_s"], "memory_bytes": memory,
            "peak_memory_bytes": peak, "peak_allocated_bytes": tensors,
            "peak_reserved_bytes": peak - runtime_reserved_bytes, "fits": p["fits"], "mfu": p["mfu"],
            "sources": p["sources"], "tokens_per_s": p["tokens_per_s"]}


def measurement(result: dict) -> dict[str, Any]:
    """A runner result line (``measure.run_case`` + allocator peaks) as the record's measured part."""
    rank = result["ranks"][0]
    times = result["step_time_s"]
    median = statistics.median(times)
    out = {"step_time_s": median, "step_times_s": times, "tokens_per_s": result["tokens_per_step"] / median,
           "components_bytes": {k: rank[k] for k in (*COMPONENTS, "states", "states_peak", "total") if k in rank},
           "peak_bytes": rank["peak_bytes"], "peak_kind": rank["memory_kind"], "rss_bytes": rank["rss_bytes"],
           "max_memory_allocated_bytes": result.get("max_memory_allocated_bytes"),
           "max_memory_reserved_bytes": result.get("max_memory_reserved_bytes"), "wall_s": result["wall_s"]}
    return out


def errors(predicted: dict, measured: dict) -> dict[str, float | None]:
    """Every comparison of one prediction with the measurement (see the module docstring)."""
    out = {"step_time": rel_error(predicted["step_time_s"], measured["step_time_s"])}
    for name in COMPONENTS:
        out[name] = rel_error(predicted["memory_bytes"].get(name), measured["components_bytes"].get(name))
    if measured["max_memory_allocated_bytes"] is not None:
        out["peak_allocated"] = rel_error(predicted["peak_allocated_bytes"], measured["max_memory_allocated_bytes"])
        out["peak_reserved"] = rel_error(predicted["peak_reserved_bytes"], measured["max_memory_reserved_bytes"])
    else:
        out["peak_rss"] = rel_error(predicted["peak_memory_bytes"], measured["peak_bytes"])
    return out


def summarise(layouts: list[dict]) -> dict[str, Any]:
    """Counts by status and, per prediction source, the median signed and absolute error of each comparison."""
    measured = [row for row in layouts if row["status"] == "measured"]
    out: dict[str, Any] = {"num_layouts": len(layouts), "num_measured": len(measured),
                           "num_error": sum(row["status"] == "error" for row in layouts),
                           "num_skipped": sum(row["status"] == "skipped" for row in layouts), "errors": {}}
    for source in ("datasheet", "profile"):
        rows = [row["errors"][source] for row in measured if source in row.get("errors", {})]
        keys = sorted({k for r in rows for k in r})
        out["errors"][source] = {k: _medians([r[k] for r in rows if r.get(k) is not None]) for k in keys}
    return out


def _medians(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"signed_median": None, "abs_median": None, "n": 0}
    return {"signed_median": statistics.median(values), "abs_median": statistics.median(map(abs, values)),
            "n": len(values)}


def finite(value: Any) -> bool:
    """Every number inside ``value`` is finite (the record is strict JSON)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return True


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same directory and rename: never half-written
    (``profiles.io.write_text_atomic``, imported here so the module loads before the repo is on the path)."""
    from profiles.io import write_text_atomic

    write_text_atomic(path, text)


def record_json(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + "\n"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def markdown(record: dict) -> str:
    """A short summary: machine, one row per layout (measured vs both predictions), medians, notes."""
    d, s = record["device"], record["summary"]
    lines = [f"# GPU truth: {d['name']} ({record['created']})", "",
             f"- hardware preset: `{d['hardware_preset']}`; torch {record['software'].get('torch_version')}, "
             f"CUDA {record['software'].get('cuda_version')}, driver {d.get('driver_version')}",
             f"- clocks: {d.get('clocks') or 'not readable'}",
             f"- profile: {record['profile']['status']} ({record['profile'].get('wall_s', 0):.0f} s)",
             f"- layouts: {s['num_measured']} measured, {s['num_error']} failed, {s['num_skipped']} skipped; "
             f"wall {record['wall_s']:.0f} s", f"- command: `{record['command']}`", "",
             "errors are predicted / measured - 1; peak: torch.cuda.max_memory_reserved on a GPU, "
             "max RSS on CPU", "",
             "| layout | step ms | err datasheet | err profile | peak GiB | err datasheet | err profile | act err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in record["layouts"]:
        if row["status"] != "measured":
            lines.append(f"| {row['name']} | {row['status']}: {row.get('error', '')[:60]} | | | | | | |")
            continue
        m, e = row["measured"], row["errors"]
        ds, pr = e.get("datasheet", {}), e.get("profile", {})
        on_gpu = m["max_memory_reserved_bytes"] is not None
        peak_key = "peak_reserved" if on_gpu else "peak_rss"
        peak = m["max_memory_reserved_bytes"] if on_gpu else m["peak_bytes"]
        lines.append(f"| {row['name']} | {m['step_time_s'] * 1e3:.1f} | {_pct(ds.get('step_time'))} | "
                     f"{_pct(pr.get('step_time'))} | {peak / GIB:.2f} | {_pct(ds.get(peak_key))} | "
                     f"{_pct(pr.get(peak_key))} | {_pct(ds.get('activations'))} |")
    lines += ["", "median |error| (signed):", ""]
    for source, table in s["errors"].items():
        parts = [f"{k} {v['abs_median']:.0%} ({v['signed_median']:+.0%}, n={v['n']})"
                 for k, v in table.items() if v["n"]]
        lines.append(f"- {source}: " + ("; ".join(parts) or "nothing measured"))
    if record.get("notes"):
        lines += ["", "notes:", ""] + [f"- {note}" for note in record["notes"]]
    return "\n".join(lines) + "\n"
