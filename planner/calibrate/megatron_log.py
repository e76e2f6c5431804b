"""A Megatron-LM training log as one run: its arguments block, iteration lines and memory lines.

Megatron-LM prints every parsed argument at start (``megatron/training/arguments.py``
``_print_args``): a ``---- arguments ----`` line, then ``  name ....... value`` per argument (the
dots pad the name to 48 characters), then ``---- end of arguments ----``. The block gives the
model's shape, the layout, the batch and the precision, so the log describes its own job; only the
hardware is the caller's. ``training_log`` prints ``iteration N/ M | ... | elapsed time per
iteration (ms): T | ...`` every ``log_interval`` iterations, and ``report_memory`` ``memory (MB) |
allocated: A | max allocated: B | reserved: C | max reserved: D``. A CUDA out-of-memory error
(``torch.OutOfMemoryError``, "CUDA out of memory") marks the run as one that died of it.
The step time is the median of the iteration lines after the warm-up (``WARMUP_ITERATIONS``).
"""

from __future__ import annotations

import ast
import re
import statistics
from pathlib import Path
from typing import Any

from costmodels.model_spec import ModelSpec, MoESpec
from planner.launch.megatron_fields import ARG_FIELDS
from planner.launch.readback import megatron_fields_layout

from .runs import CalibrationError, LoggedRun

ARGS_START = re.compile(r"-{3,}\s*arguments\s*-{3,}")
ARGS_END = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
ARG_LINE = re.compile(r"^\s*(\w+)\s+\.*\s*(.*?)\s*$")
LINE_PREFIX = re.compile(r"^(\[?rank\s*\d+\]?:?\s*|\d+:\s)", re.I)
"""A launcher's per-rank prefix (``[rank0]:``, srun --label's ``0: ``)."""
ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")
MEMORY = re.compile(r"memory \(MB\)\s*\|.*?max allocated:\s*([0-9.]+)(?:.*?max reserved:\s*([0-9.]+))?")
OUT_OF_MEMORY = re.compile(r"OutOfMemoryError|CUDA out of memory")
WARMUP_ITERATIONS = 10
"""Iterations whose logged interval is dropped: the first ones build NCCL communicators, tune
kernels and fill the data loader. The first logged interval holds them whatever its length, so it
is dropped too (``--log-interval 100`` logs iteration 100 first). Where a log has no line past both,
every line but the first is kept."""
MIB = 2**20
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
            "micro_batch_size", "world_size")
FIELDS = (("gpus", "world_size"), ("global_batch", "global_batch_size"), ("seq_len", "seq_length"))
"""The job's inputs as the arguments block names them (errors about the run say these)."""


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _clean(line: str) -> str:
    return LINE_PREFIX.sub("", line.rstrip("\n"))


def log_lines(text: str) -> list[str]:
    """A log's lines without a launcher's per-rank prefix (``LINE_PREFIX``)."""
    return [_clean(line) for line in text.splitlines()]


def arguments(lines: list[str], path: Path) -> dict[str, Any]:
    """The arguments block as {argparse dest: value}; raises naming the file when there is none."""
    start = next((i for i, line in enumerate(lines) if ARGS_START.search(line) and "end of" not in line), None)
    if start is None:
        raise CalibrationError(f"{path}: no Megatron-LM arguments block ('---- arguments ----'); log the run with "
                               "Megatron-LM's startup output, or put it in a table (dp, tp, pp, ... columns)")
    args: dict[str, Any] = {}
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if ARGS_END.search(line):
            return args
        match = ARG_LINE.match(_clean(line))
        if not match:
            raise CalibrationError(f"{path}:{number}: not an argument line inside the arguments block: {line.strip()!r}")
        args[match.group(1)] = _value(match.group(2))
    raise CalibrationError(f"{path}: the arguments block never ends ('---- end of arguments ----'); the log is cut")


