"""The runtime's `home` and `even` mappings, vectorised, against their per-expert definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.evaluator.fastmap import _home_or_even


def by_definition(home, experts, published, buffered, even):
    """Expert by expert: no replica → the earliest buffer, else home; `even` deals an expert's
    (token, rank) pairs in token order over its replicas from its offset among the micro-batch's
    selections (the selections of experts with smaller ids: best_split/even.py); else its home
    replica, or its first."""
    assignment = np.empty_like(experts)
    for e in np.unique(experts):
        rows, ranks = np.nonzero(experts == e)
        replicas = np.flatnonzero(published[e])
        if replicas.size == 0:
            finite = np.isfinite(buffered[e]).any()
            assignment[rows, ranks] = int(np.argmin(buffered[e])) if finite else int(home[e])
        elif even and replicas.size > 1:
            offset = int((experts < e).sum())
            assignment[rows, ranks] = replicas[(offset + np.arange(rows.size)) % replicas.size]
        else:
            assignment[rows, ranks] = home[e] if published[e, home[e]] else replicas[0]
    return assignment


@given(st.integers(0, 2**32 - 1), st.booleans())
def test_vectorised_mapping_matches_its_definition(seed, even):
    rng = np.random.default_rng(seed)
    experts_n, chiplets, tokens = int(rng.integers(2, 20)), int(rng.integers(1, 9)), int(rng.integers(1, 40))
    k = int(rng.integers(1, min(experts_n, 4) + 1))
    experts = np.stack([rng.choice(experts_n, size=k, replace=False) for _ in range(tokens)])
    published = rng.random((experts_n, chiplets)) < rng.random()
    buffered = np.where(rng.random((experts_n, chiplets)) < 0.2, rng.random((experts_n, chiplets)), np.inf)
    home = rng.integers(0, chiplets, size=experts_n)
    got = _home_or_even(home, experts, published, buffered, even)
    assert np.array_equal(got, by_definition(home, experts, published, buffered, even))
