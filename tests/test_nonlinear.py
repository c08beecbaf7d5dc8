"""Non-linear generators: branches, folds, stability, the gap to the linear identity."""

from functools import partial

import numpy as np
import pytest

import fastslow_sim as fs
from fastslow_sim.nonlinear import (
    NonlinearBirthDeath,
    critical_branches,
    family_for,
    identity_gap,
    relaxation_oscillation,
)


def exact_curve(kappa, m):
    """The manifold of NonlinearBirthDeath as a graph y(m) over its mean m = c.x.

    Given the ratio r = u/down, p_st is geometric, p_i ~ r^i, with mean m(r); self-consistency
    u = exp(4 (y - 1/2) + kappa m) gives y = 1/2 + (log r(m) - kappa m) / 4.
    """
    i = np.arange(8)
    log_r = np.linspace(-12, 12, 200001)
    w = np.exp(np.outer(log_r, i) - np.max(np.outer(log_r, i), axis=1, keepdims=True))
    mean = (w @ (i / 7)) / w.sum(1)
    return 0.5 + (np.interp(m, mean, log_r) - kappa * m) / 4.0


def test_field_jacobians_against_finite_differences():
    fam = NonlinearBirthDeath(kappa=2.5)
    x = np.random.default_rng(0).dirichlet(np.ones(8))
    y = np.array([0.3])
    Fx, Fy = fam.field_jacobians(x, y)

    def F(x, y):
        return np.einsum("ji,j->i", fam.rates(x, y), x)

    h = 1e-6
    fd = np.stack([(F(x + h * e, y) - F(x - h * e, y)) / (2 * h) for e in np.eye(8)], 1)
    np.testing.assert_allclose(Fx, fd, atol=1e-8)
    np.testing.assert_allclose(Fy[:, 0], (F(x, y + h) - F(x, y - h)) / (2 * h), atol=1e-8)


def test_kappa_zero_is_the_linear_identity():
    fam = NonlinearBirthDeath(kappa=0.0)
    curve = critical_branches(fam, (-1.0, 1.5))
    assert curve["folds"] == [] and len(curve["branches"]) == 1 and curve["branches"][0]["stable"]
    assert identity_gap(fam, curve) <= 1e-12
    # and every point is p_st of the linear birth-death chain at its y
    p = fs.BirthDeath().closed_form(curve["y"])
    np.testing.assert_allclose(curve["x"], p, atol=1e-12)


def test_the_repelling_branch_just_past_the_onset_of_folding_is_listed():
    """At kappa = 1.3333334 (onset 4/3) the folds are 2e-12 apart in y, below the tolerance of
    a branch's y span: the branch between them (means 0.4999 to 0.5001) had been dropped as
    "only a fold", leaving two folds with no branch between them."""
    curve = critical_branches(NonlinearBirthDeath(kappa=1.3333334), (-1.0, 1.5))
    assert len(curve["folds"]) == 2
    low, mid, high = curve["branches"]
    assert low["stable"] and high["stable"] and mid["stable"] is False
    lo, hi = sorted(f["mean"] for f in curve["folds"])
    assert mid["mean_min"] == pytest.approx(lo, abs=1e-9) and mid["mean_max"] == pytest.approx(hi, abs=1e-9)
    assert mid["y_max"] - mid["y_min"] < 1e-11 and hi - lo > 1e-4


@pytest.mark.parametrize("kappa", [2.0, 3.0, 5.0])
def test_folds_and_stability_against_the_exact_curve(kappa):
    curve = critical_branches(NonlinearBirthDeath(kappa=kappa), (-1.5, 1.5))
    m = np.linspace(0.001, 0.999, 20001)
    y = exact_curve(kappa, m)
    dy = np.diff(y)
    turns = np.flatnonzero(np.sign(dy[1:]) != np.sign(dy[:-1])) + 1
    assert len(curve["folds"]) == len(turns) == 2
    for fold, k in zip(sorted(curve["folds"], key=lambda f: f["mean"]), sorted(turns)):
        assert fold["y"] == pytest.approx(y[k], abs=1e-5)
        assert fold["mean"] == pytest.approx(m[k], abs=2e-3)
    # points of the continuation lie on the exact curve
    mean = curve["x"] @ (np.arange(8) / 7)
    np.testing.assert_allclose(curve["y"], exact_curve(kappa, mean), atol=1e-6)
    # three branches: stable, repelling, stable (middle one has an eigenvalue > 0)
    assert [b["stable"] for b in curve["branches"]] == [True, False, True]
    assert curve["branches"][1]["max_real_eigenvalue"] > 0


def test_gap_grows_with_kappa():
    gaps = []
    for kappa in [0.0, 0.5, 1.0, 2.0, 3.0]:
        fam = NonlinearBirthDeath(kappa=kappa)
        gaps.append(identity_gap(fam, critical_branches(fam, (-1.0, 1.5))))
    assert gaps[0] <= 1e-12
    assert np.all(np.diff(gaps) > 0)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_relaxation_oscillation_crosses_the_folds():
    kappa = 3.0
    folds = sorted(
        f["y"] for f in critical_branches(NonlinearBirthDeath(kappa=kappa), (-1, 1.5))["folds"]
    )
    overshoot = []
    for eps in [0.01, 0.001]:
        ds = relaxation_oscillation(kappa=kappa, eps=eps, t_end=12.0)
        assert ds.attrs["status"] == "success"
        late = ds["time"].values > 4.0
        y = ds["y"].values[late, 0]
        mean = ds["x"].values[late] @ (np.arange(8) / 7)
        # y sweeps past both folds, x jumps between the outer branches
        assert y.min() < folds[0] and y.max() > folds[1]
        assert mean.min() < 0.2 and mean.max() > 0.8
        assert np.count_nonzero(np.diff(np.sign(np.diff(y)))) >= 6  # several periods
        overshoot.append(max(folds[0] - y.min(), y.max() - folds[1]))
    # the delay past a fold shrinks like eps^(2/3): a factor ~0.2 for eps 0.01 -> 0.001
    assert overshoot[1] < 0.5 * overshoot[0]


