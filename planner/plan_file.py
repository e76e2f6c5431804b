"""Reading plan files back (``explain``, ``launch``, ``validate``), with schema checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hardware_specs.errors import AutoplanError

from .report import SCHEMA_VERSION


class PlanFileError(AutoplanError):
    """A plan file that is missing, corrupt, or of another schema version."""


def read_plan_file(path: Path) -> dict[str, Any]:
    """The plan file as a dict, after checking it is a plan file this version can read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanFileError(f"plan file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as err:
        raise PlanFileError(f"plan file {path}: not valid JSON (line {err.lineno}: {err.msg}); "
                            f"regenerate it with 'autoplan plan --out'") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PlanFileError(f"plan file {path}: cannot read ({err})") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise PlanFileError(f"plan file {path}: no schema_version; is it an autoplan plan file?")
    if data["schema_version"] != SCHEMA_VERSION:
        raise PlanFileError(f"plan file {path}: schema_version {data['schema_version']!r} is not "
                            f"{SCHEMA_VERSION}; regenerate it with this autoplan")
    for key in ("inputs", "best", "candidates", "search"):
        if key not in data:
            raise PlanFileError(f"plan file {path}: missing field {key!r}")
    return data
