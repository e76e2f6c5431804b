"""Training logs in each framework's own format, written for the calibration tests.

Megatron-LM: the startup arguments block as ``megatron/training/arguments.py`` ``_print_args``
prints it (``  name <dots to 48> value``, sorted case-insensitively), ``training_log``'s iteration
lines (`` [date] iteration N/ M | consumed samples: ... | elapsed time per iteration (ms): T | ...``)
and ``report_memory``'s line, with per-rank launcher prefixes on some lines. torchtitan: the job
TOML autoplan's export writes (``planner.launch.frameworks.torchtitan_config``) and the metrics
logger's ``step: N  loss: L  grad_norm: G  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%`` lines,
with their colour codes. The measured times are what the caller says (the tests make them with
known factors).
"""

from __future__ import annotations

from pathlib import Path

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec

ITERATIONS = 100
LOG_INTERVAL = 10


def megatron_args(model: ModelSpec, layout: Layout, *, seq_len: int, global_batch: int) -> dict[str, object]:
    """The arguments Megatron-LM would print for this job (with a few that do not matter here)."""
    v = layout.virtual_stages if layout.pp > 1 else None
    return {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads, "group_query_attention": model.num_kv_heads < model.num_attention_heads,
        "num_query_groups": model.num_kv_heads, "kv_channels": model.d_head, "vocab_size": model.vocab_size,
        "padded_vocab_size": None, "swiglu": model.gated_mlp, "normalization": "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        "position_embedding_type": "rope" if model.positions == "rotary" else "learned_absolute",
        "untie_embeddings_and_output_weights": not model.tied_embeddings, "add_bias_linear": model.linear_bias,
        "rotary_base": int(model.rope_theta), "max_position_embeddings": model.max_position_embeddings,
        "seq_length": seq_len, "micro_batch_size": layout.micro_batch_size, "global_batch_size": global_batch,
        "world_size": layout.world_size, "data_parallel_size": layout.dp, "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp, "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep, "virtual_pipeline_model_parallel_size": v,
        "sequence_parallel": layout.sequence_parallel, "use_distributed_optimizer": layout.zero_stage == 1,
        "tp_comm_overlap": layout.tp_comm_overlap, "overlap_grad_reduce": layout.dp > 1, "overlap_param_gather": False,
        "recompute_granularity": None if layout.recompute == "none" else layout.recompute,
        "recompute_method": None, "recompute_num_layers": None, "bf16": True, "fp16": False, "fp8": None,
        "lr": 3e-4, "min_lr": 3e-5, "seed": 1234, "train_iters": ITERATIONS, "log_interval": LOG_INTERVAL,
        "tokenizer_type": "NullTokenizer", "optimizer": "adam", "weight_decay": 0.1, "clip_grad": 1.0,
    }


def megatron_log_text(args: dict[str, object], step_s: float, *, peak_mib: float | None = None,
                      out_of_memory: bool = False) -> str:
    """A Megatron-LM log of a run whose steps take ``step_s`` (the first interval 3x slower)."""
    lines = ["using world size: {}, data-parallel size: {}".format(args["world_size"], args["data_parallel_size"]),
             "------------------------ arguments ------------------------"]
    entries = ["  {} {} {}".format(name, "." * (48 - len(name)), value) for name, value in args.items()]
    lines += sorted(entries, key=lambda x: x.lower())
    lines.append("-------------------- end of arguments ---------------------")
    lines.append("> building NullTokenizer tokenizer ...")
    if out_of_memory:
        lines += ["[rank0]: Traceback (most recent call last):",
                  "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
        return "\n".join(lines) + "\n"
    consumed = 0
    for iteration in range(LOG_INTERVAL, ITERATIONS + 1, LOG_INTERVAL):
        consumed += LOG_INTERVAL * int(args["global_batch_size"])
        ms = step_s * 1e3 * (3.0 if iteration == LOG_INTERVAL else 1.0 + 0.002 * (iteration % 3))
        prefix = "[rank0]: " if iteration % 20 == 0 else ""
        lines.append(f"{prefix} [2026-11-28 10:{iteration // 10:02d}:00] iteration {iteration:8d}/{ITERATIONS:8d} | "
                     f"consumed samples: {consumed:12d} | elapsed time per iteration (ms): {ms:.1f} | "
                     f"learning rate: {3e-4:.6E} | global batch size: {args['global_batch_size']:5d} | "
                     f"lm loss: {7.1:.6E} | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
                     "number of nan iterations:   0 |")
        if iteration == LOG_INTERVAL and peak_mib is not None:
            lines.append(f"[Rank 0] (after {iteration} iterations) memory (MB) | allocated: {peak_mib * 0.6:.1f} | "
                         f"max allocated: {peak_mib * 0.93:.1f} | reserved: {peak_mib:.1f} | max reserved: {peak_mib:.1f}")
    return "\n".join(lines) + "\n"


def write_torchtitan_run(directory: Path, model_name: str, model: ModelSpec, training, layout: Layout, *,
                         seq_len: int, step_s: float, peak_gib: float) -> None:
    """A torchtitan run directory: the job TOML autoplan's export writes and a log of its steps."""
    from planner.launch.frameworks import toml_text, torchtitan_config

    config, _ = torchtitan_config(model_name, model, training, layout, seq_len)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "torchtitan.toml").write_text(toml_text(config, ["synthetic run"]), encoding="utf-8")
    tps = training.global_batch_size * seq_len / (step_s * layout.world_size)
    lines = ["[titan] 2026-11-28 10:00:00,000 - root - INFO - Starting job: synthetic run"]
    for step in range(1, 21):
        slow = 4.0 if step == 1 else 1.0
        lines.append(f"[titan] 2026-11-28 10:00:{step:02d},000 - root - INFO - \x1b[31mstep: {step:2}  "
                     f"\x1b[32mloss: {7.1:8.5f}  \x1b[33mgrad_norm: {1.2:7.4f}  \x1b[36mmemory: {peak_gib:5.2f}GiB"
                     f"({peak_gib / 80 * 100:.2f}%)  \x1b[34mtps: {round(tps / slow):,}  \x1b[36mtflops: 400.00  "
                     f"\x1b[35mmfu: 40.44%\x1b[39m")
    (directory / "train.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
