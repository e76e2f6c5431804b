"""What a device spends on a transformer layer, kernel by kernel, with the host's share apart.

    python benchmarks/gpu_layer_truth.py --device cuda --out-dir OUT    # on a lent GPU, about 5 minutes
    python benchmarks/gpu_layer_truth.py --device cpu --quick --out-dir /tmp/lt   # toy shapes, seconds

For each shape of ``planner.published.device_records.LAYER_SHAPES`` (a Llama layer as one
tensor-parallel rank holds it) at sequence 4096 and 8192, micro-batch 1, in bf16:
- each weight GEMM's forward, input-gradient and weight-gradient GEMM timed alone, twice: with CUDA
  events around each call (what a script sees: the host's dispatch time included) and as the sum of
  the kernels' own durations under the profiler (the device's time alone), so the host's share of
  an isolated call is measured, not fitted (``planner.published.device_kernels`` had to fit it);
- causal SDPA forward and forward + backward per backend (default, flash, cuDNN), likewise;
- autoplan's own torch-runtime layer (``planner.launch.torchjob.model.TransformerBlock``, the layer
  ``--runtime torch`` costs) forward + backward, four stacked, eager and under ``torch.compile``;
- and two sustained loads for ``--sustained-s`` seconds each, one sample a second with the SM clock
  and power (nvidia-smi): an 8192^3 GEMM loop (against a short burst of the same GEMM: the part's
  ``sustained_rate_share``) and the first shape's four stacked layers, forward + backward.
The record keeps ``layer_truth``'s fields (``kernel_floor_ms``, ``eager_layer_ms``,
``compiled_layer_ms``, ``square_8192_tflops``) so ``device_records`` reads it, and adds the kernel
times. Written atomically to ``OUT/layer_truth-<device>-<date>.json`` (and ``sustained-...``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GEMM_REPEATS, LAYER_STACK, QUICK_SHAPE = 10, 4, "quick"


def _torch():
    import torch

    return torch


def timed_ms(fn: Callable[[], Any], device: str, repeats: int = GEMM_REPEATS) -> dict[str, float]:
    """Median ms per call by CUDA events (host dispatch included) and, on a GPU, the mean sum of the
    kernels' own durations per call under the profiler (the device's time alone)."""
    torch = _torch()
    for _ in range(3):
        fn()
    if device != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return {"event_ms": statistics.median(times)}
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages())
    return {"event_ms": statistics.median(times), "kernel_ms": kernel_us / 1e3 / repeats}


def gemm_row(tokens: int, k: int, n: int, device: str, dtype: Any) -> dict[str, Any]:
    """Forward (X W^T, as F.linear), input gradient (dY W) and weight gradient (dY^T X), each alone."""
    torch = _torch()
    x = torch.randn(tokens, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) * 0.02
    dy = torch.randn(tokens, n, device=device, dtype=dtype)
    out = {"m": tokens, "n": n, "k": k}
    for name, fn in (("fwd", lambda: torch.nn.functional.linear(x, w)), ("dgrad", lambda: dy @ w),
                     ("wgrad", lambda: dy.t() @ x)):
        for key, value in timed_ms(fn, device).items():
            out[f"{name}_{key}"] = value
    out["fwd_ms"] = out["fwd_event_ms"]
    out["fwdbwd_ms"] = out["fwd_event_ms"] + out["dgrad_event_ms"] + out["wgrad_event_ms"]
    return out


def attention_row(heads: int, kv_heads: int, head_dim: int, seq: int, device: str, dtype: Any) -> dict[str, Any]:
    """Causal SDPA forward and forward + backward per backend that runs the shape."""
    torch = _torch()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, kv_heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, kv_heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype)
    backends = {"default": None}
    if device == "cuda":
        backends |= {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    out: dict[str, Any] = {}
    for name, backend in backends.items():
        def forward():
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
        try:
            fwd = timed_ms(forward, device)
            both = timed_ms(lambda: forward().backward(grad), device)
        except RuntimeError as err:
            out[name] = {"err": str(err)[:160]}
            continue
        out[name] = {"fwd_ms": fwd["event_ms"], "fwdbwd_ms": both["event_ms"],
                     **({"fwd_kernel_ms": fwd["kernel_ms"], "fwdbwd_kernel_ms": both["kernel_ms"]}
                        if "kernel_ms" in fwd else {})}
    return out


def layer_ms(spec: Any, seq: int, device: str, dtype: Any, *, compiled: bool) -> dict[str, float]:
    """autoplan's torch-runtime layer, ``LAYER_STACK`` stacked, forward + backward, per layer."""
    torch = _torch()
    from planner.launch.torchjob.model import TransformerBlock

    blocks = torch.nn.ModuleList([TransformerBlock(spec, i) for i in range(LAYER_STACK)]).to(device=device, dtype=dtype)
    run = [torch.compile(b) if compiled else b for b in blocks]
    x0 = torch.randn(1, seq, spec.hidden_size, device=device, dtype=dtype, requires_grad=True)

    def step():
        x = x0
        for block in run:
            x = block(x)
        x.float().pow(2).mean().backward()

    timed = timed_ms(step, device, repeats=5)
    return {k: v / LAYER_STACK for k, v in timed.items()}


