"""The argument schemas of Megatron-LM's and Megatron-DeepSpeed's ``pretrain_gpt.py`` (generated from
their source by ``scripts/framework_arg_schema.py``, kept in ``tests/data/framework_args``), turned
back into an ``argparse`` parser that reads an exported job's arguments the way the framework's
would: unknown options, a value its type cannot convert (``int('1e+06')``) or a value outside its
choices are refused; then a few ``validate_args`` rules that decide whether a layout starts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SCHEMAS = Path(__file__).parent / "data" / "framework_args"

_TYPES = {"int": int, "float": float, "str": str}


class ArgumentRefused(Exception):
    """The framework's parser would stop here (its ``error``)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's exit(2) with a message, as an exception
        raise ArgumentRefused(message)


def load_schema(name: str) -> dict:
    """``name``: the file's stem, ``megatron-lm@core_v0.19.0`` or ``megatron-deepspeed@4efb479d5317``."""
    return json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))


def schema_parser(schema: dict) -> argparse.ArgumentParser:
    """An argparse parser with the schema's options: same names, destinations, actions, counts, types
    (the framework's own converters beyond int/float/str read as strings) and choices."""
    parser = _Parser(allow_abbrev=False, add_help=False)
    seen: dict[str, list[str]] = {}
    for name, entry in schema["options"].items():
        seen.setdefault(json.dumps(entry, sort_keys=True) + entry["dest"], []).append(name)
    for names in seen.values():
        entry = schema["options"][names[0]]
        action = entry["action"]
        kwargs: dict = {"dest": entry["dest"], "default": entry["default"]}
        if action in ("StoreTrue", "StoreFalse"):
            kwargs["action"] = "store_true" if action == "StoreTrue" else "store_false"
        elif action == "BooleanOptional":  # --x / --no-x: argparse adds the negative itself
            kwargs["action"] = argparse.BooleanOptionalAction
            names = [n for n in names if not (n.startswith("--no-") and "--" + n[5:] in names)]
        else:
            kwargs["nargs"] = entry["nargs"]
            kwargs["type"] = _TYPES.get(entry["type"], str)
            if entry["choices"] is not None:
                kwargs["choices"] = [kwargs["type"](c) if entry["type"] in _TYPES else str(c) for c in entry["choices"]]
        parser.add_argument(*sorted(names), **kwargs)
    return parser


def parse(schema_name: str, tokens: list[str]) -> argparse.Namespace:
    """Parse ``tokens`` with the schema's parser; raises ``ArgumentRefused`` as the framework would exit."""
    return schema_parser(load_schema(schema_name)).parse_args(tokens)


def megatron_validate(args: argparse.Namespace, world_size: int) -> list[str]:
    """``validate_args`` rules of NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (commit d98e8a64)
    that decide whether a layout starts; one message per broken rule (empty: it starts)."""
    a, out = args, []
    model = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    if world_size % model:  # "world size ... is not divisible by total_model_size"
        out.append(f"world size {world_size} is not divisible by tp x pp x cp = {model}")
    dp = world_size // model
    if a.global_batch_size % (a.micro_batch_size * dp):  # "global batch size ... not divisible by micro ... times dp"
        out.append(f"global batch {a.global_batch_size} is not divisible by micro-batch x dp")
    uneven = a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None
    if a.pipeline_model_parallel_layout is None and not uneven and a.num_layers % a.pipeline_model_parallel_size:
        out.append("Number of layers should be divisible by the pipeline-model-parallel size")
    if uneven and getattr(a, "num_layers_per_virtual_pipeline_stage", None) is not None:
        out.append("uneven stages need --num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-...")
    if a.overlap_param_gather and not (a.use_distributed_optimizer or getattr(a, "use_megatron_fsdp", False)):
        out.append("--overlap-param-gather only supported with distributed optimizer or megatron fsdp")
    if a.overlap_param_gather and not a.overlap_grad_reduce:
        out.append("Must use --overlap-param-gather with --overlap-grad-reduce")
    sequence_parallel = a.sequence_parallel and a.tensor_model_parallel_size > 1  # tp 1 turns it off
    if a.tp_comm_overlap and not sequence_parallel:
        out.append("Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled")
    if a.num_attention_heads % a.tensor_model_parallel_size:
        out.append("num_attention_heads must be divisible by tensor_model_parallel_size")
    if a.num_experts and a.num_experts % a.expert_model_parallel_size:
        out.append("num_experts must be divisible by expert_model_parallel_size")
    if a.num_experts and a.expert_model_parallel_size > 1 and a.tensor_model_parallel_size > 1 and not sequence_parallel:
        out.append("sequence parallelism must be used with expert and tensor parallelism")
    if a.optimizer_cpu_offload and not a.use_precision_aware_optimizer:
        out.append("--optimizer-cpu-offload needs --use-precision-aware-optimizer")
    return out + required_missing(a)


REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
            "micro_batch_size", "lr", "tokenizer_type")
"""Arguments both Megatrons need set to start (``validate_args`` asserts the model sizes, sequence and
position lengths; ``training.py`` needs iterations or samples; the optimizer needs ``--lr``, which
defaults to None; ``build_tokenizer`` needs a tokenizer, and ``NullTokenizer`` a vocabulary size)."""


def required_missing(a: argparse.Namespace) -> list[str]:
    out = [f"--{name.replace('_', '-')} is required" for name in REQUIRED if getattr(a, name) is None]
    if a.train_iters is None and getattr(a, "train_samples", None) is None:
        out.append("either train-iters or train-samples should be provided")
    if a.tokenizer_type == "NullTokenizer" and a.vocab_size is None:
        out.append("NullTokenizer needs --vocab-size")
    return out


def megatron_deepspeed_validate(args: argparse.Namespace, ds_config: dict, world_size: int) -> list[str]:
    """Rules of deepspeedai/Megatron-DeepSpeed (commit 4efb479d) a layout must meet to start:
    ``megatron/arguments.py`` ``validate_args`` and ``pretrain_gpt.py`` / DeepSpeed's pipeline engine."""
    a, out = args, []
    model = a.tensor_model_parallel_size * a.pipeline_model_parallel_size
    if world_size % model:
        out.append(f"world size {world_size} is not divisible by tp x pp = {model}")
    if a.num_layers % a.pipeline_model_parallel_size:
        out.append("num_layers must be divisible by pipeline_model_parallel_size")
    stage = ds_config["zero_optimization"]["stage"]
    if a.zero_stage != stage:  # pretrain_gpt.py builds the model under zero.Init only when args.zero_stage == 3
        out.append(f"--zero-stage {a.zero_stage} disagrees with the JSON's zero_optimization.stage {stage}")
    if stage >= 2 and not a.no_pipeline_parallel:  # the pipeline engine asserts ZeRO below 2
        out.append("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    return out + required_missing(a)


def megatron_fields(schema_name: str, args: argparse.Namespace) -> dict[str, object]:
    """``{section.field: value}`` (``planner.launch.megatron_fields.ARG_FIELDS``) of a namespace the
    schema's parser returned: each field read from the option's own destination (``--fp8-format``
    stores ``fp8``), so the layout is rebuilt from what the parser holds, not from the file's text."""
    from planner.launch.megatron_fields import ARG_FIELDS

    options = load_schema(schema_name)["options"]
    fields: dict[str, object] = {}
    for key, targets in ARG_FIELDS.items():
        option = options.get("--" + key.replace("_", "-"))
        if option is None:
            continue
        value = getattr(args, option["dest"])
        if value == option["default"]:  # left at the parser's default: as if unset
            continue
        if key == "recompute_modules":
            value = list(value)
        for target in targets:
            fields[target] = value
    if not args.add_bias_linear:
        fields["model.add_bias_linear"] = False
    if fields.get("model.cpu_offloading_num_layers"):
        fields["model.cpu_offloading"] = True
    return fields
