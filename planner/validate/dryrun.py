"""Dry run: the training step of a plan at its real size, on fake tensors, one rank at a time.

    python -m planner.validate.dryrun plan.json out.json

No memory is allocated and no process is started per rank: a fake process group (PyTorch's
``fake`` backend, its collectives return at once) stands in for the job, and the model parts
are built exactly as the generated job builds them (``planner.launch.torchjob``: meshes, stage split,
recomputation wrappers, TP/SP, FSDP2) on the meta device, then materialised under
``FakeTensorMode``. The step runs forward, backward and the optimizer step on fake tensors
with ``MemoryProbe`` counting parameters, gradients, optimizer states and saved activations.
(``torch.distributed._tools.mem_tracker.MemTracker`` refuses a module called once per
micro-batch, as this step does, so the probe's own sum at one instant gives the peak.)

Differences from the real job, by necessity: the device is the CPU, with the precision policy
the job applies on CUDA (bf16/fp16 compute, fp32 master weights, gradients and reduction);
weights are not initialised (their values do not change memory); gradient clipping is skipped
(it reads a value); RMSNorm keeps what the plan's GPU keeps, not the CPU's composite
(``fused_norm.gpu_rms_norm``); and with pp > 1 the schedule's order of forwards and backwards
(``schedule.rank_order``) is replayed on the rank's stages, with fake tensors in place of the
activations a neighbour would send, because the pipelining runtime exchanges shapes by value.
Output: {"plan": ..., "ranks": [{"pp_rank", "rank", "params", "grads", "optimizer", "states",
"activations", "total", "seconds"}]}.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import replace

import torch
import torch.distributed as dist

from costmodels.layout import Layout
from planner.launch.torchjob import context_parallel, experts, trainer
from planner.plan.plan_file import read_plan_file
from planner.launch.torchjob.parallel import build_meshes, build_parts, parallelize, shard_embedding_grads

from .fused_norm import gpu_rms_norm
from .probe import MemoryProbe
from .schedule import rank_order

MIXED = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def _mp_policy(precision: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision in MIXED:
        return MixedPrecisionPolicy(param_dtype=MIXED[precision], reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def build_fake_job(spec, layout: Layout, rank: int, precision: str, optimizer: str, lora_rank: int = 0,
                   lora_targets: tuple[str, ...] = ()):
    """(job, fake mode): the rank's job with the runtime's own construction, parameters fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    device = torch.device("cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    meshes = build_meshes(layout, "cpu")
    pp_rank = meshes.world.get_local_rank("pp")
    job = trainer.Job(spec=spec, layout=layout, device=device, meshes=meshes,
                      dp_rank=trainer.data_parallel_rank(meshes, layout), context=trainer.context_group(meshes, device))
    parts = build_parts(spec, layout, meshes, pp_rank)
    for _, part in parts:
        parallelize(part, layout, meshes, _mp_policy(precision), lora=(lora_rank, lora_targets))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        for index, part in parts:
            part.to_empty(device=device)
            shard_embedding_grads(part)
            context_parallel.attach(part, job.context)
            experts.configure(part, layout)
            part.train()
            job.parts.append((index, part))
            job.optimizers.append(trainer.make_optimizer(optimizer, trainer.trainable(part), 3e-4, 0.1))
    indices = [index for index, _ in job.parts]
    job.has_first, job.has_last = 0 in indices, layout.num_chunks - 1 in indices
    if precision in MIXED and meshes.dp is None:
        job.autocast_dtype = MIXED[precision]
    return job, mode


def _stage_input(job, index: int, tokens: torch.Tensor, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    if index == 0:
        return tokens
    L = job.layout
    s = seq_len // L.tp if L.sequence_parallel and L.tp > 1 else seq_len
    return torch.empty(L.micro_batch_size, s, job.spec.hidden_size, dtype=dtype).requires_grad_()


def _set_sync(part, sync: bool) -> None:
    from torch.distributed.fsdp import FSDPModule

    if isinstance(part, FSDPModule):
        part.set_requires_gradient_sync(sync)


def pipeline_step(job, tokens: torch.Tensor, seq_len: int, dtype: torch.dtype) -> None:
    """Replay the schedule's forwards and backwards on this rank's stages (``rank_order``)."""
    L = job.layout
    pp_rank = job.meshes.world.get_local_rank("pp")
    m = L.num_microbatches
    micro = tokens.chunk(m)
    # what a neighbour sends is its residual stream: fp32 under autocast (fp32 embeddings plus
    # 16-bit branches promote), the compute dtype under FSDP2's mixed-precision policy
    dtype = torch.float32 if job.autocast_dtype is not None else dtype
    held: dict[tuple[int, int], torch.Tensor] = {}
    received: dict[tuple[int, int], torch.Tensor] = {}
    job.recv_buffers = []
    for kind, chunk, j in rank_order(L.schedule, L.pp, pp_rank, m, L.virtual_stages):
        index, part = job.parts[chunk]
        if kind == "F":
            with _autocast(job):
                if index == 0:
                    out = part(micro[j])
                else:  # one receive buffer per micro-batch, kept for the step as the runtime does
                    if (chunk, j) not in received:
                        received[(chunk, j)] = _stage_input(job, index, micro[j], seq_len, dtype)
                        job.recv_buffers.append(received[(chunk, j)])
                    out = part(received[(chunk, j)])
                if index == L.num_chunks - 1:
                    out = trainer.loss_fn(out, micro[j]) / m
            held[(chunk, j)] = out
            continue
        out = held.pop((chunk, j))
        _set_sync(part, j == m - 1)
        out.backward(None if out.dim() == 0 else torch.empty_like(out))


def _autocast(job):
    if job.autocast_dtype is None:
        return nullcontext()
    return torch.autocast("cpu", dtype=job.autocast_dtype)


def run_step(job, seq_len: int, dtype: torch.dtype, batch_rows: int | None = None) -> None:
    """One training step (no clipping) on fake tensors (this cp rank's share of each sequence).
    ``batch_rows``: sequences of the plan's replica batch when the job steps fewer micro-batches
    (``stepped_layout``); the token ids are drawn for all of them and the job reads its first
    rows, so the ids' storage, which the embedding saves, is as large as in the real step."""
    tokens = torch.randint(0, job.spec.vocab_size, (batch_rows or job.replica_batch, seq_len))
    if job.context is not None:
        tokens = context_parallel.shard_sequence(tokens, job.context.degree, job.context.rank)
        seq_len //= job.context.degree
    tokens = tokens[:job.replica_batch]
    if job.layout.pp > 1:
        pipeline_step(job, tokens, seq_len, dtype)
    else:
        trainer.forward_backward(job, tokens, tokens)
    for optimizer in job.optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def measure_rank(spec, layout: Layout, rank: int, seq_len: int, precision: str, optimizer: str,
                 lora_rank: int = 0, lora_targets: tuple[str, ...] = (), *, gpu: bool = True) -> dict:
    """Probe the second step of one rank (the optimizer states exist by then), stepping the
    micro-batches of ``stepped_layout(layout)``; ``gpu``: the plan is for a GPU (its RMSNorm
    keeps what the fused kernel keeps, ``fused_norm``)."""
    began = time.perf_counter()
    job, mode = build_fake_job(spec, stepped_layout(layout), rank, precision, optimizer, lora_rank, lora_targets)
    dtype = MIXED.get(precision, torch.float32)
    rows = layout.micro_batch_size * layout.num_microbatches
    with mode, gpu_rms_norm(gpu):
        run_step(job, seq_len, dtype, rows)
        with MemoryProbe(job) as probe:
            run_step(job, seq_len, dtype, rows)
    result = {"rank": rank, "pp_rank": job.meshes.world.get_local_rank("pp"), **probe.peak,
              "seconds": time.perf_counter() - began}
    dist.destroy_process_group()
    return result


STEPPED_MICROBATCHES = 3
"""Micro-batches a pp = 1 dry run steps, of the plan's m: the first (no gradient yet), one in the
middle (accumulating) and the last (synchronising gradients). Micro-batches 2 .. m-1 allocate and
free the same tensors in the same order, so their peaks are equal and one stands for all."""


def stepped_layout(layout: Layout) -> Layout:
    """``layout`` with the micro-batches the dry run steps (``STEPPED_MICROBATCHES``; pipelines
    keep all of theirs, since their schedule holds several in flight)."""
    if layout.pp > 1 or layout.num_microbatches <= STEPPED_MICROBATCHES:
        return layout
    return replace(layout, num_microbatches=STEPPED_MICROBATCHES)


def pipeline_ranks(layout: Layout) -> list[int]:
    """One global rank per pipeline stage (tp, dp ranks of a stage are alike): i · dp · tp · cp."""
    return [i * layout.dp * layout.tp * layout.cp for i in range(layout.pp)]


def in_child(fn, *args) -> dict:
    """``fn(*args)`` (a JSON-able dict) in a child forked from this interpreter, which must not have
    made a process group (one cannot be re-created cleanly in one process) nor run a torch op (the
    child would inherit its thread pool's state). The child is a process of its own, as a fresh
    interpreter is, but inherits the imports (torch, and ``torch._dynamo``, which FSDP2 and DTensor
    import on first use: about 4 s of CPU per rank on a 2-core machine)."""
    import multiprocessing
    import traceback

    import torch._dynamo  # noqa: F401  (imported once here, before the fork)

    def child(conn) -> None:
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as error:  # noqa: BLE001  (reported to the parent, which raises)
            traceback.print_exc()
            conn.send(("error", f"{type(error).__name__}: {error}"))

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(send,))
    process.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:  # it died without a word (a signal, os._exit)
        status, value = "error", "it exited without a result"
    process.join()
    if status != "ok":
        raise SystemExit(value)
    return value


def _rank_in_child(plan_path: str, rank: int) -> dict:
    try:
        return in_child(_rank_here, plan_path, rank)
    except SystemExit as error:
        raise SystemExit(f"dry run of rank {rank} failed: {error}") from None


def _rank_here(plan_path: str, rank: int) -> dict:
    """One rank in this interpreter (which must not have made a process group before)."""
    from hardware_specs import load_node

    plan = read_plan_file(plan_path)
    t = plan.inputs.training
    gpu = load_node(plan.inputs.hardware).hardware.device_type != "cpu"
    return measure_rank(plan.inputs.model_spec, plan.best.layout, rank, t.seq_len, t.precision, t.optimizer,
                        t.lora_rank, t.lora_targets, gpu=gpu)


def main(argv: list[str]) -> None:
    """``plan.json out.json [rank]``: one rank in this process, or every pipeline rank in turn, each
    in a child forked from this process (``in_child``)."""
    warnings.filterwarnings("ignore")
    plan_path, out_path = argv[:2]
    if len(argv) > 2:
        result = _rank_here(plan_path, int(argv[2]))
    else:
        ranks = [_rank_in_child(plan_path, r) for r in pipeline_ranks(read_plan_file(plan_path).best.layout)]
        result = {"plan": plan_path, "ranks": ranks}
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1, sort_keys=True, allow_nan=False)


if __name__ == "__main__":
    main(sys.argv[1:])