def test_bad_kappa_and_family():
    with pytest.raises(fs.InputError, match="finite"):
        NonlinearBirthDeath(kappa=float("nan"))
    with pytest.raises(fs.InputError, match="no non-linear family"):
        family_for("cycle", 1.0)
    with pytest.raises(fs.InputError, match="A < B"):
        critical_branches(NonlinearBirthDeath(), (1.0, 0.0))
    with pytest.raises(fs.InputError, match="domain"):
        critical_branches(family_for("michaelis-menten", 0.0), (-1.0, 1.0))
    with pytest.raises(fs.InputError, match="beta != 0"):  # the graph's start looped forever
        critical_branches(NonlinearBirthDeath(beta=0.0, kappa=3.0), (-1.0, 1.0))


@pytest.mark.parametrize("kappa, y_range", [(0.0, (-1.0, 1.5)), (3.0, (-1.0, 1.5)),
                                            (3.0, (-1.0, 0.7))])  # fmt: skip
def test_branches_span_to_their_folds_and_the_range_ends(kappa, y_range):
    """A branch runs from fold to fold, or to the end of the y range: its reported extents are
    those of the curve, not of the last continuation point short of them (branch 2 of kappa = 3
    was printed as y in [0.0245, 1.4663] for a branch from the fold at 0.0229 to y = 1.5)."""
    curve = critical_branches(NonlinearBirthDeath(kappa=kappa), y_range)
    branches, folds = curve["branches"], sorted(curve["folds"], key=lambda f: f["mean"])
    a, b = y_range
    assert branches[0]["y_min"] == a and branches[-1]["y_max"] == pytest.approx(b, abs=1e-12)
    assert curve["y"].max() == pytest.approx(b, abs=1e-12)  # the saved curve reaches it too
    mean_end = (curve["x"] @ (np.arange(8) / 7))[np.argmax(curve["y"])]
    assert exact_curve(kappa, mean_end) == pytest.approx(b, abs=1e-6)  # a point on the curve
    assert branches[-1]["mean_max"] == pytest.approx(mean_end, abs=1e-12)
    if kappa == 0.0:
        assert folds == []
        return
    low, high = folds  # by mean: the fold ending branch 0, the fold starting branch 2
    # the same point, its mean summed in another order: equal to round-off (one unit in the
    # last place apart on one machine), where a continuation point short of it was 1.6e-3 off
    same = partial(pytest.approx, abs=1e-12)
    assert branches[0]["y_max"] == same(low["y"]) and branches[0]["mean_max"] == same(low["mean"])
    assert branches[1]["y_min"] == same(high["y"]) and branches[1]["y_max"] == same(low["y"])
    assert branches[1]["mean_min"] == same(low["mean"])
    assert branches[1]["mean_max"] == same(high["mean"])
    assert branches[2]["y_min"] == same(high["y"])
    assert branches[2]["mean_min"] == same(high["mean"])


def exact_pieces(kappa, y_range):
    """The monotone pieces of the exact curve y(m) that cross the y range, in order along m:
    `[(stable, y_min, y_max)]` clipped to the range (the middle piece of a fold repels)."""
    m = np.linspace(1e-5, 1 - 1e-5, 400001)
    y = exact_curve(kappa, m)
    turns = np.flatnonzero(np.sign(np.diff(y)[1:]) != np.sign(np.diff(y)[:-1])) + 1
    a, b = y_range
    pieces = []
    for k, (i, j) in enumerate(zip([0, *turns], [*turns, len(m) - 1])):
        lo, hi = max(y[i : j + 1].min(), a), min(y[i : j + 1].max(), b)
        if hi > lo:
            pieces.append((k != 1, lo, hi))  # pieces 0 and 2 (or the only one) attract
    return pieces


@pytest.mark.parametrize("kappa, y_range", [
    (3.0, (0.1, 0.2)),   # inside the fold region: three branches, no fold in the range
    (3.0, (1.0, 2.0)),   # above both folds: only the upper branch (the start used to stall)
    (3.0, (-1.0, 0.1)),  # one fold inside, the other above the range
    (5.0, (0.5, 1.0)),   # above both folds, the low state far from the manifold
    (5.0, (0.1, 0.2)),   # one fold inside, the lower fold far below
    (5.0, (-0.3, 0.0)),  # between the folds
    (-3.0, (1.0, 2.0)),  # no folds at all
    # from the review (helper-21) of the first version:
    (5.0, (-0.4058, -0.4056)),  # a fold just below the range: 4 branches, one twice
    (3.0, (-0.3, 0.22710649273694006 - 1e-9)),  # 1e-9 short of a fold: the middle one short
    (3.0, (0.0228, 0.0230)),  # a tiny range around a fold: the repelling branch missing
    (2.0, (0.27921, 0.5)),  # just above the fold's ghost: the start raised a LinAlgError
    (1.3334, (-0.1, 1.5)),  # near the onset: a pair of folds 6.5e-5 apart stepped over
])  # fmt: skip
def test_every_branch_that_crosses_the_range_is_found(kappa, y_range):
    """Ranges that do not contain the whole fold region: the branches are those of the exact
    curve y(m), each with its stability and its extent in the range; the curve used to be
    followed only while it stayed in the range, so the branches that enter it only between folds
    outside it were missed, and a range above the folds stalled at its start."""
    curve = critical_branches(NonlinearBirthDeath(kappa=kappa), y_range)
    want = exact_pieces(kappa, y_range)
    got = [(b["stable"], b["y_min"], b["y_max"]) for b in curve["branches"]]
    assert [g[0] for g in got] == [w[0] for w in want]
    np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], atol=1e-5)
    mean = curve["x"] @ (np.arange(8) / 7)
    np.testing.assert_allclose(curve["y"], exact_curve(kappa, mean), atol=1e-6)
    a, b = y_range
    assert np.all((curve["y"] >= a) & (curve["y"] <= b))
    assert all(a <= f["y"] <= b for f in curve["folds"])
    assert len(curve["folds"]) == sum(a < y < b for y in _exact_fold_ys(kappa))
    assert sorted(set(curve["branch_id"])) == list(range(len(want)))


def _exact_fold_ys(kappa):
    m = np.linspace(1e-5, 1 - 1e-5, 400001)
    y = exact_curve(kappa, m)
    turns = np.flatnonzero(np.sign(np.diff(y)[1:]) != np.sign(np.diff(y)[:-1])) + 1
    return y[turns]


@pytest.mark.parametrize("kappa, y_range", [(-3.0, (90.0, 91.0)), (3.0, (100.0, 101.0)),
                                            (-3.0, (0.0, 176.9))])  # fmt: skip
