"""``autoplan trace`` and ``autoplan shard``: Alpa-style intra-operator search on PyTorch graphs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from hardware_specs.checks import MAX_SEQ_LEN, MAX_SOLVER_TIME_S, MAX_TOKENS_PER_STEP
from autoplan_base.errors import AutoplanError

from .common import FiniteFloat, check_places, run_command, write_atomic

if TYPE_CHECKING:
    from planner.plan.plan_file import PlanFile


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8,2048"`` -> (8, 2048)."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if not 1 <= len(shape) <= 2 or any(s < 1 for s in shape):
        raise AutoplanError(f"--input-shape {json.dumps(text)}: expected one or two positive integers like "
                            "8,2048 (batch,seq)")
    if max(shape) > MAX_SEQ_LEN or math.prod(shape) > MAX_TOKENS_PER_STEP:
        raise AutoplanError(f"--input-shape {json.dumps(text)}: at most {MAX_SEQ_LEN} per dimension and 2^40 "
                            "tokens in all")
    return shape


def _module(module_path: str | None, model: str | None, input_shape: str | None, dtype: str):
    """(module on the meta device, token shape, name) from a factory path or a preset built by the project's model."""
    from planner.alpa import trace

    if model is not None:
        from costmodels.presets import load_model
        from planner.launch.torchjob.model import build_model

        spec = load_model(model)
        shape = parse_shape(input_shape) if input_shape else (1, min(2048, spec.max_position_embeddings))
        return build_model(spec, device="meta", dtype=trace.DTYPES[dtype]), shape, f"--model {model}"
    if input_shape is None:
        raise AutoplanError("--input-shape is required with --module (e.g. --input-shape 8,2048)")
    shape = parse_shape(input_shape)
    return trace.build_from_factory(module_path, dtype), shape, f"--module {module_path}"


def _traced(module_path: str | None, model: str | None, input_shape: str | None, dtype: str):
    """The operator graph of a factory's module or of a preset."""
    from planner.alpa import trace

    module, shape, name = _module(module_path, model, input_shape, dtype)
    return trace.trace_module(module, trace.token_inputs(shape), name=name)


@click.command("trace")
@click.option("--module", "module_path", required=True, help="pkg.mod:factory returning an nn.Module.")
@click.option("--input-shape", required=True, help="Token ids shape, e.g. 8,2048 (batch,seq).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True), default="-", show_default=True,
              help="Graph JSON file ('-' for stdout).")
def trace_command(module_path: str, input_shape: str, dtype: str, out: str) -> None:
    """Trace a module on the meta device into an operator graph (shapes, FLOPs, params, blocks)."""

    def work() -> None:
        from planner.alpa.graph import find_blocks, to_json

        check_places(out=out)
        graph = _traced(module_path, None, input_shape, dtype)
        write_atomic(out, to_json(graph, find_blocks(graph)))

    run_command(work)


def _print_table(report: dict, seconds: float) -> None:
    blocks = report["blocks"]
    first = blocks["first"] if blocks else None
    prefix = first.rsplit(".", 1)[0] + "." if first and "." in first else None
    shown = {k: v for k, v in report["tp_plan"].items()
             if prefix is None or not k.startswith(prefix) or k.startswith(first + ".")}
    width = max((len(k) for k in shown), default=10)
    click.echo(f"tensor-parallel plan (mesh {report['mesh']})")
    for fqn, style in shown.items():
        click.echo(f"  {fqn:<{width}}  {style}")
    if len(shown) < len(report["tp_plan"]):
        click.echo(f"  (the other {blocks['members'] - 1} blocks under {prefix}* repeat {first}; --format json lists all)")
    if report["collectives_per_block"] is not None:
        click.echo(f"collectives per block ({report['blocks']['members']} blocks):")
        for direction, counts in report["collectives_per_block"].items():
            click.echo(f"  {direction:<8} " + (", ".join(f"{k} x{v}" for k, v in counts.items()) or "none"))
    cost = report["cost"]
    click.echo(f"cost per step: {cost['objective_s'] * 1e3:.3f} ms (compute {cost['compute_s'] * 1e3:.3f}, "
               f"gradient sync {cost['gradient_sync_s'] * 1e3:.3f}, resharding {cost['resharding_s'] * 1e3:.3f}); "
               f"memory {cost['memory_gib_per_device']:.2f} GiB/device")
    s = report["solver"]
    gap = "n/a" if s["gap"] is None else f"{s['gap']:.2g}"
    click.echo(f"solver: {s['name']} {s['status']} in {seconds:.2f} s, {s['variables']} variables, "
               f"{s['constraints']} constraints, gap {gap}")
    for issue in report["unexpressible"]:
        click.echo(f"warning: {issue}")


