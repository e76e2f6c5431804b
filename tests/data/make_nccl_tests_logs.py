"""Write the synthetic nccl-tests logs under tests/data/nccl-tests/ (run from the repository root).

    .venv/bin/python tests/data/make_nccl_tests_logs.py

The logs follow the layout nccl-tests prints (``src/util.cu``: device lines, a two-line column
header, rows of size/count/type/redop/root then time/algbw/busbw/#wrong out-of-place and in-place)
but every number is made up: times come from a two-regime alpha-beta model per collective (a
latency-bound regime, then a bandwidth regime) with a fixed ±3% wobble, so the tests know the
truth the import must recover. No real cluster's output is copied.
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "nccl-tests"
FACTORS = {"all_reduce_perf": lambda n: 2 * (n - 1) / n, "all_gather_perf": lambda n: (n - 1) / n,
           "reduce_scatter_perf": lambda n: (n - 1) / n, "alltoall_perf": lambda n: (n - 1) / n,
           "sendrecv_perf": lambda n: 1.0, "broadcast_perf": lambda n: 1.0}
WOBBLE = (1.00, 1.03, 0.98, 1.01, 0.97, 1.02, 0.99)


def fmt(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: 2 decimals, fewer if they do not fit the width."""
    for spec in (f"{width}.2f", f"{width}.1f", f"{width}.0f"):
        text = format(value, spec)
        if len(text) <= width:
            return text
    return format(value, f"{width}.1e")


def time_us(size: int, n: int, program: str, regimes: list[tuple[int, float, float]]) -> float:
    """Regimes: (first size, alpha us, busbw GB/s); the last one that starts at or below size."""
    alpha, busbw = next((a, b) for first, a, b in reversed(regimes) if size >= first)
    return alpha + FACTORS[program](n) * size / (busbw * 1e3)


def write(name: str, program: str, hosts: list[str], regimes, *, new_format: bool, dtype: str = "float",
          elem: int = 4, min_bytes: int = 8, max_bytes: int = 1 << 30, redop: str = "sum",
          noise_lines: bool = False) -> None:
    n = len(hosts)
    lines = []
    if new_format:
        lines += ["# nccl-tests version 2.17.4 nccl-headers=22703 nccl-library=22703",
                  f"# Collective test starting: {program}"]
    lines += [f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: 2(factor) warmup iters: 5 "
              "iters: 20 agg iters: 1 validation: 1 graph: 0" + (" unalign: 0" if new_format else ""), "#",
              "# Using devices"]
    for rank, host in enumerate(hosts):
        local = rank % (n // len(set(hosts)))
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {41000 + rank:6d} on {host:>10s} device {local:2d} "
                     f"[{0x18 + 0x20 * local:04x}:00:00] NVIDIA H100 80GB HBM3")
    if noise_lines:
        lines.append(f"{hosts[0]}:41000:41000 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>")
    lines += ["#",
              f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           out-of-place"
              "                       in-place          ",
              f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  "
              f"{'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}",
              f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
              f"{'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s}"]
    size, i = min_bytes, 0
    while size <= max_bytes:
        per_rank = program in ("all_gather_perf", "reduce_scatter_perf", "alltoall_perf")
        count = size // elem
        shard = (count // n) & ~(16 // elem - 1) if per_rank else count
        printed = shard * n * elem if per_rank else size
        t_out = time_us(printed, n, program, regimes) * WOBBLE[i % len(WOBBLE)] if printed else 0.5
        t_in = t_out * WOBBLE[(i + 3) % len(WOBBLE)]
        row = f"{printed:12d}  {shard:12d}  {dtype:>8s}  {redop:>6s}  {-1:6d}"
        for t in (t_out, t_in):
            algbw = printed / t / 1e3
            busbw = algbw * FACTORS[program](n)
            row += f"  {fmt(t, 7)}  {fmt(algbw, 6)}  {fmt(busbw, 6)}  {0:6g}"
        lines.append(row)
        size, i = size * 2, i + 1
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 123.456 ", "#"]
    if new_format:
        lines.append(f"# Collective test concluded: {program}")
    (OUT / name).write_text("\n".join(lines) + "\n\n")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    node = ["gpu-a01"] * 8
    two_nodes = ["gpu-a01"] * 8 + ["gpu-a02"] * 8
    # One H100 node (NVLink 4): a latency regime below 256 KiB, a bandwidth regime above.
    write("all_reduce_perf-8.log", "all_reduce_perf", node, [(0, 18.0, 40.0), (262144, 45.0, 360.0)],
          new_format=True, noise_lines=True)
    write("all_gather_perf-8.log", "all_gather_perf", node, [(0, 14.0, 30.0), (262144, 30.0, 340.0)],
          new_format=True, redop="none")
    write("reduce_scatter_perf-8.log", "reduce_scatter_perf", node, [(0, 15.0, 30.0), (262144, 32.0, 330.0)],
          new_format=True)
    write("alltoall_perf-8.log", "alltoall_perf", node, [(0, 22.0, 20.0), (524288, 60.0, 300.0)],
          new_format=True, redop="none")
    write("sendrecv_perf-2.log", "sendrecv_perf", node[:2], [(0, 9.0, 20.0), (131072, 20.0, 320.0)],
          new_format=True, redop="none")
    # Two nodes (8 x 400 Gb/s NDR): the old header without a version line; the file name says the test.
    write("all_reduce_perf-16-2nodes.log", "all_reduce_perf", two_nodes, [(0, 40.0, 10.0), (1048576, 120.0, 170.0)],
          new_format=False, dtype="bfloat16", elem=2)


if __name__ == "__main__":
    main()