def shape_spec(name: str, shape: Any, seq: int) -> Any:
    from costmodels.model_spec import ModelSpec

    return ModelSpec(name=name, num_layers=LAYER_STACK, hidden_size=shape.hidden, ffn_hidden_size=shape.ffn,
                     num_attention_heads=shape.q_heads, num_kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                     vocab_size=1024, gated_mlp=True, activation="silu", norm="rmsnorm", positions="rotary",
                     max_position_embeddings=seq)


def shapes(quick: bool) -> list[tuple[str, Any, int]]:
    from planner.published.device_records import LAYER_SHAPES, LayerShape

    if quick:
        return [(QUICK_SHAPE, LayerShape(hidden=256, q_heads=4, kv_heads=2, head_dim=64, ffn=512), 256)]
    return [(name, shape, seq) for name, shape in LAYER_SHAPES.items() for seq in (8192, 4096)]


def measure_shape(name: str, shape: Any, seq: int, device: str, dtype: Any) -> dict[str, Any]:
    gemms = {g: gemm_row(seq, gemm.k, gemm.n, device, dtype) for g, gemm in shape.gemms(seq).items()}
    attn = attention_row(shape.q_heads, shape.kv_heads, shape.head_dim, seq, device, dtype)
    spec = shape_spec(name, shape, seq)
    eager = layer_ms(spec, seq, device, dtype, compiled=False)
    row = {"shape": name, "seq": seq, "mb": 1, "gemm": gemms, "attn": attn,
           "eager_layer_ms": eager["event_ms"], "eager_layer_kernel_ms": eager.get("kernel_ms")}
    best_attention = min(a["fwdbwd_ms"] for a in attn.values() if "fwdbwd_ms" in a)
    row["kernel_floor_ms"] = sum(g["fwdbwd_ms"] for g in gemms.values()) + best_attention
    if device == "cuda":
        kernels = [a["fwdbwd_kernel_ms"] for a in attn.values() if "fwdbwd_kernel_ms" in a]
        row["kernel_floor_device_ms"] = sum(g["fwd_kernel_ms"] + g["dgrad_kernel_ms"] + g["wgrad_kernel_ms"]
                                            for g in gemms.values()) + min(kernels)
        try:
            row["compiled_layer_ms"] = layer_ms(spec, seq, device, dtype, compiled=True)["event_ms"]
        except Exception as err:  # noqa: BLE001 - a compile failure is recorded, not fatal
            row["compiled_err"] = str(err)[:200]
    return row


def smi() -> dict[str, Any]:
    query = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        raw = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.strip().split(", ")
        return {"sm_mhz": float(raw[0]), "power_w": float(raw[1]), "temp_c": float(raw[2]), "throttle": raw[3]}
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return {}


