"""The compiled RODAS4 march (`rosenbrock.compiled`) against the torch march: one implementation
of the numerics, so the same solution (to 1e-10: the two differ only in the rounding of sums),
the same statuses and the same statistics, trajectory by trajectory."""

import dataclasses
import math

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.cpu_kernels import chain_solve
from fastslow_sim.errors import InputError
from fastslow_sim.generators import BirthDeath
from fastslow_sim.rosenbrock import RODAS4, STATUS, StepControl, solve

compiled = pytest.importorskip("fastslow_sim.rosenbrock.compiled", reason="numba does not import")

STAT_KEYS = ("nfev", "njev", "nlu", "nsolve", "naccept", "nreject")


def _both(system, z0, t, eps=None, **kw):
    """The torch march and the compiled one on the same problem."""
    z0 = torch.as_tensor(z0, dtype=torch.float64)
    t = torch.as_tensor(t, dtype=torch.float64)
    e = None if eps is None else torch.as_tensor(eps, dtype=torch.float64)
    torch_run = solve(system.torch_functions(torch.float64, "cpu", e), z0, t, **kw)
    compiled_run = compiled.march_chain(system.chain_arrays(), z0, t, eps=eps, **kw)
    return torch_run, compiled_run


def _assert_same(torch_run, compiled_run, tol=1e-10):
    (zt, st, stt), (zc, sc, stc) = torch_run, compiled_run
    assert [STATUS[int(s)] for s in st] == [STATUS[int(s)] for s in sc]
    for key in STAT_KEYS:
        assert torch.equal(stt[key], stc[key]), key
    assert stt["iterations"] == stc["iterations"]
    assert torch.equal(torch.isnan(zt), torch.isnan(zc))  # NaN after a failure in both
    ok = ~torch.isnan(zt)
    assert float((zt[ok] - zc[ok]).abs().max()) <= tol


def _z0(system, B, seed=0):
    return np.concatenate(fs.random_initial_conditions(system, B, seed), axis=1)


CASES = [("birth-death", 4), ("birth-death", 16), ("two-state", None), ("michaelis-menten", 6)]


@pytest.mark.parametrize("name,states", CASES)
@pytest.mark.parametrize("eps", [1e-2, 1e-4])
@pytest.mark.parametrize("dense_output", [True, False])
def test_compiled_march_matches_torch(name, states, eps, dense_output):
    system = fs.make_system(name, eps=eps, states=states)
    B = 13 if eps == 1e-2 else 37  # not multiples of the lane count
    t = [0.0, 0.003, 0.4, 1.0, 2.0]
    runs = _both(system, _z0(system, B, seed=3), t, rtol=1e-6, atol=1e-9,
                 dense_output=dense_output)  # fmt: skip
    _assert_same(*runs)
    assert (runs[1][1] == 0).all()
    # trajectories of different lengths: the lanes took new trajectories at different steps
    steps = runs[1][2]["naccept"] + runs[1][2]["nreject"]
    assert len(set(steps.tolist())) > 3


@pytest.mark.parametrize("B", [1, 8, 100])
def test_batch_sizes_and_one_eps_per_trajectory(B):
    system = fs.make_system("birth-death", eps=1e-3, states=8)
    eps = np.geomspace(1e-5, 1e-2, B)
    runs = _both(system, _z0(system, B, seed=1), [0.0, 0.5, 1.5], eps=eps, rtol=1e-7, atol=1e-10)
    _assert_same(*runs)


def test_statuses_max_steps_step_underflow_and_non_finite():
    system = fs.make_system("birth-death", eps=1e-3, states=5)
    z0 = _z0(system, 3, seed=2)
    _assert_same(*_both(system, z0, [0.0, 5.0], rtol=1e-10, atol=1e-12, max_steps=7))
    # an error that can never be met (atol 1e-100) shrinks the step 10-fold per step until it is
    # below ten ulps of t = 1: step_underflow, the error finite
    runs = _both(system, z0, [1.0, 2.0], rtol=1e-100, atol=1e-100)
    _assert_same(*runs)
    assert {STATUS[int(s)] for s in runs[1][1]} == {"step_underflow"}
    # y0 = 200: e^{4 y} overflows, the error is NaN at every step: non_finite, beside a good one
    z0[1, -1] = 200.0
    runs = _both(system, z0, [0.0, 1.0], rtol=1e-6, atol=1e-9)
    _assert_same(*runs)
    assert [STATUS[int(s)] for s in runs[1][1]] == ["success", "non_finite", "success"]


