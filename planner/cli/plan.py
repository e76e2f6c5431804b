"""``autoplan plan``, ``evaluate``, ``explain``, ``models`` and ``hardware``."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Callable

import click

from .common import EXIT_INFEASIBLE, FiniteFloat, check_places, output_console, run_command, write_atomic
from .progress import search_notice

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v", "dualpipe")
"""``costmodels.layout.SCHEDULES``, spelled out so the CLI loads no cost model (a test checks they agree)."""
MOE_DISPATCHER_NAMES = ("alltoall", "deepep", "hybridep")
"""``costmodels.layout.MOE_DISPATCHERS``, spelled out likewise (a test checks they agree)."""

if TYPE_CHECKING:
    from rich.console import Console

    from planner.plan.plan_file import PlanEntry, PlanFile, PlanInputs

JOB_OPTIONS: list[Callable] = [
    click.option("--model", "model", required=True, help="Preset name (see 'autoplan models') or a config.json path."),
    click.option("--hardware", required=True, help="Preset name (see 'autoplan hardware') or a node TOML path."),
    click.option("--gpus", type=click.IntRange(min=1), required=True, help="Total GPUs."),
    click.option("--global-batch", type=click.IntRange(min=1), required=True, help="Sequences per optimizer step."),
    click.option("--seq-len", type=click.IntRange(min=1), required=True, help="Tokens per sequence."),
    click.option("--gpus-per-node", type=click.IntRange(min=1), default=None, help="Override the node type's GPU count."),
    click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32"]), default="bf16",
                 show_default=True, help="fp8/mxfp8/nvfp4: weight GEMMs in low precision (not the LM head, router or "
                 "attention core), with the recipe's casts and weight copies; mxfp8/nvfp4 need Blackwell. MFU stays "
                 "against the bf16 peak."),
    click.option("--fp8-recipe", type=click.Choice(["delayed", "tensorwise", "rowwise", "blockwise"]), default=None,
                 help="With --precision fp8: delayed or current tensorwise scaling, rowwise, or blockwise "
                      "(DeepSeek-V3 1x128/128x128, bf16 Adam moments) [default: tensorwise]."),
    click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True),
    click.option("--lora-rank", type=click.IntRange(min=0), default=0, show_default=True,
                 help="LoRA rank (0 = full training); adapters on q, k, v, o."),
    click.option("--attention", type=click.Choice(["fused", "eager"]), default="fused", show_default=True,
                 help="fused: flash-style kernel, scores not stored; eager: scores stored."),
    click.option("--runtime", type=click.Choice(["megatron", "megatron-bridge", "deepspeed", "torch", "torchtitan"]),
                 default=None,
                 help="Who runs the plan, so memory and syncs are counted as it does them: megatron "
                      "(ZeRO-paper states, Megatron activations; the default), megatron-bridge (as megatron, "
                      "with the bf16 gradient buffer of NeMo's performance recipes), deepspeed (Megatron-DeepSpeed: "
                      "as megatron, plus the bf16 gradients its pipeline engine keeps) or torch (autoplan launch's "
                      "job: FSDP2, PyTorch TP/SP) or torchtitan (as torch, with "
                      "the loss on vocabulary-sharded logits under TP). plan searches exactly what it runs "
                      "(costmodels/capabilities.py)."),
    click.option("--moe-imbalance", type=FiniteFloat(min=1.0), default=None,
                 help="MoE models: tokens of the busiest expert rank over the even share (1 + MaxVio, Wang et "
                      "al. 2024; default 1.0, the force-balanced routing of vendor benchmarks)."),
    click.option("--cp-attention", "context_attention", type=click.Choice(["ring", "all_gather"]), default=None,
                 help="How context parallelism is costed: ring (K/V passed around the cp ranks, overlapped) or "
                      "all_gather (Llama 3: K/V gathered, exposed). Default: what runs the plan, all_gather for "
                      "the launched job on a non-CUDA device, else ring."),
    click.option("--memory-fraction", type=FiniteFloat(min=0, max=1, min_open=True), default=0.95,
                 show_default=True, help="Usable share of device memory."),
    click.option("--profile", type=click.Path(dir_okay=False), default=None,
                 help="Measured profile JSON (autoplan profile); datasheet rates otherwise."),
    click.option("--calibration", type=click.Path(dir_okay=False), default=None,
                 help="A calibration from this cluster's own runs (autoplan calibrate --out; a profile with its "
                      "fitted factors): the rates it corrects, and its leave-one-out error as the step band. "
                      "Give it or --profile, not both (autoplan calibrate --profile P folds P's rates in)."),
    click.option("--profile-device-mismatch", type=click.Choice(["refuse", "ok"]), default="refuse", show_default=True,
                 help="ok: use a --profile or --calibration measured on other devices than --hardware (recorded in "
                      "the plan)."),
    click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                 help="json prints JSON only on stdout."),
    click.option("--out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
                 help="Write the plan file here (atomically; '-' for stdout). With a path, nothing goes to "
                      "stdout: one line on stderr names the file and the best layout."),
]


def job_options(func: Callable) -> Callable:
    for option in reversed(JOB_OPTIONS):
        func = option(func)
    return func


def _job_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    keys = ("model", "hardware", "gpus", "global_batch", "seq_len", "gpus_per_node", "precision", "fp8_recipe",
            "optimizer", "lora_rank", "attention", "memory_fraction", "profile", "profile_device_mismatch")
    out = {k: kw[k] for k in keys}
    if kw.get("calibration") is not None:
        if kw["profile"] is not None:
            raise click.BadParameter("give --calibration or --profile, not both: 'autoplan calibrate --profile "
                                     f"{kw['profile']}' writes a calibration that keeps that profile's rates",
                                     param_hint="--calibration")
        out["profile"] = kw["calibration"]
    out["model"], out["hardware"] = _full_names(kw["model"], kw["hardware"])
    for key in ("runtime", "moe_imbalance", "context_attention"):
        if kw.get(key) is not None:
            out[key] = kw[key]
    return out


def _run_job_command(work: Callable[[], None], kw: dict[str, Any]) -> None:
    """``run_command``, with errors about the profile naming ``--calibration`` when that option gave it."""
    from autoplan_base.errors import given_as

    if kw.get("calibration") is None:
        run_command(work)
        return
    with given_as("profile", "--calibration"):
        run_command(work)


def _full_names(model: str, hardware: str) -> tuple[str, str]:
    """Preset names as typed -> full names, each expansion said once on stderr."""
    from costmodels.presets import model_name
    from hardware_specs.loader import hardware_name

    full = (model_name(model), hardware_name(hardware))
    for given, name in zip((model, hardware), full):
        if given != name:
            click.echo(f"{given} means {name}", err=True)
    return full


def _emit(text: str, fmt: str, out: str | None, console_view: Callable, best: "PlanEntry | None") -> None:
    """Print or write the result. With ``--out FILE`` stdout stays empty (in either format) and
    stderr gets one line: the path and the best layout; ``--out -`` writes the plan file to stdout."""
    if out and out != "-":
        write_atomic(out, text)
        click.echo(f"wrote {out}: {_one_line(best)}", err=True)
    elif out == "-":
        write_atomic(out, text)
    elif fmt == "json":
        click.echo(text, nl=False)
    else:
        console_view()


def _unrunnable(job: Any, layout: Any) -> tuple[str, ...]:
    """What ``launch`` would refuse of an evaluated layout under its runtime (``export_problems``): said
    now, as a warning, since ``evaluate`` costs any layout, runnable or not."""
    from planner.launch.export_problems import export_problems

    problems = export_problems(job.training.runtime, job.model, job.training, layout)
    if not problems:
        return ()
    return (f"{problems[0]}: the {job.training.runtime} job cannot run this layout as costed ('autoplan launch' "
            "refuses it)",)


def _warn(warnings: tuple[str, ...]) -> None:
    """Each warning as one line on stderr (stdout stays the table or the JSON)."""
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _one_line(best: "PlanEntry | None") -> str:
    from planner.plan.render import layout_summary

    if best is None:
        return "no layout fits"
    return f"{layout_summary(best.layout)} · step {best.predicted['step_time_s']:.3f} s"


def split_options(func: Callable) -> Callable:
    """``--layers-per-chunk`` (alias ``--layers-per-stage``) and Megatron's ``--first-stage-layers`` / ``--last-stage-layers``."""
    func = click.option("--last-stage-layers", type=click.IntRange(min=1), default=None,
                        help="Megatron's uneven form: layers on the last pipeline rank (all its virtual "
                             "stages).")(func)
    func = click.option("--first-stage-layers", type=click.IntRange(min=1), default=None,
                        help="Megatron's uneven form: layers on the first pipeline rank (all its virtual "
                             "stages); the middle ranks split the rest equally.")(func)
    return click.option("--layers-per-chunk", "--layers-per-stage", "layers_per_chunk", default=None,
                        metavar="N,N,...",
                        help="Layers on each of the pp x virtual-stages model chunks, in model order (chunk c "
                             "of pipeline rank i is chunk c*pp + i; with one chunk per rank, the layers per "
                             "stage), also as plan prints them (3,4x30,3: NxK is N layers on each of K chunks); "
                             "default: balanced (plan: refined). --layers-per-stage is the same option.")(func)