@pytest.mark.slow
def test_far_ranges_and_the_domains_edge(kappa, y_range):
    """Saturated branches (the mean within 1e-150 of 1) and a range that ends 0.01 short of the
    domain's edge: one stable branch over the whole range, every point on the exact curve (the
    ratio x_(i+1)/x_i gives s = log(u/down), and then y)."""
    fam = NonlinearBirthDeath(kappa=kappa)
    curve = critical_branches(fam, y_range)
    assert curve["folds"] == [] and len(curve["branches"]) == 1 and curve["branches"][0]["stable"]
    b = curve["branches"][0]
    assert (b["y_min"], b["y_max"]) == pytest.approx(y_range, abs=1e-9)
    np.testing.assert_allclose(curve["y"], _graph_y(fam, curve["x"]), atol=1e-9)


def test_linear_families_stop_at_the_range():
    """A fold-free family is traced from y_lo up only (the backward trace of the first version
    stepped past michaelis-menten's domain edge at y = 0 and stalled)."""
    fam = family_for("michaelis-menten", 0.0)
    for y_range in [(1e-12, 1.5), (0.0, 1.5)]:
        curve = critical_branches(fam, y_range)
        assert curve["y"][0] == y_range[0] and curve["y"][-1] == pytest.approx(1.5, abs=1e-12)
        assert np.all(np.diff(curve["y"]) > 0) and len(curve["branches"]) == 1


def test_a_range_that_ends_on_a_fold():
    """The fold is reported, the branches that meet there end on it, and a branch that meets the
    range only at the fold is that fold, not a branch of its own."""
    fam = NonlinearBirthDeath(kappa=3.0)
    F = max(y for _, y in fam.fold_points())
    curve = critical_branches(fam, (-0.0729, F))
    assert len(curve["folds"]) == 2
    assert [b["stable"] for b in curve["branches"]] == [True, False, True]
    assert [b["y_max"] for b in curve["branches"]] == pytest.approx([F, F, F], abs=1e-12)
    above = critical_branches(fam, (F, 1.0))
    assert len(above["branches"]) == 1 and above["branches"][0]["mean_min"] > 0.8


def test_fold_points_against_the_exact_curve():
    for kappa in (2.0, 3.0, 5.0, 30.0):
        fam = NonlinearBirthDeath(kappa=kappa)
        got = sorted(y for _, y in fam.fold_points())
        np.testing.assert_allclose(got, sorted(_exact_fold_ys(kappa)), atol=1e-6)
        for x, y in fam.fold_points():
            assert np.abs(_residual_of(fam, x, y)).max() < 1e-12
    assert NonlinearBirthDeath(kappa=1.0).fold_points() == []
    assert NonlinearBirthDeath(kappa=-3.0).fold_region() is None


def _residual_of(fam, x, y):
    return np.einsum("ji,j->i", fam.rates(x, np.array([y])), x)


def test_saturated_outer_branches_that_come_back():
    """kappa 30 on [-0.17, 0.1]: the upper branch (mean within 1e-12 of 1) runs down to a fold at
    y = -6.34, far outside the range, and back up as the repelling branch (the first version
    took its flatness for the curve having left for good: 1 branch, no fold)."""
    fam = NonlinearBirthDeath(kappa=30.0)
    curve = critical_branches(fam, (-0.17, 0.1))
    assert [b["stable"] for b in curve["branches"]] == [True, False, True]
    (fold,) = curve["folds"]
    assert fold["y"] == pytest.approx(max(y for _, y in fam.fold_points()), abs=1e-12)


@pytest.mark.slow  # 7 s
def test_the_smallest_accepted_osc_eps_runs_and_hugs_the_folds():
    """At eps = OSC_EPS_MIN (1e-9) the oscillation runs in seconds (Radau took over 5 minutes
    at 1e-9) and its turning points sit on the folds (the overshoot ~ eps^(2/3) is 1e-6 here)."""
    from fastslow_sim.nonlinear import OSC_EPS_MIN

    ds = relaxation_oscillation(kappa=3.0, eps=OSC_EPS_MIN, t_end=6.0)
    assert ds.attrs["status"] == "success"
    y = ds["y"].values[ds["time"].values > 2.0, 0]
    lo, hi = sorted(y for _, y in NonlinearBirthDeath(kappa=3.0).fold_points())
    assert abs(y.min() - lo) < 5e-4 and abs(y.max() - hi) < 5e-4
    assert np.count_nonzero(np.diff(np.sign(np.diff(y)))) >= 4  # it still oscillates


def test_an_oscillation_that_drifts_keeps_its_warning_and_its_dataset(monkeypatch):
    """`manifold --osc-eps 1e-10` (drift beyond the budget over t_end 20) failed with
    "conflicting sizes for dimension 'state': length 1 on 'state' and length 8": the count of
    the runs that warned replaced the number of states. A budget of 1e-9 times the usual makes
    the cheap eps 0.01 run drift: the dataset keeps its 8 states and the warning."""
    import warnings

    from fastslow_sim import integrators

    monkeypatch.setattr(integrators, "MASS_DRIFT_FACTOR", 1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fs.MassDriftWarning)
        ds = fs.nonlinear.manifold_dataset(NonlinearBirthDeath(kappa=3.0), (-1.0, 1.5),
                                           osc_eps=0.01, osc_t_end=2.0)  # fmt: skip
    assert ds.sizes["state"] == 8 and ds["curve_x"].shape[1] == 8
    assert ds.attrs["mass_drift_warning"].startswith(("the total probability", "4 runs of"))
    assert "drifted by up to" in ds.attrs["mass_drift_warning"]
    assert ds.attrs["osc_eps"] == 0.01 and ds.sizes["osc_time"] == 4001


@pytest.mark.parametrize("kappa", [0.0, 3.0])
@pytest.mark.slow
def test_a_range_up_to_the_domains_edge(kappa):
    """The range may end on the domain's edge (helper-22: the trace stalled within 1e-10 of it,
    where every step's predictor left the domain)."""
    fam = NonlinearBirthDeath(kappa=kappa)
    lo, hi = fam.domain()
    curve = critical_branches(fam, (170.0, hi))
    (branch,) = curve["branches"]
    assert branch["stable"] and branch["y_min"] == 170.0
    assert branch["y_max"] == pytest.approx(hi, abs=1e-6)
    low = critical_branches(fam, (lo, lo + 1.0))
    assert len(low["branches"]) == 1 and low["branches"][0]["y_min"] == lo


