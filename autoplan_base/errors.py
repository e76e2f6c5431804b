"""The project-wide user-input error base, ``AutoplanError``, and ``SpecError``.

All are ``ValueError`` subclasses so callers can catch one type; the CLI prints ``str(error)`` as
a single line and exits with status 2. ``field`` names an input in the caller's words: a keyword
(``seq_len=``) from Python, a flag (``--seq-len``) from the command line, a file's own field
(``seq_len``, a table's column) while a file is read.
"""

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar


class AutoplanError(ValueError):
    """Base class: bad user input, with a message naming the field and the fix."""


class SpecError(AutoplanError):
    """A model, hardware, cluster or training specification is invalid."""


_CLI_NAMES = {"top_k": "--top", "layers_per_chunk": "--layers-per-stage", "context_attention": "--cp-attention",
              "fmt": "--format", "micro_batch_size": "--micro-batch", "zero_stage": "--zero"}
"""Inputs whose command-line flag is not their keyword spelled with dashes."""

_ON_COMMAND_LINE: ContextVar[bool] = ContextVar("autoplan_on_command_line", default=False)
_FILE_FIELDS: ContextVar[Mapping[str, str] | None] = ContextVar("autoplan_file_fields", default=None)
_GIVEN_AS: ContextVar[Mapping[str, str] | None] = ContextVar("autoplan_given_as", default=None)


def field(name: str, value: object = None) -> str:
    """How an error names the input ``name`` (a keyword of ``planner.plan``, e.g. ``seq_len``), with
    the value given when there is one: ``seq_len=32768`` from the Python API, ``--seq-len 32768``
    under ``command_line_wording`` (the CLI), ``seq_len 32768`` (the file's field) under ``file_wording``."""
    fields = _FILE_FIELDS.get()
    if fields is not None:
        key = fields.get(name, name)
        return key if value is None else f"{key} {value}"
    if _ON_COMMAND_LINE.get():
        flag = (_GIVEN_AS.get() or {}).get(name) or _CLI_NAMES.get(name, "--" + name.replace("_", "-"))
        return flag if value is None else f"{flag} {value}"
    return f"{name}=" if value is None else f"{name}={value}"


@contextmanager
def _holding(var: ContextVar, value: object) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def command_line_wording() -> AbstractContextManager[None]:
    """Within this block errors name command-line flags (``--seq-len``), not keywords (``seq_len=``)."""
    return _holding(_ON_COMMAND_LINE, True)


def given_as(name: str, flag: str) -> AbstractContextManager[None]:
    """Within this block the command line names the input ``name`` by ``flag``, the option the user
    gave it by where two options fill one input (``--calibration`` fills ``profile``)."""
    return _holding(_GIVEN_AS, {**(_GIVEN_AS.get() or {}), name: flag})


def file_wording(fields: Mapping[str, str] | None = None) -> AbstractContextManager[None]:
    """Within this block errors name inputs as the file being read spells them (``seq_len``, a
    table's column), also on the command line: the value came from the file, not a flag. ``fields``
    maps a keyword to the file's field where the two differ (``micro_batch_size`` -> ``micro_batch``)."""
    return _holding(_FILE_FIELDS, dict(fields or {}))
