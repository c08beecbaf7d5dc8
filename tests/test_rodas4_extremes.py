"""RODAS4 at the extremes (issue 13): step control as in Hairer's codes, the smallest step
relative to the current time and no floor tied to the span, on the reference stiff problems."""

import re

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.manifold import integrate_reduced
from fastslow_sim.rosenbrock import STATUS, rodas4_solve


@pytest.fixture
def one_thread():
    # tiny batched LU factorisations: a second intra-op thread only adds contention
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _robertson(z, idx=None):
    y1, y2, y3 = z.unbind(-1)
    r1, r2, r3 = 0.04 * y1, 1e4 * y2 * y3, 3e7 * y2**2
    return torch.stack([-r1 + r2, r1 - r2 - r3, r3], -1)


def _robertson_jac(z, idx=None):
    y1, y2, y3 = z.unbind(-1)
    J = torch.zeros(z.shape[0], 3, 3, dtype=z.dtype)
    J[:, 0, 0], J[:, 0, 1], J[:, 0, 2] = -0.04, 1e4 * y3, 1e4 * y2
    J[:, 1, 0], J[:, 1, 1], J[:, 1, 2] = 0.04, -1e4 * y3 - 6e7 * y2, -1e4 * y2
    J[:, 2, 1] = 6e7 * y2
    return J


def test_robertson_to_1e11_with_rodas4(one_thread):
    """ROBER, Test Set for IVP Solvers (Mazzia, Iavernaro, Magherini; Bari, release 2.4):
    y(1e11) = (0.2083340149701255e-07, 0.8333360770334713e-13, 0.9999999791665050). Before
    issue 13 rodas4 stopped at once (0 accepted, 3 rejected steps: step_underflow) because its
    smallest step was 1e-14 * t_end = 1e-3."""
    ref = np.array([0.2083340149701255e-07, 0.8333360770334713e-13, 0.9999999791665050])
    z0 = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.0, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0.0, 1e3, 1e11], dtype=torch.float64)
    z, status, stats = rodas4_solve(_robertson, _robertson_jac, z0, t, rtol=1e-7, atol=1e-20)
    assert [STATUS[int(s)] for s in status] == ["success"] * 3
    # a pure relative control (atol 1e-20) at rtol 1e-7: measured error 8.2e-9 relative
    for b in (0, 2):
        np.testing.assert_allclose(z[-1, b].numpy(), ref, rtol=1e-6, atol=0)
    # y1 + y2 + y3 is a linear invariant: a Rosenbrock method keeps it to round-off
    np.testing.assert_allclose(z.sum(-1).numpy(), 1.0, rtol=0, atol=1e-13)
    # the batch does not change a trajectory: row 0 equals the same problem solved alone
    alone, _, st1 = rodas4_solve(_robertson, _robertson_jac, z0[:1], t, rtol=1e-7, atol=1e-20)
    torch.testing.assert_close(z[:, 0], alone[:, 0], rtol=1e-12, atol=1e-24)
    assert int(stats["naccept"][0]) == int(st1["naccept"][0]) < 2000


def _van_der_pol(eps):
    def fun(z, idx=None):
        e = eps if idx is None else eps[idx]
        y1, y2 = z.unbind(-1)
        return torch.stack([y2, ((1 - y1**2) * y2 - y1) / e], -1)

    def jac(z, idx=None):
        e = eps if idx is None else eps[idx]
        y1, y2 = z.unbind(-1)
        J = torch.zeros(z.shape[0], 2, 2, dtype=z.dtype)
        J[:, 0, 1] = 1.0
        J[:, 1, 0], J[:, 1, 1] = (-2 * y1 * y2 - 1) / e, (1 - y1**2) / e
        return J

    return fun, jac