def sustained(seconds: float, device: str, dtype: Any, size: int) -> dict[str, Any]:
    """A burst of ``size``^3 GEMMs, then a loop of them for ``seconds``, one sample a second."""
    torch = _torch()
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    flops = 2 * size ** 3
    burst = timed_ms(lambda: a @ b, device, repeats=20)["event_ms"]
    samples, started = [], time.time()
    while time.time() - started < seconds:
        t0, n = time.time(), 0
        while time.time() - t0 < min(1.0, seconds):
            a @ b
            n += 1
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append({"t": round(time.time() - started, 1), "tflops": flops * n / (time.time() - t0) / 1e12, **smi()})
    return {"burst_tflops": flops / (burst / 1e3) / 1e12, "gemm": samples,
            "median_tflops": statistics.median(s["tflops"] for s in samples)}


def sustained_layers(seconds: float, spec: Any, seq: int, device: str, dtype: Any) -> list[dict[str, Any]]:
    """``LAYER_STACK`` stacked layers of ``spec`` forward + backward in a loop for ``seconds``, one
    sample a second (ms per layer, SM clock, power)."""
    torch = _torch()
    from planner.launch.torchjob.model import TransformerBlock

    blocks = torch.nn.ModuleList([TransformerBlock(spec, i) for i in range(LAYER_STACK)]).to(device=device, dtype=dtype)
    x0 = torch.randn(1, seq, spec.hidden_size, device=device, dtype=dtype, requires_grad=True)
    samples, started = [], time.time()
    while time.time() - started < seconds:
        t0, n = time.time(), 0
        while time.time() - t0 < min(1.0, seconds):
            x = x0
            for block in blocks:
                x = block(x)
            x.float().pow(2).mean().backward()
            n += 1
            if device == "cuda":
                torch.cuda.synchronize()
        samples.append({"t": round(time.time() - started, 1), "ms_per_layer": (time.time() - t0) * 1e3 / (n * LAYER_STACK),
                        **smi()})
    return samples


def write_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1, allow_nan=False)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="one toy shape (the CPU default)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--sustained-s", type=float, default=None, help="GEMM loop seconds (60 on cuda, 1 on cpu)")
    args = parser.parse_args(argv)
    torch = _torch()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu --quick", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    quick = args.quick or args.device == "cpu"
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    started = time.time()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    rows = [measure_shape(n, shape, seq, args.device, dtype) for n, shape, seq in shapes(quick)]
    seconds = args.sustained_s or (60.0 if args.device == "cuda" else 1.0)
    load = sustained(seconds, args.device, dtype, 8192 if not quick else 256)
    first, shape, seq = shapes(quick)[0]
    layers = sustained_layers(seconds, shape_spec(first, shape, seq), seq, args.device, dtype)
    record = {"device": name, "torch": torch.__version__, "sms": torch.cuda.get_device_properties(0).multi_processor_count
              if args.device == "cuda" else 0, "square_8192_tflops": load["burst_tflops"], "rows": rows,
              "writer": "benchmarks/gpu_layer_truth.py", "wall_s": time.time() - started}
    tag = f"{name.split()[1].lower() if args.device == 'cuda' and len(name.split()) > 1 else args.device}-" \
          f"{datetime.date.today().isoformat()}"
    write_atomic(args.out_dir / f"layer_truth-{tag}.json", record)
    write_atomic(args.out_dir / f"sustained-{tag}.json", {"device": name, "gemm": load["gemm"], "layers": layers,
                                                          "layer_shape": [first, seq], "burst_tflops": load["burst_tflops"]})
    print(f"wrote {args.out_dir}/layer_truth-{tag}.json and sustained-{tag}.json ({time.time() - started:.0f} s); "
          f"sustained {load['median_tflops']:.1f} of a {load['burst_tflops']:.1f} TFLOP/s burst")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
