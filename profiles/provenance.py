"""What a profiling run records about where and how it measured (imports torch inside functions).

Device identity of every rank, the device's clock, power and mode state (NVML, when ``pynvml``
is importable; null on CPU or without it), the numerics flags the run set, versions and load.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

DEVICE_STATE_KEYS: tuple[str, ...] = ("sm_clock_mhz", "max_sm_clock_mhz", "power_limit_w", "power_draw_w",
                                      "temperature_c", "mig_mode", "ecc_mode")
"""What ``device_state`` reports; every value is None where it cannot be read."""


def device_name(device: Any) -> str:
    """Marketing name of the device: CUDA device name, or the CPU model from /proc/cpuinfo."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_identity(device: Any) -> dict[str, Any]:
    """This rank's host and device: name, compute capability and memory (None on CPU)."""
    import torch

    identity: dict[str, Any] = {"host": socket.gethostname(), "device_name": device_name(device),
                                "capability": None, "memory_bytes": None}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        identity.update(capability=[props.major, props.minor], memory_bytes=int(props.total_memory))
    return identity


def set_numerics() -> dict[str, Any]:
    """Turn TF32 off for matmuls and cuDNN, so fp32 is measured as fp32, and read the flags back
    (they are process-wide and only matter on GPU, but are set and recorded on every device)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return {"tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def device_state(device: Any) -> dict[str, Any]:
    """SM clock (now and max, MHz), power limit and draw (W), temperature (C), MIG and ECC mode
    of a CUDA device through NVML (``pynvml``); every value None on CPU or where NVML is absent."""
    state: dict[str, Any] = dict.fromkeys(DEVICE_STATE_KEYS)
    if device.type != "cuda":
        return state
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(device))
    except Exception:  # no pynvml, no driver access: the state stays unknown
        return state
    reads = {
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        "power_draw_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "mig_mode": lambda: pynvml.nvmlDeviceGetMigMode(handle)[0],
        "ecc_mode": lambda: pynvml.nvmlDeviceGetEccMode(handle)[0],
    }
    for key, read in reads.items():
        try:
            state[key] = read()
        except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: unknown, not fatal
            state[key] = None
    return state


def _nvml_index(device: Any) -> int:
    """NVML's index of a CUDA device: CUDA_VISIBLE_DEVICES renumbers CUDA's, not NVML's."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = device.index or 0
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if index < len(entries) and entries[index].isdigit():
            return int(entries[index])
    return index


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (None where the OS has none): other work
    on the machine while profiling slows every measurement down."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def provenance(args: argparse.Namespace, device: Any, identities: list[dict[str, Any]], skipped: dict[str, str],
               extra: dict[str, Any]) -> dict[str, Any]:
    """Where and how the profile was measured. ``identities``: every rank's ``device_identity``;
    ``extra``: what the run itself recorded (numerics, device state, load before, pools)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    hosts = [i["host"] for i in identities]
    cuda = device.type == "cuda"
    nccl = torch.cuda.nccl.version() if cuda else None
    return {
        "device_name": identities[0]["device_name"], "devices": identities, "num_devices": world,
        "num_nodes": len(set(hosts)), "devices_per_node": max(hosts.count(h) for h in set(hosts)),
        "backend": dist.get_backend(), "hosts": sorted(set(hosts)),
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda if cuda else None,
        "nccl_version": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "python_version": platform.python_version(), "platform": platform.platform(),
        "threads_per_process": torch.get_num_threads(), "mode": "quick" if args.quick else "full",
        "phases": [args.only] if getattr(args, "only", None) else ["compute", "collectives"],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": args.command or " ".join(["python -m profiles.harness", *sys.argv[1:]]),
        "skipped": skipped, "load_average_after": load_average(), **extra,
    }
