"""A published run's row -> the specs and ``Layout`` that ``planner.evaluate`` costs, or a reason.

Rows follow the development set's schema (``benchmarks/data/published_runs.json``, copied from
``shared/published_runs/runs.json``; its README lists the fields). Every default filled in for a
field the source left out is written to ``MappedRun.assumptions`` (prose) and ``MappedRun.assumed``
(one short ``field=value`` key each, counted by ``benchmarks/published.py``). Nothing measured
(throughput, MFU, memory) decides the mapping: the measured figures are only converted, through
the mapped layout, into the rate that is scored. A run the cost model cannot
express yet (an unknown GPU, MLA, a block-scaled FP8 recipe, uneven stages, a missing shape) is an
``Unexpressible`` with a short ``reason`` that the benchmark counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.stage_split import first_last_split
from hardware_specs import NodeSpec
from hardware_specs.units import GBIT

from .conventions import HARDWARE_FLOP_FAMILIES, measured_tokens_per_s_per_gpu
from .shapes import PRESET_SHAPES, ShapeError, model_spec_for

GPU_PRESETS: tuple[tuple[str, str], ...] = (
    (r"A100.*40\s*GB", "a100-sxm-40gb"),
    (r"A100", "a100-sxm-80gb"),
    (r"Ampere-generation", "a100-sxm-80gb"),
    (r"^NVIDIA H100 SXM 96GB HBM2e", "h100-hbm2e-96gb-500w"),
    (r"^NVIDIA H100", "h100-sxm-80gb"),
    (r"^NVIDIA H200", "h200-sxm-141gb"),
    (r"^NVIDIA H800", "h800-sxm-80gb"),
    (r"^NVIDIA B200", "b200"),
    (r"^NVIDIA B300", "b300"),
    (r"^NVIDIA GB200", "gb200-nvl72"),
    (r"^NVIDIA GB300", "gb300-nvl72"),
    (r"^NVIDIA V100", "v100-sxm-32gb"),
)
"""Row ``hardware.gpu`` pattern -> shipped hardware preset, first match wins."""

PRECISION_RECIPES: tuple[tuple[str, str, str | None], ...] = (
    (r"NVFP4", "nvfp4", None),
    (r"MXFP8|FP8-MX", "mxfp8", None),
    (r"fine-grained", "fp8", "blockwise"),
    (r"rowwise", "fp8", "rowwise"),
    (r"FP8-CS|tensorwise|Float8 linear", "fp8", "tensorwise"),
    (r"^FP8$", "fp8", "delayed"),
)
"""Row ``precision`` pattern -> (precision, fp8 recipe), first match wins (case-insensitive).
NeMo's tables write FP8-CS for current (tensorwise) scaling and plain FP8 for its default
``bf16_with_fp8_mixed`` recipe, delayed scaling; FP8-MX and MXFP8 are MXFP8; DeepSeek-V3's
"fine-grained quantization" is its 1x128/128x128 blockwise recipe (arXiv 2412.19437 Sec. 3.3);
torchtitan's Float8 linear rows without a recipe name are torchao's tensorwise default."""
MEGATRON_DEFAULT_FAMILIES = frozenset({"nemo_megatron_bridge_perf", "megatron_readme_h100", "megascale_2024"})
"""Megatron-Core stacks: distributed optimizer (ZeRO-1) and sequence parallelism under TP by default."""
EAGER_ATTENTION_FAMILIES = frozenset({
    "megatron_sc21_table1", "megatron_sc21_table2", "korthikanti_2022", "bloom_tr11", "bloom_prequel_sweep",
    "mtnlg_530b", "gpt_neox_20b", "opt_175b"})
"""Runs from before FlashAttention (2021-2022): attention scores are materialised."""


NEMO_ACTIVATION_OFFLOAD: dict[tuple[str, str, str], int] = {
    ("LLAMA3_70B", "gb300-nvl72", "bf16"): 30, ("LLAMA3_70B", "gb300-nvl72", "fp8"): 20,
    ("LLAMA3_70B", "gb200-nvl72", "bf16"): 20, ("LLAMA3_70B", "gb200-nvl72", "fp8"): 40,
    ("LLAMA3_70B", "b200", "fp8"): 5,
}
"""Layers whose activations NeMo's Megatron-FSDP runs offload to the host, by (row model, GPU
preset, precision): Megatron-Bridge ``scripts/performance/configs/llama/llama3_workload_base_configs.py``
(``cpu_offloading_num_layers`` of the ``use_megatron_fsdp`` presets, V1 and V2 alike); the rows do
not state it."""
NEMO_EMBEDDING_LOSS_SPLIT = frozenset({"LLAMA3.1_405B"})
"""Row models whose NeMo recipe counts the embedding and the loss as one layer each when it splits
the pipeline (Megatron-Bridge ``recipes/llama/llama31_405b.py``: ``account_for_embedding_in_pipeline_split``
and ``account_for_loss_in_pipeline_split`` default True): (L + 2) / (pp·v) layers per chunk, one fewer
on the first and the last."""
NEMO_LAYOUT_ERRATA: dict[str, str] = {
    "nemo-mb-26-02-01-nemo-container-dgx-gb300-llama3-70b-64gpu-nvfp4-tp1pp1cp1vpnoneepnone-gbs256-mbs2":
        "states tp 1, pp 1, MBS 2 without FSDP, where the bf16 weights and bf16 gradient buffer of 70.6B "
        "parameters alone are 282 GB of the GB300's 288; the release's recipe (LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2) and "
        "the 26.02 table's same row run pp 4, vp 5, MBS 1",
    "nemo-mb-26-02-01-nemo-container-dgx-gb300-llama3-70b-64gpu-mxfp8-tp1pp4cp1vpnoneepnone-gbs256-mbs2":
        "states pp 4 without interleaving at MBS 2; the release's recipe (LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2) "
        "and the 26.02 table's same row run pp 4, vp 5, MBS 1",
}
"""NeMo rows whose stated layout contradicts the recipe of their own release, by row id: the
26.02.01 patch tables (Megatron-Bridge ``docs/performance-summary-archive.md``, '26.02.01 NeMo
Container') list the GB300 Llama 3 70B NVFP4 and MXFP8 runs with layouts that neither the
release branch's presets (Megatron-Bridge ``r0.3.0``
``scripts/performance/configs/llama/llama3_workload_base_configs.py``, unchanged for these since
v0.3.0) nor the 26.02 table's same configurations have. Which figure is right the row cannot
say, so it is not scored rather than re-mapped."""
BLOOM_FP32_ACCUMULATION_FROM = (2, 28)
"""(month, day) of 2022 from which the BLOOM prequel sweep ran DeepSpeed's BF16_Optimizer, which
accumulates gradients in fp32 (its rows' precision text says so). Its 'Rebalancing layers'
section (bigscience-workshop/bigscience ``train/tr11-176B-ml/chronicles-prequel.md``) says the
runs before it used fp16, 'which grad accumulates in fp16', and that the new optimizer costs
'4bytes x params' more; its 02-17 'Best TFLOPs' tables read 67 GB in fp16 and 68 GB in bf16 for
one layout, so the bf16 of that date kept 16-bit gradients too. Earlier rows are therefore costed
with 16-bit gradients: fp16 where the row states no precision or fp16, and as fp16 where it states
bf16 (the A100's fp16 and bf16 rates are equal, and fp16 is how the cost model keeps 16-bit gradients
under DeepSpeed)."""
OP_SAC = re.compile(r"op-level SAC|per-op SAC", re.IGNORECASE)
"""Row recompute text naming torchtitan's op-level selective checkpointing (``selective_ac_option =
"op"``), which keeps every other matmul output (``costmodels.op_sac``), not Megatron's selective."""


