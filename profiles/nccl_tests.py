"""Read the stdout of NVIDIA's nccl-tests into collective curves. Pure: no torch, no file writes.

nccl-tests (github.com/NVIDIA/nccl-tests) prints, per run of one binary (``all_reduce_perf`` ...):

- an optional ``# nccl-tests version V nccl-headers=H nccl-library=L`` and ``# Collective test
  starting: NAME`` (versions from 2.13 on), then ``# nThread ... nGpus ... minBytes ...``;
- ``# Using devices`` and one ``#  Rank R Group G Pid P on HOST device D [BUS] NAME`` line per rank;
- a two-line column header (``size count type redop root time algbw busbw #wrong`` for the
  out-of-place then the in-place half; older versions say ``bytes``/``N``/``op``/``error``, some
  forks drop ``root``, ``-R``-style per-iteration columns may follow) and one row per size, with
  ``time`` in microseconds.

The size column is ``max(send bytes, receive bytes)`` of one rank (``src/common.cu``), which is the
full buffer S of ``doc/PERFORMANCE.md`` for every collective read here: the all-gather output, the
reduce-scatter input, the all-to-all send buffer, the all-reduce, broadcast and send/recv buffer.
That is the convention of the profile's curves (``fit.bus_factor``), so the row's time is stored
against the size as printed. ``sendrecv_perf`` on n ranks is a ring step (every rank sends to the
next and receives from the previous at once), stored as ``send_recv`` on n ranks; a pipeline stage
boundary is its 2-rank case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .build import fit_collective
from .schema import CollectiveCurve, HardwareProfile, ProfileError

PROGRAM_OPS: dict[str, str] = {
    "all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all",
    "sendrecv_perf": "send_recv", "broadcast_perf": "broadcast",
}
"""nccl-tests binaries whose results the profile holds, and the profile's name of each collective."""

NCCL_TYPES: dict[str, str] = {
    "float": "fp32", "float32": "fp32", "half": "fp16", "float16": "fp16",
    "bfloat16": "bf16", "f8e4m3": "fp8", "f8e5m2": "fp8",
}
"""nccl-tests ``type`` column (``-d``) to the profile's dtype names."""

_PROGRAM = re.compile(r"(?<![a-z])((?:all_reduce|all_gather|reduce_scatter|alltoallv?|sendrecv|broadcast|reduce|"
                      r"gather|scatter|hypercube)_perf)(?![a-z])")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$")
_VERSION = re.compile(r"^# nccl-tests version (\S+)(?:.*nccl-library=(\d+))?")


class NcclTestsError(ProfileError):
    """A log is not nccl-tests output, or holds results the profile cannot take."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRow:
    """One size of one run: the microsecond times of the out-of-place and in-place calls."""

    size_bytes: int
    """The size column: the full buffer S (see the module docstring)."""
    dtype: str
    """Profile dtype name of the ``type`` column."""
    out_of_place_time_s: float
    in_place_time_s: float | None
    """None when the log has no in-place half."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRun:
    """One nccl-tests binary's run as printed: who took part and the table."""

    where: str
    """File name (and section number when a file holds several runs), for messages."""
    program: str
    """The binary, e.g. ``all_reduce_perf``."""
    hosts: tuple[str, ...]
    """Host of each rank, by rank."""
    device_names: tuple[str, ...]
    """Device name of each rank, by rank."""
    rows: tuple[NcclTestsRow, ...]
    tests_version: str | None = None
    nccl_version: str | None = None

    @property
    def op(self) -> str:
        return PROGRAM_OPS[self.program]

    @property
    def num_ranks(self) -> int:
        return len(self.hosts)

    @property
    def num_nodes(self) -> int:
        return len(set(self.hosts))

    @property
    def ranks_per_node(self) -> int:
        return self.num_ranks // self.num_nodes


