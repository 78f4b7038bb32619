"""How reliable an agent is over repeated runs, and whether a change between two batches is
more than chance (DESIGN §5.11).  Pure functions, no I/O, beside :mod:`stats`.

A **trial** is a run of a scenario that ended ``passed`` or ``failed``; a run that ended in
``error`` is no trial (the agent or the judge could not be reached: it says nothing about
the agent), so a scenario's trials may be fewer than the batch's repetitions.

* **pass^j** (τ-bench, Yao et al. 2024): the chance that j trials of a scenario drawn at
  random all pass, estimated without bias from c passes of n trials as C(c, j) / C(n, j),
  and averaged over the scenarios.  A scenario with fewer than j trials cannot say it:
  it is left out of pass^j's mean (and pass^j is ``None`` when no scenario has j).
* **pass@k**: the share of scenarios (with at least one trial) that passed at least once.
* **flaky**: a scenario with some passes and some failures, 0 < passes < trials.
* **Regression test**: the one-sided Fisher exact test that B's pass proportion is lower
  than A's, on the 2x2 table of one scenario's trials in A and in B.
* **Paired bootstrap**: the 95 % percentile interval of the mean difference of pass rates,
  B - A, over the scenarios run in both (the pairs), resampling scenarios with replacement
  :data:`RESAMPLES` times from :data:`SEED`: the same pairs give the same interval on any
  machine with the same numpy release (its generator does not depend on the platform, but
  a release may change how it draws; a batch's stored comparison keeps what it found).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy

from shared.calibration.stats import percentile_95

RESAMPLES = 2000
SEED = 0
SIGNIFICANCE = 0.05  # a regression is significant when its p-value is below this


@dataclass(frozen=True, slots=True)
class Tally:
    """One scenario's trials in a batch: its runs that passed, of those that passed or
    failed."""

    passes: int
    trials: int

    @property
    def rate(self) -> float | None:
        return self.passes / self.trials if self.trials else None

    @property
    def flaky(self) -> bool:
        return 0 < self.passes < self.trials


def pass_hat_k(tallies: Sequence[Tally], k: int) -> list[float | None]:
    """pass^j for j = 1..k (index j - 1): the mean over the scenarios with at least j
    trials of C(passes, j) / C(trials, j)."""
    found: list[float | None] = []
    for j in range(1, k + 1):
        eligible = [t for t in tallies if t.trials >= j]
        if not eligible:
            found.append(None)
            continue
        found.append(
            sum(math.comb(t.passes, j) / math.comb(t.trials, j) for t in eligible) / len(eligible)
        )
    return found


def pass_at_k(tallies: Sequence[Tally]) -> float | None:
    """The share of the scenarios with a trial that passed at least once."""
    tried = [t for t in tallies if t.trials]
    if not tried:
        return None
    return sum(1 for t in tried if t.passes) / len(tried)


def flaky(tallies: Sequence[Tally]) -> int:
    """How many scenarios passed some trials and failed others."""
    return sum(1 for t in tallies if t.flaky)


def regression_p_value(a: Tally, b: Tally) -> float | None:
    """The one-sided Fisher exact test of a regression from A to B: with the table's
    margins fixed (A's trials, all passes), the chance under no difference that A holds
    at least as many of the passes as it does, P(X >= a.passes) for X hypergeometric.
    ``None`` when a side has no trial."""
    if not a.trials or not b.trials:
        return None
    total, passes = a.trials + b.trials, a.passes + b.passes
    fails = total - passes
    tables = sum(
        math.comb(passes, x) * math.comb(fails, a.trials - x)
        for x in range(a.passes, min(passes, a.trials) + 1)
    )
    return tables / math.comb(total, a.trials)  # exact integers, one rounding


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """A mean difference of pass rates (B - A) over ``pairs`` scenarios and its 95 %
    percentile interval."""

    difference: float
    low: float
    high: float
    pairs: int
    resamples: int
    seed: int


def paired_bootstrap(
    differences: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED
) -> Bootstrap | None:
    """The mean of ``differences`` (one per paired scenario) and its 95 % percentile
    bootstrap interval; ``None`` without pairs.

    Each resample picks n scenarios with replacement.  Its mean depends only on how many
    times each distinct difference is picked, a multinomial draw (numpy's, 2,000 of them
    in one call: drawn one binomial at a time in Python they took 3.8-7.4 ms for 25
    scenarios, most of a comparison's read, where numpy takes 0.2-0.4); the distinct
    differences are sorted, so the answer does not depend on the order the pairs come in."""
    n = len(differences)
    if not n:
        return None
    values, counts = numpy.unique(numpy.asarray(differences, dtype=float), return_counts=True)
    picks = numpy.random.default_rng(seed).multinomial(n, counts / n, size=resamples)
    means = picks @ values / n
    low, high = percentile_95(means)
    return Bootstrap(
        difference=math.fsum(differences) / n,  # exactly rounded: in any order, the same
        low=low,
        high=high,
        pairs=n,
        resamples=resamples,
        seed=seed,
    )
