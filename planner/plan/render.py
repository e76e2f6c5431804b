"""Human-readable views of plans (rich tables), built from ``PlanFile`` so that ``plan``,
``evaluate`` and ``explain plan.json`` print the same thing."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from costmodels.breakdown import MEMORY_TERMS, TIME_TERMS
from costmodels.capabilities import capabilities, runtime_summary
from costmodels.layout import Layout
from costmodels.stage_split import describe_split
from autoplan_base.errors import AutoplanError
from hardware_specs import load_node, make_cluster

from .plan_file import PlanEntry, PlanFile, PlanInputs, SearchStats

TIME_LABELS = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP comm (exposed)",
               "cp_comm": "CP comm (exposed)", "ep_comm": "EP comm (exposed)", "dp_comm": "DP comm (exposed)",
               "pp_comm": "PP send/recv", "bubble": "pipeline bubble", "optimizer": "optimizer step",
               "offload": "offload (host)", "overhead": "fixed overhead"}


def layout_summary(L: Layout) -> str:
    """One line: ``dp 8 · tp 8 · pp 4 · ZeRO-1 · mb 1 × 64 · 1f1b · recompute selective · SP``."""
    parts = list(L.degree_labels())
    zero = f"ZeRO-{L.zero_stage}"
    if L.hsdp_shard_degree:
        zero += f" (HSDP shard {L.hsdp_shard_degree})"
    parts.append(zero)
    parts.append(f"mb {L.micro_batch_size} x {L.num_microbatches}")
    if L.pp > 1:
        parts.append(f"{L.schedule} v={L.virtual_stages}" if L.virtual_stages > 1 else L.schedule)
    if L.layers_per_chunk:
        parts.append(f"layers {describe_split(L.layers_per_chunk)}")
    parts.append(f"recompute {L.recompute}")
    if L.sequence_parallel:
        parts.append("SP")
    if L.tp_comm_overlap:
        parts.append("TP overlap")
    if L.moe_dispatcher != "alltoall":
        parts.append(L.moe_dispatcher)
    if L.ep_comm_overlap:
        parts.append("EP overlap")
    if L.gpus_per_nvlink_domain:
        parts.append(f"{L.gpus_per_nvlink_domain} per NVLink domain")
    if L.optimizer_offload:
        parts.append("offload")
    if L.activation_offload_layers:
        parts.append(f"activations of {L.activation_offload_layers} layers on the host")
    return " · ".join(parts)


def placement_line(placement: dict) -> str:
    """Where the ranks sit on multi-node NVLink domains (``predicted.placement``): ``placement: 64 of
    each 72-GPU NVLink domain (2 domains: 64 + 64); inside one: ep 64; across 2: dp 128``."""
    used, domain, sizes = placement["gpus_per_nvlink_domain"], placement["nvlink_domain_gpus"], placement["domains"]
    share = "all" if used == domain else str(used)
    count = f"{len(sizes)} domain{'s' * (len(sizes) != 1)}: {' + '.join(map(str, sizes))}"
    line = f"placement: {share} of each {domain}-GPU NVLink domain ({count})"
    groups = placement.get("groups") or {}
    inside = [f"{axis} {g['degree']}" for axis, g in groups.items() if g["domains"] == 1]
    across = [f"{axis} {g['degree']} across {g['domains']}" for axis, g in groups.items() if g["domains"] > 1]
    if inside:
        line += f"; inside one: {', '.join(inside)}"
    if across:
        line += f"; {', '.join(across)}"
    return line


def prediction_status(sources: dict[str, str]) -> str:
    """What grounds the predicted figures: the datasheet, a measured profile, or a mix of the two."""
    measured = sorted(k for k, v in sources.items() if v != "datasheet")
    if sources and len(measured) == len(sources):
        return "predicted from the measured profile"
    if measured:
        return f"partly measured: {', '.join(measured)} from the profile, the rest datasheet estimates"
    return "datasheet estimates, shipped calibration (fit on published runs); --profile measures this machine"


def _in_order(values: dict[str, float], order: list[str]) -> list[tuple[str, float]]:
    """``values`` in the breakdown's term order (a plan file stores its keys sorted), unknown keys last."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(values.items(), key=lambda kv: (rank.get(kv[0], len(order)), kv[0]))


