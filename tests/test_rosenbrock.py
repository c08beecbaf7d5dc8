"""The batched torch RODAS4 solver and the multirate map (issue 4)."""

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.linalg import ArrowTridiagonal
from fastslow_sim.multirate import multirate_map
from fastslow_sim.rosenbrock import STATUS, VectorField, rodas4_solve, solve
from fastslow_sim.systems import LinearSlowLaw, MasterEquationSystem


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("cycle", "random")
                                  else n for n in fs.SYSTEMS])  # cycle, random: 6-8 s each
def test_rodas4_matches_scipy_at_tight_tolerance(name):
    system = fs.make_system(name, eps=1e-3)
    ref = fs.integrate(system, (0, 2), method="radau", rtol=1e-12, atol=1e-14, n_eval=21)
    ds = fs.integrate(system, (0, 2), method="rodas4", rtol=1e-9, atol=1e-12, n_eval=21)
    assert ds.attrs["status"] == "success" and ds.attrs["method"] == "rodas4"
    np.testing.assert_allclose(ds["x"].values, ref["x"].values, atol=1e-7)
    np.testing.assert_allclose(ds["y"].values, ref["y"].values, atol=1e-7)
    assert np.max(np.abs(ds["mass_error"].values)) < 1e-12


@pytest.mark.parametrize("structured", [True, False])
def test_jacobian_of_torch_functions_against_finite_differences(structured):
    kinds = set()
    for name in fs.SYSTEMS:
        system = fs.make_system(name, eps=0.01)
        fun, jac = system.torch_functions(structured=structured).batch_first()
        z = torch.tensor(np.concatenate([np.full(system.n_fast, 1 / system.n_fast), [0.7]]))[None]
        h = 1e-6
        fd = torch.stack([(fun(z + h * e) - fun(z - h * e))[0] / (2 * h)
                          for e in torch.eye(z.shape[1], dtype=torch.float64)], 1)  # fmt: skip
        J = jac(z)
        kinds.add(type(J).__name__)
        J = J.dense() if isinstance(J, ArrowTridiagonal) else J
        torch.testing.assert_close(J[0], fd, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            fun(z)[0].numpy(), system.rhs(0, z[0].numpy()), rtol=1e-12, atol=1e-12
        )
    # the neighbour chains come structured, the others dense
    assert kinds == ({"ArrowTridiagonal", "Tensor"} if structured else {"Tensor"})


# the reference solution of the batch, multirate and dense-output tests below: LSODA (Fortran,
# BDF/Adams, independent of the Rosenbrock and multirate code) at rtol 1e-13; on each of their runs
# within 5e-13 of the Radau references used before (rtol 1e-11 to 1e-12; measured), at a twentieth
# to a fiftieth of Radau's time
_REFERENCE = {"method": "lsoda", "rtol": 1e-13, "atol": 1e-15}


def test_batch_of_initial_conditions_and_of_eps():
    system = fs.make_system("birth-death", eps=1e-3)
    rng = np.random.default_rng(0)
    x0 = rng.dirichlet(np.ones(8), 5)
    y0 = rng.uniform(0, 1, (5, 1))
    ds = fs.integrate(system, (0, 1), x0, y0, rtol=1e-9, atol=1e-12, n_eval=11)
    assert ds["x"].dims == ("batch", "time", "state") and ds.sizes["batch"] == 5
    assert ds.attrs["method"] == "rodas4" and list(ds["status"].values) == ["success"] * 5
    for k in ("stat_nfev", "stat_njev", "stat_nlu", "stat_nsolve", "stat_naccept", "stat_nreject"):
        assert ds[k].dims == ("batch",) and np.all(ds[k].values >= 0)
    for b in [0, 3]:
        one = fs.integrate(system, (0, 1), x0[b], y0[b], **_REFERENCE, n_eval=11)
        np.testing.assert_allclose(ds["x"].values[b], one["x"].values, atol=1e-7)
    eps = np.array([1e-1, 1e-2, 1e-3, 1e-4, 1e-5])
    de = fs.integrate_batch(
        system, (0, 1), system.x0, system.y0, eps=eps, rtol=1e-9, atol=1e-12, n_eval=3
    )
    for b, e in enumerate(eps):
        one = fs.integrate(system.with_eps(e), (0, 1), **_REFERENCE, n_eval=3)
        np.testing.assert_allclose(de["y"].values[b], one["y"].values, atol=1e-7)
    # and a scipy method over the same batch gives the same answers
    dl = fs.integrate(
        system, (0, 1), x0[:2], y0[:2], method="lsoda", rtol=1e-10, atol=1e-12, n_eval=11
    )
    np.testing.assert_allclose(dl["x"].values, ds["x"].values[:2], atol=1e-6)


