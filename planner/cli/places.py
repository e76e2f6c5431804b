"""Output places checked before any work starts: a file or directory autoplan may write.

A place is refused, in one line naming the option, when it is under ``/proc`` or ``/sys``,
under a regular file, not writable, a directory where a file is wanted (or the reverse), or, for
a job directory, a non-empty directory that is not an earlier autoplan job (``launch --out /``
must never write into the filesystem root) unless the caller passes ``force``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autoplan_base.errors import AutoplanError

PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")
JOB_MARKERS = ("plan.json", "launch.sh", "slurm.sbatch")
"""Files every ``autoplan launch`` job directory holds: a directory with all of them is an earlier job."""


class OutputPlaceError(AutoplanError):
    """An output path autoplan cannot or must not write."""


def _resolved(path: str | Path, option: str) -> Path:
    shown = json.dumps(str(path))
    if "\x00" in str(path) or not str(path):
        raise OutputPlaceError(f"{option} {shown}: not a valid path")
    if not str(path).isprintable():  # a line break would split every line that names the path
        raise OutputPlaceError(f"{option} {shown}: a path with a line break or control character; give a plain path")
    try:
        resolved = Path(os.path.realpath(path))
        resolved.exists()
    except OSError as err:  # a name too long, a symlink loop
        raise OutputPlaceError(f"{option} {shown[:200]}: not a usable path ({err.strerror})") from None
    for root in PSEUDO_FILESYSTEMS:
        if resolved == Path(root) or Path(root) in resolved.parents:
            raise OutputPlaceError(f"{option} {shown}: {root} is not a place to write output; choose another path")
    return resolved


def _writable_ancestor(resolved: Path, option: str, shown: str) -> None:
    """The nearest existing ancestor of ``resolved`` must be a writable directory."""
    for ancestor in resolved.parents:
        if not ancestor.exists():
            continue
        if not ancestor.is_dir():
            raise OutputPlaceError(f"{option} {shown}: {json.dumps(str(ancestor))} is a file, not a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise OutputPlaceError(f"{option} {shown}: directory {json.dumps(str(ancestor))} is not writable")
        return


def check_output_file(path: str | Path, option: str) -> None:
    """Raise ``OutputPlaceError`` unless a file can be written at ``path`` (``-`` is stdout)."""
    if str(path) == "-":
        return
    shown = json.dumps(str(path))
    resolved = _resolved(path, option)
    if resolved.is_dir():
        raise OutputPlaceError(f"{option} {shown}: is a directory; give a file path")
    if resolved.exists() and not os.access(resolved, os.W_OK):
        raise OutputPlaceError(f"{option} {shown}: the file is not writable")
    _writable_ancestor(resolved, option, shown)


def check_output_dir(path: str | Path, option: str, *, job: bool = False, force: bool = False) -> None:
    """Raise ``OutputPlaceError`` unless ``path`` can be made or reused as an output directory.

    ``job``: the directory receives an ``autoplan launch`` job, so an existing non-empty directory
    must be an earlier job (all of ``JOB_MARKERS``) unless ``force``."""
    shown = json.dumps(str(path))
    resolved = _resolved(path, option)
    if resolved.exists() and not resolved.is_dir():
        raise OutputPlaceError(f"{option} {shown}: is a file; give a directory path")
    if resolved.is_dir():
        if not os.access(resolved, os.W_OK | os.X_OK):
            raise OutputPlaceError(f"{option} {shown}: the directory is not writable")
        if job and not force and any(resolved.iterdir()) and not all((resolved / m).is_file() for m in JOB_MARKERS):
            raise OutputPlaceError(f"{option} {shown}: a non-empty directory that is not an earlier autoplan job; "
                                   "give a new or empty directory, or pass --force to write into it")
        return
    _writable_ancestor(resolved, option, shown)