def goodput_line(g: dict) -> str:
    """Expected goodput beside the raw figure, with the checkpoint interval that gives it."""
    return (f"goodput {g['tokens_per_s']:,.0f} tokens/s ({g['useful_fraction']:.1%} useful) · checkpoint every "
            f"{g['checkpoint_every_steps']:,} steps ({g['checkpoint_gib']:,.0f} GiB in {g['checkpoint_write_s']:,.0f} s;"
            f" MTBF {g['mtbf_h']:,.0f} h)")


def mismatch_line(inputs: PlanInputs) -> str:
    """A warning when the plan was costed with a profile of other devices (``--profile-device-mismatch
    ok``): its figures then come from another machine's rates; "" otherwise."""
    problems = inputs.profile_device_mismatch
    if not problems:
        return ""
    return (f"warning: profile {inputs.profile} was measured on other devices ({'; '.join(problems)}); "
            "the figures below use that machine's rates (--profile-device-mismatch ok)")


def print_plan(console: Console, plan: PlanEntry, title: str, tie_note: str = "", *, foreign_profile: bool = False) -> None:
    """Layout, headline figures, memory by component against capacity, time by term, traffic.
    ``foreign_profile``: mark the figures as costed with a profile of other devices."""
    p = plan.predicted
    console.print(f"[bold]{title}[/bold]: {layout_summary(plan.layout)}")
    if tie_note:
        console.print(f"  {tie_note}")
    if p.get("placement"):
        console.print(f"  {placement_line(p['placement'])}")
    band = p.get("band") or {}
    console.print(f"  step {p['step_time_s']:.3f} s{_pm(band.get('step_time_s'), p['step_time_s'])} · {p['tokens_per_s']:,.0f} tokens/s "
                  f"({p['tokens_per_s_per_gpu']:,.0f}/GPU)")
    low = f" ({p['mfu_low_precision_peak']:.1%} of the low-precision peak)" if "mfu_low_precision_peak" in p else ""
    console.print(f"  MFU {p['mfu']:.1%}{low} · HFU {p['hfu']:.1%} · bubble {p['bubble_fraction']:.1%}")
    if "goodput" in p:
        console.print(f"  {goodput_line(p['goodput'])}")
    status = band.get("calibration") or prediction_status(p.get("sources", {}))
    if foreign_profile:
        console.print(f"  {status}, [yellow]measured on other devices[/yellow]", highlight=False)
    else:
        console.print(f"  {status}", style="dim")
    fits = "[green]fits[/green]" if p["fits"] else "[red]does not fit[/red]"
    if p.get("host_fits") is False and p["peak_memory_gib"] <= p["memory_capacity_gib"]:
        fits = "[red]fits on the GPU, but host RAM cannot hold the offloaded states[/red]"
    elif band.get("memory_risk") and p["fits"]:
        fits = "[yellow]fits, but its band crosses the cap: memory risk[/yellow]"
    console.print(f"  peak memory {p['peak_memory_gib']:.1f}{_pm(band.get('peak_memory_gib'), p['peak_memory_gib'])} GiB per GPU, of "
                  f"{p['memory_capacity_gib']:.1f} the fit rule allows ({fits})")
    if p.get("memory_band_upper"):
        console.print(f"  fit rule: peak x {1 + p['memory_band_upper']:.3f} (95th percentile of held-out measured / "
                      f"predicted peaks: an OOM costs a restart, a miss a few per cent) <= "
                      f"{p['memory_usable_gib']:.1f} GiB usable (costmodels/data/memory_calibration.json)", style="dim")
    if "host_memory_gib_per_node" in p:
        console.print(f"  host RAM for offloaded optimizer states {p['host_memory_gib_per_node']:,.1f} / "
                      f"{p['host_memory_capacity_gib']:,.1f} GiB per node")
    for line in band_lines(band):
        console.print(f"  {line}", style="dim")
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
    for head in ("memory/GPU GiB", "step time s", "traffic/GPU GiB"):
        table.add_column(head, no_wrap=True, min_width=len(head) - 4)
        table.add_column("", justify="right", no_wrap=True)
    mem = _in_order(p["memory_gib"], [n.removesuffix("_bytes") for n in MEMORY_TERMS])
    times = [(TIME_LABELS.get(k, k), v) for k, v in _in_order(p["time_s"], [n.removesuffix("_s") for n in TIME_TERMS])
             if v > 0]
    comm = list(p["comm_gib_per_gpu"].items())
    for i in range(max(len(mem), len(times), len(comm))):
        row = []
        for items, fmt in ((mem, "{:.2f}"), (times, "{:.3f}"), (comm, "{:.1f}")):
            row += [items[i][0], fmt.format(items[i][1])] if i < len(items) else ["", ""]
        table.add_row(*row)
    console.print(table)
    buffers = p.get("buffers_gib") or {}
    if buffers:
        console.print("  buffers: " + ", ".join(f"{name.replace('_', ' ')} {gib:.2f}" for name, gib in buffers.items())
                      + " GiB", style="dim")
    sources = p.get("sources", {})
    if sources:
        console.print("  sources: " + ", ".join(f"{k}={v}" for k, v in sources.items()), style="dim")


