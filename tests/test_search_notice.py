"""A long search says so on stderr (``planner.cli.progress``), and stdout keeps its one JSON document."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from planner.cli import main, progress

PLAN = ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "8",
        "--seq-len", "64", "--format", "json"]


def test_a_search_past_the_threshold_says_it_is_searching_and_how_long_it_took(monkeypatch):
    monkeypatch.setattr(progress, "NOTICE_AFTER_S", 0.0)
    result = CliRunner().invoke(main, PLAN)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["best"]["layout"]  # stdout: the plan document alone
    assert "searching the layouts of tiny-llama on 2 GPUs" in result.stderr
    assert "searched the layouts of tiny-llama on 2 GPUs in" in result.stderr


def test_a_search_inside_the_threshold_prints_no_notice(monkeypatch):
    monkeypatch.setattr(progress, "NOTICE_AFTER_S", 600.0)
    result = CliRunner().invoke(main, PLAN)
    assert result.exit_code == 0, result.output
    assert "search" not in result.stderr


def test_the_notice_waits_for_its_threshold(capsys):
    with progress.search_notice("x", after_s=0.05):
        time.sleep(0.3)
    with progress.search_notice("y", after_s=5.0):
        pass
    err = capsys.readouterr().err
    assert "searching x" in err and "searched x in" in err and "y" not in err