def _model(args: dict[str, Any], path: Path) -> ModelSpec:
    vocab = args.get("padded_vocab_size") or args.get("vocab_size")
    if not isinstance(vocab, int):
        raise CalibrationError(f"{path}: the arguments give no vocabulary size (vocab_size or padded_vocab_size); "
                               "a table row can name the model instead")
    heads = args["num_attention_heads"]
    kv = args.get("num_query_groups") if args.get("group_query_attention") else heads
    experts = args.get("num_experts")
    moe = MoESpec(num_experts=experts, top_k=args.get("moe_router_topk") or 2,
                  expert_ffn_hidden_size=args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]) if experts else None
    swiglu = bool(args.get("swiglu"))
    return ModelSpec(name=f"megatron-{args['num_layers']}l-h{args['hidden_size']}", num_layers=args["num_layers"],
                     hidden_size=args["hidden_size"], ffn_hidden_size=args.get("ffn_hidden_size") or 4 * args["hidden_size"],
                     num_attention_heads=heads, num_kv_heads=kv or heads, head_dim=args.get("kv_channels") or 0,
                     vocab_size=vocab, gated_mlp=swiglu, activation="silu" if swiglu else "gelu",
                     norm="rmsnorm" if str(args.get("normalization")).lower() == "rmsnorm" else "layernorm",
                     positions="rotary" if args.get("position_embedding_type") == "rope" else "learned",
                     max_position_embeddings=args.get("max_position_embeddings") or args["seq_length"],
                     rope_theta=float(args.get("rotary_base") or 10000),
                     tied_embeddings=not args.get("untie_embeddings_and_output_weights", False),
                     linear_bias=bool(args.get("add_bias_linear", False)), qk_norm=bool(args.get("qk_layernorm")),
                     moe=moe)


def _fields(args: dict[str, Any]) -> dict[str, Any]:
    fields = {field: value for dest, value in args.items() for field in ARG_FIELDS.get(dest, ())}
    fields["model.virtual_pipeline_model_parallel_size"] = args.get("virtual_pipeline_model_parallel_size") or 1
    fields["model.fp8"], fields["model.fp4"] = args.get("fp8"), args.get("fp4")
    return fields


def step_times(lines: list[str]) -> list[float]:
    """Seconds per iteration of each iteration line past the warm-up."""
    logged = [(int(m.group(1)), float(m.group(2)) / 1e3) for m in map(ITERATION.search, lines) if m]
    kept = [t for i, t in logged[1:] if i > WARMUP_ITERATIONS]  # the first interval holds the warm-up
    return kept or [t for _, t in logged[1:]] or [t for _, t in logged]


def peak_memory_bytes(lines: list[str]) -> float | None:
    """The largest max reserved (else max allocated) the memory lines report."""
    peaks = [float(m.group(2) or m.group(1)) * MIB for m in map(MEMORY.search, lines) if m]
    return max(peaks) if peaks else None


def read_megatron_log(path: Path, *, hardware: str, gpus_per_node: int | None = None) -> LoggedRun:
    """One run from a Megatron-LM log on ``hardware``."""
    try:
        lines = log_lines(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as err:
        raise CalibrationError(f"{path}: cannot read ({err.strerror})") from None
    args = arguments(lines, path)
    missing = [k for k in REQUIRED if not isinstance(args.get(k), int)]
    if missing:
        raise CalibrationError(f"{path}: the arguments block lacks {', '.join(missing)}")
    model = _model(args, path)
    try:
        layout, training = megatron_fields_layout(_fields(args), args["world_size"], model.num_layers)
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as err:
        raise CalibrationError(f"{path}: the arguments give no layout autoplan can cost ({err})") from None
    times, oom = step_times(lines), any(OUT_OF_MEMORY.search(line) for line in lines)
    if not times and not oom:
        raise CalibrationError(f"{path}: no 'elapsed time per iteration (ms)' line and no out-of-memory error; "
                               "the run logged no step")
    request = {"model": model, "hardware": hardware, "gpus": args["world_size"], "gpus_per_node": gpus_per_node,
               "global_batch": training["global_batch_size"], "seq_len": training["seq_len"],
               "precision": training["precision"], "fp8_recipe": training["fp8_recipe"], "runtime": "megatron"}
    return LoggedRun(request=request, layout=layout, step_time_s=statistics.median(times) if times and not oom else None,
                     peak_memory_bytes=peak_memory_bytes(lines), out_of_memory=oom,
                     origin=f"{path} (Megatron-LM, {len(times)} iterations)", fields=FIELDS)