def _pm(band: dict | None, value: float) -> str:
    """`` ± 9%`` for a band object of ``predicted.band`` around ``value``; its edges, `` +0% to +51%``,
    when one side is under a quarter of the other (a bias more than a spread); empty without one."""
    if not band:
        return ""
    low, high = (band["low"] / value - 1, band["high"] / value - 1) if value > 0 else (0.0, 0.0)
    if value > 0 and min(-low, high) < 0.25 * max(-low, high):
        return f" {low:+.0%} to {high:+.0%}"
    return f" ± {band['half_width_rel']:.0%}"


def _figure(value: float) -> str:
    """Three significant digits, without an exponent up to the billions: 0.0123, 1.23, 123, 1,080."""
    return f"{value:,.0f}" if 100 <= abs(value) < 1e12 else f"{value:.3g}"


def band_lines(band: dict) -> list[str]:
    """Where each band comes from (``predicted.band``), one line each."""
    lines = []
    for key, what, unit in (("step_time_s", "step", "s"), ("peak_memory_gib", "memory", "GiB")):
        b = band.get(key)
        if b:
            lines.append(f"{what} band {_figure(b['low'])}-{_figure(b['high'])} {unit}: {b['basis']} "
                         f"({b['record'].split()[0]})")
    if band and band.get("step_time_s") is None and band.get("step_time_note"):
        lines.append(band["step_time_note"])
    return lines


def print_candidates(console: Console, candidates: tuple[PlanEntry, ...]) -> None:
    if not candidates:
        return
    table = Table(title="alternatives (best layout of each next-best mesh)", box=None, padding=(0, 2),
                  header_style="bold", title_justify="left")
    for col in ("#", "layout", "step s", "tokens/s", "MFU", "peak GiB"):
        table.add_column(col, justify="right" if col != "layout" else "left")
    for i, c in enumerate(candidates, start=2):
        p = c.predicted
        risk = " risk" if (p.get("band") or {}).get("memory_risk") else ""
        table.add_row(str(i), layout_summary(c.layout), f"{p['step_time_s']:.3f}", f"{p['tokens_per_s']:,.0f}",
                      f"{p['mfu']:.1%}", f"{p['peak_memory_gib']:.1f}{risk}")
    console.print(table)


def print_tp_plan(console: Console, tp_plan: dict[str, str] | None, shown: int = 12) -> None:
    """The ILP's per-module tensor-parallel plan (``autoplan shard --attach``), first entries."""
    if not tp_plan:
        return
    console.print(f"  tensor-parallel plan from the ILP ({len(tp_plan)} modules):")
    for fqn, style in sorted(tp_plan.items())[:shown]:
        console.print(f"    {fqn}: {style}")
    if len(tp_plan) > shown:
        console.print(f"    ... and {len(tp_plan) - shown} more (see the plan file)")


