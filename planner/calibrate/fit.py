"""Fit the mechanism factors to logged step times: regularised least squares on log step time.

With u_k = ln m_k the log multiplier of factor k and t_i(m) the run's step on its terms
(``terms``), the fit minimises

    sum_i (ln t_i(m) - ln measured_i)^2 / sigma^2  +  sum_k u_k^2 / tau^2

over u inside each factor's bounds: a Gaussian prior on the log multipliers, centred on 1
(the model as it is), with tau = ln 2 / 2 (``PRIOR_LOG_SD``: the bounds 0.5x-2x at two standard
deviations) against a run-to-run noise of sigma = 3% (``NOISE_LOG_SD``). It is solved by projected
Gauss-Newton (few factors, so each iteration is a K x K solve). A factor that no run moves by at
least ``INFORMED_SHARE`` of its step is held at its prior and reported so; the runs that move it by
``INFORMING_SHARE`` or more are said to inform it. The uncertainty of each factor is the posterior
standard deviation of its log, sqrt(diag(s^2 H^-1)), with H the Gauss-Newton Hessian and s^2 the
residual variance. Leave-one-out refits on the terms, warm-started from the full fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.calibration_factors import FACTORS

from .runs import CalibrationError
from .terms import RunTerms

PRIOR_LOG_SD = math.log(2.0) / 2
"""Prior standard deviation of each log multiplier: the 0.5x-2x bounds at two of them."""
NOISE_LOG_SD = 0.03
"""Run-to-run standard deviation of a measured step's log (a few per cent between repeats of one
layout on a quiet cluster); sets how strongly the prior pulls against the data."""
INFORMED_SHARE = 0.01
"""A factor is fitted only if some run's step moves by at least this share per unit of it."""
INFORMING_SHARE = 0.05
"""A run informs a factor when the factor moves its step by at least this share."""
ITERATIONS = 30
NOISE_ROUNDS = 3
"""Rounds of re-estimating the residual noise the prior is weighed against (``solve_empirical``)."""
MIN_STEP_S = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class FactorEstimate:
    """One factor's fitted multiplier and what stands behind it."""

    name: str
    mechanism: str
    multiplier: float
    log_sd: float
    """Posterior standard deviation of ln(multiplier); 0 when not informed."""
    informed: bool
    """Some run moves its step by ``INFORMED_SHARE`` of it; else the factor stays at its prior."""
    informing_runs: int
    """Runs it moves by ``INFORMING_SHARE`` or more."""
    informing: tuple[int, ...] = ()
    """Their indices among the timed runs (in the order given)."""
    on_bound: bool
    low: float
    high: float

    def to_dict(self) -> dict:
        return {"multiplier": round(self.multiplier, 6), "log_sd": round(self.log_sd, 6), "informed": self.informed,
                "informing_runs": self.informing_runs, "on_bound": self.on_bound, "bounds": [self.low, self.high],
                "mechanism": self.mechanism}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFit:
    """Fitted factors and the fit's figures (errors as predicted / measured - 1)."""

    factors: tuple[FactorEstimate, ...]
    errors_before: tuple[float, ...]
    errors_after: tuple[float, ...]
    """In sample, on the terms."""
    errors_leave_one_out: tuple[float, ...]
    """Each run predicted from the factors fitted without it; empty below two runs."""

    def multipliers(self) -> dict[str, float]:
        return {f.name: f.multiplier for f in self.factors}


