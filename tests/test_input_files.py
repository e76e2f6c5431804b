"""Hostile input files and spec numbers: one clear error naming the file or field, never a traceback or a hang.

Issue 16's failure classes 1, 2 and 9 for what enters through ``hardware_specs``: non-finite or
absurd numbers, undecodable or pathological files, FIFOs and devices, specs built in code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hardware_specs import SpecError, load_node, make_cluster
from hardware_specs.files import parse_json, read_text
from hardware_specs.loader import DATA_DIR

AUTOPLAN = str(Path(sys.executable).parent / "autoplan")
H100 = (DATA_DIR / "h100-sxm-80gb.toml").read_text()


def _node_file(tmp_path: Path, old: str, new: str) -> Path:
    assert old in H100
    path = tmp_path / "node.toml"
    path.write_text(H100.replace(old, new))
    return path


@pytest.mark.parametrize("old,new,field", [
    ("memory_gib = 80", "memory_gib = nan", "device.memory_gib"),
    ("memory_gib = 80", "memory_gib = inf", "device.memory_gib"),
    ("bf16_tflops = 989", "bf16_tflops = nan", "device.bf16_tflops"),
    ("gpus_per_node = 8", "gpus_per_node = inf", "node.gpus_per_node"),
    ("gpus_per_node = 8", "gpus_per_node = 100000", "node.gpus_per_node"),
    ("memory_gib = 80", "memory_gib = 1e300", "device.memory_gib"),
])
def test_non_finite_or_absurd_datasheet_numbers_are_refused(tmp_path, old, new, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        load_node(str(_node_file(tmp_path, old, new)))


@pytest.mark.parametrize("old,new,needle", [
    # each derived field is checked in the file's unit and named as the file writes it
    ("runtime_reserved_gib = 1.0", "runtime_reserved_gib = 100.0",
     "field 'device.runtime_reserved_gib' must be from 0 to below device.memory_gib (80)"),
    ("memory_gib = 80", "memory_gib = 2000000", "field 'device.memory_gib' must be above 0 and at most 1,048,576"),
    ("memory_gib = 80", "memory_gib = 1e-12", "field 'device.memory_gib' must be at least one byte"),
    ("compute_capability = 9.0", "compute_capability = 900",
     "field 'device.compute_capability' must be above 0 and at most 100"),
    ("sustained_rate_share = 0.914", "sustained_rate_share = 1.5",
     "field 'device.sustained_rate_share' must be above 0 and at most 1"),
    ("nvls_efficiency = 0.85", "nvls_efficiency = 85", "field 'intra_node.nvls_efficiency' must be above 0 and at most 1"),
    ("latency_us = 5\n", "latency_us = 5e7\n", "field 'inter_node.latency_us' must be above 0 and at most 10,000,000"),
    ("num_sms = 132", "num_sms = 132\npower_limited_clock_mhz = 2000",
     "field 'device.power_limited_clock_mhz' must be at most device.sustained_clock_mhz (1830)"),
])
def test_derived_fields_are_named_as_the_file_writes_them(tmp_path, old, new, needle):
    """Before: 'h100-sxm-80gb: runtime_reserved_bytes must be a whole number from 0 to 85899345919, got
    107374182400': no file, a field the file does not have, a value in bytes."""
    path = _node_file(tmp_path, old, new)
    path.write_text(path.read_text().replace("[sources]\n", '[sources]\n"device.power_limited_clock_mhz" = "x"\n'))
    with pytest.raises(SpecError) as info:
        load_node(str(path))
    assert str(info.value).startswith(f"hardware file {path}: {needle}"), str(info.value)


@pytest.mark.parametrize("old,new,needle", [
    ("memory_gib = 80", "memory_gb = 80", "unknown key 'device.memory_gb' in [device]; known keys there: memory_gib, "),
    ("num_sms = 132", 'num_sms = 132\ncolour = "green"', "unknown key 'device.colour' in [device]; known keys there: "
                                                         "fp32_tflops, "),
    ('device_type = "cuda"', 'device_type = "cuda"\nvendor = "x"', "unknown key 'vendor' in the top level"),
    ("[intra_node]", "[intra_nodes]", "unknown key 'intra_nodes' in the top level; known keys there: intra_node, "),
    ('"device.num_sms" =', '"device.num_sm" =', "[sources] cites 'device.num_sm', which is no field of a node file; "
                                               "known fields: device.num_sms, "),
])
def test_unknown_keys_are_refused_naming_the_known_ones(tmp_path, old, new, needle):
    with pytest.raises(SpecError) as info:
        load_node(str(_node_file(tmp_path, old, new)))
    assert str(info.value).startswith(f"hardware file {tmp_path / 'node.toml'}: {needle}"), str(info.value)


