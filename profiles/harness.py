"""The profiling harness: run under torchrun, one process per device.

    torchrun --standalone --nproc-per-node 8 -m profiles.harness --device cuda --out P.json
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m profiles.harness --device cuda --out P.json

Every rank measures compute on its own device at the same time (medians are then taken over
ranks), then all ranks take part in every collective layout. Rank 0 fits and writes the file.
torch is imported inside ``main`` only, so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .fit import COLLECTIVE_OPS
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
    return parser.parse_args(argv)


def compute_tasks(plan: MeasurePlan, dtypes: list[str], device: Any, timer: Any,
                  raw: dict[str, Any]) -> list[Task]:
    """One task per measured compute point; each appends its median to ``raw``."""
    from . import bench_compute as bc

    def gemm(dtype: str, m: int, n: int, k: int) -> Task:
        def run() -> None:
            t = bc.median_time_s(bc.gemm_call(m, n, k, dtype, device), timer, plan)
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
            t = bc.median_time_s(bc.memory_call(kernel, size, device), timer, plan)
            raw["memory"].setdefault(kernel, []).append({"size_bytes": size, "time_s": t})
        return f"{kernel} {size >> 20} MiB", run

    tasks = [gemm(d, *shape) for d in dtypes for shape in plan.gemm_shapes]
    tasks += [attention(d, *shape) for d in dtypes if d != "fp8" for shape in plan.attention_shapes]
    tasks += [memory(kernel, size) for kernel in MEMORY_KERNELS for size in plan.memory_sizes_bytes]
    return tasks


def comm_tasks(plan: MeasurePlan, device: Any, timer: Any, raw: dict[str, Any]) -> list[Task]:
    """One task per (group layout, collective); every rank runs all of them in the same order."""
    import torch.distributed as dist

    from . import bench_comm as bm

    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    tasks: list[Task] = []
    for layout in group_layouts(dist.get_world_size(), local):
        joined: list[Any] = []

        def run(op: str, layout: Any = layout, joined: list[Any] = joined) -> None:
            if not joined:
                joined.extend(bm.join_layout(layout))
            curve = bm.measure_curve(op, layout, joined[0], joined[1], plan, timer, device)
            if curve is not None and dist.get_rank() == 0:
                raw["collectives"].append(curve)

        for op in COLLECTIVE_OPS:
            if op != "send_recv" or layout.num_ranks == 2:
                where = "across nodes" if layout.spans_nodes else "in node"
                tasks.append((f"{op} x{layout.num_ranks} {where}", lambda op=op, run=run: run(op)))
    return tasks


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
    """Compute records of every rank and round, pooled to one median per point."""
    merged: dict[str, Any] = {}
    for family in ("gemm", "attention", "memory"):
        keys = sorted({key for r in per_rank for key in r[family]})
        merged[family] = {key: pool_medians([p for r in per_rank for p in r[family].get(key, [])])
                          for key in keys}
    return merged


def merge_curves(curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Collective sweeps of every round, pooled to one time per (op, group, size): the fastest
    round's median. Each round's median is already robust within the round; across rounds,
    interference from other processes (a shared host, the OS) only ever adds time, so the calmest
    round is the best estimate of the collective's own cost (the reason ``timeit`` reports a
    minimum). On this machine gloo's medians at 64 KiB-1 MiB jump between rounds by up to 7x."""
    points = [{**{k: c[k] for k in ("op", "num_ranks", "spans_nodes", "dtype")}, "size": s, "time_s": t}
              for c in curves for s, t in zip(c["sizes_bytes"], c["median_time_s"])]
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p in pool_medians(points, pool=min):
        key = (p["op"], p["num_ranks"], p["spans_nodes"], p["dtype"])
        curve = merged.setdefault(key, dict(zip(("op", "num_ranks", "spans_nodes", "dtype"), key),
                                             sizes_bytes=[], median_time_s=[]))
        curve["sizes_bytes"].append(p["size"])
        curve["median_time_s"].append(p["time_s"])
    return list(merged.values())


def device_name(device: Any) -> str:
    """Marketing name of the device: CUDA device name, or the CPU model from /proc/cpuinfo."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (None where the OS has none): other work
    on the machine while profiling slows every measurement down."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def provenance(args: argparse.Namespace, device: Any, hosts: list[str], skipped: dict[str, str],
               load_before: list[float] | None) -> dict[str, Any]:
    """Where and how the profile was measured."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = device.type == "cuda"
    nccl = torch.cuda.nccl.version() if cuda else None
    return {
        "device_name": device_name(device), "num_devices": world, "num_nodes": world // local,
        "devices_per_node": local, "backend": dist.get_backend(), "hosts": sorted(set(hosts)),
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda if cuda else None,
        "nccl_version": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "python_version": platform.python_version(), "platform": platform.platform(),
        "threads_per_process": torch.get_num_threads(), "mode": "quick" if args.quick else "full",
        "phases": [args.only] if args.only else ["compute", "collectives"],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": args.command or " ".join(["python -m profiles.harness", *sys.argv[1:]]),
        "skipped": skipped, "load_average_before": load_before, "load_average_after": load_average(),
    }


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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch.distributed as dist

    from . import bench_compute as bc
    from .build import build_profile
    from .io import write_profile

    load_before = load_average()
    device = setup(args.device)
    rank = dist.get_rank()
    timer = bc.Timer(device)
    plan = make_plan(args.device, args.quick)
    if device.type == "cuda":
        import torch

        plan = fit_to_memory(plan, torch.cuda.get_device_properties(device).total_memory)
    dtypes, skipped = bc.supported_gemm_dtypes(device)
    raw: dict[str, Any] = {"gemm": {}, "attention": {}, "memory": {}, "collectives": []}
    tasks = compute_tasks(plan, dtypes, device, timer, raw) if args.only != "collectives" else []
    comm = comm_tasks(plan, device, timer, raw) if dist.get_world_size() > 1 and args.only != "compute" else []
    total = plan.rounds * len(tasks) + plan.comm_rounds * len(comm)
    progress = Progress(args.progress_file, total, enabled=rank == 0)
    for _ in range(plan.rounds):
        for what, run in tasks:
            run()
            progress.step(what)
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, ({k: raw[k] for k in ("gemm", "attention", "memory")}, socket.gethostname()))
    for _ in range(plan.comm_rounds):
        for what, run in comm:
            run()
            progress.step(what)
    if rank == 0:
        raw.update(merge_compute([r[0] for r in per_rank]))
        raw["collectives"] = merge_curves(raw["collectives"])
        profile = build_profile(raw, device_type=args.device,
                                provenance=provenance(args, device, [r[1] for r in per_rank], skipped,
                                                       load_before))
        write_profile(args.out, profile)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
