"""The reliability statistics against worked values (shared/calibration/reliability.py):
τ-bench's pass^k on a hand-worked table, pass@k and flakiness, the one-sided Fisher exact
test against textbook tables, and the seeded paired bootstrap."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from shared.calibration.reliability import (
    RESAMPLES,
    SEED,
    Tally,
    flaky,
    paired_bootstrap,
    pass_at_k,
    pass_hat_k,
    regression_p_value,
)
from shared.calibration.stats import percentile_95

# Four scenarios, four trials each (passes, trials):
#   S1 4/4, S2 3/4, S3 2/4, S4 0/4.
# pass^j of one scenario is C(passes, j) / C(trials, j):
#   j=1: S1 4/4 = 1     S2 3/4           S3 2/4 = 1/2     S4 0
#   j=2: S1 6/6 = 1     S2 3/6 = 1/2     S3 1/6           S4 0
#   j=3: S1 4/4 = 1     S2 1/4           S3 0/4 = 0       S4 0
#   j=4: S1 1/1 = 1     S2 0/1 = 0       S3 0             S4 0
# and the batch's pass^j is their mean:
#   j=1: (1 + 3/4 + 1/2 + 0) / 4 = 9/16
#   j=2: (1 + 1/2 + 1/6 + 0) / 4 = (10/6) / 4 = 5/12
#   j=3: (1 + 1/4 + 0 + 0) / 4 = 5/16
#   j=4: (1 + 0 + 0 + 0) / 4 = 1/4
TABLE = [Tally(4, 4), Tally(3, 4), Tally(2, 4), Tally(0, 4)]


def test_pass_hat_k_of_a_hand_worked_table() -> None:
    assert pass_hat_k(TABLE, 4) == pytest.approx([9 / 16, 5 / 12, 5 / 16, 1 / 4])
    # pass^1 is the plain pass rate of the trials when every scenario has as many.
    assert pass_hat_k(TABLE, 1) == pytest.approx([9 / 16])
    assert pass_at_k(TABLE) == pytest.approx(3 / 4)  # S1, S2 and S3 passed at least once
    assert flaky(TABLE) == 2  # S2 and S3: some passes, some failures
    assert [t.flaky for t in TABLE] == [False, True, True, False]


def test_scenarios_with_fewer_trials_count_only_where_they_have_j() -> None:
    # A scenario whose runs errored has fewer trials (an error is no trial): 1 pass of 2.
    # j=1: (1/2 + 2/4) / 2 = 1/2
    # j=2: (C(1,2)/C(2,2) = 0 + C(2,2)/C(4,2) = 1/6) / 2 = 1/12
    # j=3, j=4: only the scenario of 4 trials has that many: C(2,3)/C(4,3) = 0, and 0.
    table = [Tally(1, 2), Tally(2, 4)]
    assert pass_hat_k(table, 4) == pytest.approx([1 / 2, 1 / 12, 0.0, 0.0])
    # A scenario with no trial at all (every run errored) counts nowhere.
    assert pass_hat_k([*table, Tally(0, 0)], 4) == pass_hat_k(table, 4)
    assert pass_at_k([*table, Tally(0, 0)]) == 1.0
    assert not Tally(0, 0).flaky
    # Nothing tried: nothing to say.
    assert pass_hat_k([Tally(0, 0)], 3) == [None, None, None]
    assert pass_at_k([Tally(0, 0)]) is None
    assert pass_hat_k([], 2) == [None, None]


@pytest.mark.parametrize(
    ("a", "b", "p"),
    [
        # Fisher's lady tasting tea: 4 of 4 cups right against 0 of 4: 1/C(8,4) = 1/70.
        (Tally(4, 4), Tally(0, 4), Fraction(1, 70)),
        # Agresti, Categorical Data Analysis, the tea table with 3 right: P(n11 >= 3)
        # = (C(4,3)C(4,1) + C(4,4)C(4,0)) / 70 = 17/70 = 0.243.
        (Tally(3, 4), Tally(1, 4), Fraction(17, 70)),
        # Wikipedia's "Fisher's exact test" worked example (dieting: 9 of 12 women, 1 of 12
        # men): one-tailed p = 0.001379728 = (C(10,9)C(14,3) + C(10,10)C(14,2)) / C(24,12).
        (Tally(9, 12), Tally(1, 12), Fraction(3731, 2704156)),
        # 3 of 3 against 0 of 3: 1/C(6,3) = 1/20 = 0.05, not below 0.05.
        (Tally(3, 3), Tally(0, 3), Fraction(1, 20)),
        # Unequal sides: 10 of 10 against 5 of 10: C(15,10) / C(20,10) = 3003/184756.
        (Tally(10, 10), Tally(5, 10), Fraction(3003, 184756)),
        # No loss: 2 of 4 both times, P(X >= 2) = (36 + 16 + 1) / 70.
        (Tally(2, 4), Tally(2, 4), Fraction(53, 70)),
        # B better than A: nothing points to a regression.
        (Tally(0, 4), Tally(4, 4), Fraction(1)),
        # k = 1 a side: a pass then a fail is p = 1/2, never significant on its own.
        (Tally(1, 1), Tally(0, 1), Fraction(1, 2)),
    ],
)
def test_the_one_sided_fisher_exact_test_against_textbook_tables(
    a: Tally, b: Tally, p: Fraction
) -> None:
    assert regression_p_value(a, b) == pytest.approx(float(p), rel=1e-12)


def test_no_trials_on_a_side_is_no_test() -> None:
    assert regression_p_value(Tally(0, 0), Tally(0, 4)) is None
    assert regression_p_value(Tally(3, 4), Tally(0, 0)) is None


# Paired differences of pass rates (B - A), one per scenario: mostly unchanged, a few lost,
# one gained.
DIFFERENCES = [0.0] * 30 + [-1.0] * 4 + [-0.5] * 3 + [-0.25] * 2 + [0.75]


def test_the_paired_bootstrap_is_reproducible_and_holds_the_observed_difference() -> None:
    first = paired_bootstrap(DIFFERENCES)
    again = paired_bootstrap(DIFFERENCES)
    assert first is not None and first == again  # seeded: the same interval every time
    assert (first.resamples, first.seed, first.pairs) == (RESAMPLES, SEED, len(DIFFERENCES))
    observed = sum(DIFFERENCES) / len(DIFFERENCES)
    assert first.difference == pytest.approx(observed)
    assert first.low <= observed <= first.high
    assert first.low < first.high < 0  # a loss, and the interval says so
    other = paired_bootstrap(DIFFERENCES, seed=SEED + 1)
    assert other is not None and (other.low, other.high) != (first.low, first.high)
    # The order the pairs come in changes nothing.
    shuffled = DIFFERENCES[::-1]
    assert paired_bootstrap(shuffled) == first


def test_the_paired_bootstrap_agrees_with_resampling_scenarios_one_by_one() -> None:
    """Drawing how many times each distinct difference is drawn (a multinomial) is the
    same resampling as picking n scenarios with replacement one by one: the two intervals
    agree within the bootstrap's own noise."""
    found = paired_bootstrap(DIFFERENCES, resamples=4000)
    rng = random.Random(7)
    n = len(DIFFERENCES)
    means = [sum(rng.choices(DIFFERENCES, k=n)) / n for _ in range(4000)]
    low, high = percentile_95(means)
    assert found is not None
    assert found.low == pytest.approx(low, abs=0.02)
    assert found.high == pytest.approx(high, abs=0.02)


def test_the_paired_bootstrap_of_no_pairs_or_identical_pairs() -> None:
    assert paired_bootstrap([]) is None
    same = paired_bootstrap([-0.5] * 12)
    assert same is not None and (same.low, same.difference, same.high) == (-0.5, -0.5, -0.5)
