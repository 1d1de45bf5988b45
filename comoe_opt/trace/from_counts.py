"""Tokens from a load dump: each step replayed as `tokens` tokens of `top_k` distinct experts.

A load dump (`[trace] kind = "counts"`) records per step and layer how many tokens each expert
got, not which token went where. Verbs that replay tokens (`evaluate`, `gap`) need routed
tokens, so each step becomes `tokens` tokens whose per-layer selections are the step's counts:

* Step 1: the counts of each (step, layer) are scaled to `tokens * top_k` selections and rounded
  by largest remainder, with no expert above `tokens` (a token picks an expert once; the excess
  goes to the others in proportion). A step whose selections already number `tokens * top_k`
  and respect that cap keeps its counts exactly.
* Step 2: the selections, sorted by expert, are dealt to the tokens in turn (selection `i` to
  token `i mod tokens`): an expert's run of at most `tokens` selections meets each token at most
  once, so every token's `top_k` experts are distinct.

What a dump cannot give stays unknown: which experts one token chose across layers (the
pairing across layers is by expert order, so the transition graph and prefetch learn nothing
real from it). Per-step loads, which set balance, are the dump's.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.errors import ComoeError


def tokens_of_counts(counts: np.ndarray, tokens: int, top_k: int) -> np.ndarray:
    """Routed tokens `[steps * tokens, layers, top_k]` (int16 or int32 ids) from per-step counts.

    Parameters: `counts` [steps, layers, experts], non-negative; `tokens` per step; `top_k`
    distinct experts per token (at most the experts).
    Returns: `topk[t, l, r]`, the step of token t being t // tokens.
    """
    steps, layers, experts = counts.shape
    if top_k > experts:
        raise ComoeError(f"top-{top_k} routing needs at least {top_k} experts, the dump has {experts}")
    # Step 1: selections per (step, layer, expert), capped at one per token
    quota = capped_apportion(counts.reshape(-1, experts).astype(np.float64), tokens * top_k, tokens)
    # Step 2: sorted selections dealt to the tokens in turn
    ids = np.repeat(np.tile(np.arange(experts), steps * layers), quota.ravel())
    dealt = ids.reshape(steps, layers, top_k, tokens).transpose(0, 3, 1, 2)
    dtype = np.int16 if experts <= np.iinfo(np.int16).max else np.int32
    return np.ascontiguousarray(dealt.reshape(steps * tokens, layers, top_k)).astype(dtype)


def capped_apportion(weights: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Integers per row of `weights` [rows, n] summing to `total`, each at most `cap`, in
    proportion to the weights (a row of zeros counts as even): largest remainder after capping.
    Needs `total <= cap * n`."""
    rows, n = weights.shape
    share = np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0)
    share = share / share.sum(axis=1, keepdims=True) * total
    for _ in range(n):  # each pass caps at least one more entry of a row that still overflows
        over = share > cap
        if not over.any():
            break
        excess = np.where(over, share - cap, 0.0).sum(axis=1, keepdims=True)
        share = np.minimum(share, cap)
        room = np.where(share < cap, share, 0.0)
        spread = np.where(room.sum(axis=1, keepdims=True) > 0, room, np.where(share < cap, 1.0, 0.0))
        share = share + excess * spread / np.maximum(spread.sum(axis=1, keepdims=True), 1e-300)
    whole = np.floor(share + 1e-9).astype(np.int64)
    whole = np.minimum(whole, cap)
    short = total - whole.sum(axis=1)  # 0..n-1 per row: the largest remainders get one more
    remainder = np.where(whole < cap, share - whole, -1.0)
    order = np.argsort(-remainder, axis=1, kind="stable")
    rank = np.empty_like(order)
    rank[np.arange(rows)[:, None], order] = np.arange(n)[None, :]
    return whole + (rank < short[:, None])