class Unexpressible(Exception):
    """A run the cost model cannot express yet; ``reason`` is the short category counted."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class MappedRun:
    """One published run as ``planner.evaluate`` inputs, with what it measured."""

    row_id: str
    family: str
    model: ModelSpec
    node: NodeSpec
    hardware_name: str
    num_gpus: int
    gpus_per_node: int
    global_batch: int
    seq_len: int
    precision: str
    fp8_recipe: str | None
    """With ``precision`` fp8: delayed, tensorwise, rowwise or blockwise (``PRECISION_RECIPES``)."""
    attention: str
    runtime: str
    layout: Layout
    status: str
    """``ok`` or ``oom`` as recorded."""
    measured_tokens_per_s_per_gpu: float | None
    measured_basis: str
    """Which published figure the measured rate came from."""
    measured_peak_memory_gib: float | None
    config_key: tuple
    """Runs with equal keys repeat one configuration (NeMo across container versions)."""
    sweep_key: tuple
    """Runs with equal keys are one sweep: same model (name and shape: the BLOOM sweep names every
    candidate "BLOOM candidate"), GPU and GPU count, varying the layout."""
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    assumed: tuple[str, ...] = field(default_factory=tuple)
    """One ``field=value`` key per default filled in for a field the row leaves out (``Notes.assume``)."""
    compiled: bool = False
    """The run used ``torch.compile`` (``TrainingSpec.compiled``; ``_compiled``)."""

    def evaluate_kwargs(self) -> dict:
        """Keyword arguments of ``planner.evaluate`` for this run (memory cap = device memory)."""
        return dict(model=self.model, hardware=self.node, gpus=self.num_gpus, global_batch=self.global_batch,
                    seq_len=self.seq_len, gpus_per_node=self.gpus_per_node, precision=self.precision,
                    fp8_recipe=self.fp8_recipe, compiled=self.compiled,
                    attention=self.attention, runtime=self.runtime, memory_fraction=1.0, layout=self.layout)


@dataclass(slots=True)
class Notes:
    """What the mapping of one row wrote down: prose ``text`` and, for each default filled in for a
    field the row leaves out, a short ``field=value`` key in ``assumed``."""

    text: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)

    def append(self, line: str) -> None:
        """A note that assumes nothing (the row, or a cited source, states it)."""
        self.text.append(line)

    def assume(self, key: str, line: str) -> None:
        """A default for a field the row leaves out: ``key`` is counted, ``line`` explains it."""
        self.assumed.append(key)
        self.text.append(line)


def load_rows(path: str | Path) -> list[dict]:
    """The rows of a published-runs JSON file (a list of objects)."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of runs")
    return rows


