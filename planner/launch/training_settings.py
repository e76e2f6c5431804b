"""How long and how fast a framework job trains: the settings every framework needs to start that
the layout does not decide (steps, learning rate and its schedule), with one default each.

Megatron-LM refuses to start without ``--train-iters`` or ``--train-samples`` (``megatron/training/
training.py``: "either train-iters or train-samples should be provided"), and its ``--lr`` defaults to
None; Megatron-DeepSpeed has the same options (``megatron/arguments.py`` at 4efb479d); torchtitan
reads ``training.steps``, ``optimizer.lr`` and ``lr_scheduler.warmup_steps``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autoplan_base.errors import AutoplanError

_RELATIVE_PATH = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSettings:
    """The schedule a framework job trains with."""

    steps: int = 1000
    """Optimizer steps (iterations) to train; Megatron's ``--train-iters``, torchtitan's ``training.steps``."""
    lr: float = 3e-4
    """Peak learning rate, reached after the warm-up."""
    min_lr_ratio: float = 0.1
    """The learning rate the decay ends at, as a fraction of ``lr``."""
    warmup_steps: int = 100
    """Steps of linear warm-up from 0 to ``lr``: fewer than ``steps`` for the Megatron-LM and
    Megatron-DeepSpeed jobs (``require_schedulable``); the other jobs write at most ``steps``."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay."""
    log_dir: str = "logs"
    """Where the job writes its TensorBoard logs: a relative path (letters, digits, '.', '_', '-', '/'),
    in the job directory (torchtitan: in its dump folder there; ``framework_scripts.output_words``)."""
    log_interval: int = 10
    """Steps between log lines."""

    def __post_init__(self) -> None:
        for flag, value, low in (("--steps", self.steps, 1), ("--warmup-steps", self.warmup_steps, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise AutoplanError(f"{flag} {value!r}: expected an integer >= {low}")
        if not (isinstance(self.lr, float) and math.isfinite(self.lr) and self.lr > 0):
            raise AutoplanError(f"--lr {self.lr!r}: expected a positive number")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise AutoplanError(f"--min-lr-ratio {self.min_lr_ratio!r}: expected a number in [0, 1]")
        if not _RELATIVE_PATH.fullmatch(self.log_dir) or ".." in self.log_dir.split("/"):
            raise AutoplanError(f"log_dir={self.log_dir!r}: expected a relative path of letters, digits, '.', '_', "
                                "'-' and '/', without '..'")

    def summary(self) -> str:
        """One line for a job's header: what it trains for and where it writes."""
        return (f"training: {self.steps} steps, learning rate {self.lr:g} after {min(self.warmup_steps, self.steps)} "
                f"warm-up steps, cosine decay to {self.min_lr:g}; checkpoints and logs in the job directory "
                "(autoplan launch --steps, --lr, --warmup-steps, --min-lr-ratio)")

    @property
    def min_lr(self) -> float:
        return self.lr * self.min_lr_ratio


DEFAULT_SETTINGS = TrainingSettings()
"""What every framework job trains with unless the plan says otherwise: 1,000 steps of cosine decay
from 3e-4 to 3e-5 after 100 warm-up steps (the scale of the Llama 3 and GPT-3 papers' peak rates)."""

WARMUP_BELOW_STEPS = {
    "megatron": "Megatron-LM's OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps, "
                "megatron/core/optimizer_param_scheduler.py",
    "deepspeed": "Megatron-DeepSpeed's OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps, "
                 "megatron/optimizer_param_scheduler.py",
}
"""Runtimes whose learning-rate scheduler stops the job at start-up unless the warm-up is shorter than
the decay, which these jobs set to the whole run (``--lr-decay-iters`` = ``--train-iters`` = ``steps``,
``megatron_training_args``; ``get_optimizer_param_scheduler`` in ``megatron/training/training.py``
multiplies both by the global batch, so the order holds in samples too). Read in NVIDIA/Megatron-LM at
d98e8a64 and deepspeedai/Megatron-DeepSpeed at 4efb479d. Not listed, because they start and shorten
the warm-up with a warning instead: Megatron-Bridge (v0.4.0 on; ``_calculate_scheduler_steps`` in
``src/megatron/bridge/training/config.py`` caps ``lr_warmup_steps`` at ``lr_decay_steps - 1``) and
torchtitan (v0.2.2 ``components/lr_scheduler.py`` and 0.3.0 ``components/optimizer/lr_scheduler.py``
cap ``warmup_steps`` at the training steps)."""


def require_schedulable(settings: TrainingSettings, runtime: str) -> None:
    """Refuse, in one line naming ``--warmup-steps`` and ``--steps``, a warm-up of ``steps`` or more
    for a runtime whose scheduler would stop on it at start-up (``WARMUP_BELOW_STEPS``)."""
    reason = WARMUP_BELOW_STEPS.get(runtime)
    if reason is None or settings.warmup_steps < settings.steps:
        return
    default = " (its default)" if settings.warmup_steps == DEFAULT_SETTINGS.warmup_steps else ""
    raise AutoplanError(f"--warmup-steps {settings.warmup_steps}{default} is not below --steps {settings.steps}: "
                        f"the {runtime} job would stop at start-up ({reason}); pass a --warmup-steps below "
                        f"{settings.steps} or a --steps above {settings.warmup_steps}")


def megatron_training_args(settings: TrainingSettings = DEFAULT_SETTINGS) -> list[str]:
    """Megatron-LM's (and Megatron-DeepSpeed's) training-length and learning-rate options: cosine decay
    over the whole run after a linear warm-up (``--lr-decay-style cosine``, ``_add_learning_rate_args``).
    Where the logs go is launch.sh's (``framework_scripts.output_words``)."""
    s = settings
    return ["--train-iters", str(s.steps), "--lr", repr(s.lr), "--min-lr", repr(s.min_lr),
            "--lr-decay-style", "cosine", "--lr-decay-iters", str(s.steps),
            "--lr-warmup-iters", str(min(s.warmup_steps, s.steps)), "--weight-decay", repr(s.weight_decay),
            "--log-interval", str(s.log_interval)]


def torchtitan_training_sections(settings: TrainingSettings = DEFAULT_SETTINGS) -> dict[str, dict]:
    """torchtitan's (v0.2.2 ``JobConfig``) steps, learning rate, warm-up and cosine decay, and its logs."""
    s = settings
    return {"training": {"steps": s.steps}, "optimizer": {"lr": s.lr, "weight_decay": s.weight_decay},
            "lr_scheduler": {"warmup_steps": min(s.warmup_steps, s.steps), "decay_type": "cosine",
                             "min_lr_factor": s.min_lr_ratio},
            "metrics": {"enable_tensorboard": True, "save_tb_folder": s.log_dir, "log_freq": s.log_interval}}