def _int_list(ctx: Any, param: Any, value: str | None) -> tuple[int, ...] | None:
    """``--tp 1,2,4`` -> (1, 2, 4); a non-integer is a ``BadParameter`` naming the option."""
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers such as 1,2,4, got {value!r}") from None


def _name_list(ctx: Any, param: Any, value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(","))


NARROWING_OPTIONS: list[Callable] = [
    click.option("--runtime-version", default=None,
                 help="Release of --runtime whose capability table is searched (costmodels/capabilities.py); "
                      "default its latest."),
    *(click.option(f"--{name}", key, default=None, metavar="N,N,...", callback=_int_list, help=text)
      for name, key, text in (
          ("tp", "tp", "Tensor-parallel degrees to search (default: all the runtime runs)."),
          ("pp", "pp", "Pipeline-parallel degrees to search."),
          ("cp", "cp", "Context-parallel degrees to search."),
          ("ep", "ep", "Expert-parallel degrees to search."),
          ("virtual-stages", "virtual_stages", "Model chunks per pipeline rank to search (pp > 1)."),
          ("micro-batch-sizes", "micro_batch_sizes", "Micro-batch sizes to search."),
          ("zero-stages", "zero_stages", "ZeRO stages to search (those the runtime runs)."),
          ("gpus-per-nvlink-domain", "gpus_per_nvlink_domain",
           "GPUs of each NVLink domain the ranks fill before the next (whole nodes, at most one domain: "
           "64 of a GB200 NVL72 rack's 72). Default: every domain filled, and on rack-scale hardware also "
           "equal segments (Megatron-Bridge's Slurm --segment rule)."))),
    click.option("--schedules", default=None, metavar="NAME,...", callback=_name_list,
                 help="Pipeline schedules to search (those the runtime runs)."),
    click.option("--recompute-modes", default=None, metavar="NAME,...", callback=_name_list,
                 help="Recomputation modes to search (those the runtime runs)."),
    click.option("--moe-dispatchers", default=None, metavar="NAME,...", callback=_name_list,
                 help="MoE token dispatchers to search: alltoall, deepep, hybridep (those the runtime and "
                      "hardware run; the flex backends only where an ep group spans NVLink domains)."),
    click.option("--no-offload", "no_offload", is_flag=True, help="Never offload optimizer states."),
]


