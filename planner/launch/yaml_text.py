"""``yaml_text``: a Kubernetes manifest (dicts, lists, strings, integers, booleans) as block YAML.

No YAML library is needed to write it: a string is written bare only when it starts with a
letter, '_' or '/', holds nothing but letters, digits and ``_./:-`` and is not one of the words
YAML 1.1 reads as a boolean or null, so plain YAML reads it back as that string; every other
string is written JSON-quoted, and a JSON string is a valid YAML double-quoted scalar (YAML 1.2,
section 7.3.1: its escapes are a superset of JSON's), so no value can turn into another type
("8" stays a string, "no" is not false) or break out of its line. Output is deterministic: dict
order is kept as built, nothing is sorted or re-flowed.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BARE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:-]*(?<!:)")
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
"""Plain scalars that YAML 1.1 readers (PyYAML, go-yaml v2) may read as booleans or null."""


def _string(text: str) -> str:
    assert isinstance(text, str), text
    return text if _BARE.fullmatch(text) and text.lower() not in _YAML_WORDS else json.dumps(text, ensure_ascii=False)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if value == {}:
        return "{}"
    if value == []:
        return "[]"
    raise AssertionError(f"not a manifest value: {value!r}")


def _is_block(value: Any) -> bool:
    return isinstance(value, (dict, list)) and len(value) > 0


def _lines(value: Any, indent: str) -> list[str]:
    """The lines of a non-empty mapping or sequence, each starting with ``indent``."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if _is_block(item):
                out.append(f"{indent}{_string(key)}:")
                out += _lines(item, indent + "  ")
            else:
                out.append(f"{indent}{_string(key)}: {_scalar(item)}")
        return out
    for item in value:
        if not _is_block(item):
            out.append(f"{indent}- {_scalar(item)}")
            continue
        inner = _lines(item, indent + "  ")
        out.append(f"{indent}- {inner[0][len(indent) + 2:]}")  # the first line shares the dash's line
        out += inner[1:]
    return out


def yaml_text(document: dict[str, Any], header: tuple[str, ...] = ()) -> str:
    """``document`` as one YAML document, preceded by ``header`` as ``#`` comment lines."""
    comments = [f"# {json.dumps(line)[1:-1]}".rstrip() for line in header]
    return "\n".join([*comments, *_lines(document, "")]) + "\n"
