"""Count the data-parallel collectives the launched job issues in one step's forward and
backward, per ZeRO stage (run under torchrun, 2 processes, CPU/gloo; ``tests/test_convention_run.py``).

    torchrun --standalone --nproc-per-node 2 tests/data/fsdp2_syncs.py out.json

Writes {stage: {num_microbatches: {collective op: count}}} and the number of FSDP units.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from contextlib import contextmanager

import torch.distributed as dist

from costmodels.layout import Layout
from costmodels.presets import load_model
from planner.launch.torchjob import trainer
from planner.launch.torchjob.data import SyntheticTokens

SEQ_LEN = 16
COUNTED = ("all_gather_single", "reduce_scatter_single", "all_reduce")
"""The ``torch.distributed`` calls FSDP2's collectives go through (``_fsdp_collectives.py``)."""


@contextmanager
def counting(counts: Counter):
    """Count calls of the ``COUNTED`` collectives while the block runs."""
    originals = {name: getattr(dist, name) for name in COUNTED}

    def wrap(name, fn):
        def counted(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def count_step(stage: int, m: int, device) -> dict[str, int]:
    """Collectives of the second step's forward and backward (the first one warms up)."""
    layout = Layout(dp=2, tp=1, pp=1, zero_stage=stage, num_microbatches=m, micro_batch_size=1)
    job = trainer.setup_job(load_model("tiny-llama"), layout, device=device)
    source = SyntheticTokens(job.vocab_size, 0)
    trainer.train_step(job, source, 0, seq_len=SEQ_LEN, max_norm=1.0)
    inputs, labels = trainer.replica_batch(job, source, 1, SEQ_LEN)
    counts: Counter = Counter()
    with counting(counts):
        trainer.forward_backward(job, inputs, labels)
    return dict(counts)


def main(out_path: str) -> None:
    device = trainer.pick_device()
    trainer.init_distributed(device)
    counts = {stage: {m: count_step(stage, m, device) for m in (2, 4)} for stage in range(4)}
    if dist.get_rank() == 0:
        units = load_model("tiny-llama").num_layers + 1
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump({"units": units, "counts": counts}, handle, indent=1, sort_keys=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
