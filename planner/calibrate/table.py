"""A table of logged runs (CSV or TSV, one run a row) as runs.

Header, then one row per run:

    model,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,recompute,step_time_s,peak_memory_gib,status
    llama3-8b,16,128,4096,8,2,1,1,none,2.41,61.2,ok
    llama3-8b,16,128,4096,16,1,1,2,none,,,oom

Required: ``model`` (a preset name or a Hugging Face ``config.json`` path, relative to the table),
``gpus``, ``global_batch``, ``seq_len``, ``dp``, ``tp``, ``pp``, and a step time (``step_time_s`` or
``step_time_ms``) unless ``status`` is ``oom``. Optional: ``cp``, ``ep``, ``zero``, ``micro_batch``,
``schedule``, ``virtual_stages``, ``recompute``, ``sequence_parallel``, ``tp_comm_overlap``,
``precision``, ``runtime``, ``gpus_per_node``, ``peak_memory_gib``, ``status`` (``ok``, ``oom``);
absent ones take ``autoplan evaluate``'s defaults. Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Callable

from autoplan_base.errors import file_wording
from costmodels.layout import Layout, LayoutError
from hardware_specs.units import GIB

from .runs import CalibrationError, LoggedRun

REQUIRED = ("model", "gpus", "global_batch", "seq_len", "dp", "tp", "pp")
FIELDS = (("micro_batch_size", "micro_batch"), ("zero_stage", "zero"))
"""The columns whose name is not the ``planner.evaluate`` keyword they give; the others are spelled alike."""
STATUSES = ("ok", "oom")
TRUE = ("1", "true", "yes", "on")


def _number(row: dict[str, str], key: str, where: str, kind: type = int, default: Any = None) -> Any:
    text = (row.get(key) or "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise CalibrationError(f"{where}: {key} is {text!r}, not a{'n integer' if kind is int else ' number'}") from None
    if not math.isfinite(value) or value < 0 or value == 0 and key != "zero":
        raise CalibrationError(f"{where}: {key} must be positive, got {text}")
    return value


def _flag(row: dict[str, str], key: str, default: bool) -> bool:
    text = (row.get(key) or "").strip().lower()
    return default if not text else text in TRUE


def row_layout(row: dict[str, str], global_batch: int, number: Callable[[str, type, Any], Any]) -> Layout:
    """The layout a table row gives (columns ``dp``, ``tp``, ``pp``, and optionally ``cp``, ``ep``,
    ``zero``, ``micro_batch``, ``schedule``, ``virtual_stages``, ``recompute``,
    ``sequence_parallel``, ``tp_comm_overlap``, else ``autoplan evaluate``'s defaults), its
    micro-batch count met from ``global_batch`` as ``evaluate`` meets it
    (``planner.api.layout_for_batch``). ``number(column, kind, default)`` reads a numeric cell
    (each table's reader, with its own errors); ``dp``, ``tp`` and ``pp`` must have values. Raises
    ``LayoutError``: call it under ``file_wording`` so it names the columns. Used by this reader and
    ``validate --from-log``'s."""
    from planner.api import layout_for_batch

    dp, tp, pp = (number(k, int, None) for k in ("dp", "tp", "pp"))
    return layout_for_batch(global_batch, dp=dp, tp=tp, pp=pp, micro_batch_size=number("micro_batch", int, 1),
                            cp=number("cp", int, 1), ep=number("ep", int, 1), zero_stage=number("zero", int, 0),
                            schedule=(row.get("schedule") or "1f1b").strip(),
                            virtual_stages=number("virtual_stages", int, 1),
                            recompute=(row.get("recompute") or "none").strip(),
                            sequence_parallel=_flag(row, "sequence_parallel", tp > 1),
                            tp_comm_overlap=_flag(row, "tp_comm_overlap", False))


def _layout(row: dict[str, str], where: str) -> Layout:
    """The row's layout (``row_layout``); the rest of its checks come once the job is known (``terms``)."""
    try:
        with file_wording(dict(FIELDS)):
            return row_layout(row, _number(row, "global_batch", where),
                              lambda key, kind, default: _number(row, key, where, kind, default))
    except LayoutError as err:
        raise CalibrationError(f"{where}: {err}") from None


def _model(text: str, table: Path) -> str:
    """A preset name as given; a path resolved against the table's directory."""
    if "/" in text or text.endswith(".json"):
        return str((table.parent / text).resolve())
    return text


def read_table(path: Path, *, hardware: str, gpus_per_node: int | None = None) -> list[LoggedRun]:
    """The table's rows as runs on ``hardware``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise CalibrationError(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise CalibrationError(f"{path}: not UTF-8 text (byte {err.start}); save the table as UTF-8 CSV or TSV") from None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise CalibrationError(f"{path}: empty; expected a header ({', '.join(REQUIRED)}, step_time_s, ...) and rows")
    reader = csv.DictReader([line for _, line in numbered], delimiter="\t" if "\t" in numbered[0][1] else ",")
    reader.fieldnames = [h.strip() for h in reader.fieldnames or []]
    missing = [k for k in REQUIRED if k not in reader.fieldnames]
    if missing or not {"step_time_s", "step_time_ms", "status"} & set(reader.fieldnames):
        raise CalibrationError(f"{path}:{numbered[0][0]}: the header needs {', '.join(REQUIRED)} and step_time_s "
                               f"(or step_time_ms, or status); missing {', '.join(missing) or 'a step time'}")
    runs = []
    for (number, _), row in zip(numbered[1:], reader):
        runs.append(_run(row, f"{path}:{number}", path, hardware, gpus_per_node))
    return runs


def _run(row: dict[str, str], where: str, table: Path, hardware: str, gpus_per_node: int | None) -> LoggedRun:
    status = (row.get("status") or "ok").strip().lower()
    if status not in STATUSES:
        raise CalibrationError(f"{where}: status is {status!r}; use ok or oom")
    seconds = _number(row, "step_time_s", where, float) or (_number(row, "step_time_ms", where, float) or 0) / 1e3
    if status == "ok" and not seconds:
        raise CalibrationError(f"{where}: no step time (step_time_s or step_time_ms) for a run with status ok")
    empty = [k for k in REQUIRED if not (row.get(k) or "").strip()]
    if empty:
        raise CalibrationError(f"{where}: {', '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty; every row "
                               f"needs {', '.join(REQUIRED)} (model: a preset name or a config.json path)")
    model = row["model"].strip()
    request = {"model": _model(model, table), "hardware": hardware,
               "gpus": _number(row, "gpus", where), "global_batch": _number(row, "global_batch", where),
               "seq_len": _number(row, "seq_len", where),
               "gpus_per_node": _number(row, "gpus_per_node", where, int, gpus_per_node),
               "precision": (row.get("precision") or "bf16").strip(), "runtime": (row.get("runtime") or "megatron").strip()}
    gib = _number(row, "peak_memory_gib", where, float)
    return LoggedRun(request=request, layout=_layout(row, where), step_time_s=seconds if status == "ok" else None,
                     peak_memory_bytes=gib * GIB if gib else None, out_of_memory=status == "oom", origin=where,
                     fields=FIELDS)
