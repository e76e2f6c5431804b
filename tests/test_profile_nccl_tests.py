"""``autoplan profile import-nccl-tests``: nccl-tests stdout -> collective curves (issue 15).

The fixtures under tests/data/nccl-tests/ are synthetic logs in nccl-tests' printed layout, made
by tests/data/make_nccl_tests_logs.py from known two-regime alpha-beta models (±3% wobble); the
tests check that the import recovers those models.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from profiles import fit, load_profile
from profiles.nccl_tests import NcclTestsError, import_logs, nccl_version_name, parse_log

DATA = Path(__file__).parent / "data" / "nccl-tests"
LOGS = sorted(str(p) for p in DATA.glob("*.log"))


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_header_ranks_and_table_are_read() -> None:
    (run,) = parse_log(_text("all_reduce_perf-8.log"), "all_reduce_perf-8.log")
    assert (run.program, run.op, run.num_ranks, run.num_nodes, run.ranks_per_node) == \
        ("all_reduce_perf", "all_reduce", 8, 1, 8)
    assert run.device_names == ("NVIDIA H100 80GB HBM3",) * 8
    assert (run.tests_version, run.nccl_version) == ("2.17.4", "2.27.3")
    assert [r.size_bytes for r in run.rows] == [8 << i for i in range(28)]     # 8 B .. 1 GiB, -f 2
    first = run.rows[0]
    # The first row as printed: 8 B, out-of-place 18.00 us, in-place (wobble 1.01) 18.18 us.
    assert first.out_of_place_time_s == pytest.approx(18.00e-6, rel=1e-3)
    assert first.in_place_time_s == pytest.approx(18.18e-6, rel=1e-3)


def test_size_column_is_the_full_buffer_so_busbw_matches_the_log() -> None:
    """All-gather prints max(send, recv) bytes = the gathered buffer; the profile's bus bandwidth
    of a row (fit.bus_bandwidth_bytes_per_s) must equal the busbw column nccl-tests printed."""
    text = _text("all_gather_perf-8.log")
    (run,) = parse_log(text, "ag")
    printed = {int(t[0]): float(t[7]) for t in (line.split() for line in text.splitlines())
               if t and t[0].isdigit() and int(t[0]) >= 1 << 20}
    for row in run.rows:
        if row.size_bytes in printed:
            ours = fit.bus_bandwidth_bytes_per_s("all_gather", 8, row.size_bytes, row.out_of_place_time_s)
            assert ours / 1e9 == pytest.approx(printed[row.size_bytes], rel=0.01)


def test_zero_byte_rows_of_small_all_gathers_are_dropped() -> None:
    (run,) = parse_log(_text("all_gather_perf-8.log"), "ag")
    assert min(r.size_bytes for r in run.rows) == 128   # 16 B x 8 ranks: the first non-empty shard


def test_import_recovers_the_regimes_each_log_was_made_from() -> None:
    profile = import_logs(LOGS, command="test", date="today")
    assert profile.device_type == "cuda"
    truth = {  # (op, ranks, ranks per node, nodes): [(first size of regime, alpha us, busbw GB/s)],
        # see make_nccl_tests_logs.py
        ("all_reduce", 8, 8, 1): [(8, 18.0, 40.0), (262144, 45.0, 360.0)],
        ("all_reduce", 16, 8, 2): [(8, 40.0, 10.0), (1048576, 120.0, 170.0)],
        ("all_gather", 8, 8, 1): [(128, 14.0, 30.0), (262144, 30.0, 340.0)],
        ("send_recv", 2, 2, 1): [(8, 9.0, 20.0), (131072, 20.0, 320.0)],
    }
    for (op, n, per_node, nodes), regimes in truth.items():
        curve = profile.collective_curve(op, n, per_node, nodes)
        assert curve is not None and curve.source == "nccl-tests"
        assert [s.first_size_bytes for s in curve.segments] == [r[0] for r in regimes]
        for seg, (_, alpha_us, busbw) in zip(curve.segments, regimes):
            assert seg.latency_s * 1e6 == pytest.approx(alpha_us, rel=0.05)
            assert seg.bus_bandwidth_bytes_per_s / 1e9 == pytest.approx(busbw, rel=0.05)
    assert profile.collective_curve("all_reduce", 16, 8, 2).dtype == "bf16"
    prov = profile.provenance
    assert (prov["num_devices"], prov["num_nodes"], prov["devices_per_node"]) == (16, 2, 8)
    assert prov["hosts"] == ["gpu-a01", "gpu-a02"] and prov["source"] == "nccl-tests"


def test_in_place_column_is_used_when_asked() -> None:
    out = import_logs([str(DATA / "all_reduce_perf-8.log")]).collectives[0]
    inp = import_logs([str(DATA / "all_reduce_perf-8.log")], in_place=True).collectives[0]
    assert inp.median_time_s[0] == pytest.approx(out.median_time_s[0] * 1.01, rel=1e-3)


def test_nccl_version_codes() -> None:
    assert nccl_version_name(22703) == "2.27.3" and nccl_version_name(2708) == "2.7.8"


@pytest.mark.parametrize(("text", "needle"), [
    ("hello world\n", "no nccl-tests result table"),
    ("# Collective test starting: all_reduce_perf\n#       size  count  type  redop  root  time  algbw  busbw  #wrong\n"
     "     1024   256  float  sum  -1  10.0  0.1  0.1  0\n", "Rank"),
    ("# Collective test starting: gather_perf\n#  Rank  0 Group  0 Pid 1 on h device  0 [0] G\n"
     "#       size  count  type  redop  root  time  algbw  busbw  #wrong\n", "does not hold"),
])
def test_foreign_logs_are_one_line_errors(tmp_path: Path, text: str, needle: str) -> None:
    log = tmp_path / "x.log"
    log.write_text(text)
    with pytest.raises(NcclTestsError, match=needle):
        import_logs([str(log)])
    result = CliRunner().invoke(main, ["profile", "import-nccl-tests", str(log), "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and needle in result.output
    assert not (tmp_path / "p.json").exists()


def test_wrong_elements_refuse_the_log(tmp_path: Path) -> None:
    lines = _text("sendrecv_perf-2.log").splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("4096 "))
    tokens = lines[i].split()
    tokens[8] = "17"
    lines[i] = "  ".join(tokens)
    log = tmp_path / "sendrecv_perf.log"
    log.write_text("\n".join(lines))
    with pytest.raises(NcclTestsError, match="17 wrong elements"):
        import_logs([str(log)])


def test_the_same_curve_twice_is_refused() -> None:
    path = str(DATA / "all_reduce_perf-8.log")
    with pytest.raises(NcclTestsError, match="also in"):
        import_logs([path, path])


def test_cli_writes_a_loadable_profile_and_show_prints_regimes(tmp_path: Path) -> None:
    out = tmp_path / "h100.json"
    result = CliRunner().invoke(main, ["profile", "import-nccl-tests", *LOGS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    loaded = load_profile(out)
    assert len(loaded.collectives) == 6 and {c.source for c in loaded.collectives} == {"nccl-tests"}
    assert json.loads(out.read_text())["collectives"][0]["source"] == "nccl-tests"
    shown = CliRunner().invoke(main, ["profile", "show", str(out)], env={"COLUMNS": "160"})
    assert shown.exit_code == 0, shown.output
    # Each regime is a row with its size range: the 8-rank all-reduce splits at 256 KiB.
    assert "8 B - 128 KiB" in shown.output and "256 KiB - 1 GiB" in shown.output


def test_a_plan_from_an_imported_profile_prices_communication_with_its_curves(tmp_path: Path) -> None:
    """Llama 3 8B at tp 8 on one H100 node: the TP all-gather/reduce-scatter (8 ranks, one node)
    come from the nccl-tests curves, and the breakdown says so; doubling every measured time of
    those curves doubles the TP communication time exactly (no datasheet term mixes in)."""
    from dataclasses import replace

    import planner
    from costmodels.layout import Layout
    from profiles import write_profile

    job = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
               layout=Layout(dp=1, tp=8, pp=1, sequence_parallel=True, num_microbatches=64))
    imported = import_logs(LOGS)
    slower = replace(imported, collectives=tuple(
        replace(c, smoothed_time_s=tuple(2 * t for t in c.smoothed_time_s)) for c in imported.collectives))
    paths = {}
    for name, profile in (("imported", imported), ("slower", slower)):
        paths[name] = tmp_path / f"{name}.json"
        write_profile(paths[name], profile)
    datasheet = planner.evaluate(**job)
    measured = planner.evaluate(**job, profile=str(paths["imported"]))
    doubled = planner.evaluate(**job, profile=str(paths["slower"]))
    assert measured.sources["tp_comm"] == "profile (nccl-tests)"
    assert datasheet.sources["tp_comm"] == "datasheet"
    assert measured.sources["compute"] == "datasheet"   # the import holds no GEMM rates
    assert measured.tp_comm_s != pytest.approx(datasheet.tp_comm_s, rel=1e-3)
    assert doubled.tp_comm_s == pytest.approx(2 * measured.tp_comm_s, rel=1e-9)


def test_explain_shows_the_source_of_each_term(tmp_path: Path) -> None:
    profile, plan = tmp_path / "h100.json", tmp_path / "plan.json"
    assert CliRunner().invoke(main, ["profile", "import-nccl-tests", *LOGS, "--out", str(profile)]).exit_code == 0
    made = CliRunner().invoke(main, ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8",
                                     "--global-batch", "64", "--seq-len", "4096", "--dp", "1", "--tp", "8", "--pp",
                                     "1", "--profile", str(profile), "--out", str(plan)])
    assert made.exit_code == 0, made.output
    shown = CliRunner().invoke(main, ["explain", str(plan)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "tp_comm=profile (nccl-tests)" in shown.output and "compute=datasheet" in shown.output