def map_row(row: dict, load_node) -> MappedRun:
    """Map one row; raise ``Unexpressible`` naming why the model cannot cost it yet.

    ``load_node(preset_name) -> NodeSpec`` (cached by the caller).
    """
    family, par, status = row["source_family"], row["parallel"], row["status"]
    if status not in ("ok", "oom"):
        raise Unexpressible("no measurement", f"status {status}")
    if row["id"] in NEMO_LAYOUT_ERRATA:
        raise Unexpressible("layout contradicts its recipe", NEMO_LAYOUT_ERRATA[row["id"]])
    notes = Notes()
    preset = _gpu_preset(row["hardware"]["gpu"])
    node = _with_row_network(load_node(preset), row, notes)
    try:
        model = model_spec_for(row)
    except ShapeError as err:
        raise Unexpressible(err.reason, err.detail) from None
    precision, fp8_recipe = _precision(row, node, notes)
    shape_preset = PRESET_SHAPES.get(row["model"]["name"] or "")
    if shape_preset is not None:
        notes.append(f"shape from preset {shape_preset} (shapes.PRESET_SHAPES; its released config.json)")
    elif not row["model"]["vocab"]:
        notes.assume("vocab=fill", f"vocab not given: {model.vocab_size} (shapes.VOCAB_FILLS)")
    if shape_preset is None and not row["model"]["ffn_hidden"]:
        notes.assume("ffn_hidden=4h", "ffn not given: 4h (GPT-style)")
    num_gpus = row["num_gpus"]
    if not num_gpus:
        raise Unexpressible("missing layout", "no GPU count")
    seq_len = row["model"]["seq_len"]
    global_batch = _global_batch(par, seq_len)
    layout = _layout(row, model, num_gpus, global_batch, notes)
    measured = None
    basis = "oom"
    if status == "ok":
        found = measured_tokens_per_s_per_gpu(
            row["throughput"], family=family, num_gpus=num_gpus, global_batch=global_batch, model=model,
            seq_len=seq_len, recompute=layout.recompute,
            datasheet_peak_tflops=node.hardware.peak_flops("bf16" if node.hardware.supports("bf16") else "fp16") / 1e12)
        if found is None:
            raise Unexpressible("no measurement", "no throughput figure")
        measured, basis = found
    offload = NEMO_ACTIVATION_OFFLOAD.get((row["model"]["name"], preset, precision)) if par["fsdp"] else None
    if family == "nemo_megatron_bridge_perf" and offload and layout.pp == 1:
        layout = replace(layout, activation_offload_layers=offload)
        notes.assume("activation_offload=NeMo preset", f"activation offload not given: {offload} layers (Megatron-Bridge's Megatron-FSDP preset, "
                     "runs.NEMO_ACTIVATION_OFFLOAD)")
    runtime = _runtime(family, row.get("framework") or "")
    _note_grad_reduction(runtime, precision, notes)
    L = layout
    config = (row["model"]["name"], preset, num_gpus, precision, seq_len, global_batch, L.dp, L.tp, L.pp, L.cp,
              L.ep, L.virtual_stages, L.micro_batch_size, L.recompute, L.zero_stage, row["precision"])
    return MappedRun(
        row_id=row["id"], family=family, model=model, node=node, hardware_name=preset, num_gpus=num_gpus,
        gpus_per_node=_gpus_per_node(row, node), global_batch=global_batch,
        seq_len=seq_len, precision=precision, fp8_recipe=fp8_recipe,
        attention="eager" if family in EAGER_ATTENTION_FAMILIES else "fused",
        runtime=runtime, layout=layout, status=status,
        measured_tokens_per_s_per_gpu=measured, measured_basis=basis,
        measured_peak_memory_gib=row["memory"]["peak_mem_gb"], config_key=config,
        sweep_key=(family, row["model"]["name"], model.num_layers, model.hidden_size, model.num_attention_heads,
                   model.ffn_hidden_size, model.vocab_size, preset, num_gpus, seq_len, precision, fp8_recipe),
        assumptions=tuple(notes.text), assumed=tuple(notes.assumed), compiled=_compiled(row))


