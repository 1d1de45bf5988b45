"""The class LP bound's certificate: the checker recomputes it from the problem's data alone, never
above the optimum whatever the duals, and it survives a JSON round trip.

Optima come from test_decompose's brute force over every placement of 2-layer instances (its
`optimum` joins the layers' tables under the coupling constraints)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import GPTOSS, ROOT
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_decompose import optimum, scenario_problem, small_problems

from comoe_opt.instance import load_instance
from comoe_opt.planning import plan_window
from comoe_opt.residency.bounds.check_bound import (
    FAMILIES,
    BoundCertificate,
    CertificateError,
    check_certificate,
    recompute,
)
from comoe_opt.residency.bounds.decompose import (
    ClassModel,
    certificate_at,
    class_lp_bound,
    class_lp_certificate,
    device_classes,
)
from comoe_opt.residency.problem import ResidencyProblem, Tenant
from comoe_opt.trace import load_batches

TOL = 1e-6


def certified(p: ResidencyProblem) -> BoundCertificate:
    cert = class_lp_certificate(p)
    assert cert is not None
    return cert


def agrees(p: ResidencyProblem, cert: BoundCertificate) -> float:
    """The recomputed bound, checked against the certificate's (and its parts)."""
    again = recompute(p, cert)
    scale = max(1.0, abs(cert.bound))
    assert again.bound == pytest.approx(cert.bound, rel=TOL, abs=TOL * scale)
    assert again.layer_values == pytest.approx(cert.layer_values, rel=TOL, abs=TOL * scale)
    assert again.coupling_value == pytest.approx(cert.coupling_value, rel=TOL, abs=TOL * scale)
    assert again.projected == 0 and again.same_data
    # L at the solver's own duals is the LP optimum up to the solver's tolerances
    assert cert.bound == pytest.approx(cert.lp_objective, rel=1e-6, abs=1e-6 * scale)
    return again.bound


def with_duals(cert: BoundCertificate, duals: list) -> BoundCertificate:
    return dataclasses.replace(cert, duals=duals)


# ------------------------------------------------------------ hand-checked


def test_near_chiplet_bound_is_recomputed_and_tight():
    # a (3 tokens) and b (1 token), one page each on a near (NoP 0) and a far (NoP 1) chiplet:
    # the optimum puts a near, b far, 3 + 1 = 4, and the class LP proves it
    p = scenario_problem([[[3, 1]]], [1, 1], tokens=[[3, 1]], nop=[0, 1], all_resident=True)
    cert = certified(p)
    assert cert.lp_objective == pytest.approx(class_lp_bound(p))
    assert agrees(p, cert) == pytest.approx(4.0)
    assert check_certificate(p, cert) == pytest.approx(optimum(p))
    assert {family for family, _, _ in cert.duals} <= set(FAMILIES)


