"""The machine side of ``gpu_truth.py``: wheels for a bare GPU image, device facts, the hardware preset.

No torch here: the parent process stays light; what torch reports comes from the measuring
process (``gpu_truth_runner.environment``) and from the profile's provenance.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

REQUIRED_WHEELS: dict[str, str] = {"pulp": "PuLP==3.3.2", "highspy": "highspy==1.16.0"}
"""import name -> pinned requirement (constraints.txt) of the pyproject dependencies the GPU image
lacks: it has torch, numpy, click, rich, networkx and matplotlib (with their own dependencies)."""
OPTIONAL_WHEELS: dict[str, str] = {"pynvml": "nvidia-ml-py"}
"""Not a dependency: with it the profile records SM clocks and power through NVML
(``profiles/provenance.py``); nvidia-smi gives the record's clocks either way."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DEVICE_PRESETS: tuple[tuple[str, str], ...] = (
    (r"H100.*(PCIe)", "h100-pcie-80gb"),
    (r"H100 NVL", ""),
    (r"H100.*96\s*GB|H100.*HBM2e", "h100-hbm2e-96gb-500w"),
    (r"H100", "h100-sxm-80gb"),
    (r"H200", "h200-sxm-141gb"),
    (r"H800", "h800-sxm-80gb"),
    (r"A100.*PCIe", ""),
    (r"A100.*40\s*GB", "a100-sxm-40gb"),
    (r"A100", "a100-sxm-80gb"),
    (r"GB200", "gb200-nvl72"),
    (r"GB300", "gb300-nvl72"),
    (r"B200", "b200"),
    (r"B300", "b300"),
    (r"L40S", "l40s"),
    (r"V100", "v100-sxm-32gb"),
    (r"MI300X", "mi300x"),
)
"""``torch.cuda.get_device_name`` pattern -> shipped preset, first match wins; "" = a card with no
preset of its own (an H100 NVL is neither the SXM nor the PCIe datasheet): pass --hardware."""
SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.draw", "power.limit", "temperature.gpu", "memory.total", "pstate", "compute_mode")


class TruthError(ValueError):
    """Bad input to gpu_truth.py (one ``error:`` line, exit 2)."""


def hardware_preset(device_name: str) -> str:
    """The shipped hardware preset of a device name; ``TruthError`` naming --hardware when none fits."""
    for pattern, preset in DEVICE_PRESETS:
        if re.search(pattern, device_name, re.IGNORECASE):
            if preset:
                return preset
            break
    raise TruthError(f"device {device_name!r} has no hardware preset of its own; pass --hardware NAME "
                     "(see 'autoplan hardware') or a node TOML")


def nvidia_smi() -> dict[str, str] | None:
    """``nvidia-smi --query-gpu`` of GPU 0 as {field: text}; None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout).strip()[:300]}
    values = [v.strip() for v in lines[0].split(",")]
    return dict(zip(SMI_FIELDS, values))


def missing_modules(names) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def install_wheels(wheels: Path, target: Path) -> list[str]:
    """Install the missing required (and optional) packages from the wheels in ``wheels`` into
    ``target`` and put it on ``sys.path``; returns what was installed. pip with --no-index when
    pip is there, else the wheels are unpacked (a wheel is a zip laid out for site-packages)."""
    if not wheels.is_dir():
        raise TruthError(f"--wheels {wheels}: no such directory; make it with --prepare-wheels DIR where pip works")
    target.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    names = missing_modules([*REQUIRED_WHEELS, *OPTIONAL_WHEELS])
    files = {name: _wheel_for(wheels, REQUIRED_WHEELS.get(name) or OPTIONAL_WHEELS[name]) for name in names}
    absent = [REQUIRED_WHEELS[n] for n, f in files.items() if f is None and n in REQUIRED_WHEELS]
    if absent:
        raise TruthError(f"--wheels {wheels}: no wheel for {', '.join(absent)}; rerun --prepare-wheels {wheels}")
    chosen = [f for f in files.values() if f is not None]
    if chosen and not _pip_install(chosen, target):
        for wheel in chosen:
            _unpack(wheel, target)
    importlib.invalidate_caches()
    still = missing_modules(REQUIRED_WHEELS)
    if still:
        raise TruthError(f"--wheels {wheels}: {', '.join(still)} still not importable after installing into {target}")
    return [f.name for f in chosen]


def _wheel_for(wheels: Path, requirement: str) -> Path | None:
    stem = re.split(r"[=<>]", requirement)[0].lower().replace("-", "_")
    found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(stem + "-"))
    return found[-1] if found else None


def _pip_install(files: list[Path], target: Path) -> bool:
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--upgrade",
               "--target", str(target), *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True).returncode == 0


def _unpack(wheel: Path, target: Path) -> None:
    """Unzip a wheel into ``target`` keeping the files' permission bits (pulp ships a CBC binary)."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, target))
            mode = info.external_attr >> 16
            if mode and not info.is_dir():
                path.chmod(stat.S_IMODE(mode))


def prepare_wheels(out: Path, *, optional: bool = True) -> list[Path]:
    """Download the wheels of ``REQUIRED_WHEELS`` (and ``OPTIONAL_WHEELS``) for Linux x86-64 CPython
    3.12 into ``out`` with pip (binary only, no dependencies: the GPU image has theirs); returns them."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = [*REQUIRED_WHEELS.values(), *(OPTIONAL_WHEELS.values() if optional else ())]
    for requirement in wanted:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
                   "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                   *[arg for p in PLATFORMS for arg in ("--platform", p)], "--dest", str(out), requirement]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise TruthError(f"--prepare-wheels: pip could not download {requirement}: "
                             f"{' '.join(done.stderr.split())[-300:]}")
    return sorted(out.glob("*.whl"))


def child_env(repo: Path, extra_paths: list[Path], device: str) -> dict[str, str]:
    """The environment of every subprocess: the repo and installed wheels first on PYTHONPATH,
    unbuffered output; on CPU one math thread (the 'cpu' preset is one process per core)."""
    env = dict(os.environ)
    paths = [str(repo), *map(str, extra_paths)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    return env
