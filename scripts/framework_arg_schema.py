"""Generate the argument schema of Megatron-LM's or Megatron-DeepSpeed's ``pretrain_gpt.py`` from a
source checkout, one JSON file per commit, for ``tests/data/framework_args/`` (what the tests validate
every exported flag and value against; neither argument parser is in a package).

Usage::

    python scripts/framework_arg_schema.py megatron-lm GIT_DIR REF [REF ...] --out tests/data/framework_args
    python scripts/framework_arg_schema.py megatron-deepspeed GIT_DIR REF --out tests/data/framework_args

For each REF the script extracts the framework's Python package from ``GIT_DIR`` (``git archive``,
into a temporary folder that is removed afterwards), then in a child Python imports its arguments
module from there and runs the framework's own ``parse_args``, with ``argparse`` stopped at the
moment it would parse: the parser is complete then, with every group the framework adds (the
dataclass-generated ones of newer Megatron-LM included). Modules the framework imports but this
environment lacks (Transformer Engine, apex, ...) are replaced by empty stand-ins; they define no
arguments. Each option's names, destination, type, choices, default, ``nargs`` and action are
written, with the commit, the source file and its sha256. Nothing of the framework's code is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FRAMEWORKS = {
    "megatron-lm": {"repository": "NVIDIA/Megatron-LM", "paths": ("megatron",),
                    "module": "megatron.training.arguments", "source": "megatron/training/arguments.py"},
    "megatron-deepspeed": {"repository": "deepspeedai/Megatron-DeepSpeed", "paths": ("megatron", "tools"),
                           "module": "megatron.arguments", "source": "megatron/arguments.py"},
}
"""What to extract from each framework's checkout and which module holds ``parse_args``."""

SCHEMA_VERSION = 1

_CHILD = r'''
import argparse, enum, importlib, importlib.abc, importlib.machinery, json, sys, types
root, module_name, missing_ok = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, root)

class _Stub(types.ModuleType):
    """A module the environment lacks: any attribute is another stand-in."""
    __path__ = []
    __version__ = "0.0.0"
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")
    def __call__(self, *a, **k):
        return _Stub(self.__name__ + "()")

def _asked_by_framework():
    """Whether the import comes from the framework's own code (torch's optional imports keep failing)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == "<string>"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(root)

class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in missing_ok and _asked_by_framework():
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        return _Stub(spec.name)
    def exec_module(self, module):
        pass

# torch's own optional imports (triton, ...) are settled before any stand-in exists
import torch, torch._dynamo, torch._inductor.utils, torch.utils.flop_counter, torch._inductor.codecache  # noqa: E401
import functorch.compile, torch._dynamo.repro.after_dynamo, torch._dynamo.backends.debugging  # noqa: E401
import typing, typing_extensions  # noqa: E401
if not hasattr(typing, "override"):  # newer Megatron-LM needs Python 3.12's typing.override (a no-op marker)
    typing.override = typing_extensions.override
sys.meta_path.append(_StubFinder())

class _Built(Exception):
    pass

def _stop(self, *a, **k):
    raise _Built(self)

argparse.ArgumentParser.parse_args = _stop
argparse.ArgumentParser.parse_known_args = _stop
module = importlib.import_module(module_name)
assert module.__file__.startswith(root), module.__file__
try:
    module.parse_args()
except _Built as built:
    parser = built.args[0]

def plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return repr(value)

def type_name(kind):
    if kind is None:
        return None
    if kind in (int, float, str):
        return kind.__name__
    return "custom:" + getattr(kind, "__qualname__", repr(kind))

options = {}
for action in parser._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    entry = {"dest": action.dest, "action": type(action).__name__.lstrip("_").removesuffix("Action") or "Store",
             "type": type_name(action.type), "nargs": plain(action.nargs),
             "choices": None if action.choices is None else [plain(c) for c in action.choices],
             "default": plain(action.default)}
    for name in action.option_strings:
        options[name] = entry
print("\n@@schema@@" + json.dumps(options, sort_keys=True))
'''


def extract(git_dir: Path, ref: str, paths: tuple[str, ...], into: Path) -> str:
    """Unpack ``paths`` of ``ref`` into ``into``; returns the full commit hash."""
    commit = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", commit, *paths],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def options_of(root: Path, module: str) -> dict:
    """The child's {option string: entry}, stubbing modules this environment lacks one by one."""
    missing: list[str] = []
    for _ in range(40):
        run = subprocess.run([sys.executable, "-c", _CHILD, str(root), module, json.dumps(missing)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        if run.returncode == 0:
            return json.loads(run.stdout.rsplit("@@schema@@", 1)[1])
        last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        name = last.split("No module named ", 1)[1].strip("'\"").split(".")[0] if "No module named" in last else None
        if name is None or name in missing:
            raise SystemExit(f"{module}: cannot build the parser:\n{run.stderr[-3000:]}")
        missing.append(name)
        print(f"{module}: {name} is absent here, a stand-in replaces it", file=sys.stderr)
    raise SystemExit(f"{module}: too many missing modules: {missing}")


def schema(framework: str, git_dir: Path, ref: str) -> dict:
    spec = FRAMEWORKS[framework]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        commit = extract(git_dir, ref, spec["paths"], root)
        source = (root / spec["source"]).read_bytes()
        options = options_of(root, spec["module"])
    return {"schema_version": SCHEMA_VERSION, "framework": framework, "repository": spec["repository"],
            "ref": ref, "commit": commit, "source": spec["source"],
            "source_sha256": hashlib.sha256(source).hexdigest(),
            "generated_by": "scripts/framework_arg_schema.py", "options": options}


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=sorted(FRAMEWORKS))
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("refs", nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for ref in args.refs:
        record = schema(args.framework, args.git_dir, ref)
        path = args.out / f"{args.framework}@{ref[:12] if len(ref) == 40 else ref}.json"
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        write_atomic(path, text)
        print(f"{path}  {len(record['options'])} options  sha256 {hashlib.sha256(text.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