def test_an_empty_domain_is_refused():
    with pytest.raises(fs.InputError, match="leaves no y where"):
        NonlinearBirthDeath(kappa=2000.0).domain()


@pytest.mark.parametrize("system, y_range", [
    ("two-state", (300.0, "edge")),  # stalled at y = 354.545 when domain() was the real line
    pytest.param("michaelis-menten", (1e299, 1e300),  # ended at 9.996e299: the arc's length
                 marks=pytest.mark.slow),  # overflowed (5 s)
    pytest.param("michaelis-menten", (1e306, "edge"),  # 20,000 steps that no longer moved y
                 marks=pytest.mark.slow),  # near the edge (6 s)
])  # fmt: skip
def test_linear_families_reach_the_range_end_far_out_and_at_the_domains_edge(system, y_range):
    """A linear family's one stable branch runs over the whole range: up to the domain's edge
    (where the rates' Jacobian is about to overflow), and for michaelis-menten (rates linear in
    y, domain up to 9e306) over ranges beyond 1e154, whose steps' squares overflow."""
    fam = family_for(system, 0.0)
    a, b = y_range
    b = fam.domain()[1] if b == "edge" else b
    curve = critical_branches(fam, (a, b))
    (branch,) = curve["branches"]
    assert branch["stable"] and (branch["y_min"], branch["y_max"]) == (a, b)
    assert curve["y"][0] == a and curve["y"][-1] == b and np.all(np.diff(curve["y"]) >= 0)
    p = fam.generator.closed_form(curve["y"])
    np.testing.assert_allclose(curve["x"], p, rtol=0, atol=1e-12)


def test_the_gap_where_a_rate_is_zero():
    """michaelis-menten at y = 0 binds nothing: states 1..N are transient. The gap's p_st gives
    them no mass, as h0 does (it refused the chain as reducible: `manifold --system
    michaelis-menten --kappa 0 --y-range 0 1.5` failed inside its domain)."""
    fam = family_for("michaelis-menten", 0.0)
    curve = critical_branches(fam, (0.0, 1.5))
    assert identity_gap(fam, curve) < 1e-15


def _fold_points_on_a_grid(fam):
    """The first `fold_points`: sign changes of `kappa (n-1) Var(c.x) - 1` on a grid of 120,001
    values of s in [-60, 60] (all at once: 120,001 x n floats), each refined by brentq."""
    from scipy.optimize import brentq

    n = fam.n_states

    def f(s):
        return fam.kappa * (n - 1) * fam._graph(np.atleast_1d(s))[2] - 1.0

    grid = np.linspace(-60.0, 60.0, 120001)
    v = f(grid)
    roots = [brentq(lambda s: f(s)[0], grid[j], grid[j + 1], xtol=1e-15)
             for j in np.flatnonzero(np.sign(v[1:]) != np.sign(v[:-1]))]  # fmt: skip
    return [(fam._graph(np.array([r]))[0][0], float(fam._graph(np.array([r]))[3][0]))
            for r in roots]  # fmt: skip


@pytest.mark.parametrize("kappa", [1.34, 1.5, 3.0, 10.0, 4 / 3 + 1e-9])
def test_fold_points_equal_the_grids(kappa):
    """The folds solved from the exact structure of Var(c.x) (even in s, falling in |s|) are
    those of the dense grid, to round-off, down to a pair 1e-5 apart in s near the onset."""
    fam = NonlinearBirthDeath(kappa=kappa)
    got, want = fam.fold_points(), _fold_points_on_a_grid(fam)
    assert len(got) == len(want) == 2
    for (x, y), (x_w, y_w) in zip(got, want):
        assert y == pytest.approx(y_w, abs=1e-13)
        np.testing.assert_allclose(x, x_w, atol=1e-13)


def test_fold_points_at_400_states_are_cheap():
    """n = 400: the grid took 5.4 s and 1.2 GB (120,001 x 400 floats, several times over); the
    memory is the deterministic guard (no timed assertion: the time is 14 ms here)."""
    import tracemalloc

    fam = NonlinearBirthDeath(n=400, kappa=3.0)
    tracemalloc.start()
    folds = fam.fold_points()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1e6
    assert len(folds) == 2
    # kappa (n-1) Var(c.x) = 1 there, Var(i) from its closed form r/(1-r)^2 - n^2 r^n/(1-r^n)^2
    for x, y in folds:
        s = np.log(x[1] / x[0])
        r, n = np.exp(s), 400
        var_i = r / (1 - r) ** 2 - n**2 * r**n / (1 - r**n) ** 2
        assert 3.0 * var_i / (n - 1) == pytest.approx(1.0, rel=1e-9)
        assert np.abs(_residual_of(fam, x, y)).max() < 1e-12
    assert fam.fold_points()[0][1] > fam.fold_points()[1][1]  # the low-mean fold is the upper


def _graph_pieces(fam, y_range):
    """`[(stable, y_min, y_max)]`: the monotone pieces of the exact graph y(s) (split at the
    folds, from `fold_points`, checked against the grid above) that cross the y range in more
    than a point, clipped to it, in order of the mean (beta > 0: low, middle, high)."""
    a, b = y_range
    folds = [y for _, y in fam.fold_points()]
    up = fam.beta > 0  # y(s) rises on the outer pieces
    spans = [(True, -np.inf, np.inf)] if not folds else [
        (True, -np.inf, folds[0]) if up else (True, folds[0], np.inf),
        (False, min(folds), max(folds)),
        (True, folds[1], np.inf) if up else (True, -np.inf, folds[1])]
    return [(st, max(lo, a), min(hi, b)) for st, lo, hi in spans if min(hi, b) > max(lo, a)]


def _graph_y(fam, x):
    """y(s) of each row of x, s = log(x_(i+1)/x_i) from its best-resolved neighbouring pair."""
    i = np.argmax(x[:, :-1] * x[:, 1:], axis=1)
    rows = np.arange(len(x))
    s = np.log(x[rows, i + 1] / x[rows, i])
    return fam.y_mid + (s - np.log(fam.up / fam.down) - fam.kappa * (x @ fam.c)) / fam.beta


@pytest.mark.parametrize("delta", [1e-4, 1e-6])
@pytest.mark.parametrize("where", ["upper fold", "lower fold", "to the upper fold", "folds",
                                   "between", "across"])  # fmt: skip
