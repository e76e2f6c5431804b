"""Profile files: JSON with ``schema_version`` and provenance, validated on load, written atomically."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autoplan_base.errors import field
from hardware_specs.files import read_json

from .fit import COLLECTIVE_OPS
from .schema import (CURVE_SOURCES, MEMORY_KERNELS, PROFILE_KIND, SCHEMA_VERSION, AttentionPoint,
                     CollectiveCurve, ComputeTable, GemmPoint, HardwareProfile, MemoryPoint, ProfileError,
                     ThroughputFit)
from .segments import HockneySegment
from .shapes import legacy_placement
from .work import PROFILE_DTYPES

DEVICE_TYPES = ("cpu", "cuda")
READABLE_VERSIONS = (1, 2, SCHEMA_VERSION)
"""Schema versions ``load_profile`` reads; a version-1 curve has no ``segments`` (see
``_segments``), a version-1 or 2 curve has ``spans_nodes`` in place of its placement (see ``_placement``)."""


ZERO_ALLOWED_CALIBRATION = ("overlap_fraction", "step_overhead_s", "layer_overhead_s", "tp_layer_overhead_s",
                            "allocator_fragmentation")
"""Calibration keys whose fitted value may be 0: the additive terms (a share, or seconds) that
``planner.validate.calibrate`` fits on a linear grid (its ``ADDITIVE``), and the allocator's
fragmentation share ``autoplan calibrate`` fits (``planner.calibrate.memory``)."""


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """The JSON-ready form: schema header, provenance, raw medians with their fits."""
    def table(t: ComputeTable) -> dict[str, Any]:
        return {"points": [asdict(p) for p in t.points], "fit": asdict(t.fit)}

    return {
        "schema_version": profile.schema_version,
        "kind": PROFILE_KIND,
        "device_type": profile.device_type,
        "provenance": profile.provenance,
        "gemm": {d: table(t) for d, t in sorted(profile.gemm.items())},
        "attention": {d: table(t) for d, t in sorted(profile.attention.items())},
        "memory": {k: [asdict(p) for p in pts] for k, pts in sorted(profile.memory.items())},
        "collectives": [{**asdict(c), "sizes_bytes": list(c.sizes_bytes),
                         "median_time_s": list(c.median_time_s),
                         "smoothed_time_s": list(c.smoothed_time_s),
                         "segments": [asdict(seg) for seg in c.segments]} for c in profile.collectives],
        "calibration": dict(sorted(profile.calibration.items())),
        **({} if profile.sustained_rate_share is None else {"sustained_rate_share": profile.sustained_rate_share}),
    }


def write_profile(path: str | Path, profile: HardwareProfile) -> None:
    """Write ``profile`` as sorted, indented JSON to ``path``, atomically."""
    write_text_atomic(Path(path), json.dumps(profile_to_dict(profile), indent=1, sort_keys=True, allow_nan=False) + "\n")


def _current_umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(target: Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` to a temporary file beside ``target``, then rename it over ``target``:
    readers see the old file or the new one, never half of one. The file gets the mode ``open``
    would give a new file (0666 less the umask; 0777 less it when ``executable``), not
    ``mkstemp``'s 0600."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, (0o777 if executable else 0o666) & ~_current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and validate a profile file; any problem raises one ``ProfileError`` naming it."""
    where = str(path)
    data = read_json(path, what=field("profile"), error=ProfileError)
    return profile_from_dict(data, where)


MAX_SUSTAINED_SHARE = 1.2
"""Largest ``sustained_rate_share`` a profile may hold: timing noise can put a burn-in's end a few
per cent above its burst, a power cap never far."""