def narrowing_options(func: Callable) -> Callable:
    for option in reversed(NARROWING_OPTIONS):
        func = option(func)
    return func


_NARROWING_KEYS = ("tp", "pp", "cp", "ep", "virtual_stages", "micro_batch_sizes", "zero_stages", "schedules",
                   "recompute_modes", "gpus_per_nvlink_domain", "moe_dispatchers")


def _narrowing_kwargs(kw: dict[str, Any], runtime: str) -> dict[str, Any]:
    """The narrowing options as ``planner.plan`` keywords, checked against ``runtime``'s table first
    so a refusal names the flag (``--tp``), not the API keyword."""
    from costmodels.capabilities import capabilities
    from planner.search.runtime_space import check_narrowing, check_narrowing_gpus, flag_name, narrowing_from

    out = {key: kw.pop(key) for key in _NARROWING_KEYS}
    out = {key: value for key, value in out.items() if value is not None}
    out["allow_offload"] = not kw.pop("no_offload")
    version = kw.pop("runtime_version")
    table = capabilities(runtime, version)
    narrowing = narrowing_from(out, flag_name)
    check_narrowing(table, narrowing, flag_name)
    check_narrowing_gpus(narrowing, kw["gpus"], flag_name)
    return {**out, "runtime_version": version}


