"""Logs as a team has them: files and directories, each read by the one reader its format needs.

A ``.csv`` / ``.tsv`` file is a table of runs (``table``); a directory holding a torchtitan job
config (``*.toml`` with ``[parallelism]``) is one torchtitan run (``torchtitan_log``); any other
file is a Megatron-LM log (``megatron_log``). A directory is searched for all three, in sorted
order (so the same directory gives the same runs in the same order); its files that are none of
them (no arguments block, not a table) are skipped and counted, never silently half-read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .megatron_log import read_megatron_log
from .runs import CalibrationError, LoggedRun
from .table import read_table
from .torchtitan_log import is_torchtitan_run, read_torchtitan_run

TABLE_SUFFIXES = (".csv", ".tsv")
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
"""Files a directory search reads as Megatron-LM logs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sources:
    """The runs read and the files a directory search passed over."""

    runs: tuple[LoggedRun, ...]
    skipped: tuple[str, ...]
    """Files in searched directories that held no run (no arguments block, no step line)."""


def _read_file(path: Path, hardware: str, gpus_per_node: int | None) -> list[LoggedRun]:
    if path.suffix.lower() in TABLE_SUFFIXES:
        return read_table(path, hardware=hardware, gpus_per_node=gpus_per_node)
    return [read_megatron_log(path, hardware=hardware, gpus_per_node=gpus_per_node)]


def _search(directory: Path, hardware: str, gpus_per_node: int | None, runs: list, skipped: list) -> None:
    if is_torchtitan_run(directory):
        runs.append(read_torchtitan_run(directory, hardware=hardware, gpus_per_node=gpus_per_node))
        return
    for path in sorted(directory.iterdir()):
        if path.is_dir():
            _search(path, hardware, gpus_per_node, runs, skipped)
        elif path.suffix.lower() in TABLE_SUFFIXES:
            runs.extend(read_table(path, hardware=hardware, gpus_per_node=gpus_per_node))
        elif path.suffix.lower() in LOG_SUFFIXES:
            try:
                runs.append(read_megatron_log(path, hardware=hardware, gpus_per_node=gpus_per_node))
            except CalibrationError as err:
                skipped.append(str(err))


def read_sources(paths: list[str | Path], *, hardware: str, gpus_per_node: int | None = None) -> Sources:
    """Every run in ``paths`` (files or directories) on ``hardware``."""
    runs: list[LoggedRun] = []
    skipped: list[str] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            _search(path, hardware, gpus_per_node, runs, skipped)
        elif path.is_file():
            runs.extend(_read_file(path, hardware, gpus_per_node))
        else:
            raise CalibrationError(f"{path}: no such file or directory")
    if not runs:
        detail = f"; skipped: {skipped[0]}" if skipped else ""
        raise CalibrationError(f"no run found in {', '.join(map(str, paths))}{detail}")
    return Sources(runs=tuple(runs), skipped=tuple(skipped))
