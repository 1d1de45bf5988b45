"""Check a scenario-group bound (group_bound.py) from the problem's data, without a solver.

The bound is L(prices) = Σ_l v_l − Σ_c μ_{k(c)} M_c − ν B − Σ_t ρ_t Q_t + constant, with each
layer's v_l the larger of a class-model value and the sum over a partition of the layer's
scenarios of (|G|/S) · (a proven bound of the group's own optimum). What a checker can redo without
a solver, and `check_group_certificate` does:

* every price is finite and ≥ 0 (a Lagrangian of ≤ rows), and the price constant is recomputed
  from the problem's capacities, budget and quotas (per chiplet: valid whatever grouping
  `classes_of` names);
* each layer's groups are a partition of 0..S−1, and its value is recomputed as the larger of
  its class value and its groups' scaled sum;
* each group's claim is at most the objective of the group's own best placement (`witness`,
  replica sets as bit masks), recomputed here from the data (cut enumeration over every chiplet
  set, nearest-replica NoP, misses, copies, priced pages) after checking that the placement keeps
  the layer's constraints: a claim above what a placement achieves is refused;
* the constant (every token's least NoP) from the data.

What it trusts: that each group's number is a solver's proven lower bound (a MILP's bound has no
short certificate), and each layer's class value (the priced class model's MILP bound,
decompose.py). Module imports: numpy, the problem's data class, check_bound's speed check.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from comoe_opt.residency.bounds.check_bound import CertificateError, _speeds
from comoe_opt.residency.problem import ResidencyProblem

# The witness check takes each scenario's makespan over all 2^C − 1 chiplet sets by itself (no min
# cut: the check must not run the code it checks): 65,535 sets at 16 chiplets, a bounded table
MAX_CHECKED_CHIPLETS = 16

KIND = "comoe-opt scenario-group bound certificate"
VERSION = 1
CLAIM_TOLERANCE = 1e-7  # relative: a group's claim above its witness by solver round-off only


@dataclass(frozen=True)
class GroupCertificate:
    """What `check_group_certificate` needs: the prices, each layer's class value and groups."""

    bound: float  # the producer's value, with constant_ms
    constant_ms: float
    class_pages: list[float]  # μ_k
    budget: float  # ν
    quota: list[float]  # ρ_t
    classes_of: list[int]  # [C]
    class_values: list[float]  # [L] the class model's layer values (trusted)
    groups: list[list[dict[str, Any]]]  # [L] each: scenarios, bound, witness (bit masks [E])
    group_size: int
    solver: str
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        data = {"kind": KIND, "version": VERSION, **self.__dict__}
        return json.dumps(data, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> GroupCertificate:
        data = json.loads(text)
        if data.pop("kind", None) != KIND or data.pop("version", None) != VERSION:
            raise CertificateError(f"not a {KIND} (version {VERSION})")
        return cls(**data)


def check_group_certificate(problem: ResidencyProblem, certificate: GroupCertificate) -> float:
    """The bound recomputed from the problem's data; raises `CertificateError` when the
    certificate does not fit the problem or a group claims more than its witness achieves."""
    p, c = problem, certificate
    L, S, C = p.layers, p.scenarios, p.chiplets
    if S == 0:
        raise CertificateError("the problem has no balance scenarios")
    of = np.asarray(c.classes_of, dtype=np.int64)
    mu = np.asarray(c.class_pages, dtype=np.float64)
    rho = np.asarray(c.quota, dtype=np.float64)
    if of.shape != (C,) or of.min() < 0 or of.max() >= mu.size:
        raise CertificateError(f"classes_of must give each of the {C} chiplets a priced class")
    if rho.shape != (len(p.tenants),) or len(c.class_values) != L or len(c.groups) != L:
        raise CertificateError("certificate's tenants or layers do not match the problem")
    prices = np.concatenate((mu, rho, [c.budget]))
    if not np.all(np.isfinite(prices)) or np.any(prices < 0):
        raise CertificateError("prices of ≤ rows must be finite and ≥ 0")
    per_chiplet = mu[of] + c.budget
    quotas = np.array([t.max_pages for t in p.tenants], dtype=np.float64)
    priced = float(per_chiplet @ p.capacity_pages) - c.budget * (p.capacity_pages.sum() - p.budget_pages)
    priced += float(rho @ quotas)
    constant = p.batches * float(np.sum(p.tokens)) * float(np.min(p.nop_ms_per_token))
    speeds = _speeds(p.scenario_work)
    total = 0.0
    for layer in range(L):
        value = float(c.class_values[layer])
        if c.groups[layer]:
            value = max(value, _groups_value(p, layer, c.groups[layer], per_chiplet, rho, speeds))
        total += value
    return total - priced + constant


def _groups_value(p, layer: int, groups: list[dict], per_chiplet: np.ndarray, rho: np.ndarray,
                  speeds: np.ndarray) -> float:  # fmt: skip
    """Σ_G (|G|/S) · bound_G after checking the partition and each claim against its witness."""
    S = p.scenarios
    seen: list[int] = []
    total = 0.0
    for group in groups:
        members = [int(s) for s in group["scenarios"]]
        seen += members
        claim = float(group["bound"])
        if not math.isfinite(claim):
            raise CertificateError(f"layer {layer}: a group's bound is {claim}")
        witness = group.get("witness")
        if witness is None:
            raise CertificateError(f"layer {layer}: a group without a witness placement")
        if p.chiplets > MAX_CHECKED_CHIPLETS:  # before the masks become int64
            raise CertificateError(
                f"a witness over {p.chiplets} chiplets: this check enumerates the 2^C chiplet sets,"
                f" up to {MAX_CHECKED_CHIPLETS} chiplets"
            )
        value = _witness_value(
            p, layer, members, np.asarray(witness, dtype=np.int64), per_chiplet, rho, speeds
        )
        if claim > value + CLAIM_TOLERANCE * max(1.0, abs(value)):
            raise CertificateError(
                f"layer {layer}, scenarios {members}: claims {claim} but a placement achieves {value}"
            )
        total += len(members) / S * claim
    if sorted(seen) != list(range(S)):
        raise CertificateError(f"layer {layer}: the groups are not a partition of the {S} scenarios")
    return total


def _witness_value(p, layer: int, scenarios: list[int], masks: np.ndarray, per_chiplet: np.ndarray,
                   rho: np.ndarray, speeds: np.ndarray) -> float:  # fmt: skip
    """The group objective of a placement of one layer (replica sets as bit masks), from the data:
    (W/|G|) Σ_s z*_s + W (NoP beyond the least + misses) + κ copies + priced pages."""
    E, C, W = p.experts, p.chiplets, p.batches
    if C > MAX_CHECKED_CHIPLETS:  # the check enumerates the 2^C chiplet sets itself, on purpose
        raise CertificateError(
            f"a witness over {C} chiplets: this check enumerates the 2^C chiplet sets, up to"
            f" {MAX_CHECKED_CHIPLETS} chiplets"
        )
    if masks.shape != (E,) or masks.min() < 0 or masks.max() >= 1 << C:
        raise CertificateError(f"a witness gives {E} replica sets over {C} chiplets")
    resident = ((masks[:, None] >> np.arange(C)) & 1).astype(bool)  # [E, C]
    held = resident.any(axis=1)
    if resident.sum(axis=1).max() > p.max_replicas or np.any(resident.sum(axis=0) > p.capacity_pages):
        raise CertificateError(f"layer {layer}: a witness breaks the replica limit or a capacity")
    if p.all_resident and not held.all():
        raise CertificateError(f"layer {layer}: a witness leaves an expert without a replica")
    if p.leased is not None and np.any(p.leased[layer] & ~resident):
        raise CertificateError(f"layer {layer}: a witness drops a leased replica")
    sets = np.arange(1, 1 << C, dtype=np.int64)
    inside = (np.where(held, masks, (1 << C) - 1)[:, None] & ~sets[None, :]) == 0  # [E, sets]
    capacity = ((sets[:, None] >> np.arange(C)) & 1) @ speeds
    work = p.scenario_work[scenarios, layer, :, 0]  # [G, E] on chiplet 0 (speed 1)
    z = ((work @ inside) / capacity).max(axis=1)
    nop = np.where(resident, p.nop_ms_per_token[None, :], np.inf).min(axis=1)
    nop = np.where(held, nop, p.nop_ms_per_token.min()) - p.nop_ms_per_token.min()
    previous = p.previous.resident[layer] if p.previous is not None else np.zeros((E, C), dtype=bool)
    owned = sum((r * t.owns[layer] for t, r in zip(p.tenants, rho, strict=True)), np.zeros(E))
    pages = float((resident * (per_chiplet[None, :] + owned[:, None])).sum())
    return float(W * z.mean() + W * (p.tokens[layer] * nop).sum() + W * p.miss_ms[layer][~held].sum()
                 + p.copy_ms * (resident & ~previous).sum() + pages)  # fmt: skip
