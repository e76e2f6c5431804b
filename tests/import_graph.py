"""The import graph of the project's packages, read from the source with ``ast`` (nothing is imported).

Every import counts: at module level, under ``TYPE_CHECKING`` and inside functions."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("autoplan_base", "hardware_specs", "profiles", "costmodels", "planner")
"""Top-level packages, lowest first: a module imports only from its own package or a lower one."""
PLANNER_LAYERS = ("plan", "search", "", "launch", "alpa", "published", "calibrate", "validate", "cli")
"""``planner``'s sub-packages, lowest first ("" is its top level: ``api``, ``explain``): the search
stands on the plan file and report, the API on the search, the launcher and Alpa's passes above
them, the calibration from a cluster's logs above the launcher's readers, validation above the
calibration (``validate --from-log`` reads a log as ``autoplan calibrate`` does), the command line
on everything."""


def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``LAYERS``."""
    out = {}
    for top in LAYERS:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def planner_layer(module: str) -> int:
    """The index in ``PLANNER_LAYERS`` of a ``planner`` module's sub-package."""
    parts = module.split(".")
    return PLANNER_LAYERS.index(parts[1] if len(parts) > 2 or parts[1:] and parts[1] in PLANNER_LAYERS else "")


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


@functools.cache
def parse(path: Path) -> ast.Module:
    """``path``'s syntax tree (parsed once per test process; the tests only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for each import in ``name``'s source."""
    out = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name, path).split(".")
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            names = [alias.name for alias in node.names]
            submodules = [n for n in names if f"{base}.{n}" in known]
            out += [(f"{base}.{n}", []) for n in submodules]
            rest = [n for n in names if n not in submodules]
            if rest or not submodules:
                out.append((base, rest))
    return out


def edges() -> dict[str, set[str]]:
    """Module -> project modules it imports."""
    known = modules()
    return {name: {target for target, _ in imports(name, path, known) if target in known and target != name}
            for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _module_aliases(tree: ast.AST, taken: list[tuple[str, list[str]]], known: dict[str, Path]) -> dict[str, str]:
    """Local names bound to project modules by ``import a.b as c`` or ``from a import b`` (b a module);
    ``taken`` is the module's ``imports``."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
        elif isinstance(node, ast.ImportFrom):
            for target, _ in taken:
                short = target.rpartition(".")[2]
                if target in known and any(a.name == short for a in node.names):
                    alias = next(a.asname or a.name for a in node.names if a.name == short)
                    aliases[alias] = target
    return aliases


def private_uses(known: dict[str, Path] | None = None) -> list[str]:
    """``module: name`` for each private name (``_x``) one module takes from another, by
    ``from m import _x`` or as ``m._x``, among ``known`` (module name -> file; default: ``modules()``)."""
    known, out = known or modules(), []
    for name, path in known.items():
        tree = parse(path)
        taken = imports(name, path, known)
        for target, names in taken:
            if target in known and target != name:
                out += [f"{name}: {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
        aliases = _module_aliases(tree, taken, known)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != name):
                out.append(f"{name}: {aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return out
