"""The markdown summary of a ``gpu_step_trace.py`` record (no torch)."""

from __future__ import annotations


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _variants(row: dict) -> list[str]:
    predicted = 1e3 * (row["predicted"]["step_time_s"] or 0.0)
    lines = [f"predicted step {predicted:.1f} ms (optimizer term {1e3 * row['predicted']['time_s'].get('optimizer', 0):.1f} ms); "
             f"{row['num_param_tensors']} parameter tensors, {row['num_params'] / 1e6:.0f} M parameters; "
             f"job optimizer {row['optimizer_defaults']}", "",
             "| variant | median step ms | vs job |", "|---|---:|---:|"]
    base = row["step_ms"].get("job", {}).get("median", 0.0)
    for kind, t in row["step_ms"].items():
        if "median" not in t:
            lines.append(f"| {kind} | {t.get('error', 'error')[:60]} | |")
            continue
        lines.append(f"| {kind} | {t['median']:.1f} | {t['median'] - base:+.1f} |")
    return lines


def _trace(kind: str, t: dict) -> list[str]:
    lines = ["", f"trace `{kind}`: wall {_ms(t['wall_ms_per_step'])} ms/step, device busy "
             f"{_ms(t['device_busy_ms_per_step'])} ms, idle {_ms(t['device_idle_ms_per_step'])} ms, "
             f"{t['num_kernels_per_step']:.0f} kernels/step; idle gaps > 1 ms: {t['gaps']['count']} "
             f"({_ms(t['gaps']['total_ms'])} ms); SDPA {t['sdpa_backends']}", "",
             "| phase | host ms | device busy ms | device idle ms |", "|---|---:|---:|---:|"]
    for name, p in t["phases"].items():
        lines.append(f"| {name} | {_ms(p['host_ms'])} | {_ms(p['device_busy_ms'])} | {_ms(p['device_idle_ms'])} |")
    if t["gaps"]["largest"]:
        lines += ["", "largest gaps: " + "; ".join(f"{g['ms']:.1f} ms in {g['phase']} ({g['cpu_op']})"
                                                   for g in t["gaps"]["largest"][:5])]
    lines += ["", "top kernels: " + "; ".join(f"{k['name'][:60]} {k['ms_per_step']:.1f} ms x{k['calls_per_step']:.0f}"
                                             for k in t["top_kernels"][:6])]
    lines += ["", "top CPU ops (self): " + "; ".join(f"{k['name'][:50]} {k['ms_per_step']:.1f} ms x{k['calls_per_step']:.0f}"
                                                    for k in t["top_cpu_ops"][:6])]
    return lines


def markdown(record: dict) -> str:
    s = record["settings"]
    lines = [f"# Step trace: {record['device_name']} ({record['hardware']}, {record['precision']})", "",
             f"- torch {s['torch_version']}, CUDA {s['cuda_version']}; TF32 matmul {s['matmul_allow_tf32']}, "
             f"cuDNN {s['cudnn_allow_tf32']}, float32 matmul precision {s['float32_matmul_precision']}; "
             f"SDPA enabled {s['sdpa_enabled']}",
             f"- command: `{record['command']}`; wall {record['wall_s']:.0f} s"]
    for row in record["layouts"]:
        lines += ["", f"## {row['name']}", ""] + _variants(row)
        for kind, t in row["traces"].items():
            lines += _trace(kind, t)
    return "\n".join(lines) + "\n"
