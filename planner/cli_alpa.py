"""``autoplan trace`` and ``autoplan shard``: Alpa-style intra-operator search on PyTorch graphs."""

from __future__ import annotations

import json

import click

from hardware_specs.errors import AutoplanError

from .cli_common import run_command, write_atomic


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8,2048"`` -> (8, 2048)."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(s < 1 for s in shape):
        raise AutoplanError(f"--input-shape {text!r}: expected positive integers like 8,2048 (batch,seq)")
    return shape


def _traced(module_path: str | None, model: str | None, input_shape: str | None, dtype: str):
    """(graph, name) from a factory path or a preset built by the project's own model."""
    from .alpa import trace

    if model is not None:
        from costmodels.presets import load_model
        from .runtime.model import build_model

        spec = load_model(model)
        shape = parse_shape(input_shape) if input_shape else (1, min(2048, spec.max_position_embeddings))
        module = build_model(spec, device="meta", dtype=trace.DTYPES[dtype])
        return trace.trace_module(module, trace.token_inputs(shape), name=f"--model {model}")
    if input_shape is None:
        raise AutoplanError("--input-shape is required with --module (e.g. --input-shape 8,2048)")
    module = trace.build_from_factory(module_path, dtype)
    return trace.trace_module(module, trace.token_inputs(parse_shape(input_shape)), name=f"--module {module_path}")


@click.command("trace")
@click.option("--module", "module_path", required=True, help="pkg.mod:factory returning an nn.Module.")
@click.option("--input-shape", required=True, help="Token ids shape, e.g. 8,2048 (batch,seq).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True), default="-", show_default=True,
              help="Graph JSON file ('-' for stdout).")
def trace_command(module_path: str, input_shape: str, dtype: str, out: str) -> None:
    """Trace a module on the meta device into an operator graph (shapes, FLOPs, params, blocks)."""

    def work() -> None:
        from .alpa.graph import find_blocks, to_json

        graph = _traced(module_path, None, input_shape, dtype)
        write_atomic(out, to_json(graph, find_blocks(graph)))

    run_command(work)


def _print_table(report: dict) -> None:
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
    click.echo(f"solver: {s['name']} {s['status']} in {s['seconds']:.2f} s, {s['variables']} variables, "
               f"{s['constraints']} constraints, gap {gap}")
    for issue in report["unexpressible"]:
        click.echo(f"warning: {issue}")


@click.command("shard")
@click.option("--model", default=None, help="Preset (built by autoplan's own model, the one launch trains).")
@click.option("--module", "module_path", default=None, help="pkg.mod:factory returning an nn.Module.")
@click.option("--input-shape", default=None, help="Token ids shape B,S (default 1,2048 with --model).")
@click.option("--tp", type=click.IntRange(min=1), required=True, help="Tensor-parallel degree.")
@click.option("--dp", type=click.IntRange(min=1), default=1, show_default=True, help="Data-parallel degree.")
@click.option("--hardware", default="h100-sxm-80gb", show_default=True, help="Hardware preset or TOML path.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--memory-fraction", type=click.FloatRange(min=0, max=1, min_open=True), default=0.9, show_default=True)
@click.option("--solver", type=click.Choice(["highs", "cbc"]), default="highs", show_default=True)
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Solver time limit (s); the best plan found so far is returned with its gap.")
@click.option("--no-reuse", is_flag=True, help="Solve every block separately (no per-block reuse).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True), default=None, help="Also write the JSON here.")
def shard_command(model, module_path, input_shape, tp, dp, hardware, gpus_per_node, dtype, memory_fraction,
                  solver, time_limit, no_reuse, fmt, out) -> None:
    """Choose per-operator sharding by Alpa's ILP and print it as a PyTorch tensor-parallel plan."""

    def work() -> None:
        from .alpa.shard import shard_graph

        if (model is None) == (module_path is None):
            raise AutoplanError("give exactly one of --model PRESET or --module pkg.mod:factory")
        graph = _traced(module_path, model, input_shape, dtype)
        result = shard_graph(graph, tp=tp, dp=dp, hardware=hardware, dtype=dtype, gpus_per_node=gpus_per_node,
                             memory_fraction=memory_fraction, reuse_blocks=not no_reuse, solver=solver,
                             time_limit_s=time_limit)
        report = result.report.to_dict()
        text = json.dumps(report, indent=1, sort_keys=True) + "\n"
        if out:
            write_atomic(out, text)
        if fmt == "json":
            click.echo(text, nl=False)
        else:
            _print_table(report)

    run_command(work)
