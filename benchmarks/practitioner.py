"""autoplan's pick next to a published layout, for four jobs practitioners know (issue #11).

Run: ``.venv/bin/python benchmarks/practitioner.py [--case NAME ...]`` (a few seconds of CPU per
case). For each job: the layout ``planner.plan`` picks and the published layout costed by
``planner.evaluate`` under the same request (same model, GPUs, batch, sequence, bf16, fused
attention), each with its predicted step time and band, MFU and peak memory; then the terms where
the two breakdowns differ most (``planner.explain.runner_up_differences``), published minus pick:
the largest is what decides. The published layout is costed as published (degrees, schedule,
micro-batch, recomputation); what a case had to assume is in its ``note``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

import planner
from planner.api import layout_for_batch
from planner.plan.bands import job_bands
from planner.explain import runner_up_differences
from planner.plan.render import layout_summary
from planner.plan.report import plan_entry
from planner.plan.plan_file import PlanEntry


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One job, its published layout, and where that layout was published."""

    name: str
    request: dict[str, Any]
    """``planner.plan`` / ``planner.evaluate`` keywords: model, hardware, gpus, global_batch, seq_len."""
    published: dict[str, Any]
    """``planner.api.layout_for_batch`` keywords of the published layout (dp, tp, pp, ...)."""
    citation: str
    note: str = ""
    plan_options: dict[str, Any] = field(default_factory=dict)


LLAMA3_405B_CHUNKS = (3,) + (4,) * 30 + (3,)
"""126 layers over pp 16 x v 2 chunks in model order; rank 0 holds chunks 0 and 16 (3 + 4 = 7
layers), rank 15 chunks 15 and 31 (4 + 3 = 7), every other rank 8: one layer fewer on the first
and the last stage (Llama 3 paper, Sec. 3.3.2)."""

CASES: tuple[Case, ...] = (
    Case(name="gpt3-175b", request=dict(model="gpt3-175b", hardware="a100-sxm-80gb", gpus=1024, global_batch=1536,
                                        seq_len=2048),
         published=dict(dp=8, tp=8, pp=16, schedule="interleaved", virtual_stages=2, recompute="full",
                        micro_batch_size=1, sequence_parallel=False),
         citation="Narayanan et al. SC'21, Table 1 (PTD-P: tp 8 inside a DGX, pp over nodes, interleaved v 2, "
                  "micro-batch 1, full recompute, as its 145B and 310B rows)",
         note="175B is between Table 1's rows; the 2021 runs used fp16 and eager attention, costed here as bf16, fused"),
    Case(name="llama3-70b", request=dict(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=128,
                                         seq_len=8192),
         published=dict(dp=2, tp=4, pp=4, cp=2, zero_stage=1, schedule="interleaved", virtual_stages=5,
                        micro_batch_size=1, recompute="none", tp_comm_overlap=True),
         citation="NVIDIA NeMo 24.07 performance summary, LLAMA3-70B pretraining on 64 DGX-H100 GPUs "
                  "(tp 4, pp 4, cp 2, vp 5, mbs 1, gbs 128; docs/source/performance/performance_summary.md)",
         note="published in FP8 (1,533 tokens/s/GPU), costed here in bf16; distributed optimizer (ZeRO-1) and "
              "no recomputation as Megatron-Core defaults; TP overlap on, as NeMo's llama3_70b performance recipe "
              "sets it (MegatronCommOverlapCallback(tp_comm_overlap=True))"),
    Case(name="mixtral-8x7b", request=dict(model="mixtral-8x7b", hardware="h100-sxm-80gb", gpus=64, global_batch=256,
                                           seq_len=4096),
         published=dict(dp=16, tp=1, pp=4, ep=8, zero_stage=1, schedule="interleaved", virtual_stages=8,
                        micro_batch_size=1, recompute="none"),
         citation="Megatron-Core MoE README, 'Reference Best Parallel Mapping' (MCore v0.8): Mixtral 8x7B dropless, "
                  "64 H100, s 4096, tp 1, ep 8, pp 4, vp 8, mbs 1, gbs 256, bf16",
         note="distributed optimizer as the README's example; 468 TFLOP/s per GPU quoted for MCore v0.9"),
    Case(name="llama3-405b", request=dict(model="llama3-405b", hardware="h100-sxm-80gb", gpus=16384,
                                          global_batch=2048, seq_len=8192),
         published=dict(dp=128, tp=8, pp=16, zero_stage=2, schedule="interleaved", virtual_stages=2,
                        micro_batch_size=1, recompute="none", layers_per_chunk=LLAMA3_405B_CHUNKS),
         citation="Llama Team, The Llama 3 Herd of Models (arXiv:2407.21783), Table 4 (16,384 GPUs: tp 8, pp 16, "
                  "dp 128, 41% MFU) and Sec. 3.3.2 (interleaved, one layer fewer on the first and last stage)",
         note="v 2 and ZeRO-2 (FSDP sharding optimizer states and gradients) assumed; recomputation not stated"),
)


