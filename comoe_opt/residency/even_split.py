"""The slow loop's objective when the engine splits each expert's tokens evenly over its replicas
(`policy.split = "even"`: vLLM, SGLang's static and dynamic dispatch), beside the best split.

Under the even split a replica of an expert with `r` replicas takes `λ / r` of its `λ` tokens of
a micro-batch, wherever the load sits. Its work on chiplet c is the roofline of that share:

    w_r[s, e, c] = max([λ_se > 0] · t_read,c , (λ_se / r) · t_flop,c)

every busy replica reading its whole page (with `balance = "tokens"`, t_read = 0 and the share is
linear in the tokens); an expert with no replica is loaded on demand, its work spread evenly
over the chiplets (one of the splits the best split may choose, as its cut condition lets such
an expert run anywhere). A chiplet's work in a scenario is the sum over the replicas it holds, the
layer's makespan the largest, and the balance term the scenarios' mean of it, as for the best
split; NoP is each expert's tokens over its replicas' mean per-token link time (each gets a share).

For one placement the best split's makespan is at most the even split's (the even split is one
of the splits the best one chooses from) and its NoP at most the even split's, so every bound of
the best-split objective is a bound of this one: the bound stands, a plan without a proof is
`feasible` (formulations/residency.md, "The even split").
"""

from __future__ import annotations

import numpy as np

from comoe_opt.residency.problem import ResidencyProblem

SPLITS = ("best", "even")  # policy.split: the dispatch the slow loop plans for


def replica_work(
    problem: ResidencyProblem, layer: int, replicas: np.ndarray, experts: np.ndarray | None = None
) -> np.ndarray:
    """[S, E, C] one replica's work in each scenario when expert e has `replicas[e]` replicas
    (the mean load as one scenario when the problem has none); with `experts` [K], [S, K, C] of
    those experts alone, `replicas` [K] theirs."""
    r = np.maximum(np.asarray(replicas, dtype=np.float64), 1.0)[None, :, None]
    rows = slice(None) if experts is None else experts
    if problem.scenario_tokens is None:  # the mean load: work is linear in the tokens
        return problem.work_ms[layer][rows][None] / r
    read, flop = problem.work_rates
    tokens = problem.scenario_tokens[:, layer, rows, None]  # [S, E, 1]
    return np.maximum((tokens > 0) * read, tokens / r * flop)


def chiplet_work(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> np.ndarray:
    """[S, C] each chiplet's work in each scenario under the even split of `resident` [E, C]; an
    expert with no replica is loaded on demand, its work spread over every chiplet."""
    return np.einsum("sec,ec->sc", replica_work(problem, layer, resident.sum(axis=1)), shares(resident))


def shares(resident: np.ndarray) -> np.ndarray:
    """[E, C] each chiplet's share of one replica's work: 1 where it holds the expert, 1 / C on
    every chiplet for an expert with no replica."""
    held = resident.astype(np.float64)
    return np.where(resident.any(axis=1, keepdims=True), held, 1.0 / resident.shape[1])


def even_nop(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> float:
    """NoP of one layer with each expert's tokens shared evenly by its replicas (sent to the
    nearest chiplet when it has none)."""
    count = resident.sum(axis=1)
    mean = (resident * problem.nop_ms_per_token[None, :]).sum(axis=1) / np.maximum(count, 1)
    nop = np.where(count > 0, mean, problem.nop_ms_per_token.min())
    return float((problem.tokens[layer] * nop).sum())


def even_layer(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> tuple[float, float, float]:
    """(mean scenario makespan, NoP, mean scenario balance) of one layer under the even split."""
    loads = chiplet_work(problem, resident, layer)  # [S, C]
    z = loads.max(axis=1)
    mean = loads.mean(axis=1)
    balance = np.where(z > 0, mean / np.where(z > 0, z, 1.0), 1.0)
    return float(z.mean()), even_nop(problem, resident, layer), float(balance.mean())
