"""The kept GPU truth records (``benchmarks/data/gpu/*.json``, written by ``gpu_truth.py``): their
errors, next to the published-run table, and as rows of their own family for the fits.

Run: ``.venv/bin/python benchmarks/gpu_records.py [--dir DIR] [--no-published]``.

``record_rows`` turns a record into rows of the published-runs schema (``benchmarks/data/
published_runs.json``), one per measured layout, family ``gpu_truth``, so that
``planner.published.score`` / ``cross_validate_by_family`` and ``benchmarks/calibrate.py`` can
read them like any other family. Each row carries its provenance (record file, command, date,
device) and the exact model spec the job trained (``extra.model_spec``, which
``planner.published.shapes.model_spec_for`` prefers to a shape lookup). Measured: step time =
``throughput.iteration_time_s`` (median of the timed steps), peak memory =
``torch.cuda.max_memory_reserved`` in GiB (``memory.peak_mem_gb``; it leaves out the CUDA
context, which the model's peak counts as ``runtime_reserved_gib``: ``extra.memory_basis``);
the probe's components are in ``extra.measured_components_bytes``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

GIB = 2**30
GPU_DIR = Path(__file__).parent / "data" / "gpu"
FAMILY = "gpu_truth"
KIND = "autoplan gpu truth"


def load_records(directory: Path = GPU_DIR) -> list[tuple[Path, dict]]:
    """(path, record) of every GPU truth record in ``directory`` (other JSON files are left alone)."""
    out = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and raw.get("kind") == KIND and raw.get("schema_version") == 1:
            out.append((path, raw))
    return out


def fit_rows(published: Path, directory: Path = GPU_DIR) -> list[dict]:
    """The rows the fits read: the published runs in ``published`` and, as the ``gpu_truth``
    family, every kept GPU record's measured layouts (``record_rows``)."""
    from planner.published import load_rows

    return load_rows(published) + [row for path, record in load_records(directory)
                                   for row in record_rows(record, path)]


def record_rows(record: dict, path: Path) -> list[dict]:
    """One published-schema row per measured layout of ``record`` (see the module docstring)."""
    device, day = record["device"], record["created"][:10]
    rows = []
    for layout in record["layouts"]:
        if layout["status"] != "measured" or "model_spec" not in layout:
            continue
        rows.append(_row(layout, device, day, record, path))
    return rows


def _row(layout: dict, device: dict, day: str, record: dict, path: Path) -> dict:
    spec, m = layout["model_spec"], layout["measured"]
    mb, seq = layout["micro_batch_size"], layout["seq_len"]
    reserved = m.get("max_memory_reserved_bytes")
    return {
        "id": f"gpu-{device['hardware_preset']}-{day}-{layout['name']}", "source_family": FAMILY, "status": "ok",
        "name": f"{layout['name']} on 1 {device['name']}", "framework": "autoplan launch (PyTorch, one process)",
        "num_gpus": 1, "derived": [], "precision": layout["precision"],
        "hardware": {"gpu": device["name"], "gpus_per_node": 1, "gpu_memory_gb": None, "cluster": record.get("host"),
                     "inter_node": None, "intra_node": None},
        "model": {"name": layout["model"], "layers": spec["num_layers"], "hidden": spec["hidden_size"],
                  "heads": spec["num_attention_heads"], "kv_heads": spec.get("num_kv_heads"),
                  "ffn_hidden": spec.get("ffn_hidden_size"), "vocab": spec["vocab_size"], "seq_len": seq,
                  "moe_experts": None, "moe_shared_experts": None, "moe_top_k": None, "params_b": None,
                  "active_params_b": None},
        "parallel": {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": None, "vpp": 1, "fsdp": False, "zero_stage": 0,
                     "global_batch_size": mb, "global_batch_tokens": None, "grad_accum": 1, "micro_batch_size": mb,
                     "model_parallel_size": 1, "pp_schedule": None, "recompute": layout["recompute"],
                     "sequence_parallel": False},
        "throughput": {"iteration_time_s": m["step_time_s"], "tokens_per_sec_per_gpu": m["tokens_per_s"]},
        "memory": {"peak_mem_gb": None if reserved is None else reserved / GIB},
        "source": {"citation": "autoplan benchmarks/gpu_truth.py", "location": str(path),
                   "command": layout["commands"].get("measure"), "date": record["created"], "url": None,
                   "repo_commit": record["software"].get("autoplan_commit"), "secondary": []},
        "extra": {"model_spec": spec, "measured_components_bytes": m["components_bytes"],
                  "max_memory_allocated_bytes": m.get("max_memory_allocated_bytes"),
                  "memory_basis": "torch.cuda.max_memory_reserved (no CUDA context); None on CPU",
                  "record_errors": layout["errors"]},
    }


def error_lines(records: list[tuple[Path, dict]]) -> list[str]:
    """One line per record: device, date, measured count, median errors of each prediction source."""
    if not records:
        return [f"no GPU truth records in {GPU_DIR} (run benchmarks/gpu_truth.py on a GPU and keep its JSON there)"]
    lines = []
    for path, record in records:
        s = record["summary"]
        lines.append(f"{path.name}: {record['device']['name']} ({record['device']['hardware_preset']}), "
                     f"{s['num_measured']}/{s['num_layouts']} measured")
        for source, table in s["errors"].items():
            parts = [f"{k} {v['signed_median']:+.0%} (|{v['abs_median']:.0%}|, n={v['n']})"
                     for k, v in sorted(table.items()) if v["n"]]
            lines.append(f"  {source:9}: " + ("; ".join(parts) or "nothing measured"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=GPU_DIR, help="where the records are [%(default)s]")
    parser.add_argument("--no-published", action="store_true", help="only the GPU records, not the published table")
    args = parser.parse_args(argv)
    records = load_records(args.dir)
    print("GPU truth records (median predicted / measured - 1):")
    for line in error_lines(records):
        print(line)
    if args.no_published:
        return 0
    from published import DATA, print_table

    from planner.published import score

    rows = fit_rows(DATA, args.dir)
    print("\nPublished runs" + (f" and the {FAMILY} family:" if records else ":"))
    print_table(score(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