@pytest.mark.parametrize("y0", [100.0, 170.0])
def test_rates_near_the_float_range_take_the_same_path(y0):
    # y0 inside the birth-death domain (y <= 177.02): up rates e^{4(y - 1/2)} of 1e173 and 1e294
    # over eps. Before, the first step's norm |f(z0)| / atol overflowed, the step was 0 and both
    # marches stopped at once: non_finite, NaN (the error norm squared such entries too)
    system = fs.make_system("birth-death", eps=0.125)
    z0 = np.concatenate([system.x0, [y0]])[None].repeat(2, 0)
    z0[1, :-1] = 1.0 / system.n_fast  # a uniform start beside the default (all in state 0)
    runs = _both(system, z0, [0.0, 0.5, 1.0], rtol=1e-8, atol=1e-10)
    _assert_same(*runs, tol=1e-10 * y0)
    assert [STATUS[int(s)] for s in runs[1][1]] == ["success"] * 2
    # after a layer of about 1e-174, x = p_st(y) ~ e_7 and dy/dt = c.x - y = 1 - y
    want = 1.0 + (y0 - 1.0) * np.exp(-np.array([0.5, 1.0]))
    np.testing.assert_allclose(runs[1][0][1:, :, -1].numpy(), want[:, None].repeat(2, 1),
                               rtol=1e-8)  # fmt: skip


def test_another_tableau_and_control_take_the_same_path():
    # a perturbed RODAS4 that is neither stiffly accurate nor has a plain error estimate: the
    # general sums over M and E; and other control constants: both marches read them
    M = list(RODAS4.M)
    M[0] += 1e-3
    tab = dataclasses.replace(RODAS4, name="variant", M=tuple(M), E=(0, 0, 0, 0, 0.5, 0.5))
    assert not tab.stiffly_accurate and not tab.plain_error
    control = StepControl(safety=0.8, fac_min=0.2, fac_max=4.0, err_floor=1e-8)
    system = fs.make_system("michaelis-menten", eps=1e-3, states=4)
    runs = _both(system, _z0(system, 20), [0.0, 0.7, 2.0], rtol=1e-6, atol=1e-9, tableau=tab,
                 control=control)  # fmt: skip
    _assert_same(*runs)
    plain = compiled.march_chain(system.chain_arrays(), _z0(system, 20), torch.tensor([0.0, 2.0]))
    assert not torch.equal(plain[2]["naccept"], runs[1][2]["naccept"])  # the options mattered


@pytest.mark.parametrize("name,states", CASES)
def test_chain_arrays_give_the_systems_right_hand_side(name, states):
    # the numbers describe the same physics as the numpy form (independent of torch)
    system = fs.make_system(name, eps=1e-3, states=states)
    z0 = _z0(system, 11, seed=5)
    ch = system.chain_arrays()
    f = np.empty_like(z0)
    keys = ("k", "beta", "l", "down", "w", "c", "b", "a", "kappa")
    compiled._rhs_all(z0, np.array([ch["inv_eps"]]), *(np.asarray(ch[k], dtype=np.float64)
                      if np.ndim(ch[k]) else float(ch[k]) for k in keys), f)  # fmt: skip
    np.testing.assert_allclose(f, system.rhs(0.0, z0), rtol=1e-12, atol=1e-9)


