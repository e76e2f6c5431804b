"""``autoplan models`` and ``autoplan hardware``: the presets as a table, TSV or JSON.

Columns: heads = query/key-value heads, ctx = max positions of the released config, moe =
experts x top-k; TF = peak dense TFLOP/s, GPUs = per node, net = NIC bandwidth per node.

Names are never cut: the name column does not wrap and the other columns fold first, at any
terminal width and in a pipe (which rich treats as 80 columns)."""

from __future__ import annotations

import json
from typing import Any

import click

from .common import output_console

FORMAT = click.option("--format", "fmt", type=click.Choice(["table", "tsv", "json"]), default="table",
                      show_default=True, help="tsv: one header line, tab-separated, for scripts; json: one document.")


def count_text(n: int) -> str:
    """A parameter count at a readable scale: ``6.3M``, ``6.74B``, ``405B``, ``12.5K``."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)


def _print_rows(fmt: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    if fmt == "tsv":
        for row in (header, *rows):
            click.echo("\t".join(row))
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold", padding=(0, 1), collapse_padding=True)
    for i, col in enumerate(header):
        if i == 0:
            table.add_column(col, no_wrap=True, min_width=max(len(r[0]) for r in rows))
        else:
            table.add_column(col, justify="right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    output_console().print(table)


@click.command("models")
@FORMAT
def models_command(fmt: str) -> None:
    """List the model presets with their parameter counts."""
    from costmodels.model_spec import model_to_dict
    from costmodels.params import active_params, total_params
    from costmodels.presets import PRESETS

    if fmt == "json":
        data = {name: {**model_to_dict(m), "params": total_params(m), "active_params": active_params(m)}
                for name, m in PRESETS.items()}
        click.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))
        return
    header = ("name", "params", "active", "layers", "hidden", "heads", "ffn", "vocab", "ctx", "moe")
    rows = [(name, count_text(total_params(m)), count_text(active_params(m)), str(m.num_layers),
             str(m.hidden_size), f"{m.num_attention_heads}/{m.num_kv_heads}", str(m.ffn_hidden_size),
             str(m.vocab_size), str(m.max_position_embeddings),
             f"{m.moe.num_experts}x{m.moe.top_k}" if m.moe else "-")
            for name, m in PRESETS.items()]
    _print_rows(fmt, header, rows)


def _hardware_rows() -> dict[str, dict[str, Any]]:
    from hardware_specs import list_hardware, load_node
    from hardware_specs.units import GB, GIB, TERA

    nodes = {name: load_node(name) for name in list_hardware()}
    return {name: {"display_name": n.hardware.display_name, "device_type": n.hardware.device_type,
                   "tflops": {k: v / TERA for k, v in sorted(n.hardware.peak_flops_per_s.items())},
                   "memory_gib": n.hardware.memory_bytes / GIB,
                   "memory_bandwidth_gb_per_s": n.hardware.memory_bandwidth_bytes_per_s / GB,
                   "gpus_per_node": n.gpus_per_node, "nvlink_domain_gpus": n.nvlink_domain_gpus,
                   "intra_node": n.intra_node.kind,
                   "intra_node_gb_per_s": n.intra_node.bandwidth_bytes_per_s / GB,
                   "inter_node_gb_per_s_per_node": n.inter_node.node_bandwidth_bytes_per_s / GB,
                   "host_memory_gib": n.host_memory_bytes / GIB}
            for name, n in nodes.items()}


def _rate_cell(tflops: dict[str, float], dtype: str) -> str:
    """A dense peak in TFLOP/s, or ``-`` where the part has no ``dtype`` rate: the rates ``plan``
    costs with (``HardwareSpec.supports``), so a V100 lists no bf16 and plan asks for fp16."""
    return f"{tflops[dtype]:g}" if dtype in tflops else "-"


def _gpus_cell(row: dict[str, Any]) -> str:
    """GPUs per node, and per NVLink domain where that holds several nodes (``4/72`` on GB200 NVL72)."""
    per_node, domain = row["gpus_per_node"], row["nvlink_domain_gpus"]
    return str(per_node) if domain == per_node else f"{per_node}/{domain}"


@click.command("hardware")
@FORMAT
def hardware_command(fmt: str) -> None:
    """List the hardware presets (datasheet figures, each with a source in its TOML)."""
    rows = _hardware_rows()
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, sort_keys=True, allow_nan=False))
        return
    header = ("name", "bf16 TF", "fp16 TF", "fp8 TF", "nvfp4 TF", "mem GiB", "HBM GB/s", "GPUs", "intra-node GB/s", "net GB/s")
    table = []
    for name, r in rows.items():
        t = r["tflops"]
        table.append((name, *(_rate_cell(t, dtype) for dtype in ("bf16", "fp16", "fp8", "nvfp4")),
                      f"{r['memory_gib']:g}", f"{r['memory_bandwidth_gb_per_s']:g}", _gpus_cell(r),
                      f"{r['intra_node']} {r['intra_node_gb_per_s']:g}", f"{r['inter_node_gb_per_s_per_node']:g}"))
    _print_rows(fmt, header, table)