def test_near_the_onset_of_folding(delta, where):
    """kappa = 4/3 + delta, the folds 1.2e-7 (delta 1e-4) or 1.2e-10 apart in y: a range starting
    on the upper fold found no start point (Newton from e_0 and the relaxation both failed), and
    a start between the pair (on the high branch at the lower fold) jumped over both with its
    first step (0.02, the pair 0.008 apart): one branch, no fold, for three."""
    fam = NonlinearBirthDeath(kappa=4 / 3 + delta)
    (_, y_up), (_, y_low) = fam.fold_points()
    y_range = {"upper fold": (y_up, 1.5), "lower fold": (y_low, 1.5), "to the upper fold":
               (-1.0, y_up), "folds": (y_low, y_up), "between": (0.5 * (y_low + y_up), 1.0),
               "across": (-1.0, 1.5)}[where]  # fmt: skip
    curve = critical_branches(fam, y_range)
    got = [(b["stable"], b["y_min"], b["y_max"]) for b in curve["branches"]]
    want = _graph_pieces(fam, y_range)
    assert [g[0] for g in got] == [w[0] for w in want]
    a, b = y_range
    tol = 1e-12 * (1 + max(abs(a), abs(b)))  # critical_branches' points "in the range"
    np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], rtol=0, atol=tol)
    assert sorted(f["y"] for f in curve["folds"]) == pytest.approx(
        sorted(y for y in (y_low, y_up) if a <= y <= b), abs=1e-13)
    np.testing.assert_allclose(curve["y"], _graph_y(fam, curve["x"]), rtol=0, atol=1e-9)


@pytest.mark.parametrize("kw, y_range, raw_negative", [
    (dict(kappa=30.0), (-0.17, 0.1), False),
    (dict(kappa=5.0, beta=2.0), (-3.0, 3.0), True),
])  # fmt: skip
def test_no_negative_probabilities(monkeypatch, kw, y_range, raw_negative):
    """The corrector resolves the tiniest entries only in absolute terms: -3e-53 (kappa 30) and
    -1.4e-19 (beta 2) were reported where the graph has 1e-60 and 1e-31. Every point, folds
    included, is now put on the exact graph, which moves x by round-off only. (Since the
    tangent comes from the corrector's bordered system, kappa 30's continuation alone stays
    positive; beta 2's does not.)"""
    fam = NonlinearBirthDeath(**kw)
    curve = critical_branches(fam, y_range)
    assert curve["x"].min() >= 0 and min(min(f["x"]) for f in curve["folds"]) > 0
    np.testing.assert_allclose(curve["y"], _graph_y(fam, curve["x"]), rtol=0, atol=1e-12)
    monkeypatch.setattr(NonlinearBirthDeath, "graph_x", lambda self, x, y: x)
    raw = critical_branches(fam, y_range)
    assert (raw["x"].min() < 0) == raw_negative  # what the continuation alone gives
    np.testing.assert_allclose(curve["x"], raw["x"], rtol=0, atol=1e-15)
    assert [b["stable"] for b in curve["branches"]] == [b["stable"] for b in raw["branches"]]


@pytest.mark.parametrize("beta, y_range", [(0.002, (-1.0, 1.5)),
                                           pytest.param(0.05, (-40.0, -20.0), marks=pytest.mark.slow),  # 7 s
                                           (-0.01, (100.0, 120.0))])  # fmt: skip
def test_small_beta(beta, y_range):
    """The curve's y scale is 1/|beta| (folds 16 apart at beta 0.05, 82 at -0.01): the
    continuation steps in (x, y |beta|) and, in the range, in y as at beta 4. beta 0.002 on
    [-1, 1.5] took 20,000 steps of 0.05 without leaving the folds' neighbourhood (RuntimeError),
    beta 0.01 took 7,082 steps."""
    fam = NonlinearBirthDeath(beta=beta, kappa=3.0)
    curve = critical_branches(fam, y_range, max_points=3000)
    want = _graph_pieces(fam, y_range)
    got = [(b["stable"], b["y_min"], b["y_max"]) for b in curve["branches"]]
    assert [g[0] for g in got] == [w[0] for w in want]
    np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], rtol=0, atol=1e-9)
    a, b = y_range
    assert sorted(f["y"] for f in curve["folds"]) == pytest.approx(
        sorted(y for _, y in fam.fold_points() if a <= y <= b), abs=1e-9)
    np.testing.assert_allclose(curve["y"], _graph_y(fam, curve["x"]), rtol=0, atol=1e-9)


def _cycle_relaxation_mp(y, dps):
    """Largest Re lambda of the cycle's Q(y)^T off its zero eigenvalue (n = 6, forward e^(y s_i),
    backward 0.2), built and solved in mpmath at `dps` digits: independent of the float64 code."""
    import mpmath as mp

    n = 6
    with mp.workdps(dps):
        Q = mp.zeros(n, n)
        for i in range(n):
            Q[i, (i + 1) % n] += mp.exp(y * (mp.mpf(i) / (n - 1) - mp.mpf(1) / 2))
            Q[i, (i - 1) % n] += mp.mpf(1) / 5
            Q[i, i] = -(Q[i, (i + 1) % n] + Q[i, (i - 1) % n])
        ev = sorted(mp.eig(Q.T, left=False, right=False), key=lambda e: abs(e))
        return float(max(mp.re(e) for e in ev[1:]))  # ev[0]: the zero eigenvalue (1e-62 here)


@pytest.mark.parametrize("y, dps", [(1.0, 30), (50.0, 60), (100.0, 80), (150.0, 120),
                                    (1000.0, 700)])  # fmt: skip
def test_fast_stability_of_a_cycle_against_mpmath(y, dps):
    """The fast eigenvalues on the tangent space of a linear generator: at y = 100 the
    orthonormal basis gave +8.99e5 (a "repelling" linear manifold) for -0.19999999959; the
    coordinates that drop the state of largest mass resolve it, and balanced, y = 1000 (rates
    e^(+-500)) too. The estimate covers the true error and is below |lambda| (the sign is
    resolved)."""
    from fastslow_sim.nonlinear import _fast_stability

    fam = family_for("cycle", 0.0)
    yy = np.array([y])
    value, err = _fast_stability(fam, fs.stationary_distribution(fam.generator.rates(yy)), yy)
    ref = _cycle_relaxation_mp(y, dps)
    assert abs(value - ref) <= err < 1e-3 * abs(ref)


