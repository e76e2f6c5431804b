"""A 4-rank gloo profile with one slow group: the profile must show that group's pace (issue 20).

The harness runs for real under ``torchrun --standalone`` (4 processes, about 20 s here) on a
tiny plan; ranks 2 and 3 sleep 20 ms inside every call of their 2-rank group, ranks 0 and 1 do
not. Before the fix only rank 0's group was recorded, so the slow pair was invisible.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profiles import load_profile

pytestmark = pytest.mark.torchrun

SLEEP_S = 0.05
SCRIPT = textwrap.dedent(f"""
    import sys, time
    from dataclasses import replace
    from profiles import bench_comm, harness, shapes

    real_call = bench_comm.collective_call

    def slow_pair(op, size, members, group, dtype, device):
        fn = real_call(op, size, members, group, dtype, device)
        if fn is None or tuple(members) != (2, 3):
            return fn
        def call():
            time.sleep({SLEEP_S})
            return fn()
        return call

    def tiny_plan(device_type, quick):
        return replace(shapes.make_plan(device_type, True), gemm_shapes=((64, 64, 64), (128, 256, 128), (256, 512, 512)),
                       attention_shapes=((1, 64, 2, 32), (1, 256, 2, 64)), memory_sizes_bytes=(1 << 20,),
                       collective_sizes_bytes=(4096, 65536), rounds=1, comm_rounds=1,
                       min_repeats=3, max_repeats=5, time_budget_s=0.01)

    bench_comm.collective_call = slow_pair
    harness.make_plan = tiny_plan
    harness.main(sys.argv[1:])
""")


@pytest.fixture(scope="module")
def slow_pair_profile(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("world")
    script, out = tmp / "slow_pair.py", tmp / "p.json"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(script), "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_profile(out)


def test_the_slow_group_sets_the_curve(slow_pair_profile) -> None:
    pair = slow_pair_profile.collective_curve("all_reduce", 2, 2, 1)
    assert pair is not None
    assert min(pair.median_time_s) >= SLEEP_S  # the pair (2, 3), not rank 0's pair (0, 1)
    whole = slow_pair_profile.collective_curve("all_reduce", 4, 4, 1)
    assert whole is not None and max(whole.median_time_s) < SLEEP_S


def test_provenance_holds_every_rank_device_and_the_numerics(slow_pair_profile) -> None:
    prov = slow_pair_profile.provenance
    assert len(prov["devices"]) == 4 and prov["num_nodes"] == 1 and prov["devices_per_node"] == 4
    assert {d["host"] for d in prov["devices"]} == set(prov["hosts"])
    assert prov["numerics"]["tf32_matmul"] is False and prov["numerics"]["tf32_cudnn"] is False
    assert all(v is None for v in prov["device_state"]["before"].values())
    assert prov["compute_rank_pool"] == "max" and prov["collective_round_pool"] == "median"
