"""Read node-type TOML files into specs, converting suffixed keys to base units once.

File layout (every number has an entry in ``[sources]`` under its dotted key)::

    schema_version = 1
    name = "h100-sxm-80gb"
    display_name = "NVIDIA H100 SXM5 80GB"
    device_type = "cuda"
    [device]      fp32_tflops, fp16_tflops, bf16_tflops?, fp8_tflops?, mxfp8_tflops?, nvfp4_tflops?, memory_gib,
                  memory_bandwidth_tb_per_s, runtime_reserved_gib, num_sms?, sustained_clock_mhz?,
                  power_limited_clock_mhz?, compute_capability?,
                  sustained_rate_share?
    [node]        gpus_per_node, host_link_gb_per_s, host_memory_gb_per_s, host_memory_gib,
                  storage_write_gb_per_s, nvlink_domain_gpus? (absent = gpus_per_node)
    [intra_node]  kind, bandwidth_gb_per_s (per device, per direction), latency_us, nvls_efficiency?
    [inter_node]  kind, nics_per_node, nic_gbit_per_s, latency_us, sharp?
    [sources]     "device.bf16_tflops" = "NVIDIA H100 datasheet ..."
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, get_args

from .checks import MAX_DEVICES_PER_NODE, MAX_LATENCY_S, MAX_MEMORY_BYTES
from autoplan_base.errors import SpecError, field
from .names import closest_first, match_name
from .files import read_toml
from .schema import HardwareSpec, LinkKind, LinkSpec, NetworkSpec, NodeSpec
from .units import GB, GBIT, GIB, MEGA, TB, TERA, US

SCHEMA_VERSION = 1
MAX_FILE_NUMBER = 1e9
"""Largest number accepted in a hardware file, in the file's units (TFLOP/s, GiB, GB/s, us)."""
DATA_DIR = Path(__file__).parent / "data"
OPTIONAL_DTYPES: tuple[str, ...] = ("bf16", "fp8", "mxfp8", "nvfp4")
"""Dense peaks a node file may give as ``device.<dtype>_tflops``; absent = the part has no such rate."""
_LINK_KINDS = get_args(LinkKind)
KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "": ("schema_version", "name", "display_name", "device_type", "device", "node", "intra_node", "inter_node",
         "sources"),
    "device": ("fp32_tflops", "fp16_tflops", *(f"{d}_tflops" for d in OPTIONAL_DTYPES), "memory_gib",
               "memory_bandwidth_tb_per_s", "runtime_reserved_gib", "num_sms", "sustained_clock_mhz",
               "power_limited_clock_mhz", "compute_capability", "sustained_rate_share"),
    "node": ("gpus_per_node", "host_link_gb_per_s", "host_memory_gb_per_s", "host_memory_gib",
             "storage_write_gb_per_s", "nvlink_domain_gpus"),
    "intra_node": ("kind", "bandwidth_gb_per_s", "latency_us", "nvls_efficiency"),
    "inter_node": ("kind", "nics_per_node", "nic_gbit_per_s", "latency_us", "sharp"),
}
"""Every key a node file may hold, by table ("" = the top level); ``[sources]`` cites any of the
others by its dotted key. Anything else is refused: a misspelt key would be ignored silently."""
MAX_LATENCY_US = MAX_LATENCY_S / US
"""Largest link latency in a file (``*.latency_us``): ``checks.MAX_LATENCY_S`` in microseconds."""


def list_hardware() -> list[str]:
    """Names of the shipped node types, sorted."""
    return sorted(p.stem for p in DATA_DIR.glob("*.toml"))


def load_node(name_or_path: str | Path) -> NodeSpec:
    """Load a shipped node type by name, or a user's TOML file by path."""
    path = _resolve(str(name_or_path))
    return parse_node(read_toml(path, what="hardware file"), origin=f"hardware file {path}")


