"""Divisors of an integer from its prime factorisation: the degrees a mesh can take divide the GPU
count and the batch, which a request may give as large as 10^25 (``planner.search.space``)."""

from __future__ import annotations

import math


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending, built from its prime factorisation (``prime_factors``),
    so a batch of 10^25 costs milliseconds, not the √N trial divisions of the naive loop."""
    out = [1]
    for prime, power in prime_factors(n).items():
        out = [d * prime**k for d in out for k in range(power + 1)]
    return sorted(out)


def prime_factors(n: int) -> dict[int, int]:
    """``{prime: exponent}`` of ``n`` >= 1: trial division by small primes, then Pollard's rho
    (Pollard, BIT 15, 1975; Brent's variant, BIT 20, 1980) with a Miller-Rabin primality test."""
    factors: dict[int, int] = {}
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_probable_prime(m):
            factors[m] = factors.get(m, 0) + 1
            continue
        d = _pollard_rho(m)
        stack += [d, m // d]
    return dict(sorted(factors.items()))


def _is_probable_prime(n: int) -> bool:
    """Miller-Rabin with the first 12 prime bases: exact below 3.3 * 10^24, and the chance of a
    wrong answer past that is below 4^-12 per composite."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    if n < 2:
        return False
    if n in bases:
        return True
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_rho(n: int) -> int:
    """A non-trivial factor of the odd composite ``n`` (deterministic: constants tried in order)."""
    for c in range(1, n):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise ValueError(f"no factor found for {n}")
