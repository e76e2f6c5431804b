"""Fuzz the ``autoplan`` command line with hostile input and count what a scheduler would trip on.

Each invocation runs ``planner.cli:main`` in a forked child with its file descriptors 0/1/2
pointed at /dev/null and files (so what a C library writes is seen too), and is killed after
``--timeout`` seconds. Arguments come from valid invocations with one or two fields replaced by a
hostile value (NaN, inf, huge or negative numbers, wrong types, unknown names, control
characters), and from valid input files corrupted (types changed, keys dropped, NaN, deep nesting,
not UTF-8, FIFOs, devices, unwritable output places). Printed counts:

    tracebacks, exit codes outside {0, 1, 2, 3}, exit 3 (internal error), multi-line exit-2
    messages, non-finite numbers in written JSON, written TOML that does not parse, hangs

Usage: ``python benchmarks/fuzz.py [--count 10000] [--seed 0] [--timeout 30] [--jobs 2]``.
Commands that need torch (shard, trace, validate, profile, launch's job) are drawn rarely, and
only with inputs that should be refused before any work starts, so a run of 10,000 takes
minutes, not hours, on two cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOSTILE_NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e400", "9" * 40, "2.5", "1e-300", "0x10", "", " ",
                   "1" + "0" * 5000, "-0", "4294967297", "9223372036854775808"]
HOSTILE_WORDS = ["", "x", "🦙", "h100", "../../etc/passwd", "a\nb", "--", "-", "NaN", "null", "{}", "$(id)",
                 "`id`", "' ; rm -rf /tmp/x '", "a" * 5000, "\x00"]
GUARDS = {"profile": ["--device", "cuda"], "validate": ["--nproc", "3"]}
"""Appended to every profile and validate invocation (click keeps the last value), so that a mutation
cannot turn it into minutes of real measurement: no CUDA device here, and no plan needs 3 processes."""
JOB = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "8", "--seq-len", "128"]
LAYOUT = ["--dp", "2", "--tp", "1", "--pp", "1"]


@dataclass
class Outcome:
    args: list[str]
    code: int | None
    stderr: str
    seconds: float
    bad_json: list[str]


def _valid_invocations(work: Path) -> list[list[str]]:
    """Invocations that succeed (or exit 1) on good input: the seeds the mutations start from."""
    plan = str(work / "plan.json")
    return [
        [],  # bare ``autoplan``: help, exit 0
        ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "64", "--global-batch", "1",
         "--seq-len", "128"],  # the batch is smaller than any dp: nothing to search
        ["launch", str(work / "emoji-plan.json"), "--out", "OUT/job"],  # a model name with an emoji and a quote
        ["validate", str(work / "launchable.json"), "--calibrate", "--profile", "OUT/prof.json", "--nproc", "3",
         "--workdir", "OUT/wd"],  # nothing measured (--nproc matches no plan)
        ["launch", plan, "--out", "/"],
        ["launch", plan, "--out", str(work / "nonempty")],
        ["explain", "/dev/zero"],
        ["explain", str(work / "fifo")],
        ["shard", "--model", "tiny-llama", "--tp", "2", "--input-shape", "1,99999999999999999999"],
        ["plan", *JOB],
        ["plan", *JOB, "--format", "json", "--out", "OUT/plan.json"],
        ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
         "--seq-len", "4096", "--top", "3"],
        ["evaluate", *JOB, *LAYOUT, "--zero", "1", "--micro-batch", "2"],
        ["evaluate", *JOB, *LAYOUT, "--format", "json", "--out", "OUT/eval.json"],
        ["explain", plan],
        ["models"], ["models", "--format", "json"],
        ["hardware"], ["hardware", "--format", "json"],
        ["launch", plan, "--out", "OUT/job"],
        ["validate", plan, "--dry-run", "--format", "json"],
        ["shard", "--model", "tiny-llama", "--tp", "2", "--format", "json"],
        ["profile", "--device", "cpu", "--nproc", "2", "--quick", "--out", "/proc/autoplan-fuzz/p.json"],
    ]


def _corrupt_json(rng: random.Random, doc: object, depth: int = 0) -> object:
    """``doc`` with one field deleted, retyped or set to a non-finite or absurd value."""
    if isinstance(doc, dict) and doc and (depth > 3 or rng.random() < 0.6):
        key = rng.choice(sorted(doc))
        choice = rng.random()
        copy = dict(doc)
        if choice < 0.25:
            del copy[key]
        else:
            copy[key] = rng.choice([float("nan"), float("inf"), -1, 0, 10**30, "x", None, [], {}, True, 1.5])
        return copy
    if isinstance(doc, dict) and doc:
        key = rng.choice(sorted(doc))
        return {**doc, key: _corrupt_json(rng, doc[key], depth + 1)}
    if isinstance(doc, list) and doc:
        i = rng.randrange(len(doc))
        return doc[:i] + [_corrupt_json(rng, doc[i], depth + 1)] + doc[i + 1:]
    return rng.choice([float("nan"), "x", None, -5])


def _hostile_file(rng: random.Random, work: Path, index: int, kind: str) -> str:
    """A path to a broken input of ``kind`` (plan, hardware, model) or a hostile path."""
    roll = rng.random()
    if roll < 0.08:
        return rng.choice(["/dev/zero", "/proc/self/status", str(work / "fifo"), str(work), "/nonexistent/x.json",
                           str(work / "deep.json"), str(work / "latin1.toml")])
    path = work / "cases" / f"{index}-{kind}.{'toml' if kind == 'hardware' else 'json'}"
    if kind == "hardware":
        text = (ROOT / "hardware_specs" / "data" / "cpu.toml").read_text()
        numbers = re.findall(r"^(\w+) = ([0-9.]+)$", text, flags=re.M)
        name, value = rng.choice(numbers)
        bad = rng.choice(["nan", "inf", "-1", "0", "1e308", '"x"'])
        text = text.replace(f"{name} = {value}", f"{name} = {bad}")
        path.write_text(text)
    else:
        source = work / ("plan.json" if kind == "plan" else "config.json")
        doc = json.loads(source.read_text())
        for _ in range(rng.randint(1, 3)):
            doc = _corrupt_json(rng, doc)
        path.write_text(json.dumps(doc))
    return str(path)


def _mutate(rng: random.Random, args: list[str], work: Path, index: int) -> list[str]:
    """One or two hostile replacements in ``args``."""
    args = list(args)
    for _ in range(rng.randint(1, 2)):
        roll = rng.random()
        if len(args) < 2:
            args.append(rng.choice(HOSTILE_WORDS))
        elif roll < 0.5:
            spots = [i for i, a in enumerate(args) if i > 0 and args[i - 1].startswith("--")
                     and not a.startswith("--")] or [len(args) - 1]
            i = rng.choice(spots)
            option = args[i - 1]
            if option in ("--hardware",) and rng.random() < 0.5:
                args[i] = _hostile_file(rng, work, index, "hardware")
            elif option == "--model" and rng.random() < 0.4:
                args[i] = _hostile_file(rng, work, index, "model")
            else:
                args[i] = rng.choice(HOSTILE_NUMBERS + HOSTILE_WORDS)
        elif roll < 0.65 and (plans := [i for i, a in enumerate(args) if a == str(work / "plan.json")]):
            args[plans[0]] = _hostile_file(rng, work, index, "plan")
        elif roll < 0.8:
            out = rng.choice(["/proc/autoplan-fuzz/x", "/", str(work / "plan.json") + "/x", str(work / "readonly/x"),
                              str(work / "nonempty")])
            args += ["--out", out]
        elif roll < 0.9:
            args.insert(rng.randrange(1, len(args) + 1), rng.choice(["--bogus", "--gpus", "-x", "--format"]))
        else:
            del args[rng.randrange(len(args))]
    return args


def _prepare(work: Path) -> None:
    from click.testing import CliRunner

    from planner.cli import main

    (work / "cases").mkdir()
    result = CliRunner().invoke(main, ["plan", *JOB, "--out", str(work / "plan.json")])
    assert result.exit_code == 0, result.output
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
              "num_hidden_layers": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 512, "tie_word_embeddings": False}
    (work / "config.json").write_text(json.dumps(config))
    emoji = work / 'llama 🦙 "x".json'
    emoji.write_text(json.dumps(config))
    for model, name in ((str(emoji), "emoji-plan.json"), ("tiny-llama", "launchable.json")):
        result = CliRunner().invoke(main, ["plan", "--model", model, "--hardware", "cpu", "--gpus", "2",
                                           "--global-batch", "8", "--seq-len", "128", "--launchable",
                                           "--out", str(work / name)])
        assert result.exit_code == 0, result.output
    os.mkfifo(work / "fifo")
    (work / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (work / "latin1.toml").write_bytes("name = \"caf\xe9\"\n".encode("latin-1"))
    (work / "readonly").mkdir()
    os.chmod(work / "readonly", 0o500)
    (work / "nonempty").mkdir()
    (work / "nonempty" / "keep.txt").write_text("someone's file\n")


def _run_child(args: list[str], out_dir: Path) -> None:
    """In the forked child: run the CLI with fds 0/1/2 redirected; exit with its status."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        handle = os.open(out_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(handle, fd)
    os.chdir(out_dir)
    sys.stdin = open(os.devnull)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    sys.stderr = os.fdopen(2, "w", closefd=False)
    from planner.cli import main

    try:
        main(args, prog_name="autoplan")
    except BaseException as err:  # what the interpreter does with an uncaught exception: traceback, exit 1
        if not isinstance(err, SystemExit):
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        stop = err
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