@click.command("plan")
@job_options
@split_options
@narrowing_options
@click.option("--top", "top_k", type=click.IntRange(min=1), default=5, show_default=True,
              help="Alternatives to list (best layout of each next-best mesh).")
@click.option("--allow-cross-node-tp", is_flag=True, help="Let tensor parallel span nodes.")
@click.option("--launchable", is_flag=True, help="Deprecated: the same as --runtime torch.")
@click.option("--solver", type=click.Choice(["search", "brute-force"]), default="search", show_default=True,
              help="search: exact branch and bound; brute-force: evaluate every layout (slow, for checking).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write PNG and SVG figures (schedule, memory, candidates) into this directory.")
def plan_command(fmt: str, out: str | None, top_k: int, allow_cross_node_tp: bool, launchable: bool, solver: str,
                 plot_dir: str | None, layers_per_chunk: str | None, first_stage_layers: int | None,
                 last_stage_layers: int | None, **kw: Any) -> None:
    """Find the layout to run: among those that fit, the least risky one the model cannot tell
    from the fastest (within its measured tie band), with ranked alternatives.

    Exits 1 when no layout fits, printing the closest misses and what would make them fit.
    """
    def work() -> None:
        from planner import api

        check_places(out=out, plot_dir=plot_dir)

        from costmodels.stage_split import parse_layers

        split = parse_layers(layers_per_chunk) if layers_per_chunk is not None else ()
        if launchable:
            click.echo("warning: --launchable is deprecated; it means --runtime torch", err=True)
        runtime = kw["runtime"] or ("torch" if launchable else "megatron")
        narrowing = _narrowing_kwargs(kw, runtime)
        with search_notice(f"the layouts of {kw['model']} on {kw['gpus']} GPUs"):
            report = api.plan(top_k=top_k, solver=solver, allow_cross_node_tp=allow_cross_node_tp,
                              launchable=launchable, layers_per_chunk=split, first_stage_layers=first_stage_layers,
                              last_stage_layers=last_stage_layers, **narrowing, **_job_kwargs(kw))
        _warn(report.warnings)
        plan_file = report.to_plan_file()
        timed = report.to_plan_file(with_timing=True)
        _emit(plan_file.to_json(), fmt, out, lambda: _print(timed), plan_file.best)
        _plot(plan_file, plot_dir)
        if not report.feasible and report.search["space_size"] == 0:
            click.echo(f"error: {report.no_fit.reason}", err=True)
            sys.exit(EXIT_INFEASIBLE)
        if not report.feasible:
            miss = report.closest_misses[0] if report.closest_misses else None
            detail = (f"; closest needs {miss.needed_gib:.1f} GiB of {miss.available_gib:.1f} GiB; "
                      + "; ".join(miss.suggestions)) if miss else ""
            click.echo(f"error: no layout fits in memory{detail}", err=True)
            sys.exit(EXIT_INFEASIBLE)

    _run_job_command(work, kw)