def test_fast_stability_says_when_float64_does_not_resolve_the_sign():
    """At a fold one eigenvalue on the tangent space is 0 exactly: float64 gives some 1e-17 of
    either sign, and the estimate says it does not resolve the sign (error above |value|); a
    branch of such points is neither stable nor repelling, and one unresolved point among
    resolved negative ones is counted, not hidden."""
    from fastslow_sim.nonlinear import _branch_stability, _fast_stability

    fam = NonlinearBirthDeath(kappa=3.0)
    for x, y in fam.fold_points():
        value, err = _fast_stability(fam, x, np.array([y]))
        assert err >= abs(value) and err < 1e-12
    br = _branch_stability(np.array([1e-17]), np.array([1e-14]), at_fold=False)
    assert br["stable"] is None and br["max_real_eigenvalue"] is None
    br = _branch_stability(np.array([-0.3, 1e-17]), np.array([1e-15, 1e-14]), at_fold=False)
    assert br["stable"] is True and br["unresolved_points"] == 1
    assert br["max_real_eigenvalue"] == -0.3 and br["max_unresolved_error"] == 1e-14


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_branch_sup_of_re_lambda_does_not_depend_on_the_step():
    """A stable branch that ends at a fold: its largest Re lambda tends to 0 there (D_x F is
    singular on the tangent space at a fold), so the supremum over the branch is 0 whatever the
    continuation's step; the sampled maximum was -0.0633 at steps 0.05, -0.0064 at 0.002."""
    fam = NonlinearBirthDeath(kappa=3.0)
    sups = []
    for h in [None, 0.005]:
        steps = {} if h is None else {"h": h, "h_max": h}
        branches = critical_branches(fam, (-1.0, 1.5), **steps)["branches"]
        assert [b["stable"] for b in branches] == [True, False, True]
        assert [b["max_real_eigenvalue"] for b in branches[::2]] == [0.0, 0.0]
        assert all(b["max_at_fold"] for b in branches[::2])
        sups.append(branches[1]["max_real_eigenvalue"])
    # the repelling branch's supremum is inside it: the sampled maximum was 0.19721 at steps of
    # 0.05 and 0.19743 at 0.002; polished along the graph, both are the maximum over 20,001
    # values of s between the folds (eigenvalues of D_x F in an orthonormal basis of the
    # tangent space, fine at these rates), to within its largest jump between neighbours
    s_star = fam._fold_s()
    s = np.linspace(-s_star, s_star, 20001)
    basis = np.linalg.svd(np.ones((1, 8)))[2][1:].T
    top = []
    for x, y in zip(*[fam._graph(s)[k] for k in (0, 3)]):
        Fx = fam.field_jacobians(x, np.array([y]))[0]
        top.append(np.max(np.linalg.eigvals(basis.T @ Fx @ basis).real))
    top = np.array(top)
    jump = np.max(np.abs(np.diff(top)))
    assert sups[0] == pytest.approx(sups[1], abs=1e-9)
    assert top.max() - 1e-12 <= sups[0] <= top.max() + jump and jump < 1e-4


def test_gap_is_the_supremum_along_the_exact_graph():
    """The gap at kappa 3 on [-1, 1.5] against a closed form on 2,000,001 values of the graph's
    parameter s: x_i ~ e^(s i), y(s) = 1/2 + (s - kappa m(s))/4, and the linear reference
    p_st(Q(x_ref, y(s))) geometric of log-ratio s - kappa (m(s) - 1/2). The curve's own points
    gave 0.6187 (the sampled maximum); the supremum is 0.61995 near y = 0.143. The grid's
    maximum is below the supremum by at most its largest step between neighbours."""
    kappa, (y_lo, y_hi) = 3.0, (-1.0, 1.5)
    fam = NonlinearBirthDeath(kappa=kappa)
    gap = identity_gap(fam, critical_branches(fam, (y_lo, y_hi)))
    i, c = np.arange(8), np.arange(8) / 7
    best, jump = -1.0, 0.0
    for s in np.array_split(np.linspace(-12.0, 12.0, 2_000_001), 20):
        x = np.exp(np.outer(s, i) - np.maximum(0, 7 * s)[:, None])
        x /= x.sum(1, keepdims=True)
        m = x @ c
        y = 0.5 + (s - kappa * m) / 4
        r = s - kappa * (m - 0.5)
        p = np.exp(np.outer(r, i) - np.maximum(0, 7 * r)[:, None])
        p /= p.sum(1, keepdims=True)
        g = np.max(np.abs(x - p), axis=1)
        inside = (y >= y_lo) & (y <= y_hi)
        best = max(best, g[inside].max(initial=-1.0))
        jump = max(jump, np.max(np.abs(np.diff(g))))
    assert best - 1e-12 <= gap <= best + jump
    assert jump < 1e-4 and gap == pytest.approx(0.61995, abs=1e-5)


