"""autoplan's pick next to the framework's published recipe and a published run, for jobs practitioners
know, per runtime.

Run: ``.venv/bin/python benchmarks/practitioner.py [--case NAME ...] [--runtime R ...] [--all-runtimes]``
(prints markdown; a few seconds to a minute of CPU per case and runtime; default runtimes megatron,
megatron-bridge and torchtitan, plus the runtime each published run ran on). For each job and
runtime: the layout ``planner.plan(runtime=R)`` picks; R's framework's own published recipe for the
job (``planner.search.recipes``: its layout on the job's GPUs and batch, costed by
``planner.evaluate``), and how the pick stands against it, as the plan says (``SearchStats.recipe``:
at least as fast, the recipe picked, or why not); the published run costed under the same request
and runtime, with its measured tokens/s per GPU where its source published one (only under the
runtime it ran on); and the breakdown term that separates the recipe (else the published run) from
the pick most (minus the pick, ``planner.explain.runner_up_differences``). A job taken from the
development set (``benchmarks/data/published_runs.json``, ``row``) is costed as that row maps
(``planner.published.map_row``: model, GPU, precision and FP8 recipe, layout and what it assumed)
and its measured figure is the row's; the others spell out their request and layout. Sources are
listed under the table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import planner
from autoplan_base.errors import AutoplanError
from planner.api import layout_for_batch
from planner.explain import runner_up_differences
from planner.plan.bands import job_bands
from planner.plan.plan_file import PlanEntry, PlanFile
from planner.plan.render import layout_summary
from planner.plan.report import plan_entry
from planner.published import MappedRun, load_rows, map_row
from planner.published.scoring import _node
from costmodels.presets import load_model
from planner.search.recipes import RECIPES, Recipe, recipe_for, recipe_layout, recipe_summary, verdict

DATA = Path(__file__).parent / "data" / "published_runs.json"
RUNTIMES = ("megatron", "megatron-bridge", "torchtitan", "deepspeed", "torch")
DEFAULT_RUNTIMES = ("megatron", "megatron-bridge", "torchtitan")


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One job, its published recipe, and where that recipe was published."""

    name: str
    kind: str
    """Which of the issue's job kinds it stands for (dense 8B, MoE, long context, ...)."""
    citation: str
    row: str | None = None
    """Id of the development-set row that is the recipe (request, layout and measurement from it)."""
    request: dict[str, Any] = field(default_factory=dict)
    """Without ``row``: ``planner.plan`` / ``planner.evaluate`` keywords (model, hardware, gpus, ...)."""
    published: dict[str, Any] = field(default_factory=dict)
    """Without ``row``: ``planner.api.layout_for_batch`` keywords of the recipe."""
    recipe_runtime: str = "megatron"
    """Without ``row``: the runtime the recipe ran on."""
    note: str = ""