def test_rigid_experts_bound_is_recomputed():
    # three equal experts with one replica each on two chiplets: two share one, makespan 8
    p = scenario_problem([[[4, 4, 4]]], [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True,
                         max_replicas=1)  # fmt: skip
    cert = certified(p)
    assert agrees(p, cert) == pytest.approx(8.0)
    assert any(family == "rigid_cut" for family, _, _ in cert.duals)


def test_two_layers_share_the_near_pages():
    # near chiplets 0-1, a far one, 9 pages for 8 experts: the coupling rows carry a price
    work = [[[4, 1, 1, 0], [0, 2, 2, 1]], [[0, 1, 1, 3], [2, 2, 0, 1]]]
    p = scenario_problem(work, [3, 3, 3], tokens=[[2, 1, 1, 2], [1, 2, 1, 1]], nop=[0, 0, 0.5],
                         all_resident=True, budget=9)  # fmt: skip
    cert = certified(p)
    value = agrees(p, cert)
    assert value <= optimum(p) + TOL
    assert sum(cert.layer_values) + cert.coupling_value + cert.constant_ms == pytest.approx(cert.bound)
    assert len(cert.layer_values) == 2


def test_no_certificate_where_the_class_model_does_not_apply():
    from conftest import make_problem

    assert class_lp_certificate(make_problem(miss=[[1.0]], work=[[1.0]], capacity=[1, 1])) is None


# ------------------------------------------------------------ properties


@settings(max_examples=12)
@given(small_problems(), st.integers(0, 2**16))
def test_recomputed_bound_matches_and_no_duals_overpromise(p, seed):
    best = optimum(p)
    assume(np.isfinite(best))
    scale = max(1.0, abs(best))
    cert = certified(p)
    assert agrees(p, cert) <= best + TOL * scale
    assert BoundCertificate.from_json(cert.to_json()) == cert
    # weak duality: scaled, perturbed or sign-flipped duals still bound the optimum from below
    rng = np.random.default_rng(seed)
    for factor in (0.0, 0.5, 1.5, 10.0):
        duals = [(f, i, y * factor) for f, i, y in cert.duals]
        assert check_certificate(p, with_duals(cert, duals)) <= best + TOL * scale
    noisy = [(f, i, y * rng.lognormal(0, 0.5) * rng.choice([1, 1, -1])) for f, i, y in cert.duals]
    assert check_certificate(p, with_duals(cert, noisy)) <= best + TOL * scale
    # duals on rows the solver priced at 0, of any sign and size
    keys = ClassModel(p, device_classes(p), list(range(p.layers))).row_keys
    picked = rng.choice(len(keys), size=min(len(keys), 20), replace=False)
    extra = [(keys[k][0], keys[k][1:], float(rng.normal(0, 3))) for k in picked]
    assert check_certificate(p, with_duals(cert, cert.duals + extra)) <= best + TOL * scale


@settings(max_examples=12)
@given(small_problems(), st.integers(0, 2**16))
def test_every_row_family_is_rebuilt_as_the_model_states_it(p, seed):
    # random duals on every row of the model: L evaluated on HiGHS's rows (certificate_at) and on
    # the checker's rows agree, so each family's rows, objective and bounds are the same
    model = ClassModel(p, device_classes(p), list(range(p.layers)))
    rng = np.random.default_rng(seed)
    lp = model.lp.h.getLp()
    lower, upper = np.array(lp.row_lower_), np.array(lp.row_upper_)
    y = rng.exponential(1.0, len(model.row_keys))  # the sign that gives each row a term
    y = np.where(np.isfinite(lower), np.where(np.isfinite(upper), y * rng.choice([-1, 1], y.size), y), -y)
    cert = certificate_at(model, y)
    again = recompute(p, cert)
    scale = 1.0 + float(np.abs(y).sum())
    assert again.bound == pytest.approx(cert.bound, rel=1e-9, abs=1e-9 * scale)
    assert again.layer_values == pytest.approx(cert.layer_values, rel=1e-9, abs=1e-9 * scale)
    assert {f for f, _, _ in cert.duals} == {key[0] for key in model.row_keys}
    assert again.projected == 0 and again.rows == len(model.row_keys)
    best = optimum(p)
    if np.isfinite(best):
        assert again.bound <= best + TOL * max(1.0, abs(best))


def test_copies_leases_and_quotas_are_rebuilt_too():
    # every family at once: a previous placement (copies), a lease, a tenant's quota, and four
    # equally busy experts on three chiplets in one scenario (rigid cut)
    work = [[[4, 1, 1, 0], [0, 2, 2, 1]], [[3, 3, 3, 3], [2, 2, 0, 1]]]
    previous = np.zeros((2, 4, 3), dtype=bool)
    previous[0, 0, 0] = previous[1, 3, 2] = previous[0, 1, 1] = True
    leased = np.zeros_like(previous)
    leased[0, 0, 0] = True
    owns = np.array([[True, True, False, False], [False, False, True, True]])
    p = scenario_problem(work, [3, 3, 3], tokens=[[2, 1, 1, 2], [1, 2, 1, 1]], nop=[0, 0, 0.5],
                         budget=9, previous=previous, leased=leased, copy_ms=0.5,
                         tenants=(Tenant("t", owns, 4),), all_resident=True, max_replicas=2)  # fmt: skip
    model = ClassModel(p, device_classes(p), list(range(p.layers)))
    families = {key[0] for key in model.row_keys}
    assert families == set(FAMILIES)
    lp = model.lp.h.getLp()
    lower, upper = np.array(lp.row_lower_), np.array(lp.row_upper_)
    y = np.where(np.isfinite(lower), np.where(np.isfinite(upper), -0.3, 0.7), -0.2)
    cert = certificate_at(model, y)
    assert recompute(p, cert).bound == pytest.approx(cert.bound, rel=1e-9)
    best = optimum(p)
    assert recompute(p, cert).bound <= best + TOL
    assert agrees(p, certified(p)) <= best + TOL


# ------------------------------------------------------------ what the checker refuses


def test_a_wrong_row_in_the_model_is_caught():
    # a model that halves the capacity of a class union claims more than it may; the checker
    # builds the row from the data, so it disagrees and stays below the optimum
    p = scenario_problem([[[3, 1]]], [1, 1], tokens=[[3, 1]], nop=[0, 1], all_resident=True)
    honest = certified(p)
    original = ClassModel._row

    def halved(self, key, lower, upper, index, value):
        if key[0] == "class_union":
            value = np.asarray(value, dtype=float).copy()
            value[0] /= 2
        original(self, key, lower, upper, index, value)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClassModel, "_row", halved)
        wrong = certified(p)
    assert wrong.bound > optimum(p) + 0.1
    assert check_certificate(p, wrong) <= optimum(p) + TOL
    assert check_certificate(p, wrong) != pytest.approx(wrong.bound)
    assert check_certificate(p, honest) == pytest.approx(honest.bound)