def _note_grad_reduction(runtime: str, precision: str, notes: Notes) -> None:
    """Record the dtype the row's data-parallel gradients were reduced in, as its runtime convention
    costs them (no row states it). Megatron-LM reduces bf16 training's gradients in fp32: until
    ``--grad-reduce-in-bf16`` (2025-02) its ``validate_args`` forced
    ``accumulate_allreduce_grads_in_fp32`` for bf16, and since then fp32 stays the default
    (``megatron/training/arguments.py``); fp16 training reduces fp16 unless asked. NeMo's
    performance recipes reduce in bf16 (``convention.MEGATRON_BRIDGE``). DeepSpeed's BF16_Optimizer
    and FSDP2's mixed precision as torchtitan and the generated job run it reduce in fp32."""
    if precision == "fp16":
        notes.assume("grad_reduce=fp16", "gradient reduction not stated: fp16 (fp16 training's default)")
    elif runtime == "megatron-bridge":
        notes.assume("grad_reduce=bf16 (NeMo recipe)", "gradient reduction not stated: bf16 (NeMo performance "
                     "recipes set grad_reduce_in_fp32 False)")
    else:
        notes.assume(f"grad_reduce=fp32 ({runtime})", f"gradient reduction not stated: fp32 ({runtime}'s default "
                     "for 16-bit training)")


def _gpus_per_node(row: dict, node: NodeSpec) -> int:
    """GPUs per node (host and its NICs): the row's figure, else the node type's (a GB200/GB300
    compute tray of 4 in a 72-GPU NVLink domain, so a 256-GPU row fills 3 racks and 40 GPUs of a
    fourth, ``ClusterSpec.group_placement``)."""
    return row["hardware"]["gpus_per_node"] or node.gpus_per_node


def _compiled(row: dict) -> bool:
    """Whether a torchtitan row ran under ``torch.compile``. Tables 1 and 3 of torchtitan's December
    2024 benchmarks list it per row ("FSDP" against "FSDP + torch.compile"); the captions of Tables 2,
    4, 5 and 6 state it for every row, and the async-TP and Trainy runs pass ``--training.compile``.
    Other frameworks fuse their elementwise kernels anyway (``RuntimeConvention.fused_elementwise``)."""
    if row["source_family"] != "torchtitan":
        return False
    per_row = (row["source"].get("location") or "") in ("Table 1", "Table 3")
    return "torch.compile" in row["name"] if per_row else True