def hardware_name(name_or_path: str) -> str:
    """The full preset name ``name_or_path`` stands for (``h100`` -> ``h100-sxm-80gb``); a path as given."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        return name_or_path
    return _resolve(name_or_path).stem


def _resolve(name_or_path: str) -> Path:
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.exists():
            raise SpecError(f"{field('hardware')}: file {name_or_path!r} does not exist")
        return path
    name = match_name(name_or_path, list_hardware(), option=field("hardware"),
                      fix="run 'autoplan hardware' for the list or pass a TOML path")
    return DATA_DIR / f"{name}.toml"


def check_keys(raw: dict[str, Any], origin: str) -> None:
    """Refuse a key no node file has (``KNOWN_KEYS``), or a source citing one, naming it and the
    known keys of its table, the closest first."""
    cited = list(raw.get("sources", {})) if isinstance(raw.get("sources"), dict) else []
    for table, keys in KNOWN_KEYS.items():
        values = raw if not table else raw.get(table)
        for key in values if isinstance(values, dict) else ():
            if key not in keys:
                where = f"[{table}]" if table else "the top level"
                raise SpecError(f"{origin}: unknown key {'.'.join(filter(None, (table, key)))!r} in {where}; "
                                f"known keys there: {', '.join(closest_first(key, list(keys)))}")
    fields = [f"{table}.{key}" for table, keys in KNOWN_KEYS.items() if table for key in keys]
    for key in cited:
        if key not in fields:
            raise SpecError(f"{origin}: [sources] cites {key!r}, which is no field of a node file; known fields: "
                            f"{', '.join(closest_first(key, fields))}")


def parse_node(raw: dict[str, Any], *, origin: str) -> NodeSpec:
    """Build a ``NodeSpec`` from parsed TOML, naming the bad field on error."""
    check_keys(raw, origin)
    reader = _Reader(raw, origin)
    if reader.get("schema_version", int) != SCHEMA_VERSION:
        raise SpecError(f"{origin}: schema_version must be {SCHEMA_VERSION}")
    device_type = reader.get("device_type", str)
    if device_type not in ("cuda", "rocm", "cpu"):
        raise SpecError(f"{origin}: device_type must be cuda, rocm or cpu, got {device_type!r}")
    peaks = {"fp32": reader.number("device.fp32_tflops") * TERA,
             "fp16": reader.number("device.fp16_tflops") * TERA}
    for dtype in OPTIONAL_DTYPES:  # optional: V100 has no bf16, A100 no fp8, Hopper no MX/NVFP4
        if reader.has(f"device.{dtype}_tflops"):
            peaks[dtype] = reader.number(f"device.{dtype}_tflops") * TERA
    memory_bytes, reserved_bytes = _device_memory(reader)
    sustained_mhz = _optional(reader, "device.sustained_clock_mhz")
    hardware = HardwareSpec(
        name=reader.get("name", str),
        display_name=reader.get("display_name", str),
        device_type=device_type,
        peak_flops_per_s=peaks,
        memory_bytes=memory_bytes,
        memory_bandwidth_bytes_per_s=reader.number("device.memory_bandwidth_tb_per_s") * TB,
        runtime_reserved_bytes=reserved_bytes,
        num_sms=reader.integer("device.num_sms") if reader.has("device.num_sms") else 0,
        sustained_clock_hz=sustained_mhz * MEGA,
        power_limited_clock_hz=_power_limited_mhz(reader, sustained_mhz) * MEGA,
        compute_capability=_optional(reader, "device.compute_capability", maximum=100.0),
        sustained_rate_share=_optional(reader, "device.sustained_rate_share", maximum=1.0, absent=1.0),
        sources=reader.sources,
    )
    gpus_per_node = reader.integer("node.gpus_per_node")
    return NodeSpec(
        hardware=hardware,
        gpus_per_node=gpus_per_node,
        nodes_per_nvlink_domain=_nodes_per_nvlink_domain(reader, gpus_per_node),
        intra_node=LinkSpec(
            kind=reader.link_kind("intra_node.kind"),
            bandwidth_bytes_per_s=reader.number("intra_node.bandwidth_gb_per_s") * GB,
            latency_s=reader.number("intra_node.latency_us", maximum=MAX_LATENCY_US) * US,
            nvls_efficiency=_optional(reader, "intra_node.nvls_efficiency", maximum=1.0),
        ),
        inter_node=NetworkSpec(
            kind=reader.link_kind("inter_node.kind"),
            nics_per_node=reader.integer("inter_node.nics_per_node"),
            nic_bandwidth_bytes_per_s=reader.number("inter_node.nic_gbit_per_s") * GBIT,
            latency_s=reader.number("inter_node.latency_us", maximum=MAX_LATENCY_US) * US,
            sharp=reader.flag("inter_node.sharp"),
        ),
        host_link_bandwidth_bytes_per_s=reader.number("node.host_link_gb_per_s") * GB,
        host_memory_bandwidth_bytes_per_s=reader.number("node.host_memory_gb_per_s") * GB,
        host_memory_bytes=int(reader.number("node.host_memory_gib") * GIB),
        storage_write_bandwidth_bytes_per_s=reader.number("node.storage_write_gb_per_s") * GB,
    )


def _nodes_per_nvlink_domain(reader: "_Reader", gpus_per_node: int) -> int:
    """``node.nvlink_domain_gpus`` (absent = one node) as a whole number of nodes."""
    if not reader.has("node.nvlink_domain_gpus"):
        return 1
    domain = reader.integer("node.nvlink_domain_gpus")
    if domain % gpus_per_node:
        raise SpecError(f"{reader.origin}: field 'node.nvlink_domain_gpus' must be a multiple of node.gpus_per_node "
                        f"({gpus_per_node}): an NVLink domain holds whole nodes, got {domain}")
    return domain // gpus_per_node


def _device_memory(reader: "_Reader") -> tuple[int, int]:
    """(memory, runtime reserve) of ``[device]`` in bytes: the memory up to ``MAX_MEMORY_BYTES``, the
    reserve below it; a bad value is named as the file has it, in GiB."""
    memory_gib = reader.number("device.memory_gib", maximum=MAX_MEMORY_BYTES // GIB)
    reserved_gib = reader.number("device.runtime_reserved_gib", minimum=0.0)
    memory, reserved = int(memory_gib * GIB), int(reserved_gib * GIB)
    if memory < 1:
        raise SpecError(f"{reader.origin}: field 'device.memory_gib' must be at least one byte "
                        f"({1 / GIB:.3g} GiB), got {memory_gib!r}")
    if reserved >= memory:
        raise SpecError(f"{reader.origin}: field 'device.runtime_reserved_gib' must be from 0 to below "
                        f"device.memory_gib ({memory_gib:g}): the runtime's reserve comes out of the device "
                        f"memory, got {reserved_gib!r}")
    return memory, reserved


def _power_limited_mhz(reader: "_Reader", sustained_mhz: float) -> float:
    """``device.power_limited_clock_mhz`` (absent = 0): at most ``device.sustained_clock_mhz``, which it needs."""
    limited = _optional(reader, "device.power_limited_clock_mhz")
    if limited > sustained_mhz:
        datasheet = f"device.sustained_clock_mhz ({sustained_mhz:g})" if sustained_mhz else \
            "device.sustained_clock_mhz, which the file does not give"
        raise SpecError(f"{reader.origin}: field 'device.power_limited_clock_mhz' must be at most {datasheet}: "
                        f"the limit lowers the datasheet clock, got {limited!r}")
    return limited


def _plain(number: float) -> str:
    """``number`` as a person writes it: 1,048,576 rather than 1.04858e+06."""
    return f"{number:,.0f}" if number == int(number) else f"{number:g}"


def _optional(reader: "_Reader", key: str, *, maximum: float | None = None, absent: float = 0.0) -> float:
    """The number at ``key`` (at most ``maximum``), ``absent`` when the file does not give it."""
    return reader.number(key, maximum=maximum) if reader.has(key) else absent


class _Reader:
    """Typed access to dotted keys of a TOML table; every number must cite a source."""

    def __init__(self, raw: dict[str, Any], origin: str) -> None:
        self.raw = raw
        self.origin = origin
        sources = raw.get("sources", {})
        if not isinstance(sources, dict):
            raise SpecError(f"{origin}: [sources] must be a table of key = \"source\"")
        self.sources = {str(k): str(v) for k, v in sources.items()}

    def has(self, key: str) -> bool:
        try:
            self._lookup(key)
        except KeyError:
            return False
        return True

    def _lookup(self, key: str) -> Any:
        table, _, name = key.rpartition(".")
        assert name in KNOWN_KEYS[table], f"{key} is read but not in KNOWN_KEYS"
        value: Any = self.raw
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                raise KeyError(key)
            value = value[part]
        return value

    def get(self, key: str, kind: type) -> Any:
        try:
            value = self._lookup(key)
        except KeyError:
            raise SpecError(f"{self.origin}: missing field {key!r}") from None
        if not isinstance(value, kind) or isinstance(value, bool):
            expected = "a number" if isinstance(kind, tuple) else f"a {kind.__name__}"
            raise SpecError(f"{self.origin}: field {key!r} must be {expected}, got {value!r}")
        return value

    def number(self, key: str, minimum: float | None = None, maximum: float | None = None) -> float:
        """The number at ``key``, in the file's unit: positive (or at least ``minimum``), at most
        ``maximum`` (else ``MAX_FILE_NUMBER``), with a source."""
        value = self.get(key, (int, float))  # type: ignore[arg-type]
        if not math.isfinite(value) or value > MAX_FILE_NUMBER:
            raise SpecError(f"{self.origin}: field {key!r} must be a finite number below {MAX_FILE_NUMBER:g}, "
                            f"got {value!r}")
        below = value <= 0 if minimum is None else value < minimum
        if below or maximum is not None and value > maximum:
            low = "above 0" if minimum is None else f"at least {minimum:g}"
            allowed = low if maximum is None else f"{low} and at most {_plain(maximum)}"
            raise SpecError(f"{self.origin}: field {key!r} must be {allowed}, got {value!r}")
        if key not in self.sources:
            raise SpecError(f"{self.origin}: field {key!r} has no entry in [sources]; cite where it comes from")
        return float(value)

    def flag(self, key: str) -> bool:
        """An optional true/false field (absent = false); when present it must cite a source."""
        if not self.has(key):
            return False
        value = self._lookup(key)
        if not isinstance(value, bool):
            raise SpecError(f"{self.origin}: field {key!r} must be true or false, got {value!r}")
        if key not in self.sources:
            raise SpecError(f"{self.origin}: field {key!r} has no entry in [sources]; cite where it comes from")
        return value

    def integer(self, key: str) -> int:
        value = self.number(key)
        if value != int(value) or value > MAX_DEVICES_PER_NODE:
            raise SpecError(f"{self.origin}: field {key!r} must be a whole number from 1 to "
                            f"{MAX_DEVICES_PER_NODE}, got {value!r}")
        return int(value)

    def link_kind(self, key: str) -> str:
        value = self.get(key, str)
        if value not in _LINK_KINDS:
            raise SpecError(f"{self.origin}: field {key!r} must be one of {', '.join(_LINK_KINDS)}, got {value!r}")
        return value
