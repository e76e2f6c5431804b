"""Pictures of a plan (matplotlib, Agg backend; PNG and SVG), drawn from a plan file's dict.

- ``schedule``: the chosen plan's pipeline schedule, one row per pipeline rank: forward,
  backward (with recomputation and exposed collectives), point-to-point transfers; the gaps
  are the bubble. Times per micro-batch and chunk come from the cost model (``rank_core_times``),
  the order from ``schedule.rank_order``, the timing from ``schedule.simulate``.
- ``memory``: per-GPU memory by component on each pipeline rank, against the fit rule's cap.
- ``candidates``: every layout of the search space (up to ``MAX_POINTS``, evenly sampled) as
  step time against peak memory; the chosen plan and the memory cap are marked.
"""

from __future__ import annotations

from pathlib import Path

from costmodels.assignment import rank_layers
from costmodels.breakdown import MEMORY_TERMS
from costmodels.estimate import CostModel
from costmodels.layout import Layout
from costmodels.rank_time import rank_core_times
from hardware_specs.units import GIB
from planner.plan.plan_file import PlanFile

from .schedule import simulate

MAX_POINTS = 4000
"""Most layouts drawn in the candidates figure (the space is sampled evenly beyond that)."""
COLORS = {"F": "#4c72b0", "B": "#dd8452", "comm": "#55a868", "idle": "#eeeeee",
          "params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
          "buffers": "#8172b3", "overhead": "#937860"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    for path in paths:
        fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Date": None} if path.suffix == ".svg" else None)
    _pyplot().close(fig)
    return paths


def stage_times(cm, layout: Layout) -> tuple[list[float], list[float], float]:
    """(forward per chunk, backward per chunk) per pipeline rank and one p2p transfer (s).

    Exposed collectives are split one third forward, two thirds backward (backward repeats the
    forward's and adds its own); recomputation is part of backward."""
    fwd, bwd, comm = [], [], 0.0
    v = layout.virtual_stages
    for rank in rank_layers(cm, layout):
        t = rank_core_times(cm, layout, rank)
        collectives = t.tp_s + t.cp_s + t.ep_s + t.dp_mb_s
        fwd.append((t.fwd_compute_s + collectives / 3) / v)
        bwd.append((t.bwd_compute_s + t.recompute_s + 2 * collectives / 3) / v)
        comm = max(comm, t.pp_s / (2 * v)) if layout.pp > 1 else 0.0
    return fwd, bwd, comm


MAX_DRAWN_MICROBATCHES = 32
"""Past this many micro-batches the schedule plot draws a window: warm-up, a stretch of steady
state and cool-down of this many, since thousands of bars become stripes in a multi-MB SVG."""


def drawn_microbatches(num_microbatches: int, pp: int, virtual_stages: int) -> int:
    """How many micro-batches the schedule plot simulates and draws: all of them up to
    ``MAX_DRAWN_MICROBATCHES``; beyond, that many (rounded to a multiple of pp for the
    interleaved schedule, which needs it), enough for the warm-up and cool-down to show whole."""
    if num_microbatches <= MAX_DRAWN_MICROBATCHES:
        return num_microbatches
    window = max(MAX_DRAWN_MICROBATCHES, 2 * pp)
    if virtual_stages > 1:
        window = -(-window // pp) * pp
    return min(window, num_microbatches)


def plot_schedule(plan: PlanFile, cm: CostModel, out_dir: Path) -> list[Path]:
    """Timeline of the chosen plan's step, per pipeline rank."""
    plt = _pyplot()
    layout = plan.best.layout
    fwd, bwd, comm = stage_times(cm, layout)
    drawn = drawn_microbatches(layout.num_microbatches, layout.pp, layout.virtual_stages)
    bars = simulate(layout.schedule, layout.pp, drawn, layout.virtual_stages, fwd, bwd, comm)
    end = max(b.end_s for b in bars)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * layout.pp))
    for i in range(layout.pp):
        ax.broken_barh([(0, end)], (i - 0.4, 0.8), color=COLORS["idle"])
    for b in bars:
        height = 0.3 if b.kind == "comm" else 0.8
        ax.broken_barh([(b.start_s, b.end_s - b.start_s)], (b.rank - height / 2, height), color=COLORS[b.kind],
                       edgecolor="white", linewidth=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("F", "B", "comm", "idle")]
    ax.legend(handles, ["forward", "backward (+recompute)", "send/recv", "bubble (idle)"], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if layout.pp > 1 else -0.5), ncol=4, frameon=False)
    ax.set_yticks(range(layout.pp), [f"pp rank {i}" for i in range(layout.pp)])
    ax.invert_yaxis()
    ax.set_xlabel("time within the step (s)")
    shown = "" if drawn == layout.num_microbatches else \
        f" (first {drawn} drawn; the steady state repeats for the other {layout.num_microbatches - drawn})"
    ax.set_title(f"{layout.schedule} schedule, pp {layout.pp}, {layout.num_microbatches} micro-batches"
                 + (f", v {layout.virtual_stages}" if layout.virtual_stages > 1 else "") + shown, fontsize=9)
    return _save(fig, out_dir, "schedule")


