"""An estimate (not a measurement) of how long ``autoplan profile`` takes on GPU nodes.

    .venv/bin/python benchmarks/profile_gpu_estimate.py [--hardware h100-sxm-80gb] [--nodes 1 2]

No GPU is needed: the script walks the harness's own plan (``profiles.shapes.make_plan``, the
layouts of ``group_layouts``, the batch sizing of ``bench_compute.batch_counts``) and prices
every call from the datasheet, so the counts are exact and the seconds are as good as the
datasheet rates (GEMMs at 70% of peak, memory kernels at 80% of bandwidth, collectives by the
cost model's alpha-beta model). Start-up, NCCL communicator creation, buffer allocation and
Python overhead are not counted, so a real run takes longer.
"""

from __future__ import annotations

import argparse

from costmodels.collectives import collective_time_s
from hardware_specs import load_node, make_cluster
from profiles.bench_comm import ops_for
from profiles.bench_compute import WARMUP_CALLS, batch_counts
from profiles.schema import MEMORY_KERNELS
from profiles.shapes import MeasurePlan, fit_to_memory, group_layouts, make_plan
from profiles.work import attention_flops, gemm_bytes, gemm_flops, memory_kernel_bytes

GEMM_EFFICIENCY = 0.7
"""Share of the datasheet peak a large GEMM reaches (an assumption for this estimate only)."""
MEMORY_EFFICIENCY = 0.8
"""Share of the datasheet bandwidth a copy reaches (an assumption for this estimate only)."""


def point_s(per_call_s: float, plan: MeasurePlan) -> float:
    """Seconds one measured point costs: one call, the warm-up batch, then the timed batches."""
    calls, repeats = batch_counts(per_call_s, plan)
    return (1 + WARMUP_CALLS + calls * repeats) * per_call_s


def compute_phases_s(plan: MeasurePlan, hardware) -> dict[str, float]:
    """Seconds of the GEMM, attention and memory phases over all rounds, burn-in apart."""
    dtypes = [d for d in ("fp32", "bf16", "fp16", "fp8") if hardware.supports(d)]
    peak = {d: hardware.peak_flops(d) * GEMM_EFFICIENCY for d in dtypes}
    bandwidth = hardware.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY

    def roofline(flops: float, moved: float, dtype: str) -> float:
        return max(flops / peak[dtype], moved / bandwidth)

    gemm = sum(point_s(roofline(gemm_flops(m, n, k), gemm_bytes(m, n, k, d), d), plan)
               for d in dtypes for m, n, k in plan.gemm_shapes)
    attention = sum(point_s(roofline(attention_flops(b, s, a, h), 0.0, d), plan)
                    for d in dtypes if d != "fp8" for b, s, a, h in plan.attention_shapes)
    memory = sum(point_s(memory_kernel_bytes(size) / bandwidth, plan)
                 for _ in MEMORY_KERNELS for size in plan.memory_sizes_bytes)
    return {"gemm": gemm * plan.rounds, "attention": attention * plan.rounds, "memory": memory * plan.rounds}


def collectives_s(plan: MeasurePlan, cluster) -> tuple[float, int]:
    """Seconds of the collective phase over all rounds, and the number of curves."""
    total, curves = 0.0, 0
    for layout in group_layouts(cluster.num_gpus, cluster.gpus_per_node):
        first = layout.groups[0]
        stride = first[1] - first[0]
        for op in ops_for(layout):
            curves += 1
            total += sum(point_s(collective_time_s(op, size, layout.num_ranks, stride, cluster), plan)
                         for size in plan.collective_sizes_bytes)
    return total * plan.comm_rounds, curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hardware", default="h100-sxm-80gb")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    node = load_node(args.hardware)
    print(f"ESTIMATE from datasheet rates ({node.hardware.display_name}); not measured")
    for quick in (True, False):
        plan = fit_to_memory(make_plan("cuda", quick), node.hardware.memory_bytes)
        phases = compute_phases_s(plan, node.hardware)
        print(f"\n{'quick' if quick else 'full'}: {len(plan.gemm_shapes)} GEMM shapes, "
              f"{len(plan.attention_shapes)} attention shapes, {len(plan.memory_sizes_bytes)} memory sizes, "
              f"{len(plan.collective_sizes_bytes)} message sizes; rounds {plan.rounds} compute, "
              f"{plan.comm_rounds} collectives; burn-in {plan.burn_in_s:.0f} s")
        print("  " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items()))
        for nodes in args.nodes:
            cluster = make_cluster(node, nodes * node.gpus_per_node)
            comm, curves = collectives_s(plan, cluster)
            total = plan.burn_in_s + sum(phases.values()) + comm
            print(f"  {nodes} node(s) x {node.gpus_per_node}: collectives {comm:.0f} s over {curves} curves; "
                  f"total about {total / 60:.0f} min")


if __name__ == "__main__":
    main()