def _runtime(family: str, framework: str) -> str:
    """Which runtime convention a row's framework runs: torchtitan for torchtitan, megatron-bridge for
    NeMo's performance tables (their recipes' bf16 gradient buffer), deepspeed for
    Megatron layers under DeepSpeed's pipeline engine (Megatron-DeepSpeed, MT-NLG, GPT-NeoX),
    megatron otherwise (DeepSpeed ZeRO-3 without Megatron runs no pipeline engine)."""
    if family == "torchtitan":
        return "torchtitan"
    if framework.startswith("autoplan launch"):  # the generated job (benchmarks/gpu_truth.py records)
        return "torch"
    if family == "nemo_megatron_bridge_perf":
        return "megatron-bridge"
    text = framework.lower()
    return "deepspeed" if "deepspeed" in text and "megatron" in text else "megatron"


def _gpu_preset(gpu: str | None) -> str:
    for pattern, preset in GPU_PRESETS:
        if gpu and re.search(pattern, gpu):
            return preset
    raise Unexpressible("unknown GPU", str(gpu))


def _precision(row: dict, node: NodeSpec, notes: Notes) -> tuple[str, str | None]:
    """(precision, fp8 recipe) of a row; raise ``Unexpressible`` when the hardware lacks its rate.

    NeMo's performance tables run every configuration in BF16 and in FP8 (the rows beside an
    unlabelled one state both), and their 25.09 archive writes "n/a" for some: such a row is
    either, and the two predictions differ by up to 2x, so it is not scored rather than guessed.
    Other families' unlabelled rows are the 16-bit type of their GPU (they predate FP8 training),
    except the BLOOM sweep's before its BF16_Optimizer, which kept 16-bit gradients: fp16
    (``BLOOM_FP32_ACCUMULATION_FROM``)."""
    text = row["precision"]
    if text is None and row["source_family"] == "nemo_megatron_bridge_perf":
        raise Unexpressible("precision not stated", "NeMo row without a precision (its tables run BF16 and FP8)")
    sixteen = "bf16" if node.hardware.supports("bf16") else "fp16"
    if row["source_family"] == "bloom_prequel_sweep" and _bloom_date(row) < BLOOM_FP32_ACCUMULATION_FROM:
        line = "fp16, 16-bit gradients (before BF16_Optimizer, BLOOM_FP32_ACCUMULATION_FROM)"
        if text is None:
            notes.assume("precision=fp16 (BLOOM chronicle)", f"precision not stated: {line}")
        else:
            notes.append(f"precision {text!r}: {line}")
        return "fp16", None
    if text is None:
        notes.assume(f"precision={sixteen}", f"precision not stated: {sixteen}")
        return sixteen, None
    for pattern, precision, recipe in PRECISION_RECIPES:
        if re.search(pattern, text, re.IGNORECASE):
            if not node.hardware.supports(precision):
                raise Unexpressible(f"{precision} recipe (no {precision} rate)", f"{text} on {node.hardware.name}")
            notes.append(f"precision {text!r}: {precision}" + (f", {recipe} scaling" if recipe else ""))
            return precision, recipe
    if re.search(r"fp8|float8", text, re.IGNORECASE):
        raise Unexpressible("FP8 recipe (unrecognised)", text)
    if re.search(r"fp16", text, re.IGNORECASE):
        return "fp16", None
    if re.search(r"bf16", text, re.IGNORECASE):
        return "bf16", None
    notes.append(f"precision {text!r}: bf16")
    return sixteen, None


OMNI_PATH_LINK_GBIT_PER_S = 100
"""Intel Omni-Path Architecture 100 Series: 100 Gb/s per port and direction (Intel OPA 100 Series
product brief)."""


def _with_row_network(node: NodeSpec, row: dict, notes: Notes) -> NodeSpec:
    """The preset node, with the network the row states where it names one the preset lacks: Jean
    Zay's A100 nodes (the BLOOM rows) have 'N OPA links per node', Omni-Path at 100 Gb/s each, not
    the DGX A100's eight 200 Gb/s HDR InfiniBand NICs."""
    text = row["hardware"].get("inter_node") or ""
    found = re.search(r"(\d+)\s+OPA links per node", text)
    if not found:
        return node
    links = int(found.group(1))
    notes.append(f"network {text!r}: {links} x {OMNI_PATH_LINK_GBIT_PER_S} Gb/s per node")
    network = replace(node.inter_node, nics_per_node=links, nic_bandwidth_bytes_per_s=OMNI_PATH_LINK_GBIT_PER_S * GBIT)
    return replace(node, inter_node=network)


