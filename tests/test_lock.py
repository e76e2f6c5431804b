"""The install reproduces: every dependency is locked, and this environment holds the locked versions.

``scripts/setup.sh`` (the README's commands and ``.ci/run``) installs through ``constraints.txt``;
if a release drifted in, or a new dependency was added without locking it, these fail.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_normal(name)] = version.strip()
    return pins


def _declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [_normal(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements]


def test_every_declared_dependency_is_locked():
    locked = _locked()
    assert [name for name in _declared() if name not in locked] == []


def test_installed_versions_are_the_locked_ones():
    installed = {_normal(d.metadata["Name"]): d.version.split("+", 1)[0] for d in metadata.distributions()}
    drift = {name: (version, installed.get(name)) for name, version in _locked().items()
             if installed.get(name) != version}
    assert drift == {}, "installed versions differ from constraints.txt (locked, installed)"
