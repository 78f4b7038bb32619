"""How well a judge agrees with human labels, and what a pass rate is once the judge's
measured error is taken out (DESIGN §5.6).  Pure functions, no I/O.

PASS is the positive class.  TP: human PASS, judge PASS; TN: both FAIL; FP: human FAIL,
judge PASS; FN: human PASS, judge FAIL.  A rate whose denominator is 0 is 0.0 (the
spec's rule); an interval on no observations is the whole [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy

Z_95 = 1.959963984540054  # the standard normal's 97.5th percentile


@dataclass(frozen=True, slots=True)
class Confusion:
    true_positives: int = 0
    true_negatives: int = 0
    false_positives: int = 0
    false_negatives: int = 0

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> Confusion:
        """From (human verdict, judge verdict) pairs, each PASS or FAIL."""
        tp = tn = fp = fn = 0
        for human, judge in pairs:
            if human == "PASS":
                tp, fn = (tp + 1, fn) if judge == "PASS" else (tp, fn + 1)
            else:
                fp, tn = (fp + 1, tn) if judge == "PASS" else (fp, tn + 1)
        return cls(tp, tn, fp, fn)

    @property
    def total(self) -> int:
        return (
            self.true_positives + self.true_negatives + self.false_positives + self.false_negatives
        )

    @property
    def agreements(self) -> int:
        return self.true_positives + self.true_negatives

    @property
    def positives(self) -> int:  # human PASS
        return self.true_positives + self.false_negatives

    @property
    def negatives(self) -> int:  # human FAIL
        return self.true_negatives + self.false_positives

    @property
    def agreement_rate(self) -> float:
        return ratio(self.agreements, self.total)

    @property
    def tpr(self) -> float:
        """Sensitivity: of the human PASSes, the share the judge passed."""
        return ratio(self.true_positives, self.positives)

    @property
    def tnr(self) -> float:
        """Specificity: of the human FAILs, the share the judge failed."""
        return ratio(self.true_negatives, self.negatives)

    @property
    def kappa(self) -> float:
        """Cohen's kappa: agreement beyond what the two raters' own rates of PASS would
        give by chance.  0.0 where chance agreement is certain (a denominator of 0)."""
        n = self.total
        if n == 0:
            return 0.0
        observed = self.agreements / n
        judge_pass = (self.true_positives + self.false_positives) / n
        human_pass = self.positives / n
        chance = human_pass * judge_pass + (1 - human_pass) * (1 - judge_pass)
        if chance >= 1.0:
            return 0.0
        return (observed - chance) / (1 - chance)


def ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def wilson(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % by default)."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def corrected_rate(raw: float, tpr: float, tnr: float) -> float | None:
    """The true pass rate behind a judge's raw pass rate, given its TPR and TNR
    (Rogan-Gladen): θ = (p + TNR - 1) / (TPR + TNR - 1), clipped to [0, 1].  ``None``
    where TPR + TNR ≤ 1: such a judge is no better than chance, and nothing follows."""
    informedness = tpr + tnr - 1
    if informedness <= 0:
        return None
    return min(1.0, max(0.0, (raw + tnr - 1) / informedness))


@dataclass(frozen=True, slots=True)
class Corrected:
    raw_rate: float
    rate: float
    interval: tuple[float, float]


def correct(
    passed: int,
    total: int,
    confusion: Confusion,
    *,
    draws: int = 2000,
    seed: int = 0,
) -> Corrected | None:
    """The corrected pass rate of ``passed`` of ``total`` judged items, and its 95 %
    interval by parametric bootstrap over the three binomials (the batch's pass count,
    the calibration's true positives among its positives, its true negatives among its
    negatives), seeded.  ``None`` when the judge is no better than chance."""
    raw = ratio(passed, total)
    tpr, tnr = confusion.tpr, confusion.tnr
    rate = corrected_rate(raw, tpr, tnr)
    if rate is None:
        return None
    rng = numpy.random.default_rng(seed)
    p = _shares(rng, total, raw, draws)
    tpr_star = _shares(rng, confusion.positives, tpr, draws)
    tnr_star = _shares(rng, confusion.negatives, tnr, draws)
    informedness = tpr_star + tnr_star - 1
    # A draw where the judge looks no better than chance says nothing: it counts as the
    # widest answer, all of [0, 1], split evenly between the two ends.
    chance = informedness <= 0
    estimates = numpy.clip((p + tnr_star - 1) / numpy.where(chance, 1.0, informedness), 0, 1)
    estimates[chance] = numpy.arange(draws)[chance] % 2
    return Corrected(raw_rate=raw, rate=rate, interval=percentile_95(estimates))


def _shares(rng: numpy.random.Generator, n: int, p: float, draws: int) -> numpy.ndarray:
    """``draws`` shares of successes in ``n`` Binomial(n, p) trials (0.0 where n is 0)."""
    if not n:
        return numpy.zeros(draws)
    return rng.binomial(n, p, draws) / n


def percentile_95(estimates: Sequence[float] | numpy.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of a bootstrap's estimates (sorted here): the
    percentile 95 % interval, the lower end rounded down and the upper up."""
    ordered = numpy.sort(estimates)
    last = len(ordered) - 1
    return (float(ordered[int(0.025 * last)]), float(ordered[math.ceil(0.975 * last)]))
