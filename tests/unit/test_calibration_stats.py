"""The calibration statistics against known values (shared/calibration/stats.py)."""

from __future__ import annotations

import random

import pytest

from shared.calibration.stats import Confusion, correct, corrected_rate, wilson


def test_confusion_counts_and_rates_of_a_hand_worked_example() -> None:
    pairs = [
        ("PASS", "PASS"),
        ("PASS", "PASS"),
        ("PASS", "PASS"),
        ("PASS", "FAIL"),  # FN
        ("FAIL", "FAIL"),
        ("FAIL", "FAIL"),
        ("FAIL", "PASS"),  # FP
    ]
    c = Confusion.of(pairs)
    assert (c.true_positives, c.true_negatives, c.false_positives, c.false_negatives) == (
        3,
        2,
        1,
        1,
    )
    assert (c.total, c.agreements) == (7, 5)
    assert c.agreement_rate == pytest.approx(5 / 7)
    assert c.tpr == pytest.approx(3 / 4)
    assert c.tnr == pytest.approx(2 / 3)


def test_rates_with_a_zero_denominator_are_zero() -> None:
    only_passes = Confusion.of([("PASS", "PASS"), ("PASS", "FAIL")])
    assert only_passes.tnr == 0.0 and only_passes.tpr == 0.5
    empty = Confusion()
    assert (empty.agreement_rate, empty.tpr, empty.tnr, empty.kappa) == (0.0, 0.0, 0.0, 0.0)


def test_kappa_matches_the_textbook_table() -> None:
    # Cohen's kappa, the usual worked example: 50 items, both yes 20, both no 15, rater A
    # yes and B no 5, A no and B yes 10: p_o = 0.7, p_e = 0.5, kappa = 0.4.
    c = Confusion(true_positives=20, true_negatives=15, false_negatives=5, false_positives=10)
    assert c.agreement_rate == pytest.approx(0.7)
    assert c.kappa == pytest.approx(0.4)
    perfect = Confusion(true_positives=10, true_negatives=10)
    assert perfect.kappa == pytest.approx(1.0)
    all_pass = Confusion(true_positives=10)  # chance agreement is certain
    assert all_pass.kappa == 0.0


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion",
        # Table I, method 3 (Wilson score, no continuity correction).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_intervals_match_published_values(
    successes: int, trials: int, low: float, high: float
) -> None:
    got = wilson(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_wilson_on_no_trials_is_the_whole_range() -> None:
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_correction_of_worked_numbers_and_of_a_chance_judge() -> None:
    # A judge with TPR 0.8 and TNR 0.95 passes 57.5 % of a batch whose true pass rate is
    # 70 %: 0.7 x 0.8 + 0.3 x 0.05 = 0.575, and (0.575 + 0.95 - 1) / (0.8 + 0.95 - 1) = 0.7.
    assert corrected_rate(0.575, 0.8, 0.95) == pytest.approx(0.7)
    assert corrected_rate(0.99, 0.8, 0.95) == 1.0  # clipped
    assert corrected_rate(0.01, 0.8, 0.95) == 0.0
    assert corrected_rate(0.5, 0.5, 0.5) is None  # no better than chance
    assert corrected_rate(0.5, 0.3, 0.6) is None


def test_a_simulated_batch_the_corrected_interval_holds_the_truth_and_the_raw_rate_not() -> None:
    rng = random.Random(2025)
    true_rate, tpr, tnr = 0.7, 0.8, 0.95

    def judged(truly_passes: bool) -> str:
        says_pass = rng.random() < (tpr if truly_passes else 1 - tnr)
        return "PASS" if says_pass else "FAIL"

    # Calibration: 400 human PASS and 400 human FAIL examples through the judge.
    calibration = Confusion.of(
        [("PASS", judged(True)) for _ in range(400)] + [("FAIL", judged(False)) for _ in range(400)]
    )
    # The batch: 10,000 items of true pass rate 0.7, as the judge sees them.
    verdicts = [judged(rng.random() < true_rate) for _ in range(10_000)]
    passed = verdicts.count("PASS")
    result = correct(passed, len(verdicts), calibration, draws=2000, seed=1)
    assert result is not None
    low, high = result.interval
    assert low <= true_rate <= high, result
    assert not low <= result.raw_rate <= high, result  # the raw rate is biased out of it
    assert abs(result.rate - true_rate) < 0.03
    assert high - low < 0.1
    # Seeded: the same inputs give the same interval.
    again = correct(passed, len(verdicts), calibration, draws=2000, seed=1)
    assert again == result


def test_no_correction_for_a_judge_no_better_than_chance() -> None:
    coin = Confusion(true_positives=50, false_negatives=50, true_negatives=50, false_positives=50)
    assert correct(60, 100, coin) is None
