"""A search that outlasts a reader's patience says so on stderr.

Most plans answer in about a second; a request at an extreme shape (a million-token sequence, tens of
thousands of GPUs, a space where nothing fits) can take tens of seconds. After ``NOTICE_AFTER_S``
without an answer one line says the search is still running, and when it ends one more says how
long it took. Both go to stderr, so ``--format json`` keeps stdout to its one document.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click

NOTICE_AFTER_S = 3.0
"""Seconds of search before the still-searching line (about three times an ordinary plan)."""


@contextmanager
def search_notice(what: str, after_s: float | None = None) -> Iterator[None]:
    """Run the body; if it lasts past ``after_s`` (default ``NOTICE_AFTER_S``), print that ``what``
    is still being searched, and its duration once done."""
    start = time.perf_counter()
    said = threading.Event()

    def notice() -> None:
        said.set()
        click.echo(f"searching {what} (over {time.perf_counter() - start:.0f} s so far) ...", err=True)

    timer = threading.Timer(NOTICE_AFTER_S if after_s is None else after_s, notice)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if said.is_set():
            click.echo(f"searched {what} in {time.perf_counter() - start:.1f} s", err=True)
