"""Profile files: round trip, clean rejection of bad files, lookups, and the shipped CPU profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import profiles
from autoplan_base.errors import AutoplanError
from profiles import HardwareProfile, ProfileError, load_profile, profile_to_dict, write_profile
from profiles.build import build_profile

SHIPPED = Path(profiles.__file__).parent / "data" / "cpu-gloo-2proc.json"


def synthetic_profile() -> HardwareProfile:
    """A profile from made-up medians that follow known laws (not measurements: for file tests)."""
    rate, t0 = 1e11, 1e-5
    gemm = [{"m": m, "n": n, "k": k, "time_s": t0 + 2 * m * n * k / rate}
            for m, n, k in [(128, 256, 256), (512, 1024, 256), (2048, 768, 512)]]
    attention = [{"batch": 1, "seq_len": s, "num_heads": 4, "head_dim": 64, "time_s": t0 + 12 * s * s * 256 / rate}
                 for s in (256, 512)]
    sizes = [4096 * 2**i for i in range(6)]
    raw = {
        "gemm": {"fp32": gemm}, "attention": {"fp32": attention},
        "memory": {"copy": [{"size_bytes": 2**20, "time_s": 2 * 2**20 / 20e9}]},
        "collectives": [{"op": "all_reduce", "num_ranks": 2, "ranks_per_node": 2, "num_nodes": 1, "dtype": "fp32",
                         "sizes_bytes": sizes, "median_time_s": [1e-4 + s / 1e9 for s in sizes]}],
    }
    return build_profile(raw, device_type="cpu", provenance={"device_name": "synthetic", "num_devices": 2})


@pytest.fixture
def written(tmp_path: Path) -> Path:
    path = tmp_path / "p.json"
    write_profile(path, synthetic_profile())
    return path


def test_round_trip_is_lossless(written: Path) -> None:
    assert profile_to_dict(load_profile(written)) == profile_to_dict(synthetic_profile())


def test_written_file_has_schema_header_and_sorted_keys(written: Path) -> None:
    text = written.read_text()
    data = json.loads(text)
    assert data["schema_version"] == profiles.SCHEMA_VERSION
    assert data["kind"] == "autoplan-hardware-profile"
    assert text == json.dumps(data, indent=1, sort_keys=True) + "\n"
    assert [p.name for p in written.parent.iterdir()] == ["p.json"]  # no temporary file left behind


def _rejected(path: Path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert isinstance(info.value, AutoplanError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_truncated_file_is_rejected(written: Path) -> None:
    text = written.read_text()
    written.write_text(text[: len(text) // 2])
    assert "not valid JSON" in _rejected(written)


def test_corrupt_bytes_are_rejected(written: Path) -> None:
    written.write_bytes(b"\x00\xff\xfe garbage")
    assert "not UTF-8 text" in _rejected(written)


def test_non_finite_numbers_are_refused_when_read(written: Path) -> None:
    data = json.loads(written.read_text())
    data["memory"]["copy"][0]["time_s"] = float("nan")
    written.write_text(json.dumps(data))
    assert "NaN is not a number JSON allows" in _rejected(written)


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    assert "cannot read" in _rejected(tmp_path / "absent.json")


def test_wrong_schema_version_is_rejected(written: Path) -> None:
    data = json.loads(written.read_text())
    data["schema_version"] = 99
    written.write_text(json.dumps(data))
    assert "schema_version" in _rejected(written) and "99" in _rejected(written)


def test_foreign_json_is_rejected(tmp_path: Path) -> None:
    plan_like = tmp_path / "plan.json"
    plan_like.write_text(json.dumps({"schema_version": 1, "inputs": {}, "best": {}}))
    assert "not an autoplan profile" in _rejected(plan_like)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2, 3]")
    assert "JSON object" in _rejected(listing)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.pop("collectives"), "collectives"),
    (lambda d: d["gemm"]["fp32"]["points"][0].update(time_s=-1.0), "gemm.fp32.points[0].time_s"),
    (lambda d: d["gemm"]["fp32"]["points"][0].update(m="128"), "gemm.fp32.points[0].m"),
    (lambda d: d["gemm"].update(fp64=d["gemm"]["fp32"]), "gemm.fp64"),
    (lambda d: d["collectives"][0].update(op="allreduce"), "collectives[0].op"),
    (lambda d: d["collectives"][0].update(num_ranks=1), "collectives[0].num_ranks"),
    (lambda d: d["collectives"][0]["sizes_bytes"].reverse(), "collectives[0].sizes_bytes"),
    (lambda d: d["collectives"][0]["smoothed_time_s"].reverse(), "collectives[0].smoothed_time_s"),
    (lambda d: d["collectives"][0]["median_time_s"].pop(), "collectives[0]"),
    (lambda d: d.update(device_type="tpu"), "device_type"),
    (lambda d: d["collectives"].append(d["collectives"][0]), "collectives"),
    (lambda d: d["memory"]["copy"][0].update(time_s=-1.0), "memory.copy[0].time_s"),
    (lambda d: d["collectives"][0].pop("segments"), "collectives[0].segments"),
    (lambda d: d["collectives"][0].update(segments=[]), "collectives[0].segments"),
    (lambda d: d["collectives"][0]["segments"][0].update(first_size_bytes=12345), "collectives[0].segments[0]"),
    (lambda d: d["collectives"][0]["segments"][0].update(latency_s=-1.0), "collectives[0].segments[0].latency_s"),
    (lambda d: d["collectives"][0]["segments"].append(d["collectives"][0]["segments"][0]),
     "collectives[0].segments[1]"),
])
def test_malformed_fields_are_named(written: Path, mutate, field: str) -> None:
    data = json.loads(written.read_text())
    mutate(data)
    written.write_text(json.dumps(data))
    assert f" {field}" in _rejected(written)


def _as_version_1(data: dict) -> dict:
    """What autoplan wrote before regimes: schema 1, no ``segments`` in the curves, and
    ``spans_nodes`` in place of ranks per node and nodes."""
    for curve in data["collectives"]:
        curve.pop("segments")
        curve["spans_nodes"] = curve.pop("num_nodes") > 1
        curve.pop("ranks_per_node")
    return {**data, "schema_version": 1}


def test_version_1_file_loads_as_one_regime_per_curve(written: Path) -> None:
    """Version-1 files keep loading: each curve is read as the one regime its single alpha-beta fit
    stated, so planning with an old file is unchanged beyond the measured range too."""
    written.write_text(json.dumps(_as_version_1(json.loads(written.read_text()))))
    curve = load_profile(written).collectives[0]
    (regime,) = curve.segments
    assert (regime.first_size_bytes, regime.last_size_bytes) == (curve.sizes_bytes[0], curve.sizes_bytes[-1])
    assert (regime.latency_s, regime.bus_bandwidth_bytes_per_s) == (curve.latency_s, curve.bus_bandwidth_bytes_per_s)
    beyond = curve.sizes_bytes[-1] * 4
    expected = curve.smoothed_time_s[-1] + (beyond - curve.sizes_bytes[-1]) / curve.bus_bandwidth_bytes_per_s
    assert curve.time_s(beyond) == pytest.approx(expected)  # all_reduce over 2 ranks: bus factor 1


def test_refit_rewrites_fits_from_stored_medians_and_records_it(written: Path, tmp_path: Path) -> None:
    written.write_text(json.dumps(_as_version_1(json.loads(written.read_text()))))
    out = tmp_path / "refit.json"
    subprocess.run([sys.executable, "-m", "profiles.refit", str(written), "--out", str(out)], check=True)
    old, new = json.loads(written.read_text()), json.loads(out.read_text())
    assert new["schema_version"] == profiles.SCHEMA_VERSION and new["provenance"]["refit"]["command"].startswith(
        "python -m profiles.refit")
    for before, after in zip(old["collectives"], new["collectives"]):
        assert after["median_time_s"] == before["median_time_s"] and after["sizes_bytes"] == before["sizes_bytes"]
        assert after["segments"]
    assert {k: v for k, v in new.items() if k not in ("collectives", "provenance", "schema_version")} == \
        {k: v for k, v in old.items() if k not in ("collectives", "provenance", "schema_version")}
    assert profile_to_dict(load_profile(out))["collectives"] == profile_to_dict(synthetic_profile())["collectives"]


def test_lookups_answer_measured_terms_and_none_elsewhere() -> None:
    p = synthetic_profile()
    # The synthetic GEMMs follow t = 1e-5 + F/1e11 exactly, so the fit reproduces that law.
    f = 2 * 4096 * 4096 * 4096
    assert p.gemm_flops_per_s(4096, 4096, 4096, "fp32") == pytest.approx(f / (1e-5 + f / 1e11), rel=1e-6)
    assert p.gemm_flops_per_s(4096, 4096, 4096, "bf16") is None
    assert p.attention_flops_per_s(1, 1024, 4, 64, "fp32") is not None
    assert p.attention_flops_per_s(1, 1024, 4, 64, "fp8") is None
    assert p.memory_bandwidth_bytes_per_s() == pytest.approx(20e9)
    assert p.collective_time_s("all_reduce", 2, 2, 1, 8192) == pytest.approx(1e-4 + 8192 / 1e9, rel=1e-6)
    assert p.collective_time_s("all_reduce", 2, 1, 2, 8192) is None     # not measured across nodes
    assert p.collective_time_s("all_reduce", 8, 8, 1, 8192) is None     # group size not measured
    assert p.collective_time_s("all_gather", 2, 2, 1, 8192) is None     # op not measured
    assert p.collective_time_s("all_reduce", 1, 1, 1, 8192) == 0.0      # one rank: nothing to send
    assert p.calibration == {}
    assert p.device_type == "cpu"


def test_import_profiles_does_not_import_torch() -> None:
    code = "import sys, profiles, profiles.harness; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_profiles_package_is_this_repository() -> None:
    assert Path(profiles.__file__).resolve().parent == Path(__file__).resolve().parents[1] / "profiles"


def test_shipped_cpu_profile_is_a_real_two_process_gloo_measurement() -> None:
    p = load_profile(SHIPPED)
    prov = p.provenance
    assert p.device_type == "cpu"
    assert (prov["num_devices"], prov["backend"], prov["threads_per_process"]) == (2, "gloo", 1)
    assert prov["command"].startswith("autoplan profile --device cpu --nproc 2")
    assert set(p.gemm) == {"fp32", "bf16"} and set(p.attention) == {"fp32", "bf16"}
    ops = {c.key for c in p.collectives}
    assert ops == {(op, 2, 2, 1) for op in profiles.fit.COLLECTIVE_OPS}
    assert p.memory_bandwidth_bytes_per_s() is not None