CASES: tuple[Case, ...] = (
    Case(name="llama3.1-8b-128gpu", kind="dense 8B", row="torchtitan-t3-8b-128gpu-fsdp-torchcompile",
         citation="torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 3 (pytorch/torchtitan@b5bcd76c): "
                  "Llama 3.1 8B, 128 H100 96GB (500 W), FSDP 128 + torch.compile, bf16, mbs 2, op-level SAC"),
    Case(name="llama3-8b-8gpu", kind="small scale (1 node)",
         row="nemo-mb-25-11-nemo-container-dgx-h100-llama3-8b-8gpu-fp8-cs-tp1pp1cp1vpnoneep1-gbs128-mbs1",
         citation="Megatron-Bridge performance summary, NeMo 25.11 container, DGX-H100: LLAMA3_8B, 8 GPUs, FP8-CS, "
                  "tp 1 pp 1, mbs 1, gbs 128, Megatron-FSDP (docs/performance-summary.md)"),
    Case(name="llama3-70b-64gpu", kind="dense 70B",
         row="nemo-2407-pretraining-llama3-70b-64gpu-s8192-tp4pp4cp2vp5-gbs128",
         citation="NVIDIA NeMo 24.07 performance summary (NVIDIA/NeMo@35029a0c docs/source/performance/"
                  "performance_summary.md): LLAMA3-70B, 64 H100, FP8, tp 4 pp 4 cp 2 vp 5, mbs 1, gbs 128"),
    Case(name="llama3-405b-16k", kind="dense 405B", row="llama3-405b-16384gpu-cp1",
         citation="Llama Team, The Llama 3 Herd of Models (arXiv:2407.21783) Table 4: 16,384 H100, tp 8 pp 16 "
                  "dp 128, seq 8192, 41% MFU (400 TFLOP/s); Sec. 3.3.2 one layer fewer on the first and last stage"),
    Case(name="llama3.1-405b-512gpu", kind="dense 405B (torchtitan)",
         row="torchtitan-t5-405b-512gpu-interleaved-1f1b",
         citation="torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 5: Llama 3.1 405B, 512 H100 96GB, "
                  "FSDP 8 x tp 8 x pp 8 interleaved 1F1B, Float8, full AC",
         note="the row states no virtual-stage count, so it maps to (and is costed as) plain 1F1B"),
    Case(name="gpt3-175b", kind="GPT-3 175B", row="megatron-sc21-t2-ptdp-175b-384gpu",
         citation="Narayanan et al. SC'21 (arXiv:2104.04473) Table 2: GPT-3 175B, 384 A100, PTD-P (tp 8, pp 12, "
                  "dp 4 as Table 1), batch 1536, 153 TFLOP/s per GPU"),
    Case(name="gpt3-175b-1024gpu", kind="GPT-3 175B at 1,024 GPUs", row="megascale-175b-meg-1024gpu",
         citation="Jiang et al. NSDI'24 (MegaScale, arXiv:2402.15627) Table 2: Megatron-LM, 175B, 1,024 A100-class "
                  "GPUs, tp 8, pp 8 interleaved (6 chunks), batch 768, 44.7% MFU"),
    Case(name="mixtral-8x7b", kind="MoE", request=dict(model="mixtral-8x7b", hardware="h100-sxm-80gb", gpus=64,
                                                       global_batch=256, seq_len=4096),
         published=dict(dp=16, tp=1, pp=4, ep=8, zero_stage=1, schedule="interleaved", virtual_stages=8,
                        micro_batch_size=1, recompute="none"),
         citation="Megatron-Core MoE README, 'Reference Best Parallel Mapping' (MCore v0.8): Mixtral 8x7B dropless, "
                  "64 H100, s 4096, tp 1, ep 8, pp 4, vp 8, mbs 1, gbs 256, bf16",
         note="distributed optimizer as the README's example; the README quotes 468 TFLOP/s per GPU (MCore v0.9), "
              "not converted here"),
    Case(name="qwen3-30b-a3b-16gpu", kind="MoE",
         row="nemo-mb-26-04-01-nemo-container-dgx-h100-qwen3-30b-a3b-16gpu-fp8-tp1pp1cp1vpnoneep16-gbs1024-mbs1",
         citation="Megatron-Bridge performance summary, NeMo 26.04.01 container, DGX-H100: Qwen3-30B-A3B, 16 GPUs, "
                  "FP8, tp 1 pp 1 ep 16, mbs 1, gbs 1024"),
    Case(name="gpt-oss-120b-64gpu", kind="MoE",
         row="nemo-mb-26-04-01-nemo-container-dgx-h100-gpt-oss-120b-64gpu-bf16-tp1pp4cp1vpnoneep8-gbs1280-mbs1",
         citation="Megatron-Bridge performance summary, NeMo 26.04.01 container, DGX-H100: GPT-OSS 120B, 64 GPUs, "
                  "BF16, tp 1 pp 4 ep 8, mbs 1, gbs 1280"),
    Case(name="llama2-7b-128k", kind="long context (131,072 tokens)",
         row="nemo-2407-long-input-sequences-llama2-7b-128gpu-s131072-tp4pp1cp4vp1-gbs32",
         citation="NVIDIA NeMo 24.07 performance summary, 'Long Input Sequences': LLAMA2-7B, 128 H100, seq 131072, "
                  "FP8, tp 4 cp 4, mbs 1, gbs 32"),
    Case(name="gpt-neox-20b", kind="A100 40 GB", row="gpt-neox-20b",
         citation="Black et al., GPT-NeoX-20B (arXiv:2204.06745) Sec. 2-3 and EleutherAI/gpt-neox configs/20B.yml: "
                  "96 A100 40GB, tp 2 pp 4 dp 12, mbs 4, ZeRO-1, full recompute, ~117 TFLOP/s per GPU"),
)


