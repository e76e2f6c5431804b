"""Search speed: the best wall time of ``planner.plan`` (and of its search alone, ``search.seconds``)
over repeated runs, and the least process CPU time, per runtime.

Reference jobs: (a) a 1T-parameter GPT (128 layers, h = 25600, 160 heads; Narayanan et al. SC'21,
Table 1) on 3072 A100-80GB at global batch 3072, seq 2048; (b) llama3-405b on 16384 H100s at seq
8192 (global batch 2048 sequences = 16M tokens, Dubey et al. 2024). The API call: llama3-70b on 64
H100s (global batch 512, seq 8192, the README's command), in this process and, import included, in a
fresh interpreter. A no-fit request: gpt-oss-120b on one A100-40GB at a million sequences of 131072
tokens (``planner.search.infeasible`` searches larger GPU counts for one that fits).

Run: ``.venv/bin/python benchmarks/search_speed.py`` (one process, so one core; ``--repeats N``,
``--runtimes megatron,torch``). On a machine shared with other jobs the wall time counts their time
too; the best of several runs and the CPU time of this process much less so. ``--phases`` prints
instead, for each reference job and the API call, the share of the search each of its phases takes
under ``cProfile`` (which slows every call alike, so shares, not seconds).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import sys
import time
from pathlib import Path

import planner
from costmodels.model_spec import ModelSpec

GPT_1T = ModelSpec(name="gpt-1t", num_layers=128, hidden_size=25600, ffn_hidden_size=4 * 25600,
                   num_attention_heads=160, num_kv_heads=160, vocab_size=51200, tied_embeddings=True,
                   linear_bias=True)

CASES = {
    "gpt-1t on 3072 x a100-sxm-80gb": dict(model=GPT_1T, hardware="a100-sxm-80gb", gpus=3072, global_batch=3072,
                                           seq_len=2048),
    "llama3-405b on 16384 x h100-sxm-80gb": dict(model="llama3-405b", hardware="h100-sxm-80gb", gpus=16384,
                                                 global_batch=2048, seq_len=8192),
}
API_CALL = dict(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192)
NO_FIT = dict(model="gpt-oss-120b", hardware="a100-sxm-40gb", gpus=1, global_batch=1_000_000, seq_len=131072)
RUNTIMES = ("megatron", "torchtitan", "deepspeed", "torch")
"""The runtimes of ``costmodels.capabilities`` whose jobs differ in their search space (Megatron-Bridge
searches Megatron's)."""


def _timed(case: dict, repeats: int) -> tuple[float, float, float, planner.PlanReport]:
    """(least wall time, least search time, least CPU time) of ``planner.plan(**case)``, and its report."""
    walls, searches, cpus = [], [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        report = planner.plan(**case)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
        searches.append(report.search["seconds"])
    return min(walls), min(searches), min(cpus), report


def _fresh_process_s(case: dict, repeats: int) -> float:
    """Least wall time of ``import planner`` plus ``planner.plan(**case)`` in a fresh interpreter."""
    code = ("import time; start = time.perf_counter(); import planner; "
            f"planner.plan(**{case!r}); print(time.perf_counter() - start)")
    root = str(Path(__file__).resolve().parents[1])
    return min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    cwd=root).stdout) for _ in range(repeats))


def _report_line(report: planner.PlanReport) -> str:
    best = report.best
    return (f"space {report.search['space_size']:,} layouts, {report.search['evaluated']:,} evaluated in full; "
            f"best {best.layout.dp}x{best.layout.tp}x{best.layout.pp} (dp x tp x pp), cp {best.layout.cp}, "
            f"ZeRO-{best.layout.zero_stage}, step {best.step_time_s:.2f} s")


PHASES = (
    ("memory screen", "planner/search/floors.py", "micro_batch_sizes_that_may_fit"),
    ("CP floors", "planner/search/solve.py", "_cp_floor_s"),
    ("mesh floors", "planner/search/solve.py", "_mesh_floor_s"),
    ("schedule groups", "planner/search/groups.py", "schedule_groups"),
    ("mesh visits", "planner/search/solve.py", "_visit_mesh"),
    ("  pipeline floors", "costmodels/bounds.py", "pipeline_floor_s"),
    ("  memory floors", "planner/search/floors.py", "too_big"),
    ("  full estimates", "costmodels/estimate.py", "estimate"),
    ("the result", "planner/search/standings.py", "result"),
    ("stage refinement", "planner/search/stages.py", "refine_stages"),
)
"""(label, file, function) of the search's phases (``planner.search.solve``); an indented one runs
inside the visits and elsewhere (full estimates mostly in the result, ``planner.search.standings``),
so shares overlap."""


def phase_shares(case: dict) -> tuple[float, dict[str, float], int]:
    """(search seconds under cProfile, each phase's cumulative share of ``planner.plan(**case)``, the
    number of full estimates it made)."""
    planner.plan(**case)  # the same warm start as a timed repeat
    profile = cProfile.Profile()
    profile.enable()
    planner.plan(**case)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = max(cumulative for (_, _, name), (_, _, _, cumulative, _) in stats.items() if name == "plan")
    shares = {}
    for label, path, function in PHASES:
        shares[label] = sum(cumulative for (file, _, name), (_, _, _, cumulative, _) in stats.items()
                            if name == function and file.endswith(path)) / total
    estimates = sum(calls for (file, _, name), (calls, *_) in stats.items()
                    if name == "estimate" and file.endswith("costmodels/estimate.py"))
    return total, shares, estimates


def print_phases(runtimes: tuple[str, ...]) -> None:
    for runtime in runtimes:
        for name, case in [*CASES.items(), ("planner.plan llama3-70b on 64 x h100-sxm-80gb", API_CALL)]:
            try:
                total, shares, estimates = phase_shares(dict(case, runtime=runtime))
            except planner.PlanError:
                continue
            parts = ", ".join(f"{label.strip()} {share:.0%}" for label, share in shares.items())
            print(f"{runtime}: {name}: {total:.2f} s under cProfile; {parts}; {estimates:,} full estimates")


def main(repeats: int = 5, runtimes: tuple[str, ...] = RUNTIMES) -> None:
    for runtime in runtimes:
        for name, case in CASES.items():
            try:
                wall_s, search_s, cpu_s, report = _timed(dict(case, runtime=runtime), repeats)
            except planner.PlanError as error:
                print(f"{runtime}: {name}: refused ({str(error).partition(': ')[2].split(';')[0]})")
                continue
            print(f"{runtime}: {name}: plan best {wall_s:.2f} s, search {search_s:.2f} s (least CPU {cpu_s:.2f} s) "
                  f"of {repeats}; {_report_line(report)}")
        case = dict(API_CALL, runtime=runtime)
        wall_s, _, cpu_s, _ = _timed(case, repeats)
        print(f"{runtime}: planner.plan llama3-70b on 64 x h100-sxm-80gb: best {wall_s:.2f} s "
              f"(least CPU {cpu_s:.2f} s), import included {_fresh_process_s(case, repeats):.2f} s, of {repeats}")
    start = time.perf_counter()
    report = planner.plan(**NO_FIT, runtime="torch")
    print(f"no fit: gpt-oss-120b on 1 x a100-sxm-40gb at 1,000,000 x 131072 tokens: answered in "
          f"{time.perf_counter() - start:.2f} s (smallest fitting GPUs {report.no_fit.smallest_fitting_gpus})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--phases", action="store_true", help="each phase's share of the search, under cProfile")
    args = parser.parse_args()
    if args.phases:
        print_phases(tuple(args.runtimes.split(",")))
    else:
        main(args.repeats, tuple(args.runtimes.split(",")))
