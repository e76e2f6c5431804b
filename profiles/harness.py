"""The profiling harness: run under torchrun, one process per device.

    torchrun --standalone --nproc-per-node 8 -m profiles.harness --device cuda --out P.json
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m profiles.harness --device cuda --out P.json

Every rank gathers every rank's device identity (mixed devices are refused unless
``--allow-mixed-devices``), sets TF32 off, burns in, then measures compute on its own device at
the same time as the others; a point's time is the slowest rank's median over rounds, since a
synchronous step runs at the pace of its slowest device. Then all ranks take part in every
collective layout (``bench_comm``). Rank 0 fits and writes the file. torch is imported inside
functions only, so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable

from .match import mixed_device_problems
from .provenance import device_identity, device_state, load_average, provenance, set_numerics
from .schema import MEMORY_KERNELS
from .shapes import MeasurePlan, fit_to_memory, group_layouts, make_plan

Task = tuple[str, Callable[[], Any]]


class Progress:
    """Rank 0 reports each finished task: a JSON line to ``path`` (read by ``autoplan profile``),
    or a line on stdout when run by hand."""

    def __init__(self, path: str | None, total: int, enabled: bool) -> None:
        self.path, self.total, self.enabled, self.done = path, total, enabled, 0

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.path is None:
            print(f"[{self.done}/{self.total}] {what}", flush=True)
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"done": self.done, "total": self.total, "what": what}) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m profiles.harness", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--out", required=True, help="profile JSON to write (rank 0)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and sizes (under a minute on CPU)")
    parser.add_argument("--only", choices=("compute", "collectives"), default=None,
                        help="measure one phase only (default: both)")
    parser.add_argument("--progress-file", default=None, help="append JSON progress lines here")
    parser.add_argument("--command", default=None, help="command line to record in the provenance")
    parser.add_argument("--allow-mixed-devices", action="store_true",
                        help="profile ranks with different devices (each point then records the slowest)")
    return parser.parse_args(argv)


def compute_tasks(plan: MeasurePlan, dtypes: list[str], device: Any, timer: Any,
                  raw: dict[str, Any]) -> list[Task]:
    """One task per measured compute point; each appends its median to ``raw``."""
    from . import bench_compute as bc

    def gemm(dtype: str, m: int, n: int, k: int) -> Task:
        def run() -> None:
            t = bc.median_time_s(bc.gemm_call(m, n, k, dtype, device, plan.flush_bytes), timer, plan)
            raw["gemm"].setdefault(dtype, []).append({"m": m, "n": n, "k": k, "time_s": t})
        return f"gemm {dtype} {m}x{n}x{k}", run

    def attention(dtype: str, b: int, s: int, a: int, d: int) -> Task:
        def run() -> None:
            t = bc.median_time_s(bc.attention_call(b, s, a, d, dtype, device), timer, plan)
            raw["attention"].setdefault(dtype, []).append(
                {"batch": b, "seq_len": s, "num_heads": a, "head_dim": d, "time_s": t})
        return f"attention {dtype} s={s} d={d}", run

    def memory(kernel: str, size: int) -> Task:
        def run() -> None:
            t = bc.median_time_s(bc.memory_call(kernel, size, device, plan.flush_bytes), timer, plan)
            raw["memory"].setdefault(kernel, []).append({"size_bytes": size, "time_s": t})
        return f"{kernel} {size >> 20} MiB", run

    tasks = [gemm(d, *shape) for d in dtypes for shape in plan.gemm_shapes]
    tasks += [attention(d, *shape) for d in dtypes if d != "fp8" for shape in plan.attention_shapes]
    tasks += [memory(kernel, size) for kernel in MEMORY_KERNELS for size in plan.memory_sizes_bytes]
    return tasks


def comm_tasks(plan: MeasurePlan, device: Any, timer: Any, raw: dict[str, Any]) -> list[Task]:
    """One task per (group layout, collective); every rank runs all of them in the same order.
    A layout's groups are made at its first collective and destroyed after its last, and the
    device's cached memory released, in every round."""
    import torch.distributed as dist

    from . import bench_comm as bm

    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    tasks: list[Task] = []
    for layout in group_layouts(dist.get_world_size(), local):
        ops = bm.ops_for(layout)
        joined: list[Any] = []

        def run(op: str, layout: Any = layout, joined: list[Any] = joined, last: str = ops[-1]) -> None:
            if not joined:
                joined.extend(bm.join_layout(layout))
            curve = bm.measure_curve(op, layout, joined[0], joined[1], plan, timer, device)
            if curve is not None and dist.get_rank() == 0:
                raw["collectives"].append(curve)
            if op == last:
                bm.leave_layout(joined[0])
                joined.clear()
                release_memory(device)

        where = f"{layout.ranks_per_node}/node x {layout.num_nodes} node(s)"
        tasks += [(f"{op} x{layout.num_ranks} {where}", lambda op=op, run=run: run(op)) for op in ops]
    return tasks