@lru_cache(maxsize=None)
def _rows() -> dict[str, dict]:
    return {row["id"]: row for row in load_rows(DATA)}


@lru_cache(maxsize=None)
def _mapped_row(row_id: str) -> MappedRun:
    return map_row(_rows()[row_id], _node)


def mapped(case: Case) -> MappedRun | None:
    """The development-set row of a row-backed case, mapped (None for a spelled-out case)."""
    return _mapped_row(case.row) if case.row else None


def request(case: Case) -> dict[str, Any]:
    """``planner.plan`` keywords of the case's job (no runtime, default memory fraction)."""
    run = mapped(case)
    if run is None:
        return dict(case.request)
    return dict(model=run.model, hardware=run.node, gpus=run.num_gpus, global_batch=run.global_batch,
                seq_len=run.seq_len, gpus_per_node=run.gpus_per_node, precision=run.precision,
                fp8_recipe=run.fp8_recipe, compiled=run.compiled, attention=run.attention)


def recipe_runtime(case: Case) -> str:
    run = mapped(case)
    return run.runtime if run is not None else case.recipe_runtime


def published_layout(case: Case) -> planner.Layout:
    """The case's published layout, meeting its global batch exactly."""
    run = mapped(case)
    return run.layout if run is not None else layout_for_batch(case.request["global_batch"], **case.published)


def measured_tokens_per_s_per_gpu(case: Case) -> float | None:
    run = mapped(case)
    return run.measured_tokens_per_s_per_gpu if run is not None else None


def evaluate_published(case: Case, runtime: str | None = None) -> PlanEntry:
    """The published layout costed under the case's request and ``runtime`` (default: its own)."""
    runtime = runtime or recipe_runtime(case)
    breakdown = planner.evaluate(layout=published_layout(case), runtime=runtime, **request(case))
    return plan_entry(breakdown, job_bands(None, None, runtime))


def plan_file(case: Case, runtime: str) -> PlanFile:
    """The plan of the case's job under ``runtime`` (one alternative)."""
    return planner.plan(top_k=1, runtime=runtime, **request(case)).to_plan_file()


def framework_recipe(case: Case, runtime: str) -> tuple[Recipe | None, PlanEntry | None]:
    """``runtime``'s framework's recipe for the case's job and its costed layout (None where it
    published none, or its layout does not apply to the job)."""
    r = request(case)
    model = r["model"] if not isinstance(r["model"], str) else load_model(r["model"])
    recipe = recipe_for(runtime, model, r["seq_len"])
    if recipe is None:
        return None, None
    layout = recipe_layout(recipe, gpus=r["gpus"], global_batch=r["global_batch"])
    if isinstance(layout, str):
        return recipe, None
    try:
        breakdown = planner.evaluate(layout=layout, runtime=runtime, **r)
    except AutoplanError:
        return recipe, None
    return recipe, plan_entry(breakdown, job_bands(None, None, runtime))


def separating_term(chosen: PlanEntry, recipe: PlanEntry) -> str:
    """The step-time term where the recipe's breakdown differs most from the pick's (recipe - pick)."""
    terms = [d for d in runner_up_differences(chosen, recipe)["terms"] if d["unit"] == "s"]
    return f"{terms[0]['term']} {terms[0]['difference']:+.2f} s" if terms else "same step-time terms"


def _figures(entry: PlanEntry) -> str:
    p = entry.predicted
    fits = "" if p["fits"] else " (does not fit)"
    return f"{p['step_time_s']:.2f} s · {p['mfu']:.0%}{fits}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One job under one runtime: the pick, the framework's recipe, the published run."""

    case: Case
    runtime: str
    pick: PlanEntry | None
    recipe: Recipe | None
    recipe_entry: PlanEntry | None
    statement: str
    """What the plan says about the recipe (``SearchStats.recipe``; empty without one)."""
    published: PlanEntry | None
    published_text: str
    refusal: str = ""
    """Why ``runtime`` cannot run the job at all (its plan refuses it), else empty."""


