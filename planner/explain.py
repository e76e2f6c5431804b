"""``autoplan explain``: why a plan won, computed from the plan file, not just its table.

Three answers: what binds the best plan (memory near capacity, or the time term that dominates
the step), why the runner-up lost (the terms that differ, in seconds and GiB), and what would
change the answer (the search re-run with one input changed: twice the NIC bandwidth, twice the
global batch)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.plan.plan_file import PlanEntry, PlanFile
from planner.search.runtime_space import plan_narrowing_kwargs
from costmodels.capabilities import runtime_summary

MEMORY_BOUND_SHARE = 0.9
"""A plan whose peak memory is at least this share of capacity is called memory-bound."""


def binding_constraint(best: PlanEntry) -> dict[str, Any]:
    """Memory when the peak is within ``MEMORY_BOUND_SHARE`` of capacity; else the largest time term."""
    p = best.predicted
    share = p["peak_memory_gib"] / p["memory_capacity_gib"]
    risk = "; its memory band crosses the cap (memory risk)" if (p.get("band") or {}).get("memory_risk") else ""
    if share >= MEMORY_BOUND_SHARE:
        return {"kind": "memory", "text": f"memory: peak {p['peak_memory_gib']:.1f} of the "
                                          f"{p['memory_capacity_gib']:.1f} GiB per GPU the fit rule allows "
                                          f"({share:.0%}){risk}"}
    term, seconds = max(p["time_s"].items(), key=lambda kv: (kv[1], kv[0]))
    return {"kind": "time", "term": term,
            "text": f"time: {term} is {seconds:.3f} s of the {p['step_time_s']:.3f} s step "
                    f"({seconds / p['step_time_s']:.0%}); memory peaks at {share:.0%} of capacity{risk}"}


def runner_up_differences(best: PlanEntry, runner: PlanEntry, shown: int = 4) -> dict[str, Any]:
    """The time terms (s) and memory components (GiB) where ``runner`` differs most from ``best``."""
    b, r = best.predicted, runner.predicted
    diffs = []
    for field, unit in (("time_s", "s"), ("memory_gib", "GiB")):
        for term in sorted(set(b[field]) | set(r[field])):
            delta = r[field].get(term, 0.0) - b[field].get(term, 0.0)
            if abs(delta) > 1e-9:
                diffs.append({"term": term, "unit": unit, "best": b[field].get(term, 0.0),
                              "runner_up": r[field].get(term, 0.0), "difference": delta})
    time_diffs = sorted((d for d in diffs if d["unit"] == "s"), key=lambda d: -abs(d["difference"]))[:shown]
    mem_diffs = sorted((d for d in diffs if d["unit"] == "GiB"), key=lambda d: -abs(d["difference"]))[:2]
    return {"step_time_s": {"best": b["step_time_s"], "runner_up": r["step_time_s"]},
            "terms": time_diffs + mem_diffs}


def what_if(plan: PlanFile, job: Any) -> list[dict[str, Any]]:
    """The best plan after changing one input, each found by running the search again (``job``: the
    plan's job as planned, ``api.job_as_planned``)."""
    from . import api
    from planner.plan.render import layout_summary

    node = job.cluster.node
    faster_nic = replace(node, inter_node=replace(node.inter_node,
                                                  nic_bandwidth_bytes_per_s=2 * node.inter_node.nic_bandwidth_bytes_per_s))
    t = job.training
    cases = (("2x the NIC bandwidth", {"hardware": faster_nic}),
             (f"global batch {2 * t.global_batch_size}", {"global_batch": 2 * t.global_batch_size}))
    request = _same_request(plan, job, job.profile)
    out = []
    for label, change in cases:
        report = api.plan(**{**request, **change})
        if report.best is None:
            out.append({"change": label, "text": f"with {label}: nothing fits"})
            continue
        same = report.best.layout == plan.best.layout
        out.append({"change": label, "layout": layout_summary(report.best.layout),
                    "step_time_s": report.best.step_time_s, "same_layout": same,
                    "text": f"with {label}: {'same layout' if same else layout_summary(report.best.layout)}, "
                            f"step {report.best.step_time_s:.3f} s"})
    return out


def within_step_band(best: PlanEntry, runner: PlanEntry) -> bool | None:
    """Whether the runner-up's step time lies inside the best plan's step-time band (the model
    cannot tell the two apart); None when the plan has no step band."""
    band = (best.predicted.get("band") or {}).get("step_time_s")
    return None if not band else runner.predicted["step_time_s"] <= band["high"]


def ties(plan: PlanFile) -> dict[str, Any]:
    """How many layouts the model could not tell apart from the best, within which band and from
    where, and why the best won (the plan file's search record)."""
    s = plan.search
    count = s.num_tied or 1
    if s.tie_band is None:
        text = "this plan file records no tie band"
    else:
        source = f" ({s.tie_band_source})" if s.tie_band_source else ""
        text = f"{count} layout{'s' if count != 1 else ''} indistinguishable within the {s.tie_band:.1%} tie band{source}"
        if s.tie_reason and count > 1:
            text += f"; picked for {s.tie_reason}"
    if s.recipe:
        text += f"\n{s.recipe}"
    return {"num_indistinguishable": count, "band_rel": s.tie_band, "source": s.tie_band_source,
            "reason": s.tie_reason, "recipe": s.recipe, "text": text}


def explain(plan: PlanFile) -> dict[str, Any]:
    """The whole explanation of a plan file as one JSON-ready document."""
    from planner.plan.render import layout_summary

    if plan.best is None:
        miss = plan.closest_misses[0] if plan.closest_misses else None
        return {"best": None, "why": list(miss.suggestions) if miss else []}
    doc: dict[str, Any] = {"best": layout_summary(plan.best.layout),
                           "runtime": runtime_summary(plan.inputs.training.runtime, plan.inputs.runtime_version,
                                                      plan.best.layout),
                           "binding": binding_constraint(plan.best), "ties": ties(plan)}
    if plan.candidates:
        doc["runner_up"] = {"layout": layout_summary(plan.candidates[0].layout),
                            **runner_up_differences(plan.best, plan.candidates[0]),
                            "within_step_band": within_step_band(plan.best, plan.candidates[0])}
    if plan.best.layout.cp > 1:
        doc["context_parallel"] = context_parallel_note(plan.inputs.training.context_attention, plan.best.layout.cp)
    if plan.inputs.module is None:
        from . import api

        job = api.job_as_planned(plan.inputs)
        doc["what_would_change"] = what_if(plan, job)
        moved = calibration_moves(plan, job)
        if moved is not None:
            doc["calibration"] = moved
    return doc


def _same_request(plan: PlanFile, job: Any, profile: Any) -> dict[str, Any]:
    """``api.plan`` keywords of the plan's own request, with ``profile`` instead of its own."""
    t = job.training
    return dict(model=job.model, hardware=job.cluster.node, gpus=plan.inputs.gpus, global_batch=t.global_batch_size,
                seq_len=t.seq_len, gpus_per_node=plan.inputs.gpus_per_node, precision=t.precision,
                fp8_recipe=t.fp8_recipe, optimizer=t.optimizer, lora_rank=t.lora_rank, attention=t.attention,
                runtime=t.runtime, context_attention=t.context_attention, memory_fraction=plan.inputs.memory_fraction,
                profile=profile, launchable=bool(plan.inputs.launchable), **plan_narrowing_kwargs(plan.inputs))


def calibration_moves(plan: PlanFile, job: Any) -> dict[str, Any] | None:
    """For a plan calibrated by a cluster's own runs (``autoplan calibrate``): the pick without the
    calibration, and, if it differs, the factors that moved it: each factor applied alone to the
    shipped rates, and how much it narrows the step gap of the calibrated pick over the uncalibrated
    one (seconds). None for a plan with no such calibration."""
    from dataclasses import replace as dc_replace

    from . import api
    from planner.plan.render import layout_summary

    profile = job.profile
    fit = profile.logged_runs_fit() if profile is not None else None
    if fit is None or plan.best is None:
        return None
    bare = dc_replace(profile, calibration={})
    plain = api.plan(**_same_request(plan, job, bare))
    if plain.best is None or plain.best.layout == plan.best.layout:
        return {"moved": False, "text": "the calibration did not move the pick: the shipped rates pick it too"}
    factors = {name: f for name, f in (fit.get("factors") or {}).items() if f.get("informed")}
    gaps = {}
    for name, factor in factors.items():
        alone = dc_replace(profile, calibration=_factor_table(profile.calibration, name))
        model = dc_replace(job, profile=alone).cost_model()
        gaps[name] = model.estimate(plan.best.layout).step_time_s - model.estimate(plain.best.layout).step_time_s
    bare_model = dc_replace(job, profile=bare).cost_model()
    base_gap = bare_model.estimate(plan.best.layout).step_time_s - bare_model.estimate(plain.best.layout).step_time_s
    movers = sorted(((gap - base_gap, name) for name, gap in gaps.items() if gap - base_gap < 0))
    names = [f"{name} x{factors[name]['multiplier']:.2f} ({delta:+.3f} s)" for delta, name in movers]
    return {"moved": True, "uncalibrated": layout_summary(plain.best.layout),
            "factors": [name for _, name in movers],
            "text": f"the calibration moved the pick: the shipped rates pick {layout_summary(plain.best.layout)}; "
                    f"moved by {', '.join(names) or 'no single factor (their combination)'}"}


def _factor_table(calibration: dict[str, float], factor: str) -> dict[str, float]:
    """A calibration table holding only ``factor``'s fields."""
    from costmodels.calibration_factors import FACTORS

    fields = next(f.fields for f in FACTORS if f.name == factor)
    return {k: v for k, v in calibration.items() if k in fields}


CONTEXT_ATTENTION_TEXT = {
    "ring": "ring attention: K/V blocks pass around the {cp} cp ranks, hidden behind the attention core",
    "all_gather": "all-gather attention (Llama 3): K/V of the whole sequence gathered from the {cp} cp ranks "
                  "before the core and their gradients reduce-scattered after, exposed",
}


def context_parallel_note(variant: str, cp: int) -> dict[str, str]:
    """Which context-parallel attention the plan was costed with (``TrainingSpec.context_attention``)."""
    return {"variant": variant, "text": "context parallelism costed as " + CONTEXT_ATTENTION_TEXT[variant].format(cp=cp)}


def explanation_lines(doc: dict[str, Any]) -> list[str]:
    """``explain``'s document as lines for the terminal."""
    if doc["best"] is None:
        return ["nothing fits:", *(f"  {why}" for why in doc["why"])]
    lines = [doc["runtime"], f"why this plan: {doc['binding']['text']}", doc["ties"]["text"]]
    if "runner_up" in doc:
        r = doc["runner_up"]
        s = r["step_time_s"]
        lines.append(f"runner-up ({r['layout']}) takes {s['runner_up']:.3f} s against {s['best']:.3f} s:")
        lines += [f"  {d['term']}: {d['runner_up']:.3f} vs {d['best']:.3f} {d['unit']} ({d['difference']:+.3f})"
                  for d in r["terms"]]
        if s["runner_up"] <= s["best"] or not any(d["unit"] == "s" for d in r["terms"]):
            lines.append("  within the tie band: the best plan won the tie (planner.search.ranking.tie_key: memory band "
                         "under the cap, then fewest uncertain mechanisms, then the simplest)")
        elif r.get("within_step_band"):
            lines.append("  the runner-up lies inside the best plan's step-time band: the cost model cannot tell "
                         "them apart (see Error bands in docs/published.md)")
    if "context_parallel" in doc:
        lines.append(doc["context_parallel"]["text"])
    for case in doc.get("what_would_change", []):
        lines.append(case["text"])
    if "calibration" in doc:
        lines.append(doc["calibration"]["text"])
    return lines