def _bloom_date(row: dict) -> tuple[int, int]:
    """(month, day) of a BLOOM prequel row, from its location's date ('... 02-21)')."""
    found = re.findall(r"\b(\d\d)-(\d\d)\b", row["source"].get("location") or "")
    if not found:
        raise Unexpressible("no date", "BLOOM prequel row without a date in its location")
    month, day = found[-1]
    return int(month), int(day)


def _global_batch(par: dict, seq_len: int) -> int:
    if par["global_batch_size"]:
        return int(par["global_batch_size"])
    tokens = par["global_batch_tokens"]
    if isinstance(tokens, int) and tokens % seq_len == 0:
        return tokens // seq_len
    raise Unexpressible("missing layout", f"global batch {tokens!r} tokens")


def _layout(row: dict, model: ModelSpec, num_gpus: int, global_batch: int, notes: Notes) -> Layout:
    family, par = row["source_family"], row["parallel"]
    schedule_text = par["pp_schedule"] or ""
    if "DualPipe" in schedule_text:
        raise Unexpressible("DualPipe schedule", schedule_text)
    tp, pp, cp = par["tp"] or 1, par["pp"] or 1, par["cp"] or 1
    if (par["tp"] is None or par["pp"] is None) and family == "megatron_sc21_table2" and par["dp"]:
        # PTD-P rows give dp only. SC'21 runs tp 8 inside each DGX A100 for every model above 18B
        # (Table 1); pp is what remains of the GPUs (175B: 384 / (4 x 8) = 12; 530B: 560 / (2 x 8) = 35).
        tp, pp = 8, num_gpus // (par["dp"] * 8 * cp)
        notes.assume("tp,pp=SC'21 rule", f"tp, pp not given: tp 8 (one DGX, as in SC'21 Table 1), pp {pp} = GPUs / (dp x tp)")
    elif par["tp"] is None or par["pp"] is None:
        raise Unexpressible("missing layout", "tp or pp not given")
    dp = par["dp"] or num_gpus // (tp * pp * cp)
    if dp * tp * pp * cp != num_gpus:
        raise Unexpressible("missing layout", f"dp {dp} x tp {tp} x pp {pp} x cp {cp} != {num_gpus} GPUs")
    vpp = _virtual_stages(par, family, pp, notes)
    split = _stage_split(family, model.num_layers, pp, vpp, notes, row["model"]["name"] or "")
    micro = par["micro_batch_size"] or _micro_batch(family, global_batch // dp, pp, vpp, notes)
    if global_batch % (dp * micro):
        raise Unexpressible("batch not divisible", f"global batch {global_batch} over dp {dp} x micro-batch {micro}")
    microbatches = global_batch // (dp * micro)
    _check_grad_accum(par, global_batch, dp, micro, microbatches)
    if vpp > 1 and microbatches % pp:
        raise Unexpressible("interleaving needs m % pp == 0", f"{microbatches} micro-batches, pp {pp}")
    ep = par["ep"] or 1
    expert_tp = 0
    if dp % ep and (tp * cp * dp) % ep == 0:
        expert_tp = max(e for e in range(1, tp + 1) if tp % e == 0 and (tp * cp * dp) % (ep * e) == 0)
        notes.assume("expert_tp=largest", f"ep {ep} exceeds dp {dp}: experts folded into tp x cp x dp with expert tp {expert_tp} "
                     "(Megatron --expert-tensor-parallel-size; not given, the largest that fits)")
    sp = _sequence_parallel(par, family, tp, notes)
    return Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, expert_tp=expert_tp, zero_stage=_zero_stage(par, family, notes),
                  sequence_parallel=sp, tp_comm_overlap=sp and _tp_comm_overlap(row, notes), micro_batch_size=micro,
                  num_microbatches=microbatches, schedule="interleaved" if vpp > 1 else "1f1b",
                  virtual_stages=vpp, layers_per_chunk=split,
                  recompute=_recompute(par["recompute"], family, notes, model))