def cycle_p_st(gen, y):
    """`p_st` of the `Cycle` generator at `y` by the Markov chain tree theorem: `p_i` is the
    total weight of the spanning trees directed into `i`; on a ring each drops one edge, so
    the states `i+1..i+k` step back towards `i` (rate `backward`) and `i+k+1..i+n-1` forward
    (rate `forward e^(y s_j)`), `k = 0..n-1`. Sums of products of positive rates, in logs: no
    cancellation, relative accuracy about `|y| 1e-16` at any `y`.
    `y` may be an array: `p` along a new last axis, every y at once (one y at a time, in
    Python loops, took as long as the continuation it checks), each sum in the same order as
    for one y (the same numbers, bit for bit)."""
    from scipy.special import logsumexp

    y = np.asarray(y, dtype=float)
    n = gen.n_states
    log_f = np.log(gen.forward) + y[..., None] * (np.arange(n) / (n - 1) - 0.5)
    log_b = np.log(gen.backward)
    terms = np.empty((*y.shape, n, n))  # [..., i, k]: the trees into i that drop edge i+k
    for i in range(n):
        for k in range(n):
            total = 0
            for j in range(k + 1, n):
                total = total + log_f[..., (i + j) % n]
            terms[..., i, k] = k * log_b + total
    log_w = logsumexp(terms, axis=-1)
    return np.exp(log_w - logsumexp(log_w, axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def cycle_curve():
    """The cycle's manifold on y in [1, 1000] and its closed form there (two tests check it)."""
    fam = family_for("cycle", 0.0)
    curve = critical_branches(fam, (1.0, 1000.0))
    return fam, curve, cycle_p_st(fam.generator, curve["y"])


@pytest.mark.parametrize("y_range", [(1.0, 1000.0), "domain"])
@pytest.mark.slow
def test_the_cycle_is_traced_where_its_rates_are_far_from_1(y_range, cycle_curve):
    """`manifold --system cycle --kappa 0 --y-range 1 1000` stalled at y = 151.8 (rates e^(+-76)):
    the tangent, the SVD's null vector of the continuation's Jacobian, was accurate only to
    round-off of its largest entry (y part 0.17 for 1), so the corrector's hyperplane met the
    curve far from the predictor. The whole range is traced now, on the closed form of
    `p_st` (to the corrector's tolerance, 1e-13 in each entry)."""
    if y_range == "domain":
        fam = family_for("cycle", 0.0)
        a, b = fam.domain()
        curve = critical_branches(fam, (a, b))
        exact = cycle_p_st(fam.generator, curve["y"])
    else:
        (a, b), (fam, curve, exact) = y_range, cycle_curve
    (branch,) = curve["branches"]
    assert branch["y_min"] == a and branch["y_max"] == b and branch["stable"]
    assert np.all(np.diff(curve["y"]) > 0)
    np.testing.assert_allclose(curve["x"], exact, rtol=0, atol=1e-13)


def test_a_linear_familys_points_are_its_p_st(cycle_curve):
    """A linear family's manifold is `p_st(y)` (DESIGN 3.2), which GTH gives to relative
    accuracy; the continuation's points resolved the tiniest entries only in absolute terms
    (the cycle at y = 95: -5e-20, and mean c.x -2e-20). Every point is now GTH's `p_st`: no
    negative entry, and each entry above 1e-290 within 2e-12 of the tree theorem's closed form
    (GTH's 1e-12, plus the closed form's round-off of logs up to 500 in size: about 3e-13)."""
    fam, curve, exact = cycle_curve
    assert curve["x"].min() >= 0
    big = exact > 1e-290
    np.testing.assert_allclose(curve["x"][big], exact[big], rtol=2e-12, atol=0)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_a_generators_relaxation_is_never_reported_repelling():
    """Where the rates span 1e-255 to 1e158 (the random family at y = 300), the first-order
    round-off estimate claimed Re lambda = +2.7e101 +- 3e100 and the branch "repelling"; every
    eigenvalue of a generator's transpose has Re <= 0 (Gershgorin), so a positive one is
    round-off: reported unresolved, not repelling."""
    fam = family_for("random", 0.0)
    curve = critical_branches(fam, (100.0, 300.0))
    assert np.all(curve["stability"] - curve["stability_error"] <= 0)
    assert all(b["stable"] is not False for b in curve["branches"])


@pytest.mark.slow
def test_the_oscillations_range_passes_the_folds_by_eps_to_the_two_thirds():
    """`manifold --osc-eps 1e-6` printed y in [0.0229, 0.2270] for folds at 0.022894 and
    0.227106: the range of the saved points (every 0.005 in t, y moving 0.0016 between them),
    which end short of the turning point in the jump. The turning points are now located by
    re-running around them (to 1e-9): the trajectory leaves each fold past it, by
    `C eps^(2/3)` (Krupa and Szmolyan's fold: the delay scales as eps^(2/3)), so the scaled
    overshoot is the same at eps 1e-6, 1e-7 and 1e-8 (2.0 above the upper fold, 1.4 below the
    lower one; its next order, eps^(1/3), moves it by 3% over these)."""
    fam = NonlinearBirthDeath(kappa=3.0)
    lo, hi = sorted(y for _, y in fam.fold_points())
    scaled = []
    for eps in (1e-6, 1e-7, 1e-8):
        ds = fs.nonlinear.manifold_dataset(fam, (-1.0, 1.5), osc_eps=eps, osc_t_end=4.0)
        assert ds.attrs["osc_y_window_kind"] == "last cycle"
        assert ds.attrs["osc_y_min"] < lo < hi < ds.attrs["osc_y_max"]
        scaled.append([(lo - ds.attrs["osc_y_min"]) / eps ** (2 / 3),
                       (ds.attrs["osc_y_max"] - hi) / eps ** (2 / 3)])  # fmt: skip
    scaled = np.array(scaled)
    np.testing.assert_allclose(scaled, np.tile(scaled[-1], (3, 1)), rtol=0.05)
    assert 1.0 < scaled[-1, 0] < scaled[-1, 1] < 3.0


@pytest.mark.parametrize("kappa, y_range", [
    (3.0, (0.1, 0.1000000000001)),  # width 1e-13: none of the three branches was found
    (3.0, (0.1, float(np.nextafter(0.1, 1.0)))),  # one float apart
    (3.0, (0.0, 1e-12)),  # the widths 1e-12 (1 + |y|) and less: no branch, gap 0 as success
    (3.0, (0.0, 1e-300)),
    (5.0, (-0.3, -0.3 + 1e-13)),  # between the folds
])  # fmt: skip
def test_a_narrow_range_finds_the_branches_across_it(kappa, y_range):
    """A branch across a range narrower than 1e-12 (1 + |y|) spanned no more y than the
    tolerance with which a segment that only touches the range at a fold is dropped: every
    branch was dropped, and the gap of no points was 0. Each branch crosses it with a point on
    each end, as across a range 1e-6 wide at the same place."""
    fam = NonlinearBirthDeath(kappa=kappa)
    a, b = y_range
    curve = critical_branches(fam, y_range)
    wide = critical_branches(fam, (a, a + 1e-6))
    assert [br["stable"] for br in curve["branches"]] == [br["stable"] for br in wide["branches"]]
    assert len(curve["branches"]) >= 1
    for k, br in enumerate(curve["branches"]):
        ys = curve["y"][curve["branch_id"] == k]
        assert (ys.min(), ys.max()) == (a, b) == (br["y_min"], br["y_max"])
    np.testing.assert_allclose([br["mean_min"] for br in curve["branches"]],
                               [br["mean_min"] for br in wide["branches"]], rtol=0, atol=1e-5)  # fmt: skip
    assert identity_gap(fam, curve) == pytest.approx(identity_gap(fam, wide), abs=1e-5)


def test_no_branch_is_no_gap_of_zero(monkeypatch, tmp_path):
    """The gap of an empty curve was 0.0, the linear identity's: `manifold` printed gap = 0.0000
    and exited 0 for a range in which it had found nothing. An empty curve has no gap, and a
    continuation that finds no branch is a failure (exit 1, one sentence)."""
    from click.testing import CliRunner

    import fastslow_sim.nonlinear as nl
    from fastslow_sim.cli import main

    fam = NonlinearBirthDeath(kappa=3.0)
    empty = {"x": np.zeros((0, 8)), "y": np.zeros(0), "branches": [], "folds": []}
    with pytest.raises(RuntimeError, match="holds no point, so it has no gap"):
        identity_gap(fam, empty)
    # a continuation whose points all miss the range (as the narrow ranges above lost theirs)
    original = nl._with_folds_and_range_ends

    def off_range(*args, **kw):
        P, T, segment = original(*args, **kw)
        return P + np.append(np.zeros(8), 10.0), T, segment

    monkeypatch.setattr(nl, "_with_folds_and_range_ends", off_range)
    with pytest.raises(RuntimeError, match=r"found no branch .* in the y range \[0.1, 0.2"):
        critical_branches(fam, (0.1, 0.2))
    monkeypatch.setattr(nl, "critical_branches", lambda *a, **k: empty)
    out = tmp_path / "m.nc"
    res = CliRunner().invoke(main, ["manifold", "--kappa", "3", "--y-range", "0.1", "0.2",
                                    "--no-plot", "--json", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "holds no point, so it has no gap" in res.output and "Traceback" not in res.output
    assert '"gap"' not in res.output and not out.exists()


def test_a_narrow_range_prints_its_two_ends_apart(tmp_path):
    """`manifold --y-range 0.1 0.1000000000001` printed `y in [0.1, 0.1]` for the range and
    `[0.1000, 0.1000]` for its branch: two ends that differ read as one point. Each is printed
    with as many digits as it takes to tell them apart."""
    from click.testing import CliRunner

    from fastslow_sim.cli import main

    res = CliRunner().invoke(main, ["manifold", "--kappa", "3", "--y-range", "0.1",
                                    "0.1000000000001", "--no-plot",
                                    "--out", str(tmp_path / "m.nc")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "y in [0.1, 0.1000000000001]" in res.output.splitlines()[0]
    branch_lines = [ln for ln in res.output.splitlines() if ln.startswith("branch ")]
    assert branch_lines and all("y in [0.1, 0.1000000000001]," in ln for ln in branch_lines)


def test_sup_along_graph_polishes_only_peaks_within_their_own_jump_of_the_top():
    """Samples of a bump at s = 0 (top 1, between samples), a flat part of round-off wiggles
    (values near 0, each one a local maximum) and a fall to -1e54 (a jump that dwarfs them):
    the bump's peak and a bounded number of the highest wiggles are polished, however many
    wiggles, and the supremum is the bump's. The largest jump anywhere as every peak's margin
    polished each wiggle (calls grew with them)."""
    from fastslow_sim.nonlinear import _sup_along_graph

    def run(n_flat):
        rng = np.random.default_rng(0)
        s = np.concatenate([np.linspace(-20.0, -3.0, n_flat), np.linspace(-2.93, 3.07, 61),
                            [3.5, 4.0]])  # fmt: skip
        bump = np.exp(-(s**2))
        values = np.where(s < -2.95, 1e-17 * rng.standard_normal(s.size), bump)
        values[-2:] = [-1e20, -1e54]
        calls = []

        def f(v):
            calls.append(v)
            return float(np.exp(-(v**2))), float(v)

        return _sup_along_graph(None, s, values, f, -20.0, 4.0), len(calls)

    # the bump's peak, and at most WIDE_PEAKS_POLISHED (8) of the highest wiggles, each towards
    # its two neighbours in some 30 evaluations: a bound that does not grow with the wiggles
    # (the old rule: 911 calls at 50 wiggles, 7,301 at 400)
    for n_flat in (50, 400, 4000):
        sup, calls = run(n_flat)
        assert sup == pytest.approx(1.0, abs=1e-12)
        assert calls < 700, (n_flat, calls)


def test_sup_along_graph_still_polishes_a_narrow_peak_between_low_samples():
    """A narrow peak (top 1.2) whose two samples sit at 0.23 on its flanks, beside a broad one
    sampled at its top 1.0 and a fall to -1e54: its own jumps (0.23) do not reach the top, but
    it is among the highest local maxima within the largest jump, so it is polished (the
    own-jump rule alone returned 1.0)."""
    from fastslow_sim.nonlinear import _sup_along_graph

    w = 0.05 / np.sqrt(np.log(1.2 / 0.23))  # the samples at 6.4 and 6.5 read 0.23

    def g(v):
        return np.exp(-(v**2)) + 1.2 * np.exp(-(((v - 6.45) / w) ** 2))

    s = np.concatenate([np.round(np.arange(-3.0, 9.05, 0.1), 10), [9.5, 10.0]])
    values = g(s)
    values[-2:] = [-1e20, -1e54]
    assert values.max() == pytest.approx(1.0) and values[np.isclose(s, 6.4)] == pytest.approx(0.23)
    sup = _sup_along_graph(None, s, values, lambda v: (float(g(v)), float(v)), -3.0, 10.0)
    assert sup == pytest.approx(1.2, abs=1e-9)


@pytest.mark.slow  # 30-40 s (the old code: 3 minutes and more, growing faster than the range)
def test_branch_stability_costs_grow_with_the_points_not_faster():
    """kappa 0 over y in [-16, 16.5] and [-32, 32.5]: Re lambda spans -1e27 (-1e54) to -0.15,
    and the eigenvalue solves are one per point in the range plus a fixed number to polish the
    top: the bump's peak and at most WIDE_PEAKS_POLISHED (8) others, each towards two
    neighbours in some 25 solves (the old code: 1,053 for 676 points, 16,328 for 1,316 at
    [-32, 32.5], polishing round-off wiggles)."""
    from fastslow_sim import nonlinear

    real = nonlinear._fast_stability
    calls = []

    def counted(*args):
        calls.append(1)
        return real(*args)

    for y_range in ((-16.0, 16.5), (-32.0, 32.5)):
        calls.clear()
        nonlinear._fast_stability = counted
        try:
            curve = critical_branches(NonlinearBirthDeath(kappa=0.0), y_range)
        finally:
            nonlinear._fast_stability = real
        assert len(curve["y"]) > 600
        assert len(calls) <= len(curve["y"]) + 500, (y_range, len(calls), len(curve["y"]))
