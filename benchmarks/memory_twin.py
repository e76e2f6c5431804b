"""The memory of autoplan's own job on this CPU against the cost model's, at shapes scaled down from
large layers: where each step phase peaks, checked without a GPU.

Run: ``.venv/bin/python benchmarks/memory_twin.py [--case NAME ...] [--json]`` (10-40 s a case).

Each case trains the job the launcher writes (``planner.launch.torchjob``: ``setup_job``,
``train_step``, one process, gloo) for one step (which makes the optimizer's states), then one more under ``torch.profiler`` with
``profile_memory``: every allocation and free of that step, so the peak of live tensor bytes over it,
plus the parameters and optimizer states alive before it (no gradient is: the job zeroes them to
None) is the step's peak allocation, as ``torch.cuda.max_memory_allocated`` is on a GPU. The job
runs under ``torch.autocast(dtype=bfloat16)`` as it does on CUDA (``trainer._autocast``; on the CPU
the launched job would run fp32). The model predicts the same job with ``--hardware cpu``, whose
one difference from a GPU here is RMSNorm's CPU composite (``activations.torch_norm_bytes``): its
peak less what lies outside the tensors (``StageMemory.overhead_parts``).

The shapes keep the ratios of large layers at tensor parallelism 1 (hidden, FFN, sequence and
vocabulary scaled by one factor, so a layer's gradients keep their size against its activations and
the logits): ``l70`` is Llama-3-70B's layer (h 8192, f 28672, GQA 8:1) cut to 2 layers with a 32k
vocabulary, scaled 1/32; ``l8`` Llama-3-8B's cut to 4 layers with its 128k vocabulary, 1/16;
``qwen`` Qwen2.5-0.5B's (tied embeddings), 1/7.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES: dict[str, dict] = {
    "l70": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 896, "num_hidden_layers": 2,
            "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 1000,
            "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False},
    "l8": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 896, "num_hidden_layers": 4,
           "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 8016,
           "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False},
    "qwen": {"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 608, "num_hidden_layers": 3,
             "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 18992,
             "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True},
}
"""Hugging Face style configs of the scaled shapes (module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One single-process job: shape, sequence, micro-batch, micro-batches per step, recompute."""

    shape: str
    seq_len: int
    micro_batch_size: int
    num_microbatches: int = 1
    recompute: str = "none"

    @property
    def name(self) -> str:
        return f"{self.shape}-s{self.seq_len}-mb{self.micro_batch_size}x{self.num_microbatches}-{self.recompute}"


CASES: tuple[Case, ...] = (
    Case(shape="l70", seq_len=128, micro_batch_size=1),
    Case(shape="l70", seq_len=256, micro_batch_size=1, recompute="selective"),
    Case(shape="l70", seq_len=128, micro_batch_size=2, recompute="full"),
    Case(shape="l70", seq_len=128, micro_batch_size=1, num_microbatches=2),
    Case(shape="l70", seq_len=512, micro_batch_size=1, recompute="full"),
    Case(shape="l8", seq_len=128, micro_batch_size=1),
    Case(shape="l8", seq_len=128, micro_batch_size=1, num_microbatches=2),
    Case(shape="qwen", seq_len=256, micro_batch_size=1),
    Case(shape="qwen", seq_len=512, micro_batch_size=2, recompute="full"),
)


def predicted(case: Case, config: Path) -> tuple[float, float, str]:
    """(the model's peak tensor bytes of the job on ``--hardware cpu``, the same by the rule before the
    step phases: activations at the loss backward with max(0, G - A) of the gradients, or all of
    them when held, the phase that sets the peak)."""
    import planner

    layout = planner.Layout(micro_batch_size=case.micro_batch_size, num_microbatches=case.num_microbatches,
                            recompute=case.recompute)
    stage = planner.evaluate(model=str(config), hardware="cpu", gpus=1, gpus_per_node=1, runtime="torch",
                             global_batch=case.micro_batch_size * case.num_microbatches, seq_len=case.seq_len,
                             precision="bf16", layout=layout).peak_stage
    grads, acts = stage.grads_bytes + stage.grads_freed_bytes, stage.schedule_activations_bytes
    held = case.num_microbatches > 1
    before = stage.params_bytes + stage.optimizer_bytes + stage.buffers_bytes + acts \
        + (grads if held else max(0.0, grads - acts))
    return stage.total_bytes - stage.overhead_bytes, before, stage.peak_phase


def measured(case: Case, config: Path) -> float:
    """The job's peak live tensor bytes over one step (module docstring)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from costmodels.presets import load_model
    from costmodels.layout import Layout
    from planner.launch.torchjob.data import SyntheticTokens
    from planner.launch.torchjob.trainer import setup_job, train_step

    spec = load_model(str(config))
    layout = Layout(micro_batch_size=case.micro_batch_size, num_microbatches=case.num_microbatches,
                    recompute=case.recompute)
    job = setup_job(spec, layout, device=torch.device("cpu"), precision="bf16")
    job.autocast_dtype = torch.bfloat16  # as on CUDA
    source = SyntheticTokens(spec.vocab_size, 0)
    for step in range(1):  # the first step makes the optimizer's states
        train_step(job, source, step, seq_len=case.seq_len, max_norm=1.0)
    before = sum(p.numel() * p.element_size() for p in job.params)
    before += sum(t.numel() * t.element_size() for opt in job.optimizers for state in opt.state.values()
                  for t in state.values() if torch.is_tensor(t))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(job, source, 1, seq_len=case.seq_len, max_norm=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    del job
    dist.barrier()
    peak = max((e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"), default=0)
    return before + peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES], help="only this case (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON document: a list of cases")
    args = parser.parse_args(argv)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29541"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in (c for c in CASES if not args.case or c.name in args.case):
            config = Path(tmp) / f"{case.shape}.json"
            config.write_text(json.dumps(SHAPES[case.shape]), encoding="utf-8")
            model_bytes, before_bytes, phase = predicted(case, config)
            job_bytes = measured(case, config)
            rows.append({"case": case.name, "measured_bytes": job_bytes, "predicted_bytes": model_bytes,
                         "phase": phase, "error": model_bytes / job_bytes - 1,
                         "loss_phase_rule_error": before_bytes / job_bytes - 1})
    dist.destroy_process_group()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'case':28} {'measured MB':>12} {'predicted MB':>13} {'error':>7} {'before':>7}  phase that sets the peak")
    for r in rows:
        print(f"{r['case']:28} {r['measured_bytes'] / 1e6:12.3f} {r['predicted_bytes'] / 1e6:13.3f} "
              f"{r['error']:+7.2%} {r['loss_phase_rule_error']:+7.2%}  {r['phase']}")
    print("before: the rule before the step phases (activations at the loss backward, max(0, G - A) of the "
          "gradients; all of them when held)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