def nccl_version_name(code: int) -> str:
    """``NCCL_VERSION_CODE`` as major.minor.patch: major·10000 + minor·100 + patch from NCCL 2.9
    on, major·1000 + minor·100 + patch before (``nccl.h``'s ``NCCL_VERSION`` macro)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def parse_log(text: str, where: str) -> list[NcclTestsRun]:
    """Every run in one nccl-tests stdout (a file may hold several binaries' output in turn)."""
    sections = _sections(text.splitlines())
    if not sections:
        raise NcclTestsError(f"{where}: no nccl-tests result table (a '#  size  count  type ...' header "
                             "followed by rows); give the stdout of an nccl-tests binary such as all_reduce_perf")
    runs = []
    for i, lines in enumerate(sections):
        name = where if len(sections) == 1 else f"{where} (run {i + 1})"
        runs.append(_parse_section(lines, name, Path(where).name if i == 0 else ""))
    return runs


def _sections(lines: list[str]) -> list[list[str]]:
    """Lines split into runs: a run starts at a version, test-starting or ``# nThread`` line unless
    the current run has not reached its table yet. Only runs with a result header are kept."""
    sections: list[list[str]] = []
    current: list[str] = []
    seen_header = seen_nthread = False
    for line in lines:
        starts = line.startswith(("# nccl-tests version", "# Collective test starting", "# nThread"))
        if starts and (seen_header or (seen_nthread and line.startswith("# nThread"))):
            sections.append(current)
            current, seen_header, seen_nthread = [], False, False
        seen_nthread |= line.startswith("# nThread")
        seen_header |= _header_columns(line) is not None
        current.append(line)
    sections.append(current)
    return [s for s in sections if any(_header_columns(line) is not None for line in s)]


def _header_columns(line: str) -> list[str] | None:
    """Column names of a result header line, or None if ``line`` is not one."""
    if not line.startswith("#"):
        return None
    cols = line[1:].split()
    if cols[:1] in (["size"], ["bytes"]) and "busbw" in cols and any(c in ("time", "cputime") for c in cols):
        return cols
    return None


def _program(lines: list[str], where: str, file_name: str) -> str:
    for line in lines:
        if line.startswith("# Collective test starting:"):
            return line.split(":", 1)[1].strip().rsplit("/", 1)[-1]
    for line in lines:
        found = _PROGRAM.search(line)
        if found:
            return found.group(1)
    found = _PROGRAM.search(file_name)
    if found:
        return found.group(1)
    raise NcclTestsError(f"{where}: cannot tell which nccl-tests binary made this log (no '# Collective test "
                         f"starting:' line); name the file after it, e.g. all_reduce_perf.log")


def _parse_section(lines: list[str], where: str, file_name: str) -> NcclTestsRun:
    program = _program(lines, where, file_name)
    if program not in PROGRAM_OPS:
        raise NcclTestsError(f"{where}: {program} measures a collective the profile does not hold; "
                             f"import {', '.join(PROGRAM_OPS)}")
    ranks: dict[int, tuple[str, str]] = {}
    columns: list[str] = []
    rows: list[NcclTestsRow] = []
    tests_version = nccl_version = None
    for line in lines:
        version = _VERSION.match(line)
        if version:
            tests_version = version.group(1)
            nccl_version = nccl_version_name(int(version.group(2))) if version.group(2) else None
        rank = _RANK.match(line)
        if rank:
            ranks[int(rank.group(1))] = (rank.group(2), rank.group(4).strip())
        columns = _header_columns(line) or columns
        if columns and not line.startswith("#"):
            row = _row(line.split(), columns, where)
            if row is not None:
                rows.append(row)
    if "cputime" in columns:
        raise NcclTestsError(f"{where}: the table reports CPU time (nccl-tests -C 1); re-run without -C so "
                             "the time column is the device time of the collective")
    if len(ranks) < 2 or sorted(ranks) != list(range(len(ranks))):
        raise NcclTestsError(f"{where}: needs the '#  Rank N Group G Pid P on HOST device D [BUS] NAME' line of "
                             f"every rank (found {len(ranks)}) to know the group size and the nodes; keep the "
                             "whole stdout, and run on at least 2 ranks")
    if not rows:
        raise NcclTestsError(f"{where}: the result table of {program} has no rows of a supported type "
                             f"({', '.join(NCCL_TYPES)})")
    return NcclTestsRun(where=where, program=program, hosts=tuple(ranks[r][0] for r in sorted(ranks)),
                        device_names=tuple(ranks[r][1] for r in sorted(ranks)), rows=tuple(rows),
                        tests_version=tests_version, nccl_version=nccl_version)


def _row(tokens: list[str], columns: list[str], where: str) -> NcclTestsRow | None:
    """A table row, or None for a line that is not one (interleaved NCCL INFO output, a size of 0
    bytes, a type the profile has no name for)."""
    times = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
    if len(tokens) <= times[0] + 2 or not (tokens[0].isdigit() and tokens[1].isdigit()):
        return None
    size, dtype = int(tokens[0]), NCCL_TYPES.get(tokens[columns.index("type")])
    if size == 0 or dtype is None:
        return None
    values = [_number(tokens, i, where) for i in times if i < len(tokens)]
    wrong = [_number(tokens, i, where) for i, c in enumerate(columns)
             if c == "#wrong" and i < len(tokens) and tokens[i] != "N/A"]
    if any(w > 0 for w in wrong):
        raise NcclTestsError(f"{where}: {size} bytes reports {max(wrong):g} wrong elements; a run that "
                             "corrupts data measures nothing, fix it before importing")
    return NcclTestsRow(size_bytes=size, dtype=dtype, out_of_place_time_s=values[0] * 1e-6,
                        in_place_time_s=values[1] * 1e-6 if len(values) > 1 else None)


def _number(tokens: list[str], i: int, where: str) -> float:
    try:
        value = float(tokens[i])
    except ValueError:
        raise NcclTestsError(f"{where}: row '{' '.join(tokens)}' has {tokens[i]!r} where a number belongs; "
                             "the table is damaged") from None
    if not value >= 0:
        raise NcclTestsError(f"{where}: row '{' '.join(tokens)}' has a negative or NaN value {tokens[i]!r}")
    return value


def curve_from_run(run: NcclTestsRun, *, in_place: bool, dtype: str | None) -> CollectiveCurve:
    """The run's table as a fitted curve (``build.fit_collective``) with source ``nccl-tests``:
    the out-of-place (or in-place) time of each size, on the run's group size and placement."""
    dtypes = sorted({r.dtype for r in run.rows})
    if dtype is None and len(dtypes) > 1:
        raise NcclTestsError(f"{run.where}: the table holds several types ({', '.join(dtypes)}); "
                             "choose one with --dtype")
    chosen = dtype or dtypes[0]
    rows = {}
    for row in run.rows:
        if row.dtype == chosen:
            rows.setdefault(row.size_bytes, row)
    if len(rows) < 2:
        raise NcclTestsError(f"{run.where}: {run.program} has {len(rows)} {chosen} sizes; a curve needs at least "
                             "2 (nccl-tests -b/-e set the range)")
    if in_place and any(r.in_place_time_s is None for r in rows.values()):
        raise NcclTestsError(f"{run.where}: the table has no in-place column; drop --in-place")
    sizes = tuple(sorted(rows))
    times = tuple((rows[s].in_place_time_s if in_place else rows[s].out_of_place_time_s) or 0.0 for s in sizes)
    if min(times) <= 0:
        raise NcclTestsError(f"{run.where}: a time of 0 us in the table; the log is damaged")
    return fit_collective(op=run.op, num_ranks=run.num_ranks, ranks_per_node=run.ranks_per_node,
                          num_nodes=run.num_nodes, dtype=chosen,
                          sizes_bytes=sizes, median_time_s=times, source="nccl-tests")


def profile_from_runs(runs: list[NcclTestsRun], *, in_place: bool, dtype: str | None, command: str,
                      date: str) -> HardwareProfile:
    """A collectives-only CUDA profile of ``runs``, one curve per (collective, group, placement),
    with the runs' devices, hosts and versions as provenance."""
    curves: dict[tuple[str, int, bool], tuple[CollectiveCurve, str]] = {}
    for run in runs:
        curve = curve_from_run(run, in_place=in_place, dtype=dtype)
        key = (curve.op, curve.num_ranks, curve.spans_nodes)
        if key in curves:
            raise NcclTestsError(f"{run.where}: {run.program} on {run.num_ranks} ranks "
                                 f"{'across nodes' if curve.spans_nodes else 'in one node'} is also in "
                                 f"{curves[key][1]}; give one log per collective, group size and placement")
        curves[key] = (curve, run.where)
    widest = max(runs, key=lambda r: (r.num_ranks, r.num_nodes))
    names = sorted({name for r in runs for name in r.device_names})
    provenance = {
        "source": "nccl-tests", "device_name": " / ".join(names), "num_devices": widest.num_ranks,
        "num_nodes": widest.num_nodes, "devices_per_node": widest.ranks_per_node, "backend": "nccl",
        "hosts": sorted({h for r in runs for h in r.hosts}), "date": date, "command": command,
        "nccl_version": next((r.nccl_version for r in runs if r.nccl_version), None),
        "nccl_tests_version": next((r.tests_version for r in runs if r.tests_version), None),
        "column": "in-place" if in_place else "out-of-place",
        "logs": [{"log": r.where, "program": r.program, "num_ranks": r.num_ranks, "num_nodes": r.num_nodes,
                  "ranks_per_node": r.ranks_per_node} for r in runs],
    }
    return HardwareProfile(device_type="cuda", provenance=provenance,
                           collectives=tuple(curves[k][0] for k in sorted(curves)))


def import_logs(paths: list[str], *, in_place: bool = False, dtype: str | None = None, command: str = "",
                date: str = "") -> HardwareProfile:
    """Read every log (``parse_log``) and build the profile (``profile_from_runs``)."""
    if dtype is not None and dtype not in set(NCCL_TYPES.values()):
        raise NcclTestsError(f"--dtype {dtype}: expected one of {', '.join(sorted(set(NCCL_TYPES.values())))}")
    runs = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise NcclTestsError(f"{path}: cannot read the log ({err.strerror})") from None
        runs += parse_log(text, str(path))
    return profile_from_runs(runs, in_place=in_place, dtype=dtype, command=command, date=date)
