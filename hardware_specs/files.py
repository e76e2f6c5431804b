"""Reading user-named input files safely: regular files only, bounded size and depth, one-line errors.

Every reader of a file a user names (hardware TOML, HF ``config.json``, profiles, plan files)
goes through here, so a FIFO never blocks, ``/dev/zero`` is never read without limit, text that
is not UTF-8 and JSON that is nested 200,000 deep or holds ``NaN``, ``1e400`` or a 5,000-digit
integer each get one line naming the file, not a traceback.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from autoplan_base.errors import AutoplanError, SpecError

MAX_INPUT_BYTES = 64 * 2**20
"""Largest input file read (64 MiB): a plan or profile is kilobytes to a few megabytes."""
MAX_JSON_DEPTH = 64
"""Deepest nesting accepted in a JSON input; autoplan's own files nest under ten levels."""


def read_text(path: str | Path, *, what: str, error: type[AutoplanError] = SpecError,
              max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; ``what`` names it in errors ("plan file")."""
    shown = json.dumps(str(path))  # quoted: a newline in a path cannot split the message
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise error(f"{what} {shown}: cannot read ({err.strerror})") from None
    except ValueError:  # a NUL byte in the path
        raise error(f"{what} {shown}: not a valid path") from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        if regular:
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(max_bytes + 1)
    except OSError as err:  # EIO and the like, e.g. /proc/self/mem
        raise error(f"{what} {shown}: cannot read ({err.strerror})") from None
    if not regular:
        os.close(fd)
        raise error(f"{what} {shown}: not a regular file; give the path of a file")
    if len(data) > max_bytes:
        raise error(f"{what} {shown}: larger than {max_bytes // 2**20} MiB; is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} {shown}: not UTF-8 text (byte {err.start}); give a text file") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(text: str, *, origin: str, error: type[AutoplanError] = SpecError) -> Any:
    """Parse ``text`` as strict JSON: finite numbers only, bounded nesting."""
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{origin}: JSON nested too deeply; is this the right file?") from None
    except ValueError as err:  # JSONDecodeError, NaN/Infinity, 1e400, integers past Python's digit limit
        raise error(f"{origin}: not valid JSON ({str(err).splitlines()[0]})") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise error(f"{origin}: JSON nested deeper than {MAX_JSON_DEPTH} levels; is this the right file?")
    return value


def read_json(path: str | Path, *, what: str, error: type[AutoplanError] = SpecError,
              max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """Parsed strict JSON of the regular file ``path`` (see ``parse_json``)."""
    text = read_text(path, what=what, error=error, max_bytes=max_bytes)
    return parse_json(text, origin=f"{what} {json.dumps(str(path))}", error=error)


def read_toml(path: str | Path, *, what: str, error: type[AutoplanError] = SpecError) -> dict[str, Any]:
    """Parsed TOML of the regular file ``path``; ``nan``/``inf`` are left to the field checks."""
    text = read_text(path, what=what, error=error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise error(f"{what} {json.dumps(str(path))}: not valid TOML ({err}); fix the syntax") from None
    except RecursionError:
        raise error(f"{what} {json.dumps(str(path))}: TOML nested too deeply") from None
