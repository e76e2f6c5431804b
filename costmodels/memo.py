"""``memoised``: the one memo helper of the cost model (a dict keyed by a function's inputs)."""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def memoised(memo: dict, key: tuple, compute: Callable[[], T]) -> T:
    """``memo[key]``, computed by ``compute()`` the first time; ``key`` holds every input of ``compute``."""
    value = memo.get(key)
    if value is None:
        value = memo[key] = compute()
    return value