def test_systems_without_chain_arrays_stay_on_the_torch_path():
    from fastslow_sim.solvers.rosenbrock import choose_march

    for name in ("cycle", "random"):
        system = fs.make_system(name, eps=1e-3)
        assert system.chain_arrays() is None
        assert choose_march(system, "auto", "cpu", "auto") == "torch"
        with pytest.raises(InputError, match="compiled march needs"):
            choose_march(system, "compiled", "cpu", "auto")

    class Steeper(BirthDeath):  # new rates without new constants: not compiled
        def chain_rates(self, *args, **kwargs):
            return super().chain_rates(*args, **kwargs)

    from fastslow_sim.systems import LinearSlowLaw, MasterEquationSystem

    system = MasterEquationSystem(Steeper(n=4), LinearSlowLaw(np.linspace(0, 1, 4)), 1e-3)
    assert system.chain_arrays() is None
    chain = fs.make_system("birth-death", eps=1e-3)
    assert choose_march(chain, "auto", "cpu", "auto") == "compiled"
    assert choose_march(chain, "auto", "cpu", "dense") == "torch"
    with pytest.raises(InputError, match="unknown march"):
        choose_march(chain, "fast", "cpu", "auto")


def test_integrate_with_either_march():
    system = fs.make_system("birth-death", eps=1e-4, states=6)
    x0, y0 = fs.random_initial_conditions(system, 16, 4)
    kw = {"method": "rodas4", "rtol": 1e-6, "atol": 1e-9, "n_eval": 5}
    a = fs.integrate(system, (0.0, 3.0), x0, y0, march="torch", **kw)
    b = fs.integrate(system, (0.0, 3.0), x0, y0, march="compiled", **kw)
    c = fs.integrate(system, (0.0, 3.0), x0, y0, **kw)
    assert a.attrs["march"] == "torch" and b.attrs["march"] == c.attrs["march"] == "compiled"
    assert float(abs(a.x - b.x).max()) <= 1e-10 and float(abs(a.y - b.y).max()) <= 1e-10
    with pytest.raises(InputError, match="compiled march"):
        fs.integrate(system, (0.0, 1.0), x0, y0, march="compiled", linear_solver="dense", **kw)


def test_compiled_march_bad_input():
    system = fs.make_system("birth-death", eps=1e-3, states=4)
    ch = system.chain_arrays()
    with pytest.raises(InputError, match="components"):
        compiled.march_chain(ch, torch.zeros(2, 9), torch.tensor([0.0, 1.0]))
    with pytest.raises(InputError, match="t_eval"):
        compiled.march_chain(ch, torch.zeros(2, 5), torch.tensor([1.0, 0.0]))
    with pytest.raises(InputError, match="eps"):
        compiled.march_chain(ch, torch.zeros(2, 5), torch.tensor([0.0, 1.0]), eps=[1e-3] * 3)
    with pytest.raises(InputError, match="lack"):
        compiled.march_chain({"k": ch["k"]}, torch.zeros(2, 5), torch.tensor([0.0, 1.0]))


def test_lanes_are_independent():
    # a trajectory's arithmetic does not depend on its lane neighbours or on the lane count:
    # bit for bit the same with 1, 5 and 32 lanes
    system = fs.make_system("birth-death", eps=1e-3, states=6)
    z0, t = _z0(system, 23, seed=8), torch.tensor([0.0, 0.2, 1.0])
    runs = [compiled.march_chain(system.chain_arrays(), z0, t, lanes=L) for L in (1, 5, 32)]
    for z, status, stats in runs[1:]:
        assert torch.equal(z, runs[0][0]) and torch.equal(status, runs[0][1])
        assert torch.equal(stats["naccept"], runs[0][2]["naccept"])


def test_rodas3_runs_compiled_from_its_table_alone():
    # a new tableau needs no new code: RODAS3 (4 stages, no continuous extension) from its table
    from fastslow_sim.rosenbrock import RODAS3

    system = fs.make_system("two-state", eps=1e-3)
    runs = _both(system, _z0(system, 17), [0.0, 0.5, 1.0], rtol=1e-6, atol=1e-9, tableau=RODAS3,
                 dense_output=False)  # fmt: skip
    _assert_same(*runs)
    with pytest.raises(InputError, match="continuous extension"):
        compiled.march_chain(system.chain_arrays(), _z0(system, 2), torch.tensor([0.0, 1.0]),
                             tableau=RODAS3)  # fmt: skip
    x0, y0 = fs.random_initial_conditions(system, 8, 1)
    kw = {"method": "rodas3", "rtol": 1e-6, "atol": 1e-9, "n_eval": 3}
    a = fs.integrate(system, (0.0, 1.0), x0, y0, march="torch", **kw)
    b = fs.integrate(system, (0.0, 1.0), x0, y0, **kw)
    assert b.attrs["march"] == "compiled" and float(abs(a.x - b.x).max()) <= 1e-10


