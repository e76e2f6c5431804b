"""How long and how fast a framework job trains: the settings every framework needs to start that
the layout does not decide (steps, learning rate and its schedule), with one default each.

Megatron-LM refuses to start without ``--train-iters`` or ``--train-samples`` (``megatron/training/
training.py``: "either train-iters or train-samples should be provided"), and its ``--lr`` defaults to
None; Megatron-DeepSpeed has the same options (``megatron/arguments.py`` at 4efb479d); torchtitan
reads ``training.steps``, ``optimizer.lr`` and ``lr_scheduler.warmup_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Steps of linear warm-up from 0 to ``lr`` (at most ``steps``)."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay."""

    @property
    def min_lr(self) -> float:
        return self.lr * self.min_lr_ratio


DEFAULT_SETTINGS = TrainingSettings()
"""What every framework job trains with unless the plan says otherwise: 1,000 steps of cosine decay
from 3e-4 to 3e-5 after 100 warm-up steps (the scale of the Llama 3 and GPT-3 papers' peak rates)."""


def megatron_training_args(settings: TrainingSettings = DEFAULT_SETTINGS) -> list[str]:
    """Megatron-LM's (and Megatron-DeepSpeed's) training-length and learning-rate options: cosine decay
    over the whole run after a linear warm-up (``--lr-decay-style cosine``, ``_add_learning_rate_args``)."""
    s = settings
    return ["--train-iters", str(s.steps), "--lr", repr(s.lr), "--min-lr", repr(s.min_lr),
            "--lr-decay-style", "cosine", "--lr-decay-iters", str(s.steps),
            "--lr-warmup-iters", str(min(s.warmup_steps, s.steps)), "--weight-decay", repr(s.weight_decay)]
