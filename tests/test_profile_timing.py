"""How the harness times kernels and collectives (issue 20, findings 2, 3, 5-8, 10, 12).

CPU only: CUDA events, the timer and ``torch.distributed`` are replaced by fakes that log what
the code asks of them, so the order of records and syncs on the CUDA path is checked here.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from profiles import bench_comm, bench_compute, harness
from profiles.shapes import GroupLayout, make_plan
from profiles.work import gemm_bytes

CUDA = SimpleNamespace(type="cuda")
PLAN = replace(make_plan("cpu", quick=True), min_repeats=3, max_repeats=20, time_budget_s=0.03)


class FakeClock:
    """A device clock that each kernel call advances by ``step_s``, and a log of what the host did."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s, self.log = 0.0, step_s, []

    def kernel(self) -> None:
        self.now += self.step_s
        self.log.append("call")


def fake_cuda(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.at = None

        def record(self) -> None:
            self.at = clock.now
            clock.log.append("record")

        def synchronize(self) -> None:
            clock.log.append("sync")

        def elapsed_time(self, end: "Event") -> float:
            assert clock.log[-1] == "sync" or "sync" in clock.log, "elapsed_time read before any sync"
            return (end.at - self.at) * 1e3  # milliseconds, as torch reports

    monkeypatch.setattr(bench_compute.torch.cuda, "Event", Event)
    monkeypatch.setattr(bench_compute.torch.cuda, "synchronize", lambda *a, **k: clock.log.append("sync"))


# --- findings 2 and 6: N back-to-back calls between one event pair, one sync ------------------

def test_batches_are_back_to_back_between_events_with_one_sync_and_divided_by_n(monkeypatch) -> None:
    clock = FakeClock(step_s=2e-6)
    fake_cuda(monkeypatch, clock)
    timer = bench_compute.Timer(CUDA)
    times = timer.batch_times_s(clock.kernel, calls=50, repeats=4)
    assert times == pytest.approx([2e-6] * 4)
    assert clock.log.count("sync") == 1 and clock.log[-1] == "sync"
    records = [i for i, what in enumerate(clock.log) if what == "record"]
    assert len(records) == 5  # one event between consecutive batches, none inside a batch
    assert all(b - a == 51 for a, b in zip(records, records[1:]))


def test_small_kernels_are_timed_in_batches_not_one_call_per_sync(monkeypatch) -> None:
    clock = FakeClock(step_s=5e-6)  # a small GEMM: 5 us of GPU time
    fake_cuda(monkeypatch, clock)
    t = bench_compute.median_time_s(clock.kernel, bench_compute.Timer(CUDA), PLAN)
    assert t == pytest.approx(5e-6)
    calls, syncs = clock.log.count("call"), clock.log.count("sync")
    assert calls / syncs >= 100, (calls, syncs)


@pytest.mark.parametrize(("step_s", "warmup_calls"), [(1e-3, 3), (4e-3, 2), (1.5, 1)])
def test_cpu_warmup_batch_ends_once_it_has_lasted_the_batch_target(monkeypatch, step_s, warmup_calls) -> None:
    """On CPU the warm-up batch stops at 5 ms (``BATCH_TARGET_S``) or 3 calls, whichever comes
    first: 1 ms calls take all 3, 4 ms calls 2 (4 < 5 <= 8 ms), a 1.5 s bf16 GEMM 1. The timed
    batches still follow ``batch_counts`` (for 1.5 s: ceil(5 ms / 1.5 s) = 1 call per batch and
    min_repeats = 3 batches), so the slow GEMM runs 1 + 1 + 3 = 5 times instead of 1 + 3 + 3."""
    clock = FakeClock(step_s=step_s)
    monkeypatch.setattr(bench_compute.time, "perf_counter", lambda: clock.now)
    t = bench_compute.median_time_s(clock.kernel, bench_compute.Timer(torch.device("cpu")), PLAN)
    assert t == pytest.approx(step_s)
    calls, repeats = bench_compute.batch_counts(step_s, PLAN)
    assert clock.log.count("call") == 1 + warmup_calls + calls * repeats


def test_call_cap_is_high_enough_for_small_messages() -> None:
    calls, repeats = bench_compute.batch_counts(1e-5, PLAN)
    assert calls >= 500 and PLAN.min_repeats <= repeats <= PLAN.max_repeats
    assert bench_compute.batch_counts(1.0, PLAN)[0] == 1


# --- findings 3 and 5: world barrier per size, world-agreed counts, world MAX ----------------

class FakeDist:
    """Logs barriers and reductions; a MAX over the world turns every value into ``world_value``."""

    class ReduceOp:
        MAX = "max"

    def __init__(self, world_factor: float) -> None:
        self.log, self.world_factor = [], world_factor

    def barrier(self, group=None) -> None:
        self.log.append(("barrier", group))

    def all_reduce(self, tensor, op=None, group=None) -> None:
        self.log.append(("all_reduce", group, op))
        if group is None:
            tensor.mul_(self.world_factor)

    def get_rank(self) -> int:
        return 0


class FakeTimer:
    def __init__(self, log: list) -> None:
        self.log = log

    def sync(self) -> None:
        self.log.append(("sync",))

    def batch_times_s(self, fn, calls: int, repeats: int) -> list[float]:
        self.log.append(("batches", calls, repeats))
        return [1e-4] * repeats


def test_sizes_start_on_a_world_barrier_with_world_agreed_counts(monkeypatch) -> None:
    dist = FakeDist(world_factor=10.0)  # another group's warm-up was 10x slower
    monkeypatch.setattr(bench_comm, "dist", dist)
    timer = FakeTimer(dist.log)
    bench_comm.lockstep_median_s(lambda: None, "my-group", timer, PLAN, torch.device("cpu"))
    warm = [e for e in dist.log if e[0] == "all_reduce"][0]
    assert warm[1] is None and warm[2] == "max"  # the warm-up time is agreed world-wide
    timed = [e for e in dist.log if e[0] == "batches"][-1]
    assert timed[1:] == bench_compute.batch_counts(1e-3, PLAN)  # from the world's slowest warm-up
    before = dist.log[:dist.log.index(timed)]
    assert ("barrier", None) in before[before.index(warm):]  # a world barrier right before timing


def test_each_size_median_is_the_world_maximum(monkeypatch) -> None:
    dist = FakeDist(world_factor=3.0)
    monkeypatch.setattr(bench_comm, "dist", dist)
    monkeypatch.setattr(bench_comm, "lockstep_median_s", lambda *a, **k: 1e-4)
    layout = GroupLayout(num_ranks=2, ranks_per_node=2, num_nodes=1, groups=((0, 1),))
    curve = bench_comm.measure_curve("all_reduce", layout, "g", (0, 1), PLAN, FakeTimer([]), torch.device("cpu"))
    assert curve["median_time_s"] == pytest.approx([3e-4] * len(curve["sizes_bytes"]))
    assert (curve["num_ranks"], curve["ranks_per_node"], curve["num_nodes"]) == (2, 2, 1)


def test_compute_points_keep_the_slowest_rank_and_the_median_round() -> None:
    point = {"m": 8, "n": 8, "k": 8}
    fast = {"gemm": {"fp32": [{**point, "time_s": t} for t in (1.0, 1.2, 9.0)]}, "attention": {}, "memory": {}}
    slow = {"gemm": {"fp32": [{**point, "time_s": t} for t in (2.0, 2.1, 2.2)]}, "attention": {}, "memory": {}}
    merged = harness.merge_compute([fast, slow])
    assert merged["gemm"]["fp32"] == [{**point, "time_s": 2.1}]  # rank 1's median, not the pooled median


def test_collective_rounds_are_pooled_by_median_not_minimum() -> None:
    sweep = {"op": "all_reduce", "num_ranks": 2, "ranks_per_node": 2, "num_nodes": 1, "dtype": "fp32",
             "sizes_bytes": [4096, 8192]}
    rounds = [{**sweep, "median_time_s": [1.0, 4.0]}, {**sweep, "median_time_s": [3.0, 2.0]},
              {**sweep, "median_time_s": [2.0, 3.0]}]
    assert harness.merge_curves(rounds) == [{**sweep, "median_time_s": [2.0, 3.0]}]


# --- finding 7: buffer rotation, burn-in, device state ---------------------------------------

def test_gemm_operands_rotate_through_enough_copies_to_leave_the_cache() -> None:
    m = n = k = 64
    footprint = 4 * (m * k + k * n + m * n)
    call = bench_compute.gemm_call(m, n, k, "fp32", torch.device("cpu"), flush_bytes=3 * footprint)
    outputs = [call().data_ptr() for _ in range(6)]
    assert len(set(outputs)) == 3 and outputs[:3] == outputs[3:]
    assert bench_compute.rotation_copies(footprint, 0) == 1
    assert bench_compute.rotation_copies(1000, 10_500) == 11


def test_cuda_plans_flush_l2_and_burn_in_for_seconds() -> None:
    for quick in (True, False):
        plan = make_plan("cuda", quick=quick)
        assert plan.flush_bytes >= 2 * 50 * 10**6 and plan.burn_in_s >= 2
    assert make_plan("cpu", quick=True).burn_in_s == 0


def test_burn_in_runs_for_the_asked_time() -> None:
    calls = []
    started = time.perf_counter()
    bench_compute.burn_in(lambda: calls.append(1), 0.05, bench_compute.Timer(torch.device("cpu")))
    assert time.perf_counter() - started >= 0.05 and calls


def test_cuda_burn_in_is_long_enough_for_a_power_cap_to_settle() -> None:
    # an H100's minute-long bf16 GEMM loop settles within about 4 s (sustained-h100-2026-11-28.json)
    assert make_plan("cuda", quick=True).burn_in_s >= 8 and make_plan("cuda", quick=False).burn_in_s >= 15


def test_sustained_burn_in_times_a_burst_before_and_the_settled_rate_after(monkeypatch) -> None:
    # a call that slows from 1 ms to 1.25 ms over the burn-in, as a power-capped GPU does: share 0.8.
    # On a virtual clock that only the call advances, so a busy machine's sleeps cannot blur it.
    clock = [0.0]
    monkeypatch.setattr(bench_compute.time, "perf_counter", lambda: clock[0])

    def call() -> None:
        clock[0] += 0.00125 if clock[0] > 0.15 else 0.001

    timed = bench_compute.sustained_burn_in(call, 0.2, bench_compute.Timer(torch.device("cpu")))
    assert timed["burn_in_s"] == 0.2
    assert timed["burst_s"] == pytest.approx(0.001) and timed["sustained_s"] == pytest.approx(0.00125)
    assert timed["burst_s"] / timed["sustained_s"] == pytest.approx(0.8)


def test_the_profile_keeps_the_burn_ins_share_and_a_file_refuses_one_above_a_burst() -> None:
    from profiles.build import build_profile
    from profiles.io import ProfileError, profile_from_dict, profile_to_dict

    raw = {"sustained": [{"burst_s": 1.0e-3, "sustained_s": 1.094e-3, "burn_in_s": 15.0, "gemm": [8192] * 3,
                          "dtype": "bf16"}]}
    profile = build_profile(raw, device_type="cuda", provenance={})
    assert profile.sustained_rate_share == pytest.approx(0.914, abs=1e-4)
    assert profile.provenance["sustained_burn_in"]["burn_in_s"] == 15.0
    doc = profile_to_dict(profile)
    assert profile_from_dict(doc).sustained_rate_share == profile.sustained_rate_share
    assert "sustained_rate_share" not in profile_to_dict(build_profile({}, device_type="cpu", provenance={}))
    with pytest.raises(ProfileError, match="sustained_rate_share"):
        profile_from_dict({**doc, "sustained_rate_share": 3.0})


def test_device_state_is_recorded_as_null_on_cpu() -> None:
    state = harness.device_state(torch.device("cpu"))
    assert set(state) >= {"sm_clock_mhz", "max_sm_clock_mhz", "power_limit_w", "mig_mode", "ecc_mode"}
    assert all(v is None for v in state.values())


# --- finding 8: TF32 off, explicitly, and recorded ----------------------------------------------

def test_tf32_flags_are_set_off_and_reported() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        flags = harness.set_numerics()
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
        assert flags["tf32_matmul"] is False and flags["tf32_cudnn"] is False
        assert flags["float32_matmul_precision"] == "highest"
    finally:
        torch.backends.cudnn.allow_tf32 = True  # torch's default


# --- finding 10: fp8 as training runs it ---------------------------------------------------------

def test_fp8_recipe_scales_by_amax_and_matches_the_high_precision_product() -> None:
    """Values near 1e-3 underflow e4m3 (smallest subnormal 2^-9) with unit scales; tensor-wise
    amax scaling keeps them, so the product is within fp8 rounding of the bf16 one."""
    torch.manual_seed(0)
    a, w = 1e-3 * torch.randn(64, 128), 1e-3 * torch.randn(96, 128)
    out = bench_compute.scaled_fp8_matmul(a.to(torch.bfloat16), w.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (64, 96)
    exact = a @ w.t()
    assert float((out.float() - exact).norm() / exact.norm()) < 0.1


def test_fp8_output_bytes_count_at_two() -> None:
    assert gemm_bytes(10, 20, 30, "fp8") == 10 * 30 + 30 * 20 + 2 * 10 * 20


# --- finding 12: memory headroom ----------------------------------------------------------------

def test_previous_size_buffers_are_freed_before_the_next_size(monkeypatch) -> None:
    monkeypatch.setattr(bench_comm, "dist", FakeDist(world_factor=1.0))
    monkeypatch.setattr(bench_comm, "lockstep_median_s", lambda *a, **k: 1e-4)
    alive: list[weakref.ref] = []

    def call(op, size, members, group, dtype, device):
        assert all(ref() is None for ref in alive), "the previous size's buffer is still alive"
        buf = torch.empty(size // 4)
        alive.append(weakref.ref(buf))
        return lambda: buf

    monkeypatch.setattr(bench_comm, "collective_call", call)
    layout = GroupLayout(num_ranks=2, ranks_per_node=2, num_nodes=1, groups=((0, 1),))
    bench_comm.measure_curve("all_reduce", layout, "g", (0, 1), PLAN, FakeTimer([]), torch.device("cpu"))
    assert len(alive) == len(PLAN.collective_sizes_bytes)


def test_groups_are_destroyed_after_each_layout_and_memory_released(monkeypatch) -> None:
    log: list = []
    layout = GroupLayout(num_ranks=2, ranks_per_node=2, num_nodes=1, groups=((0, 1),))
    monkeypatch.setattr(harness, "group_layouts", lambda world, local: (layout,))
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a: 0)
    monkeypatch.setattr(bench_comm, "join_layout", lambda lay: (log.append("join"), ("g", (0, 1)))[1])
    monkeypatch.setattr(bench_comm, "leave_layout", lambda group: log.append("leave"))
    monkeypatch.setattr(bench_comm, "measure_curve", lambda op, *a: log.append(op))
    monkeypatch.setattr(harness, "release_memory", lambda device: log.append("release"))
    raw = {"collectives": []}
    tasks = harness.comm_tasks(PLAN, torch.device("cpu"), None, raw)
    for _ in range(2):
        for _, run in tasks:
            run()
    one_round = ["join", *[op for op in bench_comm.ops_for(layout)], "leave", "release"]
    assert log == one_round * 2