@click.command("evaluate")
@job_options
@click.option("--dp", type=click.IntRange(min=1), required=True)
@click.option("--tp", type=click.IntRange(min=1), required=True)
@click.option("--pp", type=click.IntRange(min=1), required=True)
@click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--expert-tp", type=click.IntRange(min=0), default=0,
              help="Tensor-parallel degree of the routed experts (Megatron --expert-tensor-parallel-size; 0 = --tp).")
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True)
@click.option("--hsdp-shard", type=click.IntRange(min=0), default=0, help="HSDP shard-group size (0 = all dp).")
@click.option("--micro-batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--schedule", type=click.Choice(SCHEDULE_NAMES), default="1f1b", show_default=True,
              help="Pipeline schedule: zb-h1 / interleaved-zb / zb-v (zero bubble, Qi et al.), dualpipe-v and "
                   "dualpipe (DeepSeek-V3; dualpipe is costed, not launched). zb-v and dualpipe-v need "
                   "--virtual-stages 2, interleaved-zb 2 or more.")
@click.option("--virtual-stages", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--recompute", type=click.Choice(["none", "selective", "op-sac", "full"]), default="none",
              show_default=True, help="selective: the attention core (Megatron); op-sac: torchtitan's op-level "
              "selective checkpointing (every other matmul output and the attention output kept); full: whole blocks.")
@click.option("--recompute-layers", type=click.IntRange(min=0), default=0,
              help="With --recompute full: layers per stage to recompute (0 = all).")
@click.option("--sequence-parallel/--no-sequence-parallel", default=None,
              help="Megatron sequence parallelism (default: on when tp > 1).")
@click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=False, show_default=True,
              help="Overlap the sequence-parallel all-gathers and reduce-scatters with their GEMMs (Megatron "
                   "--tp-comm-overlap with Transformer Engine userbuffers; torchtitan async TP); needs tp > 1 "
                   "with sequence parallelism and GPUs. 'plan' searches it on GPUs.")
@click.option("--gpus-per-nvlink-domain", type=click.IntRange(min=0), default=0, show_default=True,
              help="GPUs of each NVLink domain the ranks fill before the next (whole nodes, at most one "
                   "domain: 64 of a GB200 NVL72 rack's 72); 0 = all of each.")
@click.option("--moe-dispatcher", type=click.Choice(MOE_DISPATCHER_NAMES), default="alltoall",
              show_default=True, help="MoE token exchange with ep > 1: one all-to-all, or Megatron-Core's flex "
              "dispatcher with DeepEP or HybridEP (a token crosses to each remote NVLink domain once).")
@click.option("--ep-comm-overlap/--no-ep-comm-overlap", default=False, show_default=True,
              help="Hide the EP all-to-alls behind the other micro-batch's compute in 1F1B (Megatron "
                   "--overlap-moe-expert-parallel-comm --delay-wgrad-compute); needs ep > 1, and pp 1 or the "
                   "interleaved schedule.")
@click.option("--offload", is_flag=True, help="Optimizer states in host memory.")
@click.option("--activation-offload-layers", type=click.IntRange(min=0), default=0,
              help="Layers whose saved activations go to host memory between forward and backward "
                   "(Megatron-Core cpu_offloading_num_layers; pp 1 only).")