def release_memory(device: Any) -> None:
    """Free what the last phase or layout left behind: Python garbage, and on GPU the caching
    allocator's unused blocks, so the next buffers fit on a 24-40 GB or shared device."""
    import gc

    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def pool_medians(records: list[dict[str, Any]], value: str = "time_s",
                 pool: Callable[[list[float]], float] = statistics.median) -> list[dict[str, Any]]:
    """Records with equal keys (all but ``value``) merged into one whose ``value`` is ``pool`` of
    theirs (the median by default); first-seen order is kept. Used over rounds and ranks."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        key = json.dumps({k: v for k, v in record.items() if k != value}, sort_keys=True)
        groups.setdefault(key, []).append(record)
    return [{**group[0], value: pool([r[value] for r in group])} for group in groups.values()]


def merge_compute(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Compute records of every rank and round: each rank's median over rounds, then the
    slowest rank's (a synchronous step waits for its slowest device)."""
    merged: dict[str, Any] = {}
    for family in ("gemm", "attention", "memory"):
        keys = sorted({key for r in per_rank for key in r[family]})
        merged[family] = {key: pool_medians([p for r in per_rank for p in pool_medians(r[family].get(key, []))],
                                            pool=max)
                          for key in keys}
    sustained = [s for r in per_rank for s in r.get("sustained", [])]
    if sustained:  # the rank that keeps the least of its burst rate: a step waits for it
        merged["sustained"] = [min(sustained, key=lambda s: s["burst_s"] / s["sustained_s"])]
    return merged


CURVE_KEY = ("op", "num_ranks", "ranks_per_node", "num_nodes", "dtype")


def merge_curves(curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Collective sweeps of every round, pooled to one time per (curve, size): the median over
    rounds (each already the world's slowest group). The minimum would bias the curve low: a
    step in training does not get to keep its calmest attempt."""
    points = [{**{k: c[k] for k in CURVE_KEY}, "size": s, "time_s": t}
              for c in curves for s, t in zip(c["sizes_bytes"], c["median_time_s"])]
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p in pool_medians(points):
        key = tuple(p[k] for k in CURVE_KEY)
        curve = merged.setdefault(key, dict(zip(CURVE_KEY, key), sizes_bytes=[], median_time_s=[]))
        curve["sizes_bytes"].append(p["size"])
        curve["median_time_s"].append(p["time_s"])
    return list(merged.values())


def setup(device_type: str) -> Any:
    """Initialise the process group (gloo on CPU, NCCL on GPU) and this rank's device."""
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already fixed by an earlier parallel call; one intra-op thread is what matters
    dist.init_process_group("gloo")
    return torch.device("cpu")


def gather_identities(device: Any) -> list[dict[str, Any]]:
    """Every rank's ``device_identity``, in rank order (on every rank)."""
    import torch.distributed as dist

    identities: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(identities, device_identity(device))
    return identities


def burn_in_device(plan: MeasurePlan, dtypes: list[str], device: Any, timer: Any) -> dict[str, Any] | None:
    """``plan.burn_in_s`` of the plan's largest GEMM in its fastest dtype, timed in a burst before
    and again at the end (``bench_compute.sustained_burn_in``); None where the plan burns in for
    no time (CPU)."""
    from . import bench_compute as bc

    if plan.burn_in_s <= 0 or not plan.gemm_shapes:
        return None
    m, n, k = max(plan.gemm_shapes, key=lambda s: s[0] * s[1] * s[2])
    dtype = "bf16" if "bf16" in dtypes else dtypes[0]
    timed = bc.sustained_burn_in(bc.gemm_call(m, n, k, dtype, device, plan.flush_bytes), plan.burn_in_s, timer)
    return {**timed, "gemm": [m, n, k], "dtype": dtype}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch.distributed as dist

    from . import bench_compute as bc
    from .build import build_profile
    from .io import write_profile

    extra: dict[str, Any] = {"load_average_before": load_average(), "compute_rank_pool": "max",
                             "collective_round_pool": "median"}
    device = setup(args.device)
    rank = dist.get_rank()
    identities = gather_identities(device)
    problems = mixed_device_problems(identities)
    if problems and not args.allow_mixed_devices:
        if rank == 0:
            print(f"error: {problems[0]}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    extra["mixed_devices"] = list(problems)
    extra["numerics"] = set_numerics()
    timer = bc.Timer(device)
    plan = make_plan(args.device, args.quick)
    if device.type == "cuda":
        plan = fit_to_memory(plan, min(i["memory_bytes"] for i in identities))
    dtypes, skipped = bc.supported_gemm_dtypes(device)
    extra["device_state"] = {"before": device_state(device)}
    sustained = burn_in_device(plan, dtypes, device, timer)
    extra["device_state"]["after_burn_in"] = device_state(device)
    raw: dict[str, Any] = {"gemm": {}, "attention": {}, "memory": {}, "collectives": []}
    if sustained is not None:
        raw["sustained"] = [sustained]
    tasks = compute_tasks(plan, dtypes, device, timer, raw) if args.only != "collectives" else []
    comm = comm_tasks(plan, device, timer, raw) if dist.get_world_size() > 1 and args.only != "compute" else []
    total = plan.rounds * len(tasks) + plan.comm_rounds * len(comm)
    progress = Progress(args.progress_file, total, enabled=rank == 0)
    for _ in range(plan.rounds):
        for what, run in tasks:
            run()
            progress.step(what)
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, {k: raw[k] for k in ("gemm", "attention", "memory", "sustained") if k in raw})
    release_memory(device)
    for _ in range(plan.comm_rounds):
        for what, run in comm:
            run()
            progress.step(what)
    extra["device_state"]["after"] = device_state(device)
    if rank == 0:
        raw.update(merge_compute(per_rank))
        raw["collectives"] = merge_curves(raw["collectives"])
        profile = build_profile(raw, device_type=args.device,
                                provenance=provenance(args, device, identities, skipped, extra))
        write_profile(args.out, profile)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
