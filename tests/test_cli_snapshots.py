"""The CLI's help texts and 80-column tables, frozen. On an intended change, regenerate them with
``.venv/bin/python tests/cli_snapshots.py`` and review the diff of ``tests/data/cli_snapshots/``."""

import pytest

from cli_snapshots import SNAPSHOT_DIR, cases, render


@pytest.mark.parametrize("name", sorted(cases()))
def test_cli_output_matches_its_snapshot(name):
    expected = (SNAPSHOT_DIR / f"{name}.txt").read_text(encoding="utf-8")
    got = render(cases()[name])
    assert got == expected, (f"'autoplan {' '.join(cases()[name])}' changed; if intended, run "
                             f"'.venv/bin/python tests/cli_snapshots.py' and review the diff")


@pytest.mark.parametrize("name", ["plan-table", "models-table", "hardware-table"])
def test_tables_fit_80_columns(name):
    assert max(len(line) for line in render(cases()[name]).splitlines()) <= 80