def test_a_failing_trajectory_does_not_take_the_others_down():
    def fun(z, idx):  # trajectory 1 blows up at t = 1/z0 = 0.5; the others decay
        idx = torch.arange(z.shape[0]) if idx is None else idx
        blow = (idx == 1)[:, None].to(z.dtype)
        return -z * (1 - blow) + blow * z**2

    def jac(z, idx):
        idx = torch.arange(z.shape[0]) if idx is None else idx
        d = torch.where((idx == 1)[:, None], 2 * z, -torch.ones_like(z))
        return torch.diag_embed(d)

    z0 = torch.tensor([[1.0], [2.0], [0.5]], dtype=torch.float64)
    out, status, stats = rodas4_solve(
        fun, jac, z0, torch.tensor([0.0, 1.0, 2.0]), rtol=1e-8, atol=1e-10
    )
    names = [STATUS[int(s)] for s in status]
    assert names[0] == names[2] == "success"
    assert names[1] in ("step_underflow", "non_finite", "max_steps")
    np.testing.assert_allclose(out[:, 0, 0].numpy(), np.exp(-np.array([0.0, 1.0, 2.0])), rtol=1e-7)
    np.testing.assert_allclose(
        out[:, 2, 0].numpy(), 0.5 * np.exp(-np.array([0.0, 1.0, 2.0])), rtol=1e-7
    )
    assert torch.isnan(out[-1, 1]).all()
    # the blow-up was followed with ever smaller steps until the step size underflowed
    assert stats["naccept"][1] + stats["nreject"][1] > 20 and stats["naccept"][0] > 0


@pytest.mark.parametrize("dense_output", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_batch_equals_trajectories_solved_alone(dense_output):
    # every trajectory has its own step sequence: inside a batch, where others finish at other
    # iterations, are frozen in place and later repacked away, it gets the solution and the
    # statistics it gets alone
    system = fs.make_system("birth-death", eps=1e-3)
    B = 20
    z0 = torch.tensor(np.concatenate(fs.random_initial_conditions(system, B, seed=7), axis=1))
    t = torch.tensor([0.0, 0.01, 0.3, 1.0, 2.5])
    field = system.torch_functions()
    out_b, status_b, stats_b = solve(field, z0, t, rtol=1e-7, atol=1e-10,
                                     dense_output=dense_output)  # fmt: skip
    assert (status_b == 0).all()
    steps = stats_b["naccept"] + stats_b["nreject"]
    assert len(set(steps.tolist())) > 5  # departures at many different iterations
    for b in range(0, B, 3):
        out_1, _, stats_1 = solve(field, z0[b : b + 1], t, rtol=1e-7, atol=1e-10,
                                  dense_output=dense_output)  # fmt: skip
        torch.testing.assert_close(out_b[:, b], out_1[:, 0], rtol=1e-12, atol=1e-14)
        assert int(stats_b["naccept"][b]) == int(stats_1["naccept"][0])
        assert int(stats_b["nreject"][b]) == int(stats_1["nreject"][0])


def test_max_steps_status():
    system = fs.make_system("two-state", eps=1e-3)
    field = system.torch_functions()
    z0 = torch.tensor([[1.0, 0.0, 0.9]], dtype=torch.float64)
    _, status, _ = solve(
        field, z0, torch.tensor([0.0, 5.0]), rtol=1e-10, atol=1e-12, max_steps=5
    )
    assert STATUS[int(status[0])] == "max_steps"


@pytest.mark.slow
def test_gradient_with_respect_to_generator_parameters():
    n = 6

    def final_loss(up, differentiable, rtol):
        gen = fs.BirthDeath(n=n, beta=2.0)
        gen.up = up  # a tensor parameter of the generator
        system = MasterEquationSystem(gen, LinearSlowLaw(np.arange(n) / (n - 1)), 0.05)
        field = system.torch_functions()
        z0 = torch.tensor(np.concatenate([np.eye(n)[0], [0.3]]))[None]
        out, _, _ = solve(field, z0, torch.tensor([0.0, 1.0]), rtol=rtol, atol=rtol * 1e-2,
                          differentiable=differentiable)  # fmt: skip
        zf = out[-1, 0]
        return zf[-1] + (zf[:n] * torch.arange(n, dtype=torch.float64)).sum() / n

    # the recorded solve at rtol 1e-9 (354 steps; the backward pass through them is most of the
    # test's time) and the differences at rtol 1e-11 (1,123 steps): measured 0.92431198590 and
    # 0.92431197875, 7.7e-9 apart as at rtol 1e-10 and 1e-12 (631 and 1,999 steps)
    up = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    final_loss(up, True, 1e-9).backward()
    d = 1e-4
    fd = (final_loss(torch.tensor(1.3 + d, dtype=torch.float64), False, 1e-11)
          - final_loss(torch.tensor(1.3 - d, dtype=torch.float64), False, 1e-11)) / (2 * d)  # fmt: skip
    assert abs(up.grad.item() - fd.item()) <= 1e-6 * abs(fd.item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_rodas4_on_cuda_matches_cpu():
    system = fs.make_system("birth-death", eps=1e-3)
    rng = np.random.default_rng(0)
    x0, y0 = rng.dirichlet(np.ones(8), 4), rng.uniform(0, 1, (4, 1))
    cpu = fs.integrate_batch(system, (0, 1), x0, y0, n_eval=3)
    gpu = fs.integrate_batch(system, (0, 1), x0, y0, n_eval=3, device="cuda")
    np.testing.assert_allclose(gpu["x"].values, cpu["x"].values, atol=1e-9)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"rtol": 0.0}, "rtol must be a positive"),
        ({"atol": -1.0}, "atol must be a positive"),
        ({"t_span": (1.0, 0.0)}, "run forward"),
        ({"t_span": (0.0, 0.0)}, "run forward"),
        ({"eps": [0.1, -1.0]}, "positive finite"),
    ],
)
def test_batch_bad_input(kwargs, fragment):
    system = fs.make_system("birth-death", eps=0.1)
    t_span = kwargs.pop("t_span", (0.0, 1.0))
    x0 = np.tile(system.x0, (2, 1))
    with pytest.raises(fs.InputError, match=fragment):
        fs.integrate_batch(system, t_span, x0, system.y0, **kwargs)