def _non_finite_json(out_dir: Path) -> list[str]:
    """JSON files the invocation wrote (under OUT/) that hold NaN or Infinity, or do not parse, and
    TOML files (the torchtitan export) that do not parse."""
    import tomllib

    bad = []
    for path in (out_dir / "OUT").rglob("*.toml") if (out_dir / "OUT").exists() else []:
        try:
            tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            bad.append(str(path.relative_to(out_dir)))
    for path in (out_dir / "OUT").rglob("*.json") if (out_dir / "OUT").exists() else []:
        def refuse(name: str):
            raise ValueError(name)
        try:
            json.loads(path.read_text(), parse_constant=refuse)
        except (ValueError, UnicodeDecodeError):
            bad.append(str(path.relative_to(out_dir)))
    return bad


def run_one(args: list[str], scratch: Path, timeout_s: float) -> Outcome:
    out_dir = Path(tempfile.mkdtemp(dir=scratch))
    (out_dir / "OUT").mkdir()
    args = [a.replace("OUT/", str(out_dir / "OUT") + "/") for a in args]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _run_child(args, out_dir)
        finally:
            os._exit(99)
    code = None
    while time.monotonic() - start < timeout_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        select.select([], [], [], 0.01)
    else:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own group: torchrun's workers go too
        os.waitpid(pid, 0)
    seconds = time.monotonic() - start
    stderr = (out_dir / "stderr").read_text(errors="replace")
    outcome = Outcome(args=args, code=code, stderr=stderr, seconds=seconds, bad_json=_non_finite_json(out_dir))
    shutil.rmtree(out_dir, ignore_errors=True)
    return outcome