def _check_grad_accum(par: dict, global_batch: int, dp: int, micro: int, microbatches: int) -> None:
    """Raise ``Unexpressible`` where the row states a gradient-accumulation count that its own
    global batch, dp and micro-batch contradict (GA = GBS / (dp · MBS), the definition NeMo's
    tables follow in every other row that gives GA): one of the stated figures is wrong, and the
    row does not say which, so its layout is not guessed."""
    stated = par.get("grad_accum")
    if stated and int(stated) != microbatches:
        raise Unexpressible("layout inconsistent", f"gradient accumulation {stated} stated, but global batch {global_batch} "
                            f"/ (dp {dp} x micro-batch {micro}) = {microbatches}")


def _virtual_stages(par: dict, family: str, pp: int, notes: Notes) -> int:
    """Virtual stages per rank: the row's ``vpp``; else what its ``pp_schedule`` text names (an
    interleaved schedule under torchtitan: 2 stages per rank, ``generate_split_points`` in
    pytorch/torchtitan ``torchtitan/parallelisms/pipelining_utils.py`` @680647378f15, "the default
    if no pipeline split is specified"); else, with pp > 1, 1 (recorded as assumed)."""
    if par["vpp"]:
        return int(par["vpp"])
    text = (par["pp_schedule"] or "").lower()
    if pp > 1 and "interleaved" in text:
        if family != "torchtitan":
            raise Unexpressible("missing layout", f"{par['pp_schedule']!r} without virtual stages")
        notes.assume("virtual_stages=2 (torchtitan default)", f"pp schedule {par['pp_schedule']!r}, virtual stages "
                     "not given: 2 per rank (torchtitan's default split for a multi-stage schedule)")
        return 2
    if pp > 1 and not text:
        notes.assume("virtual_stages=1", "pipeline schedule not given: 1F1B without interleaving")
    return 1


def _micro_batch(family: str, local_batch: int, pp: int, vpp: int, notes: Notes) -> int:
    """Micro-batch size where the row gives none: torchtitan's pipeline default, as many
    micro-batches as stages (``build_pipeline_schedule``: ``n_microbatches = pp x stages per rank``
    when ``pipeline_parallel_microbatches`` is unset, same file), so the local batch over pp·v;
    else 1 (recorded as assumed)."""
    stages = pp * vpp
    if family == "torchtitan" and pp > 1 and local_batch % stages == 0:
        micro = local_batch // stages
        notes.assume("micro_batch_size=torchtitan default", f"micro-batch not given: {micro} = local batch "
                     f"{local_batch} / {stages} stages (torchtitan's default micro-batch count)")
        return micro
    notes.assume("micro_batch_size=1", "micro-batch not given: 1")
    return 1


