"""The project-wide user-input error base, ``AutoplanError``, and ``SpecError``.

All are ``ValueError`` subclasses so callers can catch one type; the CLI prints ``str(error)`` as
a single line and exits with status 2. ``field`` names an input in the caller's words: a keyword
(``seq_len=``) from Python, a flag (``--seq-len``) from the command line.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class AutoplanError(ValueError):
    """Base class: bad user input, with a message naming the field and the fix."""


class SpecError(AutoplanError):
    """A model, hardware, cluster or training specification is invalid."""


_CLI_NAMES = {"top_k": "--top", "layers_per_chunk": "--layers-per-stage", "context_attention": "--cp-attention",
              "fmt": "--format", "micro_batch_size": "--micro-batch", "zero_stage": "--zero"}
"""Inputs whose command-line flag is not their keyword spelled with dashes."""

_ON_COMMAND_LINE: ContextVar[bool] = ContextVar("autoplan_on_command_line", default=False)


def field(name: str, value: object = None) -> str:
    """How an error names the input ``name`` (a keyword of ``planner.plan``, e.g. ``seq_len``), with
    the value given when there is one: ``seq_len=32768`` from the Python API, ``--seq-len 32768``
    under ``command_line_wording`` (the CLI)."""
    if _ON_COMMAND_LINE.get():
        flag = _CLI_NAMES.get(name, "--" + name.replace("_", "-"))
        return flag if value is None else f"{flag} {value}"
    return f"{name}=" if value is None else f"{name}={value}"


@contextmanager
def command_line_wording() -> Iterator[None]:
    """Within this block errors name command-line flags (``--seq-len``), not keywords (``seq_len=``)."""
    token = _ON_COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _ON_COMMAND_LINE.reset(token)
