"""Every captured block in README.md and docs/*.md still matches what its command prints.

The blocks are marked ``<!-- autoplan: ARGS -->`` (or ``<!-- python: SCRIPT ARGS -->``) above a
fenced block; ``scripts/refresh-docs`` regenerates them. Wall times are masked on both sides, every
other character must match. ``autoplan`` blocks run in this process through click's CliRunner;
benchmark scripts and blocks marked ``slow`` run only in the full tier."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "refresh-docs"


def _load():
    loader = importlib.machinery.SourceFileLoader("refresh_docs", str(SCRIPT))
    spec = importlib.util.spec_from_loader("refresh_docs", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["refresh_docs"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


refresh_docs = _load()
BLOCKS = refresh_docs.all_blocks()


def _params():
    for block in BLOCKS:
        marks = [pytest.mark.slow] if block.slow else []
        yield pytest.param(block, id=block.where, marks=marks)


def test_the_readme_captures_its_first_command():
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert any(b.kind == "autoplan" and b.command.startswith("plan --model llama3-70b") for b in readme)


def test_timings_are_masked_and_figures_are_not():
    line = "searched 294,132 layouts (17,010 evaluated in full) in 13.76 s; rejected: 49,981 memory"
    assert refresh_docs.mask(line) == line.replace("13.76", "T")
    figure = "step 52.676 s ± 27% · checkpoint every 508 steps (920 GiB in 126 s; MTBF 792 h)"
    assert refresh_docs.mask(figure) == figure


def test_search_notices_are_not_captured(capsys):
    """The still-searching lines appear only when the machine is slow enough; no block keeps them."""
    import time

    from planner.cli.progress import search_notice

    with search_notice("the layouts of x", after_s=0.0):
        time.sleep(0.2)
    printed = capsys.readouterr().err
    assert printed.count("\n") == 2
    assert refresh_docs._SEARCH_NOTICE.sub("", printed + "best: dp 2\n") == "best: dp 2\n"


def test_line_selection():
    text = "a1\nb2\na3\nb4\n"
    assert refresh_docs._select(text, {"lines": "2-3"}) == "b2\na3"
    assert refresh_docs._select(text, {"grep": "^a"}) == "a1\na3"


@pytest.mark.parametrize("block", list(_params()))
def test_captured_block_matches_its_command(block):
    now = refresh_docs.mask(refresh_docs.produce(block))
    assert now == refresh_docs.mask(refresh_docs.current_text(block)), (
        f"{block.where} no longer matches `{block.kind} {block.command}`: run .venv/bin/python scripts/refresh-docs"
        + (" --all" if block.slow else ""))


def _readme_api_snippet() -> str:
    text = (SCRIPT.parents[1] / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_api_snippet_runs_when_a_layout_fits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(_readme_api_snippet(), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) >= 2  # the best layout, then at least one alternative
    assert (tmp_path / "plan.json").read_text().startswith("{")


def test_readme_api_snippet_runs_when_nothing_fits(tmp_path, monkeypatch, capsys):
    import planner

    real_plan = planner.plan

    def nothing_fits(**_kwargs):  # 175B parameters' states alone exceed 8 x 40 GB
        return real_plan(model="gpt3-175b", hardware="a100-sxm-40gb", gpus=8, global_batch=8, seq_len=2048)

    monkeypatch.setattr(planner, "plan", nothing_fits)
    monkeypatch.chdir(tmp_path)
    exec(compile(_readme_api_snippet(), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert " GiB" in printed and not (tmp_path / "plan.json").exists()
