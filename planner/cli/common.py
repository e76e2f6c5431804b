"""Shared pieces of the CLI: error handling, atomic file writes, output formats."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

import click

from autoplan_base.errors import AutoplanError, command_line_wording
from profiles.io import write_text_atomic

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

PIPE_WIDTH = 200
"""Columns of a table written to a pipe or a log file (rich's default there is 80, which wraps lines
and cuts names short); an exported ``COLUMNS`` still wins."""


class FiniteFloat(click.FloatRange):
    """The type of every float option: ``click.FloatRange`` that also refuses ``nan`` and ``inf``
    (``nan`` passes each comparison of a range; ``--time-limit inf`` would mean no limit at all).
    Without bounds it is a plain finite float (the API checks the range, e.g. ``launch --lr``)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if self.min is None and self.max is None:
            self.name = "float"

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            bounds = self._describe_range()
            self.fail(f"{value} is not a finite number{f' in the range {bounds}' if bounds else ''}", param, ctx)
        return super().convert(number, param, ctx)


def output_console(*, stderr: bool = False) -> "Console":
    """A rich console for a command's output: the terminal's width on a terminal, else ``PIPE_WIDTH``."""
    from rich.console import Console

    plain = Console(stderr=stderr)
    if plain.is_terminal or "COLUMNS" in os.environ:
        return plain
    return Console(stderr=stderr, width=PIPE_WIDTH)


def one_line(message: str) -> str:
    """``message`` on one line: line breaks and the indentation after them become one space."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


def run_command(work: Callable[[], T]) -> T:
    """Run ``work``; turn user-input errors into one line on stderr and exit status 2. Errors name
    inputs by their flags (``--seq-len``; ``autoplan_base.errors.field``)."""
    try:
        with command_line_wording():
            return work()
    except AutoplanError as err:
        click.echo(f"error: {one_line(str(err))}", err=True)
        sys.exit(EXIT_USAGE)


def check_places(*, out: str | None = None, plot_dir: str | None = None) -> None:
    """Refuse an unwritable ``--out`` file or ``--plot`` directory before any work starts."""
    from .places import check_output_dir, check_output_file

    if out is not None:
        check_output_file(out, "--out")
    if plot_dir is not None:
        check_output_dir(plot_dir, "--plot")


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never half-written.

    ``-`` writes to stdout.
    """
    if str(path) == "-":
        click.echo(text, nl=not text.endswith("\n"))
        return
    try:
        write_text_atomic(Path(path), text)
    except OSError as err:
        raise AutoplanError(f"--out {json.dumps(str(path))}: cannot write ({err.strerror})") from None