def _kind(outcome: Outcome) -> str | None:
    """The failure class of an outcome, or None when it behaved."""
    if outcome.code is None:
        return "hang"
    if "Traceback (most recent call last)" in outcome.stderr:
        last = [line for line in outcome.stderr.strip().splitlines() if line and not line.startswith(" ")]
        return f"traceback: {last[-1][:120] if last else '?'}"
    if outcome.code not in (0, 1, 2, 3):
        return f"exit {outcome.code}"
    if outcome.code == 3:
        return f"exit 3: {outcome.stderr.strip()[:120]}"
    if outcome.code == 2 and outcome.stderr.rstrip("\n").count("\n") > 0:
        return "multi-line exit 2: " + outcome.stderr.strip().splitlines()[0][:100]
    if outcome.bad_json:
        return "non-finite JSON written" if any(p.endswith(".json") for p in outcome.bad_json) \
            else "invalid TOML written"
    return None


def _shell_words(args: list[str]) -> str:
    return " ".join(a if re.fullmatch(r"[\w./=-]+", a) else json.dumps(a) for a in args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--show", type=int, default=3, help="examples printed per failure class")
    opts = parser.parse_args()
    import planner.cli  # noqa: F401  (imported once here, so every forked child starts warm)

    rng = random.Random(opts.seed)
    with tempfile.TemporaryDirectory(prefix="autoplan-fuzz-") as tmp:
        work = Path(tmp)
        _prepare(work)
        scratch = work / "runs"
        scratch.mkdir()
        seeds = _valid_invocations(work)
        cheap = [s for s in seeds if not s or s[0] in ("plan", "evaluate", "explain", "models", "hardware", "launch")
                 or "--calibrate" in s]
        costly = [s for s in seeds if s not in cheap]
        counts: collections.Counter[str] = collections.Counter()
        examples: dict[str, list[Outcome]] = collections.defaultdict(list)
        codes: collections.Counter[int | None] = collections.Counter()
        began = time.monotonic()
        for index in range(opts.count):
            seed = rng.choice(costly) if rng.random() < 0.01 else rng.choice(cheap)
            args = seed if rng.random() < 0.05 else _mutate(rng, seed, work, index)  # some seeds as they are
            args = args + GUARDS.get(args[0] if args else "", [])
            outcome = run_one(args, scratch, opts.timeout)
            codes[outcome.code] += 1
            kind = _kind(outcome)
            if kind:
                group = kind.split(":")[0]
                counts[group] += 1
                if len(examples[kind]) < opts.show:
                    examples[kind].append(outcome)
        os.chmod(work / "readonly", 0o700)
    elapsed = time.monotonic() - began
    print(f"{opts.count} invocations in {elapsed:.0f} s (seed {opts.seed}, timeout {opts.timeout:g} s)")
    print("exit codes: " + ", ".join(f"{'hang' if c is None else c}: {n}" for c, n in sorted(
        codes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))
    for label in ("traceback", "exit 3", "multi-line exit 2", "non-finite JSON written", "invalid TOML written", "hang"):
        print(f"{label}: {counts.get(label, 0)}")
    print(f"exit codes outside {{0, 1, 2, 3}}: {sum(n for c, n in codes.items() if c not in (0, 1, 2, 3, None))}")
    print(f"distinct failure classes: {len(examples)}")
    for kind, outs in sorted(examples.items()):
        print(f"- {kind}")
        for o in outs:
            print(f"    autoplan {_shell_words(o.args)[:300]}")


if __name__ == "__main__":
    main()