def _map_error(eps, H, T=2.0):
    system = fs.make_system("birth-death", eps=eps)
    run = multirate_map(system, H, int(round(T / H)), P=8)
    ref = fs.integrate(system, (0, T), **_REFERENCE, t_eval=run["t_blocks"])
    assert run["x_tokens"].shape == (int(round(T / H)) * 8 + 1, 8)  # cost: P/H tokens per unit time
    np.testing.assert_allclose(run["x_tokens"].sum(-1), 1.0, rtol=0, atol=1e-12)
    return np.max(np.abs(run["y_blocks"][:, 0] - ref["y"].values[:, 0]))


def test_multirate_error_does_not_grow_as_eps_shrinks():
    errs = np.array([_map_error(eps, 0.05) for eps in [1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6]])
    assert np.all(errs <= 1.05 * errs[0])  # never worse than at eps = 0.1
    assert errs[-3:].max() / errs[-3:].min() < 1.1  # a plateau, not a drift, as eps -> 0


@pytest.mark.parametrize("eps", [1e-1, 1e-6])
def test_multirate_first_order_in_H(eps):
    Hs = np.array([0.1, 0.05, 0.025, 0.0125])
    errs = [_map_error(eps, H) for H in Hs]
    slope = np.polyfit(np.log(Hs), np.log(errs), 1)[0]
    assert 0.85 <= slope <= 1.15


def test_multirate_as_a_method_of_integrate():
    system = fs.make_system("birth-death", P=8)  # the map takes P = 1/eps from the system
    ds = fs.integrate(system, (0, 1), method="multirate", H=0.05)
    run = multirate_map(system, 0.05, 20, P=8)
    np.testing.assert_allclose(ds["y"].values, run["y_blocks"])
    np.testing.assert_allclose(ds["x"].values, run["x_tokens"][::8])
    with pytest.raises(fs.InputError, match="H"):
        multirate_map(system, -0.1, 10)
    with pytest.raises(fs.InputError, match="takes no option 'tokens_per_block'; its options"):
        fs.integrate(system, (0, 1), method="multirate", H=0.05, tokens_per_block=8)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_autograd_jacobian_fallback():
    from fastslow_sim.rosenbrock import autograd_jacobian

    for name in fs.SYSTEMS:  # the automatic Jacobian equals the analytic one on every system
        system = fs.make_system(name, eps=0.01)
        field = system.torch_functions(structured=False)
        rng = np.random.default_rng(1)
        z = torch.tensor(
            np.concatenate(
                [rng.dirichlet(np.ones(system.n_fast), 3), rng.uniform(0.2, 1, (3, 1))], 1
            )
        ).T  # batch last
        torch.testing.assert_close(autograd_jacobian(field.fun)(z), field.jac(z), rtol=1e-12,
                                   atol=1e-12)  # fmt: skip
    # and the solver takes jac=None
    system = fs.make_system("cycle", eps=1e-3)
    field = system.torch_functions()
    z0 = torch.tensor(np.concatenate([system.x0, system.y0]))[None].repeat(2, 1)
    with_jac = solve(field, z0, torch.tensor([0.0, 1.0]), rtol=1e-8, atol=1e-11)
    without = solve(VectorField(field.fun), z0, torch.tensor([0.0, 1.0]), rtol=1e-8, atol=1e-11)
    torch.testing.assert_close(without[0], with_jac[0], rtol=0, atol=1e-12)