def profile_from_dict(data: Any, where: str = "profile") -> HardwareProfile:
    """Validate a parsed profile document and build the record."""
    doc = _Doc(where)
    doc.check(isinstance(data, dict), "", "the top level must be a JSON object")
    doc.check(data.get("kind") == PROFILE_KIND, "kind",
              f"must be {PROFILE_KIND!r}; this is not an autoplan profile (make one with 'autoplan profile')")
    version = data.get("schema_version")
    doc.check(version in READABLE_VERSIONS and not isinstance(version, bool), "schema_version",
              f"is {version!r}; this autoplan reads versions {', '.join(map(str, READABLE_VERSIONS))}, "
              "re-run 'autoplan profile'")
    device_type = doc.choice(data, "device_type", DEVICE_TYPES)
    provenance = doc.get(data, "provenance", dict)
    # Additive calibration terms (overlap, overheads) may be fitted to exactly 0; factors may not.
    calibration = {k: doc.positive(data["calibration"], k, f"calibration.{k}", allow_zero=k in ZERO_ALLOWED_CALIBRATION)
                   for k in doc.get(data, "calibration", dict)}
    curves = tuple(_curve(doc, c, f"collectives[{i}]", version, provenance)
                   for i, c in enumerate(doc.get(data, "collectives", list)))
    keys = [c.key for c in curves]
    doc.check(len(set(keys)) == len(keys), "collectives",
              "holds the same (op, num_ranks, ranks_per_node, num_nodes) twice")
    sustained = None
    if "sustained_rate_share" in data:
        sustained = doc.positive(data, "sustained_rate_share", "sustained_rate_share")
        doc.check(sustained <= MAX_SUSTAINED_SHARE, "sustained_rate_share",
                  f"is {sustained!r}; a burn-in keeps at most about its burst rate (<= {MAX_SUSTAINED_SHARE}): "
                  "re-run 'autoplan profile'")
    return HardwareProfile(
        device_type=device_type, provenance=provenance, calibration=calibration, sustained_rate_share=sustained,
        gemm=_tables(doc, data, "gemm", GemmPoint, ("m", "n", "k")),
        attention=_tables(doc, data, "attention", AttentionPoint, ("batch", "seq_len", "num_heads", "head_dim")),
        memory=_memory(doc, data), collectives=curves)


class _Doc:
    """Field checks that raise ``ProfileError`` naming the file and the field path."""

    def __init__(self, where: str) -> None:
        self.where = where

    def check(self, ok: bool, path: str, problem: str) -> None:
        if not ok:
            at = f" {path}" if path else ""
            raise ProfileError(f"{field('profile', self.where)}:{at} {problem}")

    def get(self, obj: dict[str, Any], key: str, kind: type, path: str | None = None) -> Any:
        path = path or key
        self.check(key in obj, path, "is missing; the file is truncated or from another tool")
        value = obj[key]
        is_bool = isinstance(value, bool)
        ok = is_bool if kind is bool else isinstance(value, kind) and not is_bool
        self.check(ok, path, f"must be a {kind.__name__}, got {type(value).__name__}")
        return value

    def choice(self, obj: dict[str, Any], key: str, choices: tuple[str, ...], path: str | None = None) -> str:
        value = self.get(obj, key, str, path)
        self.check(value in choices, path or key, f"is {value!r}; expected one of {', '.join(choices)}")
        return value

    def objects(self, obj: dict[str, Any], key: str, path: str) -> list[tuple[str, dict[str, Any]]]:
        """The non-empty list of JSON objects at ``obj[key]``, each with its field path."""
        items = self.get(obj, key, list, path)
        self.check(len(items) > 0, path, "is empty")
        for i, item in enumerate(items):
            self.check(isinstance(item, dict), f"{path}[{i}]", "must be an object")
        return [(f"{path}[{i}]", item) for i, item in enumerate(items)]

    def positive(self, obj: dict[str, Any], key: str, path: str, allow_none: bool = False,
                 allow_zero: bool = False) -> Any:
        self.check(key in obj, path, "is missing; the file is truncated or from another tool")
        value = obj[key]
        if value is None and allow_none:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        self.check(ok and (value > 0 or allow_zero and value == 0), path,
                   f"must be a positive finite number, got {value!r}")
        return value