def plot_memory(plan: PlanFile, cm: CostModel, out_dir: Path) -> list[Path]:
    """Stacked memory components per pipeline rank, with the fit rule's cap."""
    plt = _pyplot()
    breakdown = cm.estimate(plan.best.layout)
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(breakdown.stages), 4))
    xs = list(range(len(breakdown.stages)))
    bottom = [0.0] * len(xs)
    for term in MEMORY_TERMS:
        name = term.removesuffix("_bytes")
        values = [getattr(st, term) / GIB for st in breakdown.stages]
        ax.bar(xs, values, bottom=bottom, color=COLORS[name], label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(breakdown.memory_capacity_bytes / GIB, color="black", linestyle="--", label="fit rule's cap")
    ax.set_xticks(xs, [f"pp {i}" for i in xs])
    ax.set_ylabel("GiB per GPU")
    ax.set_title("memory per GPU by component")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return _save(fig, out_dir, "memory")


def candidate_points(plan: PlanFile, cm: CostModel) -> list[tuple[float, float, bool]]:
    """(peak GiB, step s, fits) of the layouts of the plan's search space (sampled evenly)."""
    from planner.search.runtime_space import plan_search_options
    from planner.search.space import all_layouts

    inputs = plan.inputs
    options = plan_search_options(inputs, cm.cluster.hardware.device_type, cm.cluster)
    layouts = list(all_layouts(cm.model, cm.training, inputs.gpus, cm.cluster.nvlink_domain_gpus, options))
    stride = max(1, len(layouts) // MAX_POINTS)
    out = []
    for layout in layouts[::stride]:
        b = cm.estimate(layout)
        out.append((b.peak_memory_bytes / GIB, b.step_time_s, b.fits))
    return out


def plot_candidates(plan: PlanFile, cm: CostModel, out_dir: Path) -> list[Path]:
    """Step time vs peak memory of the evaluated layouts; chosen plan and memory cap marked."""
    plt = _pyplot()
    points = candidate_points(plan, cm)
    best = plan.best.predicted
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for fits, color, label in ((True, "#4c72b0", "fits"), (False, "#bbbbbb", "over memory")):
        sel = [(m, t) for m, t, f in points if f == fits]
        if sel:
            ax.scatter([m for m, _ in sel], [t for _, t in sel], s=8, color=color, alpha=0.6, label=label)
    for other in plan.candidates:
        p = other.predicted
        ax.scatter([p["peak_memory_gib"]], [p["step_time_s"]], s=30, marker="s", facecolor="none",
                   edgecolor="#55a868")
    ax.scatter([best["peak_memory_gib"]], [best["step_time_s"]], s=120, marker="*", color="#c44e52",
               label="chosen plan", zorder=5)
    ax.axvline(best["memory_capacity_gib"], color="black", linestyle="--", label="memory cap")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(f"{len(points)} layouts evaluated (ranked alternatives: squares)")
    ax.legend(frameon=False, fontsize=8)
    return _save(fig, out_dir, "candidates")


def plan_cost_model(plan: PlanFile) -> CostModel:
    """The cost model the plan was made with: its inputs and the profile they name, if any."""
    from planner.api import job_as_planned

    return job_as_planned(plan.inputs).cost_model()


def plot_plan(plan: PlanFile, out_dir: str | Path) -> list[Path]:
    """All three figures (PNG and SVG each) for a plan file; none when nothing fits.

    Costed as the plan was: with the profile its inputs name (``inputs.profile``), if any."""
    out = Path(out_dir)
    if plan.best is None:
        return []
    cm = plan_cost_model(plan)
    return plot_schedule(plan, cm, out) + plot_memory(plan, cm, out) + plot_candidates(plan, cm, out)