class _Problem:
    """The arrays of one fit: steps at the prior, slopes, measured steps, bounds."""

    def __init__(self, terms: list[RunTerms]) -> None:
        timed = [t for t in terms if t.run.step_time_s]
        if not timed:
            raise CalibrationError("no run with a measured step time to fit (every run died out of memory or "
                                   "logged no step)")
        self.step = np.array([t.step_s for t in timed])
        self.slope = np.array([t.slopes_s for t in timed])
        self.measured = np.log(np.array([t.run.step_time_s for t in timed], dtype=float))
        self.low = np.log(np.array([f.low for f in FACTORS]))
        self.high = np.log(np.array([f.high for f in FACTORS]))
        shares = np.abs(self.slope) / self.step[:, None]
        self.informed = shares.max(axis=0) >= INFORMED_SHARE
        self.informing = (shares >= INFORMING_SHARE).sum(axis=0)
        self.informing_rows = [tuple(int(i) for i in np.flatnonzero(shares[:, k] >= INFORMING_SHARE))
                               for k in range(len(FACTORS))]

    def predict(self, u: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        return np.maximum(self.step[rows] + self.slope[rows] @ (np.exp(u) - 1.0), MIN_STEP_S)

    def solve(self, rows: np.ndarray | slice = slice(None), start: np.ndarray | None = None,
              noise: float = NOISE_LOG_SD) -> np.ndarray:
        """Projected Gauss-Newton on ``rows`` from ``start`` (zeros), the uninformed factors held at 0,
        the prior weighed against a residual noise of ``noise`` (log)."""
        free = self.informed
        u = np.zeros(len(FACTORS)) if start is None else start.copy()
        u[~free] = 0.0
        prior = np.full(len(FACTORS), noise ** 2 / PRIOR_LOG_SD ** 2)
        y, slope = self.measured[rows], self.slope[rows]
        for _ in range(ITERATIONS):
            t = self.predict(u, rows)
            r = np.log(t) - y
            jac = slope * np.exp(u)[None, :] / t[:, None]
            grad = jac.T @ r + prior * u
            hess = jac.T @ jac + np.diag(prior)
            at_low = (u <= self.low + 1e-12) & (grad > 0)
            at_high = (u >= self.high - 1e-12) & (grad < 0)
            moving = free & ~at_low & ~at_high
            if not moving.any():
                break
            step = np.zeros_like(u)
            step[moving] = -np.linalg.solve(hess[np.ix_(moving, moving)], grad[moving])
            if np.max(np.abs(step)) < 1e-10:
                break
            u = np.clip(u + step, self.low, self.high)
        return u

    def noise(self, u: np.ndarray, rows: np.ndarray | slice = slice(None)) -> float:
        """The residual log noise the fit at ``u`` leaves on ``rows``, at least ``NOISE_LOG_SD``."""
        r = np.log(self.predict(u, rows)) - self.measured[rows]
        return max(float(np.sqrt(r @ r / max(len(r) - int(self.informed.sum()), 1))), NOISE_LOG_SD)

    def solve_empirical(self, rows: np.ndarray | slice = slice(None), start: np.ndarray | None = None) -> np.ndarray:
        """``solve`` with the noise re-estimated from the residuals it leaves (empirical Bayes):
        where the model misses these runs by more than the run-to-run noise, the prior holds the
        factors closer to 1 instead of letting them chase the misses."""
        u, noise = start, NOISE_LOG_SD
        for _ in range(NOISE_ROUNDS):
            u = self.solve(rows, u, noise)
            noise = self.noise(u, rows)
        return u

    def log_sd(self, u: np.ndarray) -> np.ndarray:
        """Posterior standard deviation of each log multiplier (0 for a held factor)."""
        t = self.predict(u)
        r = np.log(t) - self.measured
        jac = self.slope * np.exp(u)[None, :] / t[:, None]
        free = self.informed
        n, p = len(r), int(free.sum())
        s2 = max(float(r @ r) / max(n - p, 1), NOISE_LOG_SD ** 2)
        hess = jac.T @ jac + np.diag(np.full(len(u), s2 / PRIOR_LOG_SD ** 2))
        out = np.zeros(len(u))
        if p:
            cov = np.linalg.inv(hess[np.ix_(free, free)]) * s2
            out[free] = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        return out


def fit_steps(terms: list[RunTerms], *, leave_one_out: bool = True) -> StepFit:
    """The factors of ``terms``' timed runs, with in-sample and leave-one-out errors."""
    problem = _Problem(terms)
    u = problem.solve_empirical()
    sd = problem.log_sd(u)
    measured = np.exp(problem.measured)
    loo: list[float] = []
    n = len(measured)
    if leave_one_out and n >= 2:
        for i in range(n):
            rows = np.arange(n) != i
            held = problem.solve_empirical(rows, start=u)
            loo.append(float(problem.predict(held, np.array([i]))[0] / measured[i] - 1))
    factors = tuple(FactorEstimate(name=f.name, mechanism=f.mechanism, multiplier=float(math.exp(u[k])),
                                   log_sd=float(sd[k]), informed=bool(problem.informed[k]),
                                   informing_runs=int(problem.informing[k]), informing=problem.informing_rows[k],
                                   on_bound=bool(problem.informed[k] and (u[k] <= problem.low[k] + 1e-9
                                                                          or u[k] >= problem.high[k] - 1e-9)),
                                   low=f.low, high=f.high)
                    for k, f in enumerate(FACTORS))
    return StepFit(factors=factors, errors_before=tuple(float(x) for x in problem.step / measured - 1),
                   errors_after=tuple(float(x) for x in problem.predict(u) / measured - 1),
                   errors_leave_one_out=tuple(loo))
