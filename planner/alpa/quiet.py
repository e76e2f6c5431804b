"""Keep a C library's writes off the caller's stdout and stderr.

HiGHS (highspy 1.16) prints a licence banner from the ``Highs()`` constructor, before any
option such as ``output_flag=False`` or PuLP's ``msg=False`` can be set, and it writes to file
descriptor 1 directly, so ``sys.stdout`` redirection cannot catch it. ``quiet_fds`` points fds 1
and 2 at ``/dev/null`` around the solve and restores them, flushing the C library's buffers on
the way out so nothing buffered inside the block reaches the real stdout later.

Anything another thread writes to fds 1/2 while the block runs is lost too; the solve is short
and the planner runs it on the calling thread.
"""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from typing import Iterator


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: push out whatever the C library holds for every open stream."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library handle on this platform: nothing to flush
        pass


@contextmanager
def quiet_fds() -> Iterator[None]:
    """Run the block with file descriptors 1 and 2 sent to ``/dev/null``."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    _flush_c_stdio()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
