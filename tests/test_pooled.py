"""The pooled cut search's loop (best_split/pooled.py) on a toy caller whose rounds are scripted."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.best_split.pooled import POOL_ROUNDS, base_pool, pooled_search


@dataclass
class Scripted:
    """Plans are ints scored by `values`; round k proposes `proposals[k]`; the pool counts the
    exact checks; `cut_at` is the round a limit cuts short, `expire_at` the exact check that
    finds the limit passed."""

    values: dict[int, float]
    proposals: list[int]
    check_cut_short: bool = True
    cut_at: int | None = None
    expire_at: int | None = None
    stop_at: int | None = None
    rounds: int = 0
    checked: list[int] = field(default_factory=list)

    def exact(self, plan: int, pool: int | None) -> tuple[float, int] | None:
        if self.expire_at is not None and len(self.checked) == self.expire_at:
            return None
        self.checked.append(plan)
        return self.values[plan], (0 if pool is None else pool) + 1

    def search(self, plan: int, pool: int) -> tuple[int, bool]:
        assert pool == self.rounds + 1  # each round searches on the pool grown by every check so far
        found, self.rounds = self.proposals[self.rounds], self.rounds + 1
        return found, self.rounds - 1 == self.cut_at

    def keep(self, best: int, value: float, found: int, found_value: float) -> tuple[int, float]:
        return (found, found_value) if found_value < value else (best, value)

    def stop(self) -> bool:
        return self.stop_at is not None and self.rounds == self.stop_at


def test_keeps_only_what_is_exactly_better_and_starts_each_round_from_the_best():
    values = {0: 5.0, 1: 4.0, 2: 6.0, 3: 3.0, 4: 3.5}
    rounds = Scripted(values, [1, 2, 3, 4])
    assert pooled_search(rounds, 0) == (3, False)
    assert rounds.checked == [0, 1, 2, 3, 4]  # the start and every round, each exactly


def test_a_round_cut_short_is_checked_or_not_as_the_caller_says():
    values = {0: 5.0, 1: 4.0, 2: 1.0, 3: 0.0}
    checked = Scripted(values, [1, 2, 3, 3], cut_at=1, stop_at=2)
    assert pooled_search(checked, 0) == (2, True)  # checked, kept; the next round not started
    unchecked = Scripted(values, [1, 2, 3, 3], check_cut_short=False, cut_at=1)
    assert pooled_search(unchecked, 0) == (1, True)  # the last checked plan stands


def test_a_limit_during_an_exact_check_keeps_the_last_checked_plan():
    values = {0: 5.0, 1: 4.0, 2: 1.0}
    assert pooled_search(Scripted(values, [1, 2, 2, 2], expire_at=0), 0) == (0, True)
    assert pooled_search(Scripted(values, [1, 2, 2, 2], expire_at=2), 0) == (1, True)


@given(st.lists(st.floats(-10, 10), min_size=POOL_ROUNDS + 1, max_size=POOL_ROUNDS + 1))
def test_never_worse_than_the_start(scores):
    values = dict(enumerate(scores))
    best, stopped = pooled_search(Scripted(values, list(range(1, POOL_ROUNDS + 1))), 0)
    assert not stopped
    assert values[best] == min(scores)


def test_base_pool_is_each_chiplet_and_all():
    assert base_pool(3).tolist() == [[1], [2], [4], [7]]
    assert base_pool(3).dtype == np.uint64
    assert base_pool(70).shape == (71, 2)  # two words past 64 chiplets