def test_certificates_for_another_problem_or_with_bad_indices_are_refused():
    p = scenario_problem([[[3, 1]]], [1, 1], tokens=[[3, 1]], nop=[0, 1], all_resident=True)
    cert = certified(p)
    other = scenario_problem([[[3, 1, 1]]], [2, 1], tokens=[[3, 1, 1]], nop=[0, 1], all_resident=True)
    with pytest.raises(CertificateError, match="experts"):
        check_certificate(other, cert)
    for bad in (("type", (0, 5), 1.0), ("class_union", (0, 0, (0, 0)), 1.0), ("nonsense", (), 1.0),
                ("rigid_cut", (0, 0, 1, (0, 1)), 1.0), ("count", (0,), 1.0)):  # fmt: skip
        with pytest.raises(CertificateError):
            check_certificate(p, with_duals(cert, [bad]))
    # same shape, other data: still a valid bound for the problem it is checked on
    swapped = scenario_problem([[[1, 3]]], [1, 1], tokens=[[1, 3]], nop=[0, 1], all_resident=True)
    assert not recompute(swapped, cert).same_data
    assert check_certificate(swapped, cert) <= optimum(swapped) + TOL
    with pytest.raises(CertificateError, match="facts"):
        check_certificate(p, dataclasses.replace(cert, facts={"layers": 1}))
    with pytest.raises(CertificateError, match="not a"):
        BoundCertificate.from_json('{"kind": "something else"}')


# ------------------------------------------------------------ a real window


def test_gptoss_window_13_is_recomputed():
    if not GPTOSS.is_file():
        pytest.skip(f"GPT-OSS routing trace not present at {GPTOSS}")
    from comoe_opt.instance import load_instance
    from comoe_opt.planning import plan_window
    from comoe_opt.residency.objective import score
    from comoe_opt.trace import instance_batches

    instance = load_instance(ROOT / "instances" / "real-gptoss20b.toml")
    part = instance_batches(instance).planning_window(13, instance.policy.window_batches)
    p = plan_window(instance, part, method="static").problem
    cert = BoundCertificate.from_json(certified(p).to_json())
    bound = agrees(p, cert)
    assert bound == pytest.approx(28.3692, abs=1e-3)  # the value formulations/residency.md states
    # independently: a lower bound of every placement (weak duality), here static's and greedy's
    for method in ("static", "greedy"):
        placement = plan_window(instance, part, method=method).result.solution
        assert bound <= score(p, placement).total + 1e-9, method