@pytest.mark.slow
def test_stiff_van_der_pol_with_rodas4(one_thread):
    """VDPOL, Test Set for IVP Solvers (reference by RADAU5 in quadruple precision): eps = 1e-6,
    y(0) = (2, 0), y(2) = (0.1706167732170483e+01, -0.8928097010247975e+00). Batched with a
    second trajectory at eps = 1e-3 (its own step sizes), checked against scipy's Radau."""
    ref = np.array([0.1706167732170483e01, -0.8928097010247975e00])
    eps = torch.tensor([1e-6, 1e-3], dtype=torch.float64)
    fun, jac = _van_der_pol(eps)
    z0 = torch.tensor([[2.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    z, status, stats = rodas4_solve(fun, jac, z0, t, rtol=1e-6, atol=1e-6)
    assert [STATUS[int(s)] for s in status] == ["success", "success"]
    # measured: 1.5e-7 and 2.6e-7 relative at rtol 1e-6
    np.testing.assert_allclose(z[-1, 0].numpy(), ref, rtol=1e-6, atol=0)
    from scipy.integrate import solve_ivp

    def f(_, y):
        return [y[1], ((1 - y[0] ** 2) * y[1] - y[0]) / 1e-3]

    sol = solve_ivp(f, (0, 2), [2.0, 0.0], method="Radau", rtol=1e-12, atol=1e-12, t_eval=[1, 2])
    np.testing.assert_allclose(z[1:, 1].numpy(), sol.y.T, rtol=1e-5, atol=1e-6)
    assert stats["naccept"][0] > stats["naccept"][1]  # the stiffer one needs more steps


@pytest.mark.parametrize("eps", [1e-9, 1e-12])
def test_rodas4_integrates_tiny_eps(eps, one_thread):
    # issue 13: eps = 1e-12 on [0, 5] failed at once (step floor 1e-12 * t_end on the first step)
    system = fs.make_system("birth-death", eps=eps)
    ds = fs.integrate(system, (0, 5), method="rodas4", rtol=1e-8, atol=1e-10, n_eval=11)
    assert ds.attrs["status"] == "success"
    assert ds.attrs["naccept"] < 1000 if "naccept" in ds.attrs else ds.attrs["nfev"] < 6000
    # after a layer of duration ~ eps log(1/eps), y follows the reduced (QSS) system to O(eps)
    red = integrate_reduced(system, ds["time"].values)
    np.testing.assert_allclose(ds["y"].values[1:, 0], red[1:, 0], rtol=0, atol=1e-7)
    assert np.all(np.isfinite(ds["x"].values)) and np.all(np.isfinite(ds["p_st"].values))


def test_long_span_far_from_t_0():
    # a smallest step relative to t, not to the span: dy/dt = -y on [1e12, 1e12 + 10]
    def fun(z, idx=None):
        return -z

    t = torch.tensor([1e12, 1e12 + 10.0], dtype=torch.float64)
    z, status, stats = rodas4_solve(fun, None, torch.ones(1, 1, dtype=torch.float64), t, rtol=1e-8)
    assert STATUS[int(status[0])] == "success"
    # each t + h rounds to the grid of t (ulp 1.2e-4 at 1e12), so the elapsed time is 10 to
    # within half an ulp per step; the solution is exp(-elapsed) to the solver's 1e-6
    slack = int(stats["naccept"][0]) * np.spacing(1e12) / 2
    assert abs(np.log(z[-1, 0, 0].item()) + 10.0) <= slack + 1e-6


@pytest.mark.parametrize("y0", [100.0, 170.0])
@pytest.mark.parametrize(
    "method, options",
    [("auto", {}), ("rodas4", {"march": "compiled"}), ("rodas4", {"march": "torch"}),
     ("bdf", {}), ("lsoda", {}), ("radau", {})],
)  # fmt: skip
def test_rates_near_the_float_range(method, options, y0, one_thread):
    """The birth-death chain's domain reaches y = 177.02, where its up rate e^{4(y - 1/2)}
    (times n (|beta| + 1)) meets float64's largest number. Before, y0 = 100 (rates 1e173) gave
    status non_finite and NaN (rodas4, auto), 'ValueError: array must not contain infs or NaNs'
    (bdf), or ran for ever at t = 0 (lsoda): the first step's norm of f(z0) / atol overflowed.
    radau then ran for ever (from y0 ~ 80): scipy's Radau kept the Jacobian of t = 0, whose
    coupling (dQ/dy) x / eps of y to x is 1e174 at x0 and ~1 on the manifold, and rejected steps
    near 1e-77 without end; it now evaluates it again where it no longer gives the change of f
    over a step (see test_scipy_implicit_methods_follow_the_rates_as_they_fall)."""
    system = fs.make_system("birth-death", eps=0.125)
    ds = fs.integrate(system, (0, 1), y0=[y0], method=method, n_eval=11, **options)
    assert ds.attrs["status"] == "success", ds.attrs["message"]
    x, y = ds["x"].values, ds["y"].values[:, 0]
    # x stays on the simplex (to the absolute tolerance 1e-10)
    assert np.all(x >= -1e-10) and np.max(np.abs(x.sum(-1) - 1)) < 1e-10
    # after a layer of ~1e-174, x = p_st(y) = h0(y): at y >= 37 all but e^{-4 (y - 1/2)} < 1e-64
    # of the mass is in the top state, so h1 ~ dh0/dy is as small, and y follows the reduced
    # system dy/dt = c.h0(y) - y = 1 - y to the solver's global error, which is what it is at
    # y0 = 30, where every method worked before (relative, at rtol 1e-8: bdf 4.4e-8, lsoda
    # 2.3e-8, rodas4 8.3e-9, auto 8e-11, radau 2.6e-9)
    np.testing.assert_allclose(ds["manifold_distance"].values[1:], 0.0, atol=1e-10)
    red = integrate_reduced(system, ds["time"].values, [y0])[:, 0]  # DOP853 at rtol 1e-11
    np.testing.assert_allclose(red, 1.0 + (y0 - 1.0) * np.exp(-ds["time"].values), rtol=1e-10)
    np.testing.assert_allclose(y, red, rtol=1e-7, atol=0)


@pytest.mark.parametrize(
    "method, y0",
    [("radau", 172.0), ("radau", 175.0), ("bdf", 172.0), ("bdf", 175.0), ("bdf", 177.02),
     ("lsoda", 175.0), ("lsoda", 177.02)],
)  # fmt: skip
def test_scipy_methods_start_where_f_over_atol_is_beyond_float64(method, y0):
    """From y0 = 172 to the domain's edge 177.02 the rates reach 1e298-1e308, and |f(z0)| / atol
    (atol 1e-10) is beyond float64 itself: the starting step's 0.01 |z0| / |f(z0)| was 0, and
    radau and bdf ended with 'ValueError: array must not contain infs or NaNs' (scipy's), lsoda
    spent its 200,000 steps at t = 0. The starting step is now computed in logarithms, and y
    follows 1 + (y0 - 1) e^{-t} (the manifold is the top state, see
    test_rates_near_the_float_range) to the solvers' global error at rtol 1e-8 (measured: radau
    1.8e-11, bdf 1.1e-8, lsoda 3.5e-8)."""
    system = fs.make_system("birth-death", eps=0.125)
    ds = fs.integrate(system, (0, 1), y0=[y0], method=method, n_eval=11)
    assert ds.attrs["status"] == "success", ds.attrs["message"]
    t, x = ds["time"].values, ds["x"].values
    assert np.all(x >= -1e-10) and np.max(np.abs(x.sum(-1) - 1)) < 1e-10
    np.testing.assert_allclose(ds["manifold_distance"].values[1:], 0.0, atol=1e-10)
    np.testing.assert_allclose(ds["y"].values[:, 0], 1.0 + (y0 - 1.0) * np.exp(-t), rtol=1e-7)


@pytest.mark.parametrize("y0", [176.0, 177.02])
def test_radau_says_what_overflowed_near_the_edge_of_the_float_range(y0):
    """From y0 = 176 radau's steps must be near 1e-308 (|z| atol / |f|), and its Newton
    iteration, which multiplies by 1/h, overflows: a failed status whose message says so, not
    scipy's 'ValueError: array must not contain infs or NaNs' as status error."""
    system = fs.make_system("birth-death", eps=0.125)
    ds = fs.integrate(system, (0, 1), y0=[y0], method="radau", n_eval=11)
    assert ds.attrs["status"] == "failed"
    assert ds.attrs["message"].startswith(
        "radau stopped at t = 0: its Newton iteration overflowed float64 (largest 1.8e308) with "
        "steps h near "
    )
    assert ds.attrs["message"].endswith("the rates are too close to the float range for this "
                                        "method.")  # fmt: skip
    assert np.isnan(ds["y"].values[1:]).all()


def test_a_scipy_method_that_fails_before_its_first_output_is_a_status():
    # DOP853 at y0 = 100 (a stable step of 1e-174; integrate refuses it) stops before any
    # output time: scipy's sol.y is then an empty list, and reading sol.y.T raised AttributeError
    from fastslow_sim.solvers import METHODS

    system = fs.make_system("birth-death", eps=0.125)
    z0 = np.concatenate([system.x0, [100.0]])[None]
    sol = METHODS["dop853"].solve(system, z0, np.linspace(0, 1, 3), 1e-8, 1e-10)
    assert sol.status == ["failed"] and "step size" in sol.message[0]
    assert np.isnan(sol.z).all()


@pytest.mark.parametrize("method", ["radau", "bdf", "lsoda", "rk45", "dop853"])
def test_scipy_methods_stop_at_their_budget_of_steps(method):
    """Every scipy method takes `max_steps` (as rodas4 and torchdiffeq do): a solve that spends
    it ends with the status max_steps, the message naming the budget and how to raise it, NaN
    states after it, and the other trajectories of the batch unaffected."""
    system = fs.make_system("two-state", eps=0.5)  # not stiff: every method, 10 to 100 steps
    full = fs.integrate(system, (0, 1), method=method, n_eval=5)
    assert full.attrs["status"] == "success"
    ds = fs.integrate(system, (0, 1), method=method, n_eval=5, max_steps=3)
    assert ds.attrs["status"] == "max_steps"
    assert ds.attrs["message"].startswith(f"{method} stopped after max_steps = 3 steps at t = ")
    assert "max_steps=N in Python" in ds.attrs["message"]
    assert np.isnan(ds["y"].values[-1]).all()
    with pytest.raises(fs.InputError, match=r"max_steps must be a positive integer; got 0\."):
        fs.integrate(system, (0, 1), method=method, max_steps=0)


@pytest.mark.parametrize("y0", [30.0, 100.0])
@pytest.mark.parametrize("method", ["radau", "bdf"])
def test_scipy_implicit_methods_follow_the_rates_as_they_fall(method, y0):
    """As y decays from y0 the chain's rates fall from e^{4 y0} to ~1e3; scipy kept the Jacobian
    of the start, far too large, and its Newton iteration and error test passed without solving
    the stage equations: x stayed in the top state, at t = 5 bdf from y0 = 30 was off by 0.06 in
    x and 3.5e-3 in y, radau by 4e-3 and 7e-5 (at y0 = 100, 0.019 and 2e-4, at rtol 1e-10 too).
    With a fresh Jacobian where the one in use misses the change of f over a step, both agree
    with rodas4 at rtol 1e-11 to their own global error at rtol 1e-8 (measured: radau 3.4e-9,
    bdf 2.7e-7 in y; x 1e-10, 1.3e-8), as with one after every accepted step."""
    system = fs.make_system("birth-death", eps=0.125)
    ref = fs.integrate(system, (0, 5), y0=[y0], method="rodas4", n_eval=11, rtol=1e-11,
                       atol=1e-13)  # fmt: skip
    ds = fs.integrate(system, (0, 5), y0=[y0], method=method, n_eval=11)
    assert ds.attrs["status"] == "success" and ref.attrs["status"] == "success"
    np.testing.assert_allclose(ds["y"].values, ref["y"].values, rtol=1e-6, atol=0)
    np.testing.assert_allclose(ds["x"].values, ref["x"].values, rtol=0, atol=1e-7)


def test_a_stale_jacobian_is_one_that_misses_the_change_of_f():
    """The test after an accepted step: the Jacobian in use must give the change of f over it,
    |df - J dz| <= (|df| + |J dz|) / 2 in the error weights. On f(z) = A z, df = A dz exactly:
    A itself passes, and so does A changed by 20% (the Jacobian of a smooth change over a step);
    A times 1e3 (the chain's rates fell by e^4 per unit of y) or over 1e3 misses df by about
    its own size and is stale, as is one whose product overflows."""
    from fastslow_sim.solvers.scipy_ivp import _stale_jacobian

    rng = np.random.default_rng(0)
    A = -np.diag([1e3, 10.0, 1.0]) + rng.uniform(-0.5, 0.5, (3, 3))
    z_old = np.array([1.0, 0.5, 2.0])
    dz = 1e-3 * rng.uniform(-1, 1, 3)
    df = A @ dz
    args = (z_old, z_old + dz, 1e-8, 1e-10)
    assert not _stale_jacobian(A, dz, df, *args)
    assert not _stale_jacobian(1.2 * A, dz, df, *args)
    assert _stale_jacobian(1e3 * A, dz, df, *args) and _stale_jacobian(A / 1e3, dz, df, *args)
    assert _stale_jacobian(1e300 * A, 1e10 * dz, df, *args)


def _count_accepted_steps(monkeypatch) -> list:
    """`[n]`: the scipy methods' accepted steps, counted from here on."""
    from fastslow_sim.solvers import scipy_ivp

    steps, budgeted = [0], scipy_ivp._budgeted

    def counting(*args, **kwargs):
        solver, spent = budgeted(*args, **kwargs)

        class Counted(solver):
            def _step_impl(self):
                success, message = super()._step_impl()
                steps[0] += success
                return success, message

        return Counted, spent

    monkeypatch.setattr(scipy_ivp, "_budgeted", counting)
    return steps


@pytest.mark.parametrize("method", ["radau"])
def test_scipy_implicit_methods_keep_a_jacobian_that_still_holds(method, monkeypatch):
    """The Jacobian after every accepted step (the fix of the test above) made radau factorise
    at every step: 3-5 times the cost at --states 1024. A Jacobian is now evaluated when scipy
    factorises again anyway (step size changed), or where the one in use is stale, or 10 steps
    old. On the default chain radau takes one Jacobian and one factorisation per accepted step
    at most a third of the time (one a step before) and the same y(10) to the tolerance. (BDF
    keeps a Jacobian a step: see the next test.)"""
    steps = _count_accepted_steps(monkeypatch)
    system = fs.make_system("birth-death", eps=0.125, states=32)
    ds = fs.integrate(system, (0, 10), method=method, n_eval=11)
    ref = fs.integrate(system, (0, 10), method="rodas4", n_eval=11, rtol=1e-11, atol=1e-13)
    assert ds.attrs["status"] == "success" and steps[0] > 100
    factorisations = ds.attrs["nlu"] / (2 if method == "radau" else 1)  # radau: real, complex
    assert ds.attrs["njev"] <= steps[0] / 3 and factorisations <= steps[0] / 3
    # y(10) ~ 1e-3: the global error of rtol 1e-8 over ~400 steps, as with a Jacobian per step
    np.testing.assert_allclose(ds["y"].values, ref["y"].values, rtol=1e-5, atol=0)


@pytest.mark.parametrize("t_end", [5.0, pytest.param(20.0, marks=pytest.mark.slow)])  # 1.5 s, 10 s
def test_bdf_keeps_a_jacobian_a_step_where_the_stale_test_costs_more(monkeypatch, t_end):
    """With radau's stale-Jacobian rule, bdf took 38,117 evaluations of f (6,424 Jacobians,
    12,971 LU, 3.8 s) on the random chain of 64 states, eps 1e-6, over [0, 20]; with a Jacobian
    after every accepted step 1,874 (549 Jacobians). So bdf keeps a Jacobian a step: asserted
    as that rule, not as a count of f, which depends on the BLAS kernel's rounding here (one
    machine, the same wheel, OPENBLAS_CORETYPE: Haswell 1,394, SkylakeX 11,927, Sandybridge
    791). y(20) agrees with rodas4 either way. Over [0, 5] (318 Jacobians) the rule is the same;
    the reference there at rtol 1e-9 is within 8e-10 of rtol 1e-11's."""
    steps = _count_accepted_steps(monkeypatch)
    system = fs.make_system("random", eps=1e-6, states=64)
    ds = fs.integrate(system, (0, t_end), method="bdf", n_eval=3)
    tol = {"rtol": 1e-11, "atol": 1e-13} if t_end == 20 else {"rtol": 1e-9, "atol": 1e-11}
    ref = fs.integrate(system, (0, t_end), method="rodas4", n_eval=3, **tol)
    assert ds.attrs["status"] == "success" and steps[0] > 100
    assert ds.attrs["njev"] >= steps[0], (ds.attrs["njev"], steps[0])
    np.testing.assert_allclose(ds["y"].values, ref["y"].values, rtol=1e-6, atol=0)


def test_radau_keeps_the_mass_at_tiny_eps_far_from_the_manifold():
    """A Jacobian kept up to 50 accepted steps lost mass to 3.5e-6 at rtol 1e-8 (reported as
    success) on the default chain at eps 1e-10 from y0 = 60 over [0, 20]; at most 10 steps
    old, 1.1e-9 (2.9e-9 with one a step); y(20) within 1e-7 of rodas4's (3.4e-6 off before)."""
    system = fs.make_system("birth-death", eps=1e-10)
    y0 = np.array([60.0])
    ds = fs.integrate(system, (0, 20), y0=y0, method="radau", n_eval=5)
    ref = fs.integrate(system, (0, 20), y0=y0, method="rodas4", n_eval=5, rtol=1e-11,
                       atol=1e-13)  # fmt: skip
    assert ds.attrs["status"] == "success"
    assert np.max(np.abs(ds["x"].values.sum(-1) - 1)) < 1e-7
    np.testing.assert_allclose(ds["y"].values[-1], ref["y"].values[-1], rtol=1e-7, atol=0)


def test_a_first_guess_below_float64_starts_from_the_smallest_step(one_thread):
    """Rates of 1e173 (y0 = 100) over atol 1e-300: Hairer's first guess 0.01 |z0| / |f(z0)| is
    ~1e-470, computed as 0; a first step of 0 gave NaN and the status non_finite. The guess is
    now at least ten times the smallest step the march takes (ten ulps of t0, and float64's
    smallest normal number at t0 = 0), and from it the march succeeds: y = 1 + (y0 - 1) e^{-t}
    (the manifold is the top state for y >= 37, see test_rates_near_the_float_range). Through
    integrate at atol 1e-150 (rodas4 accepts any positive atol now): |f(z0)| / atol = 1e324
    overflows, and the guess is 0 there too."""
    from fastslow_sim.rosenbrock import StepControl

    control = StepControl()
    info = torch.finfo(torch.float64)
    z0 = torch.tensor([[1.0, 0.0, 100.0]], dtype=torch.float64)
    f0 = torch.tensor([[-1e174, 1e174, -99.0]], dtype=torch.float64)
    h = control.initial_step(f0, z0, 1e-8, 1e-300, 0.0, 1.0)
    assert h.item() == 10 * info.tiny and not control.too_small(h, torch.zeros(1)).any()
    assert control.initial_step(f0, z0, 1e-8, 1e-300, 1e3, 1.0).item() == 10 * (
        10 * info.eps * 1e3 + info.tiny
    )

    system = fs.make_system("birth-death", eps=0.125)
    ds = fs.integrate(system, (0, 1), y0=[100.0], method="rodas4", atol=1e-150, n_eval=11,
                      march="compiled")  # fmt: skip
    assert ds.attrs["status"] == "success", ds.attrs["message"]
    t, y = ds["time"].values, ds["y"].values[:, 0]
    # measured 4.8e-14: rtol 1e-8 over a global error of a few rtol
    np.testing.assert_allclose(y, 1.0 + 99.0 * np.exp(-t), rtol=1e-7, atol=0)
    assert np.max(np.abs(ds["x"].values.sum(-1) - 1)) < 1e-12


def test_a_rodas4_failure_says_why(monkeypatch):
    """The march's statuses were reported as 'rodas4 stopped: step_underflow' and the like; the
    message now says what each means and what to change."""
    from fastslow_sim.rosenbrock import compiled

    real = compiled.march_chain
    system = fs.make_system("birth-death", eps=0.125)
    for name, starts, says in [
        ("step_underflow", "rodas4 stopped: step_underflow at t = 1 (",
         "its step fell below ten float64 spacings of t"),
        ("max_steps", "rodas4 stopped after max_steps = 1,000,000 steps at t = 1,",
         "raise it with --max-steps N"),
        ("non_finite", "rodas4 stopped: non_finite at t = 1 (",
         "the solution or its error estimate became non-finite"),
    ]:  # fmt: skip

        def failing(*args, name=name, **kwargs):
            z, status, stats = real(*args, **kwargs)
            z[z.shape[0] // 2 :] = float("nan")
            return z, torch.full_like(status, STATUS.index(name)), stats

        monkeypatch.setattr(compiled, "march_chain", failing)
        ds = fs.integrate(system, (0, 1), method="rodas4", n_eval=5)
        assert ds.attrs["status"] == name
        assert ds.attrs["message"].startswith(starts)  # the real march reached t = 1
        assert says in ds.attrs["message"]


def test_a_rodas4_march_that_stops_says_where():
    """rodas4's max_steps message did not say how far a trajectory got (radau's does): both
    marches now return the t each trajectory reached, the same in both, and the message says
    it. At eps 1e-3 fifty steps of the default tolerances end near t = 1.1e-4."""
    system = fs.make_system("birth-death", eps=1e-3)
    x0, y0 = fs.random_initial_conditions(system, 3, 0)
    runs = {m: fs.integrate(system, (0, 5), x0, y0, method="rodas4", max_steps=50, n_eval=3,
                            march=m) for m in ("compiled", "torch")}  # fmt: skip
    messages = list(runs["compiled"]["message"].values)
    t = [float(re.search(r"steps at t = (\S+), the budget", m).group(1)) for m in messages]
    assert all(m.startswith("rodas4 stopped after max_steps = 50 steps at t = ") for m in messages)
    assert all(0 < v < 5e-3 for v in t), t  # the stiff transient: far from t_end = 5
    assert list(runs["torch"]["message"].values) == messages  # the t reached, to 6 digits


def test_radau_overflow_message_bounds_1_over_h_where_h_is_subnormal():
    """From y0 = 170 at eps 1e-12 radau's step is subnormal (4.97e-309), so 1/h itself overflows:
    the message said '1/h = inf'; it now gives a true bound, and every number in it is finite."""
    system = fs.make_system("birth-death", eps=1e-12)
    ds = fs.integrate(system, (0, 5), y0=[170.0], method="radau", n_eval=3)
    message = ds.attrs["message"]
    assert ds.attrs["status"] == "failed", message
    h = float(re.search(r"steps h near (\S+) \(", message).group(1))
    assert 0 < h < 1 / np.finfo(np.float64).max  # 1/h is beyond float64 here
    assert "(1/h above 1.8e308)" in message, message
    assert not re.search(r"\binf\b|\bnan\b", message), message


def test_compiled_rodas4_keeps_the_mass_where_the_rates_are_near_1e272():
    """On the birth-death chain at eps 1e-12 from y0 = 150 (stiffness index 2.55e272) the
    compiled march's one-sided elimination of s I - J lost mass at every solve (up to 1.5e-8 at
    y = 13, h = 1e-3; an LU solve 1e-14): rodas4 reported success with max |1^T x - 1| = 2.2e-6
    and |x - p_st(y)|_1 = 1.2e-6 at rtol 1e-8 (15,960 right-hand sides). Solved for the partial
    sums of the chain's unknowns, the sum of a stage is the right-hand side's over s up to
    the round-off of its entries (measured: 2.6e-10 and 9.1e-11, 5,688 right-hand sides; 4.3e-10
    before the terms in T entered divided by their pivots)."""
    system = fs.make_system("birth-death", eps=1e-12)
    ds = fs.integrate(system, (0, 5), y0=[150.0], method="rodas4", n_eval=21, march="compiled")
    assert ds.attrs["status"] == "success", ds.attrs["message"]
    assert np.max(np.abs(ds["mass_error"].values)) < 1e-8  # rtol: the mass is 1
    assert ds["manifold_distance"].values[-1] < 1e-8


@pytest.mark.parametrize("linear_solver", ["auto", "arrow-torch"])
def test_torch_rodas4_keeps_the_mass_where_the_rates_are_near_1e272(linear_solver):
    """The same run on the torch march (its solve `linalg.ArrowTridiagonal.shifted_solver`, by
    the numba kernels, or by torch operations as on CUDA): the elimination down the chain (numba
    kernels) reported success with max |1^T x - 1| = 1.6e-5 and |x - p_st(y)|_1 = 1.1e-5 at t =
    5 (15,006 right-hand sides), from both ends in torch operations with 6.0e-8. The system's
    Jacobian now carries the chain's state, and the solve runs in the partial sums of the
    compiled march (`cpu_kernels.chain_solve`): measured 5.5e-10 and 5.5e-10 (5,688 right-hand
    sides, as the compiled march; 6.4e-10 at 401 output times), 9.6e-10 and 9.6e-10 in torch
    operations, against rtol 1e-8 (the mass is 1)."""
    system = fs.make_system("birth-death", eps=1e-12)
    ds = fs.integrate(system, (0, 5), y0=[150.0], method="rodas4", n_eval=21, march="torch",
                      linear_solver=linear_solver)  # fmt: skip
    assert ds.attrs["status"] == "success", ds.attrs["message"]
    assert np.max(np.abs(ds["mass_error"].values)) < 1e-8
    assert ds["manifold_distance"].values[-1] < 1e-8