def _compiled_solve(system, z, s, r):
    """`(s I - J(z))^{-1} r` by the compiled march's `_factor` and `cpu_kernels.chain_solve` (one lane)."""
    ch = system.chain_arrays()
    n = len(z) - 1
    m1 = max(n - 1, 1)
    arr = {k: np.asarray(ch[k], dtype=np.float64) for k in ("k", "l", "down", "w", "c")}
    kr, lr, dr = (arr[k][:, None] * ch["inv_eps"] for k in ("k", "l", "down"))
    up, dup, tmp = np.zeros((m1, 1)), np.zeros((m1, 1)), np.zeros((4, 1))
    inv, pm, g, wv, vv = (np.zeros((n, 1)) for _ in range(5))
    inv_sigma, piv = np.zeros(1), np.zeros(1, dtype=np.int64)
    compiled._factor(np.array(z, dtype=np.float64)[:, None], n, np.array([s]), kr,
                     float(ch["beta"]), lr, dr, arr["w"], arr["c"], float(ch["a"]),
                     float(ch["kappa"]), up, dup, tmp, inv, pm, g, wv, vv, inv_sigma,
                     piv)  # fmt: skip
    x = np.array(r, dtype=np.float64)[:, None].copy()
    chain_solve(n, inv, pm, g, wv, vv, inv_sigma, piv, tmp, x)
    return x[:, 0]


@pytest.mark.parametrize("name, eps, y, heavy", [
    ("birth-death", 1e-12, 117.0, None), ("birth-death", 1e-12, 13.0, None),
    ("birth-death", 1e-12, 2.0, None), ("birth-death", 1e-3, -3.0, None),
    ("birth-death", 1e-3, 0.5, 3), ("michaelis-menten", 1e-6, 0.7, None),
])  # fmt: skip
def test_compiled_solve_keeps_the_mass_of_each_stage(name, eps, y, heavy):
    """The chain block of J has zero column sums, so the exact solve of (s I - J) k = r has
    sum_i k_i = sum_i r_i / s over the chain's states. The one-sided elimination lost up to
    1.5e-8 of it in a solve at y = 13, h = 1e-3, eps 1e-12 (rodas4 from y0 = 150 ended with
    mass 2.2e-6 off); in the partial sums it is kept to the round-off of the entries, and the
    solve is backward stable entry by entry (mass at the top, bottom or middle of the chain; at
    y = 117 an LU solve by numpy gives k_7 = 0 for k_6 = 4.8e-207: that mass is lost)."""
    system = fs.make_system(name, eps=eps)
    n = system.n_fast
    x = system.critical_manifold(np.array([y])).reshape(-1) if heavy is None else np.eye(n)[heavy]
    z = np.concatenate([x, [y]])
    J = system.jacobian(0.0, z)
    rng = np.random.default_rng(1)
    for h in (1e-6, 1e-3):
        s = 1.0 / (0.25 * h)
        for r in (system.rhs(0.0, z), rng.standard_normal(n + 1) * 1e-3):
            k = _compiled_solve(system, z, s, r)
            A = s * np.eye(n + 1) - J
            mass = math.fsum(k[:n]) - math.fsum(r[:n]) / s
            assert abs(mass) <= 1e-14 * (np.sum(np.abs(k[:n])) + np.sum(np.abs(r[:n])) / s)
            # (an entry of k below float64's normal range is 0: its row may miss |A_ii| tiny)
            bound = np.abs(A) @ np.abs(k) + np.abs(r) + np.abs(np.diag(A)) * np.finfo(float).tiny
            assert np.max(np.abs(A @ k - r) / bound) < 1e-12, h