def test_solve_json_carries_a_certificate_that_recomputes_its_bound(write_toml, cli):
    """`solve --json` carries the class bound's certificate; rebuilt from the instance and window
    alone, the checker gets the same bound, which is at most the objective and the reported bound."""
    table = {
        "name": "certified",
        "model": {"layers": 2, "experts_per_layer": 8, "top_k": 2, "page_gb": 1.0, "hidden_size": 64,
                  "bytes_per_element": 2},
        "hardware": {"chiplets": 4, "capacity_gb": 6, "local_bandwidth_gb_s": 2000, "peak_tflops": 200,
                     "d2d_bandwidth_gb_s": 512, "nop_hops": [1, 1, 2, 2], "hop_latency_ns": 20,
                     "prefetch_buffer_gb": 2},
        "trace": {"kind": "synthetic", "zipf_alpha": 1.2, "rho": 0.6, "drift_every": 20,
                  "tokens_per_batch": 16, "micro_batches": 20, "seed": 3},
        "policy": {"window_batches": 20, "balance_scenarios": 6, "search_moves": 0, "anneal_proposals": 0},
    }  # fmt: skip
    path = write_toml(table)
    out = cli("solve", path, "--method", "milp", "--gap", "0", "--work-limits", "--json")
    assert out.code == 0, out.err
    result = out.json()
    cert = result["report"]["certificate"]
    assert cert is not None
    instance = load_instance(path)
    _, batches = load_batches(instance, None)
    problem = plan_window(instance, batches.planning_window(0, 20), method="greedy").problem
    recomputed = check_certificate(problem, BoundCertificate.from_json(json.dumps(cert)))
    assert recomputed == pytest.approx(cert["bound"], rel=1e-9)
    assert recomputed <= result["bound"] + 1e-9 and recomputed <= result["objective"] + 1e-9
    text = cli("solve", path, "--method", "milp", "--gap", "0", "--work-limits")
    named = [line for line in text.out.splitlines() if "bound from" in line]
    report = result["report"]
    sources = {"the full model": report["full_model_bound"], "Lagrangian": report["lagrangian_bound"]}
    larger = [name for name, value in sources.items() if value is not None and value > cert["bound"]]
    if larger:  # the polish or the Lagrangian over layers proved more than the class LP
        top = max(larger, key=lambda name: sources[name])
        assert named and top in named[0]
    else:
        assert named and "hop-class LP" in named[0]


@settings(max_examples=15)
@given(small_problems())
def test_exact_lagrangian_at_the_certificates_prices_is_a_bound_above_the_lp(p):
    """`exact`'s Lagrangian over layers takes its prices from the certificate's coupling duals
    (HiGHS's ≤-row duals, ≤ 0): it must bound the brute-force optimum and, at the LP's own prices,
    be at least the LP bound (a wrong sign would price pages as a reward and break one or the other)."""
    from comoe_opt.deadline import Deadline
    from comoe_opt.residency.exact.pipeline import _Incumbent, _lagrangian, _Run

    best = optimum(p)
    assume(np.isfinite(best))
    scale = max(1.0, abs(best))
    cert = certified(p)
    run = _Run(p, Deadline(math.inf), 0.0, exact=True)  # no time limit: its work limits
    run.best = _Incumbent(None, best + 1.0, "test", None)  # an open gap, so that it runs
    run.certificate = cert
    _lagrangian(run)
    value = run.lagrangian
    assert value is not None and run.bound == value
    assert value <= best + TOL * scale
    assert value >= cert.bound - TOL * scale