def _stage_split(family: str, num_layers: int, pp: int, vpp: int, notes: Notes, name: str) -> tuple[int, ...]:
    """Layers per chunk when pp x vpp does not divide the layers: Llama 3's published rule, NeMo's
    embedding/loss accounting where its recipe sets it, else the balanced default (the source
    does not state the split)."""
    chunks = pp * vpp
    if pp == 1 or num_layers % chunks == 0:
        return ()
    per = (num_layers + 2) // chunks
    if family == "nemo_megatron_bridge_perf" and name in NEMO_EMBEDDING_LOSS_SPLIT and \
            (num_layers + 2) % chunks == 0 and per >= 2:
        notes.assume("stage_split=NeMo recipe", f"{num_layers} layers over pp {pp} x vpp {vpp}: the embedding and the loss count as one layer "
                     f"each (NeMo's recipe), {per - 1} layers on the first and last chunk, {per} on the others")
        return (per - 1,) + (per,) * (chunks - 2) + (per - 1,)
    if family == "llama3_405b" and vpp == 1:
        # Dubey et al. 2024, Sec. 3.3.2: one layer fewer on the first and the last pipeline stage
        per = -(-num_layers // pp)
        ends = num_layers - per * (pp - 2)
        if ends >= 2 and ends % 2 == 0:
            notes.assume("stage_split=Llama 3 paper", f"{num_layers} layers over pp {pp}: {ends // 2} on the first and last stage, {per} on "
                         "the others (Llama 3 paper Sec. 3.3.2)")
            return first_last_split(num_layers, pp, 1, ends // 2, ends // 2)
    notes.assume("stage_split=balanced", f"{num_layers} layers over pp {pp} x vpp {vpp}: split not given; balanced chunks, the first "
                 f"{num_layers % chunks} one layer more")
    return ()


def _zero_stage(par: dict, family: str, notes: Notes) -> int:
    if par["zero_stage"] is not None:
        return int(par["zero_stage"])
    if par["fsdp"]:
        return 3
    if family in MEGATRON_DEFAULT_FAMILIES:
        notes.assume("zero_stage=1 (Megatron-Core)", "ZeRO stage not given: 1 (Megatron-Core distributed optimizer)")
        return 1
    notes.assume("zero_stage=0", "ZeRO stage not given: 0")
    return 0


def _sequence_parallel(par: dict, family: str, tp: int, notes: Notes) -> bool:
    if par["sequence_parallel"] is not None:
        return bool(par["sequence_parallel"]) and tp > 1
    if tp > 1 and family in MEGATRON_DEFAULT_FAMILIES | {"llama3_405b", "torchtitan"}:
        notes.assume("sequence_parallel=on", "sequence parallel not given: on under tp")
        return True
    if tp > 1:
        notes.assume("sequence_parallel=off", "sequence parallel not given: off")
    return False


def _tp_comm_overlap(row: dict, notes: Notes) -> bool:
    """TP communication overlap (with SP and tp > 1) where the run or its recipe has it on:
    torchtitan's async-TP rows (the id says so), MegaScale's own system (its "-ms-" rows and Table 3
    ablation steps 4 on, "+ TP overlap"; Jiang et al. NSDI'24 Sec. 3.2), NeMo's performance
    summary, measured with the ``*_performance`` recipes, which add ``MegatronCommOverlapCallback(
    tp_comm_overlap=True)`` (NVIDIA/NeMo ``nemo/collections/llm/recipes/llama3_70b.py``), and the
    Megatron-LM README's scaling table ("Communication optimizations: ... TP (``--tp-comm-overlap``)").
    Elsewhere off: no other row states it."""
    family, run = row["source_family"], row["id"]
    ablation = re.search(r"ablation-(\d+)$", run)
    on = (family == "torchtitan" and ("asynctp" in run and not run.endswith("vanilla"))) or \
        (family == "megascale_2024" and ("-ms-" in run or (ablation is not None and int(ablation.group(1)) >= 4))) \
        or family in ("nemo_megatron_bridge_perf", "megatron_readme_h100")
    if on:
        notes.assume("tp_comm_overlap=on (recipe)", "TP communication overlap on (async TP, MegaScale's TP overlap, NeMo's performance recipe or "
                     "Megatron-LM's README benchmark)")
    return on


def _recompute(text: str | None, family: str, notes: Notes, model: ModelSpec) -> str:
    """The row's recompute mode; where it gives none, its recipe's (NeMo's DeepSeek-V3), its family's
    habit (the hardware-FLOP families ran full recomputation: SC'21, BLOOM, MT-NLG), else none.
    Never inferred from the measured figures."""
    if text is None and family == "nemo_megatron_bridge_perf" and model.mla is not None:
        # Megatron-Bridge scripts/performance/configs/deepseek/deepseek_llm_pretrain.py sets
        # recompute_granularity = "selective" for every DeepSeek-V3 run, and its workload presets
        # recompute "mla_up_proj" (deepseek_workload_base_configs.py): our selective on MLA
        notes.assume("recompute=selective (NeMo recipe)", "recompute not given: selective (NeMo's DeepSeek-V3 performance recipe: MLA up-projections)")
        return "selective"
    if text is None:
        if family in HARDWARE_FLOP_FAMILIES:
            notes.assume("recompute=full (family)", "recompute not given: full (this family's runs recompute)")
            return "full"
        notes.assume("recompute=none", "recompute not given: none")
        return "none"
    if OP_SAC.search(text):
        notes.append(f"recompute {text!r}: op-sac (torchtitan's op-level selective checkpointing, costmodels.op_sac)")
        return "op-sac"
    for mode in ("full", "selective", "none"):
        if text.startswith(mode):
            return mode
    raise Unexpressible("recompute mode", text)