def _tables(doc: _Doc, data: dict[str, Any], key: str, point_type: type,
            dims: tuple[str, ...]) -> dict[str, ComputeTable]:
    out = {}
    for dtype, body in doc.get(data, key, dict).items():
        path = f"{key}.{dtype}"
        doc.check(dtype in PROFILE_DTYPES, path, f"unknown dtype; expected one of {', '.join(PROFILE_DTYPES)}")
        doc.check(isinstance(body, dict), path, "must be an object with points and fit")
        points = []
        for ppath, p in doc.objects(body, "points", f"{path}.points"):
            values = {d: doc.get(p, d, int, f"{ppath}.{d}") for d in dims}
            for d, v in values.items():
                doc.check(v > 0, f"{ppath}.{d}", f"must be a positive integer, got {v}")
            points.append(point_type(**values, time_s=doc.positive(p, "time_s", f"{ppath}.time_s")))
        f = doc.get(body, "fit", dict, f"{path}.fit")
        out[dtype] = ComputeTable(dtype=dtype, points=tuple(points), fit=ThroughputFit(
            overhead_s=doc.positive(f, "overhead_s", f"{path}.fit.overhead_s", allow_zero=True),
            flops_per_s=doc.positive(f, "flops_per_s", f"{path}.fit.flops_per_s", allow_none=True),
            bytes_per_s=doc.positive(f, "bytes_per_s", f"{path}.fit.bytes_per_s", allow_none=True),
            rms_relative_error=doc.positive(f, "rms_relative_error", f"{path}.fit.rms_relative_error",
                                            allow_zero=True)))
        doc.check(out[dtype].fit.flops_per_s is not None or out[dtype].fit.bytes_per_s is not None,
                  f"{path}.fit", "has neither flops_per_s nor bytes_per_s")
    return out


def _memory(doc: _Doc, data: dict[str, Any]) -> dict[str, tuple[MemoryPoint, ...]]:
    out = {}
    for kernel, pts in doc.get(data, "memory", dict).items():
        path = f"memory.{kernel}"
        doc.check(kernel in MEMORY_KERNELS, path, f"unknown kernel; expected one of {', '.join(MEMORY_KERNELS)}")
        doc.check(isinstance(pts, list) and len(pts) > 0, path, "must be a non-empty list")
        points = []
        for i, p in enumerate(pts):
            doc.check(isinstance(p, dict), f"{path}[{i}]", "must be an object")
            points.append(MemoryPoint(size_bytes=doc.get(p, "size_bytes", int, f"{path}[{i}].size_bytes"),
                                      time_s=doc.positive(p, "time_s", f"{path}[{i}].time_s")))
        sizes = [p.size_bytes for p in points]
        doc.check(sizes == sorted(set(sizes)) and sizes[0] > 0, path, "sizes must be positive and increasing")
        out[kernel] = tuple(points)
    return out


def _curve(doc: _Doc, c: Any, path: str, version: int, provenance: dict[str, Any]) -> CollectiveCurve:
    doc.check(isinstance(c, dict), path, "must be an object")
    op = doc.choice(c, "op", COLLECTIVE_OPS, f"{path}.op")
    num_ranks = doc.get(c, "num_ranks", int, f"{path}.num_ranks")
    doc.check(num_ranks >= 2, f"{path}.num_ranks", f"must be at least 2, got {num_ranks}")
    series = {}
    for key in ("sizes_bytes", "median_time_s", "smoothed_time_s"):
        values = doc.get(c, key, list, f"{path}.{key}")
        doc.check(len(values) > 0, f"{path}.{key}", "is empty")
        series[key] = tuple(doc.positive({"v": v}, "v", f"{path}.{key}[{i}]") for i, v in enumerate(values))
    doc.check(len({len(v) for v in series.values()}) == 1, path,
              "sizes_bytes, median_time_s and smoothed_time_s must have the same length")
    sizes = series["sizes_bytes"]
    doc.check(all(isinstance(s, int) for s in sizes) and all(a < b for a, b in zip(sizes, sizes[1:])),
              f"{path}.sizes_bytes", "must be integers, strictly increasing")
    smoothed = series["smoothed_time_s"]
    doc.check(all(a <= b for a, b in zip(smoothed, smoothed[1:])), f"{path}.smoothed_time_s",
              "must be nondecreasing")
    single = {"latency_s": doc.positive(c, "latency_s", f"{path}.latency_s", allow_zero=True),
              "bus_bandwidth_bytes_per_s": doc.positive(c, "bus_bandwidth_bytes_per_s",
                                                        f"{path}.bus_bandwidth_bytes_per_s", allow_none=True),
              "rms_relative_error": doc.positive(c, "rms_relative_error", f"{path}.rms_relative_error",
                                                 allow_zero=True)}
    return CollectiveCurve(
        op=op, num_ranks=num_ranks, **_placement(doc, c, path, version, num_ranks, provenance),
        dtype=doc.choice(c, "dtype", PROFILE_DTYPES, f"{path}.dtype"), **series, **single,
        segments=_segments(doc, c, path, version, sizes, single),
        source=doc.choice(c, "source", CURVE_SOURCES, f"{path}.source") if "source" in c else "measured")


