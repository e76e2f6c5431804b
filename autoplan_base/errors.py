"""The project-wide user-input error base, ``AutoplanError``, and ``SpecError``.

All are ``ValueError`` subclasses so callers can catch one type; the CLI prints ``str(error)`` as
a single line and exits with status 2.
"""


class AutoplanError(ValueError):
    """Base class: bad user input, with a message naming the field and the fix."""


class SpecError(AutoplanError):
    """A model, hardware, cluster or training specification is invalid."""
