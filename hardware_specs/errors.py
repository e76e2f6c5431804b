"""The project-wide user-input error base, ``AutoplanError``, and ``SpecError``.

It lives here, in ``hardware_specs``, only because that is the lowest package of the one-way
import chain (``hardware_specs <- profiles <- costmodels <- planner``), so every package can raise
it. All are ``ValueError`` subclasses so callers can catch one type; the CLI prints
``str(error)`` as a single line and exits with status 2.
"""


class AutoplanError(ValueError):
    """Base class: bad user input, with a message naming the field and the fix."""


class SpecError(AutoplanError):
    """A model, hardware, cluster or training specification is invalid."""


def closest_names(name: str, choices: list[str], limit: int = 3) -> str:
    """Return ``" (did you mean a, b?)"`` for the nearest known names, or ``""``."""
    import difflib

    near = difflib.get_close_matches(name, choices, n=limit, cutoff=0.5)
    return f" (did you mean {', '.join(near)}?)" if near else ""
