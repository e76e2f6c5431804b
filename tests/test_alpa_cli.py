"""``autoplan trace`` and ``autoplan shard`` through CliRunner and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main

TESTS = str(Path(__file__).parent)
AUTOPLAN = str(Path(sys.executable).parent / "autoplan")


def _run(args):
    return CliRunner().invoke(main, args)


def test_trace_writes_graph_json(tmp_path):
    out = tmp_path / "graph.json"
    result = _run(["trace", "--module", "test_alpa_fixtures:tower", "--input-shape", "2,8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["blocks"]["members"] == ["trunk.0", "trunk.1", "trunk.2"]
    assert {n["layer"] for n in doc["nodes"]} == {"pre", "trunk.0", "trunk.1", "trunk.2", "post"}


def test_shard_module_json():
    result = _run(["shard", "--module", "test_alpa_fixtures:tower", "--input-shape", "8,512", "--tp", "2",
                   "--dp", "2", "--hardware", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) >= {"tp_plan", "collectives_per_block", "cost", "solver"}
    assert set(doc["solver"]) >= {"status", "variables", "constraints", "gap"}
    assert doc["mesh"] == {"dp": 2, "tp": 2}
    assert set(doc["tp_plan"]) >= {"trunk.0.inner", "trunk.2.outer", "lookup", "proj"}
    assert doc["solver"]["status"] == "optimal"


@pytest.mark.parametrize("args, needle", [
    (["--module", "no_such_pkg.mod:f", "--input-shape", "2,8"], "cannot import no_such_pkg.mod"),
    (["--module", "test_alpa_fixtures:raising", "--input-shape", "2,8"], "factory raised RuntimeError: checkpoint"),
    (["--module", "test_alpa_fixtures:data_dependent", "--input-shape", "2,8"], "cannot trace"),
    (["--module", "test_alpa_fixtures:not_a_module", "--input-shape", "2,8"], "not an nn.Module"),
    (["--module", "test_alpa_fixtures", "--input-shape", "2,8"], "expected pkg.mod:factory"),
    (["--module", "test_alpa_fixtures:mlp", "--input-shape", "2,x"], "--input-shape"),
    (["--model", "no-such-model"], "--model"),
    (["--model", "tiny-llama", "--module", "test_alpa_fixtures:mlp"], "exactly one of"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    result = _run(["shard", "--tp", "2", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output


def test_shard_preset_prints_table():
    result = _run(["shard", "--model", "tiny-llama", "--tp", "2", "--hardware", "cpu"])
    assert result.exit_code == 0, result.output
    assert "layers.0.attention.wq" in result.output and "solver: highs optimal" in result.output
    assert "layers.1.attention.wq" not in result.output  # repeated blocks are summarised in the table


def test_trace_bad_factory_as_subprocess():
    env = {**os.environ, "PYTHONPATH": TESTS}
    proc = subprocess.run([AUTOPLAN, "trace", "--module", "test_alpa_fixtures:raising",
                           "--input-shape", "2,8"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