def tie_note(search: SearchStats) -> str:
    """The best plan's headline on ties: how many layouts the model could not tell apart, within
    which band, and why the pick won (``planner.search.ranking.tie_reason``, which says whether
    the pick's memory band crosses the cap). Empty when nothing was tied."""
    tied = search.num_tied or 0
    if tied <= 1 or search.tie_band is None:
        return ""
    why = f": picked for {search.tie_reason}" if search.tie_reason else ""
    return f"{tied} layouts indistinguishable (within the {search.tie_band:.1%} tie band){why}"


def tie_band_line(search: SearchStats) -> str:
    """Which tie band the search used and where it comes from (empty for a file without one)."""
    if search.tie_band is None:
        return ""
    source = f": {search.tie_band_source}" if search.tie_band_source else ""
    return f"tie band {search.tie_band:.1%}{source}"


def _version(inputs: "PlanInputs") -> str:
    """The runtime release a plan was searched for (older plan files: the table's latest)."""
    return capabilities(inputs.training.runtime, inputs.runtime_version).latest


def _placement(inputs: "PlanInputs") -> str:
    """GPUs per node and, where one NVLink domain spans several nodes (GB200/GB300 NVL72: trays of
    4 in a rack of 72), the domain's size; the node alone when the hardware can no longer be read."""
    try:
        domain = make_cluster(load_node(inputs.hardware), inputs.gpus, inputs.gpus_per_node).nvlink_domain_gpus
    except AutoplanError:
        domain = inputs.gpus_per_node
    extra = f", NVLink domain of {domain}" if domain > inputs.gpus_per_node else ""
    return f"{inputs.gpus_per_node} per node{extra}"


def print_report(console: Console, report: PlanFile) -> None:
    """A whole plan file: inputs, best plan, alternatives, search statistics, or the closest misses."""
    i, t = report.inputs, report.inputs.training
    console.print(f"[bold]{i.model}[/bold] on {i.gpus} x {i.hardware} ({_placement(i)}) · "
                  f"global batch {t.global_batch_size} x {t.seq_len} tokens · {t.recipe.name} · {t.optimizer}"
                  + (f" · LoRA r={t.lora_rank}" if t.lora_rank else "") + f" · {t.runtime} {_version(i)}")
    console.print(runtime_summary(t.runtime, i.runtime_version, report.best.layout if report.best else None),
                  style="dim")
    if i.module:
        shape = list(i.input_shape) if i.input_shape is not None else None
        console.print(f"user model {i.module} (input shape {shape})")
    if mismatch_line(i):
        console.print(mismatch_line(i), style="yellow", highlight=False)
    foreign = bool(i.profile_device_mismatch)
    if report.best is not None:
        print_plan(console, report.best, "best", tie_note(report.search), foreign_profile=foreign)
        print_tp_plan(console, report.best.tp_plan)
        print_candidates(console, report.candidates)
    for miss in report.closest_misses:
        print_plan(console, miss.entry, "closest miss", foreign_profile=foreign)
        console.print(f"  needs {miss.needed_gib:.1f} GiB, has {miss.available_gib:.1f} GiB; would fit with: "
                      + "; ".join(miss.suggestions))
    s = report.search
    rejected = ", ".join(f"{n:,} {why}" for why, n in sorted(s.rejected.items()))
    timing = f" in {s.seconds:.2f} s" if s.seconds is not None else ""
    console.print(f"searched {s.space_size:,} layouts ({s.evaluated:,} evaluated in full){timing}; "
                  f"rejected: {rejected or 'none'}", style="dim")
    if tie_band_line(s):
        console.print(tie_band_line(s), style="dim")
    if s.recipe:
        console.print(s.recipe, style="dim", highlight=False)