def test_a_bad_hardware_file_is_one_line_and_exit_2_on_the_cli(tmp_path):
    from click.testing import CliRunner

    from planner.cli import main

    path = _node_file(tmp_path, "runtime_reserved_gib = 1.0", "runtime_reserved_gib = 100.0")
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--hardware", str(path), "--gpus", "8",
                                       "--global-batch", "64", "--seq-len", "4096"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "runtime_reserved_gib" in result.output and "bytes" not in result.output


def test_nan_peak_is_refused_by_the_cli_with_one_line_and_exit_2(tmp_path):
    """Before: exit 0 and a plan file holding NaN."""
    path = _node_file(tmp_path, "bf16_tflops = 989", "bf16_tflops = nan")
    out = tmp_path / "plan.json"
    proc = subprocess.run([AUTOPLAN, "plan", "--model", "llama3-8b", "--hardware", str(path), "--gpus", "8",
                           "--global-batch", "64", "--seq-len", "4096", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "device.bf16_tflops" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_toml_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(H100.replace('display_name = "', 'display_name = "\xe9').encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        load_node(str(path))


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "node.toml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_node(str(fifo))


def test_device_file_is_not_read_without_limit():
    with pytest.raises(SpecError, match="not a regular file"):
        read_text("/dev/zero", what="plan file")


def test_oversized_file_is_refused(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 4096)
    with pytest.raises(SpecError, match="larger than"):
        read_text(path, what="plan file", max_bytes=1024)


@pytest.mark.parametrize("text,needle", [
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ("[" * 100 + "]" * 100, "nested deeper than"),
    ('{"vocab_size": 1' + "0" * 5000 + "}", "not valid JSON"),
    ('{"vocab_size": 1e400}', "out of range"),
    ('{"vocab_size": NaN}', "NaN is not a number"),
    ('{"x": -Infinity}', "Infinity is not a number"),
])
def test_pathological_json_gets_one_line(text, needle):
    with pytest.raises(SpecError, match=needle) as info:
        parse_json(text, origin="config.json")
    assert "\n" not in str(info.value)


def test_quoted_path_keeps_the_message_on_one_line(tmp_path):
    with pytest.raises(SpecError) as info:
        read_text(tmp_path / "a\nb.json", what="plan file")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("change", [
    lambda n: replace(n, intra_node=replace(n.intra_node, bandwidth_bytes_per_s=0.0)),
    lambda n: replace(n, inter_node=replace(n.inter_node, nic_bandwidth_bytes_per_s=float("nan"))),
    lambda n: replace(n, gpus_per_node=None),
    lambda n: replace(n, hardware=replace(n.hardware, memory_bytes=float("inf"))),
    lambda n: replace(n, hardware=replace(n.hardware, peak_flops_per_s={"bf16": -1.0})),
    lambda n: replace(n, host_link_bandwidth_bytes_per_s="fast"),
], ids=["zero-bandwidth", "nan-nic", "none-gpus", "inf-memory", "negative-peak", "string-bandwidth"])
def test_specs_built_in_code_raise_value_errors(change):
    with pytest.raises(SpecError):
        change(load_node("h100-sxm-80gb"))


def test_absurd_cluster_size_is_refused():
    with pytest.raises(SpecError, match="gpus= must be a whole number from 1 to 16777216"):
        make_cluster(load_node("h100-sxm-80gb"), 2**40)


@pytest.mark.parametrize("name", ["a" * 5000, "x\x00y", "../h100-sxm-80gb"])
def test_hostile_hardware_names_are_unknown_not_os_errors(name):
    with pytest.raises(SpecError, match="hardware="):
        load_node(name)


def test_directory_and_nul_paths_are_refused(tmp_path):
    with pytest.raises(SpecError, match="not a regular file"):
        read_text(tmp_path, what="plan file")
    with pytest.raises(SpecError, match="not a valid path"):
        read_text("a\x00b", what="plan file")