def row(case: Case, runtime: str) -> Row:
    """The figures of one table row."""
    try:
        published = evaluate_published(case, runtime)
    except AutoplanError as err:
        published, text = None, f"not expressible ({str(err).split(';')[0][:60]})"
    try:
        plan = plan_file(case, runtime)
    except AutoplanError as err:
        return Row(case=case, runtime=runtime, pick=None, recipe=None, recipe_entry=None, statement="",
                   published=None, published_text="-", refusal=str(err).split(": ", 1)[-1].split(";")[0])
    measured = measured_tokens_per_s_per_gpu(case) if runtime == recipe_runtime(case) else None
    if published is not None:
        text = (f"{_figures(published)} · {published.predicted['tokens_per_s_per_gpu']:,.0f} tok/s/GPU"
                + (f" (measured {measured:,.0f})" if measured else ""))
    recipe, entry = framework_recipe(case, runtime)
    return Row(case=case, runtime=runtime, pick=plan.best, recipe=recipe, recipe_entry=entry,
               statement=plan.search.recipe or "", published=published, published_text=text)


def row_cells(case: Case, runtime: str) -> list[str]:
    """One table row: job, runtime, pick, its figures, the framework's recipe and the pick against it,
    the published run's predicted (measured) figures, and the separating term."""
    r = row(case, runtime)
    if r.refusal:
        return [case.name, runtime, f"refused ({r.refusal})", "-", "-", "-", "-", "-"]
    if r.recipe is None:
        recipe_text, against = "no published recipe", "-"
    else:
        recipe_text = f"{r.recipe.name}: " + (_figures(r.recipe_entry) if r.recipe_entry else "does not apply")
        against = verdict(r.statement) if r.statement else "-"
    if r.pick is None:
        return [case.name, runtime, "nothing fits", "-", recipe_text, against, r.published_text, "-"]
    other = r.recipe_entry or r.published
    if other is None:
        term = "-"
    elif other.layout == r.pick.layout:
        term = "same layout"
    else:
        term = separating_term(r.pick, other)
    return [case.name, runtime, layout_summary(r.pick.layout), _figures(r.pick), recipe_text, against,
            r.published_text, term]


def table(cases: list[Case], runtimes: tuple[str, ...]) -> list[str]:
    """The markdown table, then each published run's layout and source, then the recipes'."""
    head = ["job", "runtime", "autoplan pick", "pick: step · MFU", "framework recipe: step · MFU",
            "pick against the recipe", "published run predicted (measured)", "separating term (recipe or run - pick)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        own = recipe_runtime(case)
        for runtime in runtimes + ((own,) if own not in runtimes else ()):
            lines.append("| " + " | ".join(row_cells(case, runtime)) + " |")
    lines += ["", "Published runs:"]
    for case in cases:
        r = request(case)
        model = r["model"] if isinstance(r["model"], str) else r["model"].name
        lines.append(f"- {case.name} ({case.kind}; {model}, {r['gpus']:,} GPUs, batch {r['global_batch']} x "
                     f"{r['seq_len']}, {r.get('precision', 'bf16')}, ran on {recipe_runtime(case)}): "
                     f"{layout_summary(published_layout(case))}. Source: {case.citation}."
                     + (f" Note: {case.note}." if case.note else ""))
    lines += ["", "Framework recipes (planner/search/recipes.py):"]
    for recipe in RECIPES:
        lines.append(f"- {recipe.name} ({', '.join(recipe.runtimes)}; {recipe.model}, seq {recipe.seq_len}): "
                     f"{recipe_summary(recipe)}. Source: {recipe.source}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES], help="only this case (repeatable)")
    parser.add_argument("--runtime", action="append", choices=RUNTIMES, help="only this runtime (repeatable)")
    parser.add_argument("--all-runtimes", action="store_true", help=f"every runtime: {', '.join(RUNTIMES)}")
    args = parser.parse_args(argv)
    runtimes = RUNTIMES if args.all_runtimes else tuple(args.runtime or DEFAULT_RUNTIMES)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    print("\n".join(table(cases, runtimes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
