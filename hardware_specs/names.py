"""Preset names as users type them: exact, case-insensitive, or an unambiguous leading part.

``h100`` names ``h100-sxm-80gb``: a name matches a preset when its tokens (split at ``-``, ``_``
and ``.``) are the preset's leading tokens, case ignored. When a bare chip name matches several
form factors, the SXM one is meant (the datacenter default: ``h100`` is ``h100-sxm-80gb``, not
``h100-pcie-80gb``); any other tie is ambiguous and refused with the candidates named.
Suggestions for unknown names go by shared token first, then by spelling.
"""

from __future__ import annotations

import difflib
import re

from autoplan_base.errors import SpecError

_SPLIT = re.compile(r"[-_.]")


def _tokens(name: str) -> list[str]:
    return [t for t in _SPLIT.split(name.lower()) if t]


def match_name(given: str, choices: list[str], *, option: str, fix: str) -> str:
    """The preset ``given`` names; ``SpecError`` naming ``option`` when none or several do.
    ``fix``: how to find a valid name, for the message."""
    if given in choices:
        return given
    folded = [c for c in choices if c.lower() == given.lower()]
    if len(folded) == 1:
        return folded[0]
    want = _tokens(given)
    leading = [c for c in choices if want and _tokens(c)[:len(want)] == want]
    if len(leading) > 1:
        sxm = [c for c in leading if "sxm" in _tokens(c)]
        leading = sxm if len(sxm) == 1 and len(want) == 1 else leading
    if len(leading) == 1:
        return leading[0]
    if leading:
        raise SpecError(f"{option}: {given!r} is ambiguous: it could be {', '.join(sorted(leading))}")
    raise SpecError(f"{option}: unknown name {given!r}{suggest(given, choices)}; {fix}")


def suggest(given: str, choices: list[str], limit: int = 3) -> str:
    """``" (did you mean a, b?)"``: presets sharing the most tokens with ``given`` (a token counts
    when one starts with the other; the leading, family token counts double), ties and the rest by
    spelling; ``""`` when nothing is near."""
    want = _tokens(given)

    def score(choice: str) -> int:
        have = _tokens(choice)
        shared = sum(any(t.startswith(w) or w.startswith(t) for t in have if len(t) >= 2) for w in want if len(w) >= 2)
        family = bool(want and have and (have[0].startswith(want[0]) or want[0].startswith(have[0])))
        return shared + family

    def spelling(choice: str) -> float:
        return difflib.SequenceMatcher(None, given.lower(), choice).ratio()

    ranked = sorted((c for c in choices if score(c) > 0), key=lambda c: (-score(c), -spelling(c), c))
    near = ranked[:limit] or _spelled_alike(given, choices, limit)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def _spelled_alike(given: str, choices: list[str], limit: int) -> list[str]:
    """Presets whose whole name or family token (``h100`` of ``h100-sxm-80gb``) is spelled like
    ``given`` (a typo such as ``h10O``, also read with O as 0), closest first; a tie goes to the SXM form, as in ``match_name``."""
    typed = {given.lower(), given.lower().replace("o", "0")}  # the letter O for a zero: h1OO

    def likeness(choice: str) -> float:
        family = _tokens(choice)[0] if _tokens(choice) else choice
        return max(difflib.SequenceMatcher(None, t, name).ratio() for t in typed for name in (choice, family))

    def sxm_first(choice: str) -> int:
        return 0 if "sxm" in _tokens(choice) else 1

    alike = [c for c in choices if likeness(c) >= 0.6]
    return sorted(alike, key=lambda c: (-round(likeness(c), 6), sxm_first(c), c))[:limit]


def closest_first(given: str, choices: list[str]) -> list[str]:
    """``choices`` with the one spelled most like ``given`` first, if any is close (a typo), the
    rest in their order."""
    near = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
    return near + [c for c in choices if c not in near]