@pytest.mark.slow
def test_dense_output_matches_the_ode_and_costs_no_steps():
    system = fs.make_system("birth-death", eps=1e-3)
    rng = np.random.default_rng(2)
    x0, y0 = rng.dirichlet(np.ones(8), 4), rng.uniform(0, 1, (4, 1))
    # over (0, 1), 1,400-2,000 steps a trajectory (to 2 before: the same largest errors, from the
    # first half, at two thirds of the cost)
    ref = [fs.integrate(system, (0, 1), x0[b], y0[b], **_REFERENCE, n_eval=101) for b in range(4)]
    field = system.torch_functions()
    z0 = torch.tensor(np.concatenate([x0, y0], 1))
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    runs = {}
    for dense in (True, False):
        out, status, stats = solve(
            field, z0, t, rtol=1e-9, atol=1e-12, dense_output=dense
        )
        assert (status == 0).all()
        runs[dense] = stats["naccept"] + stats["nreject"]
        for b in range(4):
            zr = np.concatenate([ref[b]["x"].values, ref[b]["y"].values], 1)
            # between steps the order-3 interpolant stays within the requested rtol (measured:
            # 8.3e-11 with dense output, 2.8e-11 landing on every output time)
            np.testing.assert_allclose(out[:, b].numpy(), zr, rtol=0, atol=1e-9)
    # with dense output the steps do not depend on the output times
    _, _, two = solve(field, z0, t[[0, -1]], rtol=1e-9, atol=1e-12)
    assert torch.equal(runs[True], two["naccept"] + two["nreject"])
    assert (runs[True] < runs[False]).all()  # landing on 100 output times costs steps


@pytest.mark.slow  # 1.4 s after other rodas4 runs, 3.1 s alone (the first solve's loads)
def test_interpolated_outputs_are_of_third_order_step_ends_within_the_tolerance():
    # RODAS4's continuous extension (Hairer's D, checked against rodas.f) is of order 3, its steps
    # of order 4: from all mass on the last of 16 states at eps 1e-6 and rtol 1e-8 the outputs
    # between steps missed by 3.3e-8 (3.3 rtol), those landed on by 9.0e-11 (4.3e-8 and 1.2e-10
    # on the 30-state chain over [0, 5] at 430 outputs, against Radau at rtol 1e-12). The bounds:
    # 20 rtol (6 times the measured miss) and rtol; D21 off by 0.1% missed by 1.8e-6
    system = fs.make_system("birth-death", eps=1e-6, states=16)
    x0 = np.eye(16)[-1]
    ref = fs.integrate(system, (0, 1), x0, 0.2, method="lsoda", rtol=1e-12, atol=1e-14,
                       n_eval=100)  # fmt: skip
    zr = np.concatenate([ref["x"].values, ref["y"].values], 1)
    miss = {}
    for dense in (True, False):
        ds = fs.integrate(system, (0, 1), x0, 0.2, method="rodas4", rtol=1e-8, atol=1e-10,
                          n_eval=100, dense_output=dense, march="torch")  # fmt: skip
        miss[dense] = np.max(np.abs(np.concatenate([ds["x"].values, ds["y"].values], 1) - zr))
    assert miss[False] < 1e-8 < miss[True] < 20 * 1e-8


@pytest.mark.parametrize(
    "z0, t, kwargs, fragment",
    [
        ([1.0], [0.0, 1.0], {}, "z0 must have shape"),
        ([[1.0]], [1.0, 0.0], {}, "strictly increasing"),
        ([[1.0]], [0.0], {}, "at least two"),
        ([[1.0]], [0.0, float("nan")], {}, "finite"),
        ([[1.0]], [0.0, 1.0], {"rtol": 0.0}, "rtol must be a positive"),
        ([[1.0]], [0.0, 1.0], {"atol": float("inf")}, "atol must be a positive"),
        ([[1.0]], [0.0, 1.0], {"max_steps": 0}, "max_steps must be a positive"),
    ],
)
def test_rodas4_solve_bad_input(z0, t, kwargs, fragment):
    def fun(z, idx):
        return -z

    with pytest.raises(fs.InputError, match=fragment):
        rodas4_solve(fun, None, torch.tensor(z0, dtype=torch.float64), torch.tensor(t), **kwargs)
