"""The layouts ``gpu_truth.py`` measures: one GPU (or one CPU process), data parallel 1, no
gradient accumulation, so each job's step is exactly what the single-device cost terms describe.

The GPU sweep covers three Llama-shaped models (Qwen2.5-0.5B, Llama-3.2-1B, Llama-3-8B cut to
4 layers), micro-batch 1, 2 and 4, recomputation none, selective and full, sequences of 2k and
8k tokens: 12 jobs, chosen so each axis moves with the others held (mb 1 -> 4 on one model and
sequence; none -> selective -> full at one shape) and every predicted peak (datasheet, 2026-11-26) stays under 51 GiB
of an 80 GiB device. The CPU quick sweep has the same structure at toy sizes (8 jobs).

The large sweep (issue #37, item 3) measures what large layers hold that small ones do not:
Llama-3-70B's layer (h 8192, f 28672, 64/8 heads) at tensor parallelism 1, cut to 2 layers with
Llama 2's 32,000-token vocabulary so the layers, not the logits, set the peak (recomputation none,
selective and full, sequences 2k-8k); and Llama-3-8B whole (32 layers, 128k vocabulary), which
with fp32 AdamW states needs about 124 GiB: measured only on a device with that much
(``Case.needs_device_gib``), and launched past the fit rule (``Case.allow_no_fit``), since the
measurement is of the limit itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = Path(__file__).parent / "data" / "gpu" / "models"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One single-device training job of the sweep."""

    model: str
    """Preset name (``autoplan models``) or a config.json path (HF style)."""
    seq_len: int
    """Tokens per sequence."""
    micro_batch_size: int
    """Sequences per micro-batch; also the global batch (one micro-batch per step, dp 1)."""
    recompute: str
    """none, selective or full (``autoplan evaluate --recompute``)."""
    needs_device_gib: float = 0.0
    """Device memory (GiB, as the hardware preset gives it) below which the case is recorded as
    skipped instead of measured; 0: any device of the sweep."""
    allow_no_fit: bool = False
    """Launch it even where the fit rule predicts no fit (``autoplan launch --allow-no-fit``)."""

    @property
    def model_label(self) -> str:
        return Path(self.model).stem if self.model.endswith(".json") else self.model

    @property
    def name(self) -> str:
        """A file-safe name: model, sequence, micro-batch, recompute."""
        return f"{self.model_label}-s{self.seq_len}-mb{self.micro_batch_size}-{self.recompute}"


def _model(stem: str) -> str:
    return str(MODELS_DIR / f"{stem}.json")


def gpu_sweep() -> tuple[Case, ...]:
    """12 jobs for one 80 GB GPU (bf16 autocast, fp32 AdamW states)."""
    q, l1, l8 = _model("qwen2.5-0.5b"), _model("llama3.2-1b"), _model("llama3-8b-4l")
    return (
        Case(model=q, seq_len=2048, micro_batch_size=1, recompute="none"),
        Case(model=q, seq_len=2048, micro_batch_size=4, recompute="none"),
        Case(model=q, seq_len=8192, micro_batch_size=1, recompute="selective"),
        Case(model=q, seq_len=8192, micro_batch_size=2, recompute="full"),
        Case(model=l1, seq_len=2048, micro_batch_size=1, recompute="none"),
        Case(model=l1, seq_len=2048, micro_batch_size=2, recompute="selective"),
        Case(model=l1, seq_len=2048, micro_batch_size=4, recompute="full"),
        Case(model=l1, seq_len=8192, micro_batch_size=1, recompute="none"),
        Case(model=l1, seq_len=8192, micro_batch_size=2, recompute="full"),
        Case(model=l8, seq_len=2048, micro_batch_size=1, recompute="none"),
        Case(model=l8, seq_len=2048, micro_batch_size=2, recompute="selective"),
        Case(model=l8, seq_len=8192, micro_batch_size=1, recompute="full"),
    )


def heldout_sweep() -> tuple[Case, ...]:
    """7 jobs at shapes the GPU sweep did not measure (sequence 1k and 4k, micro-batch 8), on the
    same three models: a record of them is held out from a fit made on the first sweep's record."""
    q, l1, l8 = _model("qwen2.5-0.5b"), _model("llama3.2-1b"), _model("llama3-8b-4l")
    return (
        Case(model=q, seq_len=4096, micro_batch_size=1, recompute="none"),
        Case(model=q, seq_len=4096, micro_batch_size=2, recompute="selective"),
        Case(model=l1, seq_len=4096, micro_batch_size=1, recompute="none"),
        Case(model=l1, seq_len=4096, micro_batch_size=2, recompute="selective"),
        Case(model=l1, seq_len=1024, micro_batch_size=8, recompute="none"),
        Case(model=l8, seq_len=4096, micro_batch_size=1, recompute="none"),
        Case(model=l8, seq_len=4096, micro_batch_size=2, recompute="full"),
    )


def large_sweep() -> tuple[Case, ...]:
    """6 jobs of large layers (module docstring): the 70B layer at tp 1 in five shapes, each
    predicted (2026-11-28) at 36-44 GiB of an 80 GiB device, and Llama-3-8B whole on a device of
    141 GB (H200), predicted at 124 GiB."""
    l70 = _model("llama3-70b-2l-v32k")
    return (
        Case(model=l70, seq_len=2048, micro_batch_size=1, recompute="none"),
        Case(model=l70, seq_len=4096, micro_batch_size=1, recompute="none"),
        Case(model=l70, seq_len=8192, micro_batch_size=1, recompute="selective"),
        Case(model=l70, seq_len=4096, micro_batch_size=2, recompute="full"),
        Case(model=l70, seq_len=8192, micro_batch_size=2, recompute="full"),
        Case(model="llama3-8b", seq_len=2048, micro_batch_size=1, recompute="full", needs_device_gib=130.0,
             allow_no_fit=True),
    )


def cpu_sweep() -> tuple[Case, ...]:
    """8 toy jobs for one CPU process (fp32), a few seconds each on one core."""
    tiny, qwen = "tiny-llama", _model("tiny-qwen")
    return (
        Case(model=tiny, seq_len=128, micro_batch_size=1, recompute="none"),
        Case(model=tiny, seq_len=128, micro_batch_size=4, recompute="none"),
        Case(model=tiny, seq_len=256, micro_batch_size=2, recompute="selective"),
        Case(model=tiny, seq_len=256, micro_batch_size=2, recompute="full"),
        Case(model=qwen, seq_len=128, micro_batch_size=1, recompute="none"),
        Case(model=qwen, seq_len=128, micro_batch_size=2, recompute="selective"),
        Case(model=qwen, seq_len=256, micro_batch_size=4, recompute="full"),
        Case(model=qwen, seq_len=256, micro_batch_size=1, recompute="none"),
    )