def _placement(doc: _Doc, c: dict[str, Any], path: str, version: int, num_ranks: int,
               provenance: dict[str, Any]) -> dict[str, int]:
    """``ranks_per_node`` and ``num_nodes`` of a curve. Versions 1 and 2 stored only
    ``spans_nodes``: an in-node curve was one node of ``num_ranks``; a cross-node curve is the
    layout that harness measured, rebuilt from the provenance's world and node size."""
    if version >= 3:
        per_node = doc.get(c, "ranks_per_node", int, f"{path}.ranks_per_node")
        nodes = doc.get(c, "num_nodes", int, f"{path}.num_nodes")
        doc.check(per_node >= 1 and nodes >= 1 and per_node * nodes >= num_ranks, f"{path}.ranks_per_node",
                  f"{per_node} per node on {nodes} nodes cannot hold {num_ranks} ranks")
        return {"ranks_per_node": per_node, "num_nodes": nodes}
    if not doc.get(c, "spans_nodes", bool, f"{path}.spans_nodes"):
        return {"ranks_per_node": num_ranks, "num_nodes": 1}
    world = doc.get(provenance, "num_devices", int, "provenance.num_devices")
    local = doc.get(provenance, "devices_per_node", int, "provenance.devices_per_node")
    found = legacy_placement(world, local, num_ranks, True) if world >= 1 and local >= 1 else None
    doc.check(found is not None, path, f"spans nodes, but no layout of {num_ranks} ranks on {world} devices "
              f"of {local} per node does; the file is inconsistent, re-run 'autoplan profile'")
    return {"ranks_per_node": found[0], "num_nodes": found[1]}


def _segments(doc: _Doc, c: dict[str, Any], path: str, version: int, sizes: tuple[int, ...],
              single: dict[str, Any]) -> tuple[HockneySegment, ...]:
    """The curve's regimes. A version-1 curve predates them: it is read as the one regime of its
    single alpha-beta fit over all its sizes, which is the model that file stated."""
    if version == 1:
        return (HockneySegment(first_size_bytes=sizes[0], last_size_bytes=sizes[-1], **single),)
    out: list[HockneySegment] = []
    for where, r in doc.objects(c, "segments", f"{path}.segments"):
        first, last = (doc.get(r, k, int, f"{where}.{k}") for k in ("first_size_bytes", "last_size_bytes"))
        doc.check(first in sizes and last in sizes and first <= last, where,
                  f"spans {first}..{last} bytes; both ends must be measured sizes, first <= last")
        doc.check(not out or out[-1].last_size_bytes < first, where, "overlaps or precedes the regime before it")
        out.append(HockneySegment(
            first_size_bytes=first, last_size_bytes=last,
            latency_s=doc.positive(r, "latency_s", f"{where}.latency_s", allow_zero=True),
            bus_bandwidth_bytes_per_s=doc.positive(r, "bus_bandwidth_bytes_per_s",
                                                   f"{where}.bus_bandwidth_bytes_per_s", allow_none=True),
            rms_relative_error=doc.positive(r, "rms_relative_error", f"{where}.rms_relative_error",
                                            allow_zero=True)))
    return tuple(out)