PRECISION_DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "bf16", "mxfp8": "bf16", "nvfp4": "bf16"}
"""ILP dtype for a plan's training precision (fp8/MXFP8/NVFP4 GEMMs are costed at the bf16 rate here)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Target:
    """The plan file ``--attach`` names, read and checked before tracing and solving."""

    path: str
    plan: "PlanFile"
    dp: int
    input_shape: str


def _attach_target(path: str, out: str | None, *, tp: int, dp: int | None, model: str | None,
                   module_path: str | None) -> _Target:
    from costmodels.model_spec import model_to_dict
    from costmodels.presets import load_model

    from planner.alpa.attach import check_degrees, check_target, read_target

    if not out or out == "-":
        raise AutoplanError("--attach needs --out NEW_PLAN.json, the plan file to write (not '-')")
    plan, layout = read_target(path)
    dp_used = check_degrees(path, layout, tp=tp, dp=dp)
    model_dict = json.loads(json.dumps(model_to_dict(load_model(model)))) if model else None
    check_target(path, plan, layout, module=module_path, model_dict=model_dict)
    seq_len = plan.inputs.training.seq_len
    return _Target(path=path, plan=plan, dp=dp_used, input_shape=f"{layout.micro_batch_size},{seq_len}")


def _attach_write(target: _Target, report: dict, out: str, module_path: str | None, shape) -> None:
    from planner.alpa.attach import attached

    if report["unexpressible"]:
        raise AutoplanError(f"--attach: {len(report['unexpressible'])} layout change(s) of the ILP plan cannot be "
                            f"written as a module-level plan ({report['unexpressible'][0]}); try another --tp")
    new = attached(target.plan, report["tp_plan"], module=module_path, input_shape=shape if module_path else None)
    write_atomic(out, new.to_json())


def _check_contract(module, tp: int) -> None:
    from planner.launch.torchjob.user_model import contract_problems

    problems = contract_problems(module, splits_params=tp > 1)
    if problems:
        raise AutoplanError(f"--module: {problems[0]} (the job could not train it)")


@click.command("shard")
@click.option("--model", default=None, help="Preset (built by autoplan's own model, the one launch trains).")
@click.option("--module", "module_path", default=None, help="pkg.mod:factory returning an nn.Module.")
@click.option("--input-shape", default=None,
              help="Token ids shape B,S (default 1,2048 with --model; micro-batch,seq-len of the plan with --attach).")
@click.option("--tp", type=click.IntRange(min=1), required=True, help="Tensor-parallel degree.")
@click.option("--dp", type=click.IntRange(min=1), default=None, help="Data-parallel degree [default: 1, or the plan's].")
@click.option("--hardware", default=None, help="Hardware preset or TOML path [default: h100-sxm-80gb, or the plan's].")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default=None,
              help="Compute dtype of the costs [default: bf16, or the plan's precision].")
@click.option("--memory-fraction", type=FiniteFloat(min=0, max=1, min_open=True), default=0.9, show_default=True)
@click.option("--solver", type=click.Choice(["highs", "cbc"]), default="highs", show_default=True)
@click.option("--time-limit", type=FiniteFloat(min=0, max=MAX_SOLVER_TIME_S, min_open=True), default=60.0, show_default=True,
              help="Solver time limit (s); the best plan found so far is returned with its gap.")
@click.option("--no-reuse", is_flag=True, help="Solve every block separately (no per-block reuse).")
@click.option("--attach", "attach_path", type=click.Path(dir_okay=False), default=None,
              help="Plan file (autoplan plan/evaluate --out) to add this tp_plan to; --out names the new plan file.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Also write the JSON here (with --attach: the new plan file).")
def shard_command(model, module_path, input_shape, tp, dp, hardware, gpus_per_node, dtype, memory_fraction,
                  solver, time_limit, no_reuse, attach_path, fmt, out) -> None:
    """Choose per-operator sharding by Alpa's ILP and print it as a PyTorch tensor-parallel plan.

    \b
    With --attach PLAN --out NEW, also write NEW: the plan file PLAN with best.tp_plan set (and,
    with --module, inputs.module and inputs.input_shape), ready for 'autoplan launch NEW'."""

    def work() -> None:
        from planner.alpa import trace
        from planner.alpa.shard import shard_graph

        if (model is None) == (module_path is None):
            raise AutoplanError("give exactly one of --model PRESET or --module pkg.mod:factory")
        check_places(out=out)
        target = _attach_target(attach_path, out, tp=tp, dp=dp, model=model, module_path=module_path) \
            if attach_path else None
        inputs = target.plan.inputs if target else None
        cost_dtype = dtype or PRECISION_DTYPES.get(inputs.training.precision if inputs else None, "bf16")
        module, shape, name = _module(module_path, model, input_shape or (target and target.input_shape), cost_dtype)
        if target and module_path:
            _check_contract(module, tp)
        graph = trace.trace_module(module, trace.token_inputs(shape), name=name)
        result = shard_graph(graph, tp=tp, dp=target.dp if target else dp or 1,
                             hardware=hardware or (inputs.hardware if inputs else "h100-sxm-80gb"), dtype=cost_dtype,
                             gpus_per_node=gpus_per_node or (inputs.gpus_per_node if inputs else None),
                             memory_fraction=memory_fraction, reuse_blocks=not no_reuse, solver=solver,
                             time_limit_s=time_limit)
        report = result.report.to_dict()
        text = json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + "\n"
        if target:
            _attach_write(target, report, out, module_path, shape)
        elif out:
            write_atomic(out, text)  # "-" is stdout: the one JSON document printed
        if out == "-":
            pass
        elif fmt == "json":
            click.echo(text, nl=False)
        else:
            _print_table(report, result.solution.seconds)
        if target and fmt == "table":
            click.echo(f"wrote {out}: {target.path} with best.tp_plan ({len(report['tp_plan'])} modules); "
                       f"run: autoplan launch {out} --out DIR")

    run_command(work)
