"""A torchtitan run directory as one run: its job config (TOML) and its training log.

torchtitan reads its job from a TOML (``--job.config_file``; ``[model] name, flavor``,
``[parallelism]``, ``[training]``, ``[activation_checkpoint]``, ...), which autoplan's export writes
too (``planner.launch.frameworks.torchtitan_config``); the layout comes from it through the same
reader the export's round trip uses (``planner.launch.readback.torchtitan_sections_layout``). Its
metrics logger prints ``step: N  loss: L  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%`` per
logged step (``torchtitan/components/metrics.py``; colour codes stripped), where ``tps`` is tokens
per second per device and ``memory`` the peak reserved GiB. A step of the global batch takes
global batch x sequence / (tps x devices). The first ``WARMUP_STEPS`` logged steps are dropped.
"""

from __future__ import annotations

import re
import statistics
import tomllib
from pathlib import Path
from typing import Any

from costmodels.presets import load_model
from hardware_specs.units import GIB
from planner.launch.frameworks import TORCHTITAN_LLAMA3_FLAVORS
from planner.launch.readback import torchtitan_sections_layout

from .runs import CalibrationError, LoggedRun

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP = re.compile(r"step:\s*(\d+)\s.*?tps:\s*([0-9,]+)")
MEMORY = re.compile(r"memory:\s*([0-9.]+)\s*GiB")
OUT_OF_MEMORY = re.compile(r"OutOfMemoryError|CUDA out of memory")
WARMUP_STEPS = 5
"""Logged steps dropped: the first ones compile, tune kernels and build communicators."""
SHAPE_PRESETS = {(32, 4096, 128256): "llama3-8b", (80, 8192, 128256): "llama3-70b", (126, 16384, 128256): "llama3-405b"}
"""The autoplan preset of each Llama 3 shape torchtitan registers a flavor for."""
FLAVOR_PRESETS = {flavor: SHAPE_PRESETS[shape] for shape, flavor in TORCHTITAN_LLAMA3_FLAVORS.items()}
"""torchtitan's llama3 flavor ("8B", "70B", "405B") -> autoplan preset; any other flavor names a preset."""
FIELDS = (("global_batch", "training.global_batch_size"), ("seq_len", "training.seq_len"))
"""The job's inputs as the job config names them (errors about the run say these)."""


def _config_path(directory: Path) -> Path | None:
    for path in sorted(directory.glob("*.toml")):
        try:
            if "parallelism" in tomllib.loads(path.read_text(encoding="utf-8")):
                return path
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
    return None


def is_torchtitan_run(directory: Path) -> bool:
    """Whether ``directory`` holds a torchtitan job config (a TOML with ``[parallelism]``)."""
    return _config_path(directory) is not None


def log_lines(text: str) -> list[str]:
    """A log's lines without colour codes."""
    return ANSI.sub("", text).splitlines()


def step_times(lines: list[str], tokens_per_step: float, num_gpus: int) -> list[float]:
    """Seconds per step of each logged step past the warm-up (``WARMUP_STEPS``; where none is past
    it, every step but the first): global batch tokens / (tps x devices)."""
    logged = [float(m.group(2).replace(",", "")) for m in map(STEP.search, lines) if m]
    return [tokens_per_step / (tps * num_gpus) for tps in logged[WARMUP_STEPS:] if tps > 0] or \
        [tokens_per_step / (tps * num_gpus) for tps in logged[1:] if tps > 0]


def peak_memory_bytes(lines: list[str]) -> float | None:
    """The largest peak reserved memory the step lines report (bytes), None if none does."""
    peaks = [float(m.group(1)) * GIB for m in map(MEMORY.search, lines) if m]
    return max(peaks) if peaks else None


def _log_lines(directory: Path) -> tuple[Path, list[str]]:
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix.lower() in (".log", ".txt", ".out"):
            lines = log_lines(path.read_text(encoding="utf-8", errors="replace"))
            if any(STEP.search(line) or OUT_OF_MEMORY.search(line) for line in lines):
                return path, lines
    raise CalibrationError(f"{directory}: a torchtitan config but no log with 'step: N ... tps: T' lines "
                           "(or an out-of-memory error) beside it")


def _world_size(parallelism: dict[str, Any], path: Path) -> int:
    degrees = [parallelism.get(k, 1) for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                                 "tensor_parallel_degree", "pipeline_parallel_degree",
                                                 "context_parallel_degree")]
    if any(not isinstance(d, int) or d < 1 for d in degrees):
        raise CalibrationError(f"{path}: [parallelism] degrees must be set explicitly (a -1 leaves the world size "
                               "to the launcher, which the log does not say)")
    size = 1
    for degree in degrees:
        size *= degree
    return size


def read_torchtitan_run(directory: Path, *, hardware: str, gpus_per_node: int | None = None) -> LoggedRun:
    """One run from a torchtitan run directory on ``hardware``."""
    config_path = _config_path(directory)
    if config_path is None:
        raise CalibrationError(f"{directory}: no torchtitan config (*.toml with [parallelism])")
    config = tomllib.loads(config_path.read_text(encoding="utf-8"))
    flavor = str(config.get("model", {}).get("flavor", ""))
    try:
        model = load_model(FLAVOR_PRESETS.get(flavor, flavor))
    except ValueError as err:
        raise CalibrationError(f"{config_path}: model.flavor {flavor!r} is no torchtitan llama3 flavor and no "
                               f"autoplan preset ({err})") from None
    world = _world_size(config.get("parallelism", {}), config_path)
    try:
        layout, training = torchtitan_sections_layout(config, world, model.num_layers)
    except (KeyError, TypeError, ValueError, AssertionError, ZeroDivisionError) as err:
        raise CalibrationError(f"{config_path}: the config gives no layout autoplan can cost ({err!r})") from None
    log_path, lines = _log_lines(directory)
    times = step_times(lines, training["global_batch_size"] * training["seq_len"], world)
    oom = any(OUT_OF_MEMORY.search(line) for line in lines)
    request = {"model": model, "hardware": hardware, "gpus": world, "gpus_per_node": gpus_per_node,
               "global_batch": training["global_batch_size"], "seq_len": training["seq_len"],
               "precision": training["precision"], "fp8_recipe": training["fp8_recipe"], "runtime": "torchtitan",
               "compiled": training["compiled"]}
    return LoggedRun(request=request, layout=layout, step_time_s=statistics.median(times) if times and not oom else None,
                     peak_memory_bytes=peak_memory_bytes(lines), out_of_memory=oom,
                     origin=f"{log_path} (torchtitan, {len(times)} steps)", fields=FIELDS)