def published_layout(case: Case) -> planner.Layout:
    """The case's published layout, meeting its global batch exactly."""
    return layout_for_batch(case.request["global_batch"], **case.published)


def evaluate_published(case: Case) -> PlanEntry:
    """The published layout costed under the case's request, with its bands."""
    breakdown = planner.evaluate(layout=published_layout(case), **case.request)
    return plan_entry(breakdown, job_bands(None))


def pick(case: Case) -> PlanEntry | None:
    """The layout autoplan picks for the case's request, with its bands (None when nothing fits)."""
    report = planner.plan(top_k=1, **case.request, **case.plan_options)
    return report.to_plan_file().best


def describe(label: str, entry: PlanEntry) -> list[str]:
    """Two lines: the layout, then step time with band, MFU and peak memory against the cap."""
    p, band = entry.predicted, entry.predicted.get("band") or {}
    step_band = band.get("step_time_s")
    pm = f" ± {step_band['half_width_rel']:.0%}" if step_band else ""
    fits = "fits" if p["fits"] else "does not fit"
    if band.get("memory_risk"):
        fits += ", band crosses the cap"
    return [f"  {label:10} {layout_summary(entry.layout)}",
            f"  {'':10} step {p['step_time_s']:.2f} s{pm} · MFU {p['mfu']:.1%} · "
            f"peak {p['peak_memory_gib']:.1f} / {p['memory_capacity_gib']:.1f} GiB ({fits})"]


def deciding_terms(chosen: PlanEntry, published: PlanEntry) -> str:
    """The terms where the published breakdown differs most from the pick's (published - pick)."""
    diff = runner_up_differences(chosen, published)
    parts = [f"{d['term']} {d['difference']:+.2f} {d['unit']}" for d in diff["terms"]]
    return ", ".join(parts) if parts else "identical breakdowns"


def case_lines(case: Case) -> list[str]:
    r = case.request
    lines = [f"{case.name} on {r['gpus']:,} x {r['hardware']} · batch {r['global_batch']} x {r['seq_len']} tokens · bf16",
             f"  published: {case.citation}"]
    if case.note:
        lines.append(f"  note: {case.note}")
    published, chosen = evaluate_published(case), pick(case)
    lines += describe("published", published)
    if chosen is None:
        return lines + ["  autoplan   no layout fits"]
    lines += describe("autoplan", chosen)
    if chosen.layout == published.layout:
        return lines + ["  same layout"]
    ratio = published.predicted["step_time_s"] / chosen.predicted["step_time_s"]
    lines.append(f"  published / pick step time {ratio:.2f}; published minus pick: {deciding_terms(chosen, published)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [c.name for c in CASES]
    parser.add_argument("--case", action="append", choices=names, help="run only this case (repeatable)")
    args = parser.parse_args(argv)
    for i, case in enumerate(c for c in CASES if not args.case or c.name in args.case):
        if i:
            print()
        print("\n".join(case_lines(case)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
