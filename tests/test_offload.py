"""Optimizer offload (issue #11): host RAM must hold the offloaded states, the host step runs at
CPU-Adam's rate (ZeRO-Offload Table 4), the copies at the host link's bandwidth."""

import dataclasses

import pytest

import planner
from costmodels.convention import MEGATRON
from costmodels.memory import state_bytes
from costmodels.offload import (CPU_ADAM_PARAMS_PER_S_REF, CPU_ADAM_REF_HOST_BANDWIDTH_BYTES_PER_S,
                                cpu_adam_time_s, host_copy_time_s, host_state_bytes)
from costmodels.params import total_params
from costmodels.presets import load_model
from hardware_specs import load_node
from hardware_specs.units import GB, GIB

REQUEST = dict(model="llama3-8b", gpus=8, global_batch=64, seq_len=4096)
OFFLOAD = planner.Layout(dp=8, zero_stage=1, num_microbatches=8, optimizer_offload=True)


def test_cpu_adam_time_by_hand():
    # Reference: 10e9 parameters in 2.57 s on a 255.9 GB/s host (2 sockets x 6 ch x DDR4-2666 x 8 B).
    assert CPU_ADAM_REF_HOST_BANDWIDTH_BYTES_PER_S == pytest.approx(255.936e9)
    assert 10e9 / CPU_ADAM_PARAMS_PER_S_REF == pytest.approx(2.57)
    # A DGX H100 device's share: 614.4 / 8 = 76.8 GB/s. 1e9 parameters:
    # t = 1e9 · 255.936e9 / (3.891e9 · 76.8e9) = 1e9 / (3.891e9 · 0.30008) = 0.8565 s
    assert cpu_adam_time_s(1e9, 76.8e9) == pytest.approx(1e9 * 2.57 / 10e9 * 255.936 / 76.8, rel=1e-9)
    assert cpu_adam_time_s(1e9, 76.8e9) == pytest.approx(0.8565, abs=1e-3)


def test_offload_step_is_copies_plus_cpu_adam():
    node = load_node("h100-sxm-80gb")
    cost = planner.evaluate(hardware=node, layout=OFFLOAD, **REQUEST)
    sb = state_bytes(planner.api.resolve_job(hardware=node, **REQUEST).training, MEGATRON)
    stepped = total_params(load_model("llama3-8b")) / 8     # ZeRO-1 over dp 8
    copies = (sb.grad + sb.param) * stepped / (64 * GB)     # PCIe Gen5 x16, per direction
    host = stepped * 2.57 / 10e9 * 255.936e9 / (76.8 * GB)
    assert host_copy_time_s(stepped, sb, 64 * GB) == pytest.approx(copies)
    assert cost.offload_s == pytest.approx(copies + host, rel=1e-9)
    assert cost.optimizer_s == 0


def test_host_ram_per_node_is_ranks_times_offloaded_bytes():
    node = load_node("h100-sxm-80gb")
    cost = planner.evaluate(hardware=node, layout=OFFLOAD, **REQUEST)
    sb = state_bytes(planner.api.resolve_job(hardware=node, **REQUEST).training, MEGATRON)
    per_rank = (sb.optimizer + sb.grad) * total_params(load_model("llama3-8b")) / 8
    assert host_state_bytes(total_params(load_model("llama3-8b")) / 8, sb) == pytest.approx(per_rank)
    assert cost.host_memory_bytes_per_node == pytest.approx(8 * per_rank)
    assert cost.host_fits and node.host_memory_bytes == 2048 * GIB
    p = cost.predicted_dict()
    assert p["host_memory_gib_per_node"] == pytest.approx(8 * per_rank / GIB, rel=1e-5)
    assert "host_memory_gib_per_node" not in planner.evaluate(
        hardware=node, layout=dataclasses.replace(OFFLOAD, optimizer_offload=False), **REQUEST).predicted_dict()


def test_offload_that_host_ram_cannot_hold_is_infeasible():
    # llama3-8b, Megatron bf16: (12 + 4) bytes x 8.03e9 params = 128.5 GB per node > 64 GiB of host RAM.
    # full recomputation keeps the device side under the cap with the memory band's margin
    small = dataclasses.replace(load_node("h100-sxm-80gb"), host_memory_bytes=64 * GIB)
    cost = planner.evaluate(hardware=small, layout=dataclasses.replace(OFFLOAD, recompute="full"), **REQUEST)
    assert cost.peak_memory_bytes <= cost.memory_capacity_bytes
    assert cost.host_memory_bytes_per_node > 64 * GIB
    assert not cost.host_fits and not cost.fits
    # and the search never picks it
    report = planner.plan(hardware=small, **REQUEST)
    assert all(not c.layout.optimizer_offload or c.host_fits for c in (report.best, *report.candidates))


def test_host_ram_is_read_from_the_toml_with_a_source():
    for name in ("h100-sxm-80gb", "a100-sxm-80gb", "v100-sxm-32gb"):
        node = load_node(name)
        assert node.host_memory_bytes > 0
        assert "node.host_memory_gib" in node.hardware.sources