@split_options
def evaluate_command(fmt: str, out: str | None, dp: int, tp: int, pp: int, cp: int, ep: int, expert_tp: int,
                     zero: int, hsdp_shard: int, micro_batch: int, schedule: str, virtual_stages: int, recompute: str,
                     recompute_layers: int, sequence_parallel: bool | None, tp_comm_overlap: bool,
                     gpus_per_nvlink_domain: int, moe_dispatcher: str, ep_comm_overlap: bool, offload: bool,
                     activation_offload_layers: int, layers_per_chunk: str | None, first_stage_layers: int | None, last_stage_layers: int | None,
                     **kw: Any) -> None:
    """Cost one explicit layout: memory per GPU, step time by term, traffic."""
    def work() -> None:
        from planner import api
        from planner.plan.bands import job_bands
        from planner.plan.report import PlanReport, plan_entry

        check_places(out=out)
        job_kwargs = _job_kwargs(kw)
        job = api.resolve_job(**job_kwargs)
        split = api.stage_split_option(job.model.num_layers, pp=pp, virtual_stages=virtual_stages,
                                       layers_per_chunk=layers_per_chunk, first=first_stage_layers,
                                       last=last_stage_layers)
        layout = api.layout_for_batch(kw["global_batch"], dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, expert_tp=expert_tp,
                                      zero_stage=zero,
                                      hsdp_shard_degree=hsdp_shard, micro_batch_size=micro_batch, schedule=schedule,
                                      virtual_stages=virtual_stages, recompute=recompute,
                                      recompute_num_layers=recompute_layers, sequence_parallel=sequence_parallel,
                                      tp_comm_overlap=tp_comm_overlap, optimizer_offload=offload, layers_per_chunk=split,
                                      activation_offload_layers=activation_offload_layers,
                                      gpus_per_nvlink_domain=gpus_per_nvlink_domain, moe_dispatcher=moe_dispatcher,
                                      ep_comm_overlap=ep_comm_overlap)
        breakdown = api.evaluate(layout=layout, **job_kwargs)
        bands = job_bands(job.profile, job.inputs.profile, job.training.runtime)
        _warn(job.warnings + _unrunnable(job, layout))
        report = PlanReport(inputs=job.inputs, best=breakdown, candidates=(), bands=bands,
                            search={"solver": "evaluate", "space_size": 1, "evaluated": 1}, warnings=job.warnings)
        single = plan_entry(breakdown, bands)
        if out:
            _emit(report.to_json(), fmt, out, lambda: None, single)
        elif fmt == "json":
            click.echo(json.dumps(single.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n", nl=False)
        else:
            print_plan_view(output_console(), single, job.inputs)

    _run_job_command(work, kw)


def print_plan_view(console: "Console", single: "PlanEntry", inputs: "PlanInputs | None" = None) -> None:
    from planner.plan.render import mismatch_line, print_plan

    foreign = inputs is not None and bool(inputs.profile_device_mismatch)
    if foreign:
        console.print(mismatch_line(inputs), style="yellow", highlight=False)
    print_plan(console, single, "layout", foreign_profile=foreign)


def _print(report: "PlanFile") -> None:
    from planner.plan.render import print_report

    print_report(output_console(), report)


def _plot(plan: "PlanFile", plot_dir: str | None) -> None:
    """``--plot DIR``: figures of the plan (planner.validate.plot), listed on stderr."""
    if plot_dir:
        from planner.validate.plot import plot_plan

        paths = plot_plan(plan, plot_dir)
        click.echo(f"wrote {len(paths)} figures to {plot_dir}", err=True)


@click.command("explain")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write PNG and SVG figures (schedule, memory, candidates) into this directory.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json prints the explanation as one JSON document on stdout.")
def explain_command(plan_file: str, plot_dir: str | None, fmt: str) -> None:
    """Explain a plan file: what binds the best plan, why the runner-up lost, and what would
    change the answer (the search re-run with 2x NIC bandwidth and 2x global batch)."""
    def work() -> None:
        from planner.explain import explain, explanation_lines
        from planner.plan.plan_file import read_plan_file

        check_places(plot_dir=plot_dir)
        plan = read_plan_file(plan_file)
        doc = explain(plan)
        if fmt == "json":
            click.echo(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))
        else:
            _print(plan)
            for line in explanation_lines(doc):
                click.echo(line)
        _plot(plan, plot_dir)

    run_command(work)
