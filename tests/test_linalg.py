"""Batched solves with `s I - J` for the Rosenbrock stages: arrow-tridiagonal against dense LU."""

import math

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim import linalg
from fastslow_sim.linalg import ArrowTridiagonal, shifted_solver

# the in-place solves run as compiled CPU kernels (numba) or as torch vector operations


@pytest.fixture(params=["numba", "torch"])
def kernels(request):
    """The `kernels` argument of `shifted_solver`: the compiled module, or None (torch)."""
    if request.param == "torch":
        return None
    module = linalg.compiled_kernels()
    if module is None:
        pytest.skip("numba does not import here")
    return module


def _master_equation_arrow(B, n, scale, seed, chain=False):
    """The Jacobian shape of a neighbour chain: `T = Q^T * scale` (a generator's transpose:
    columns sum to zero), a dense bordering column `u` that sums to zero (as `d(Q^T x)/dy` does:
    the chain conserves probability), a dense row and a corner. `chain`: with a chain state
    (random, on the simplex), which makes the solve keep the mass."""
    g = torch.Generator().manual_seed(seed)
    up = torch.rand(B, n, generator=g, dtype=torch.float64) * scale
    down = torch.rand(B, n, generator=g, dtype=torch.float64) * scale
    up[:, -1] = 0  # no jump beyond the last state
    down[:, -1] = 0
    sub = torch.roll(up, 1, 1)  # T[i, i-1] = rate i-1 -> i
    sup = down  # T[i, i+1] = rate i+1 -> i
    diag = -(up + torch.roll(down, 1, 1))
    u = torch.randn(B, n, generator=g, dtype=torch.float64) * scale
    u = u - u.mean(1, keepdim=True)
    v = torch.randn(B, n, generator=g, dtype=torch.float64)
    d = -torch.rand(B, generator=g, dtype=torch.float64)
    if chain:  # u from the flux's derivative du, u_i = du_{i-1} - du_i (equal up to round-off)
        x = torch.rand(n, B, generator=g, dtype=torch.float64)
        du = -torch.cumsum(u, 1)[:, :-1]
        return ArrowTridiagonal.master_equation(*(t.T.contiguous() for t in (up[:, :-1],
                                                down[:, :-1], du, v)), d, x / x.sum(0))  # fmt: skip
    # stored chain-major: (n, B)
    return ArrowTridiagonal(*(t.T.contiguous() for t in (sub, diag, sup, u, v)), d)


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 33])
def test_arrow_solve_is_backward_stable_against_dense_lu(n, kernels, chain):
    # stiff to mild: rates up to 1e8 (eps = 1e-8) against shifts 1/(h gamma) from 1e-2 to 1e4;
    # by elimination down the chain, or (chain) in the partial sums around the heaviest state
    for k, scale in enumerate([1.0, 1e4, 1e8]):
        J = _master_equation_arrow(6, n, scale, seed=10 * n + k, chain=chain)
        assert torch.allclose(
            J.dense()[:, :n, :n].sum(1), torch.zeros(6, n, dtype=torch.float64), atol=1e-6 * scale
        )
        s = torch.logspace(-2, 4, 6, dtype=torch.float64)
        r = torch.randn(
            6, n + 1, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64
        )
        x = J.shifted_solver(s, kernels=kernels)(r.T).T
        M = torch.diag_embed(s[:, None].expand(-1, n + 1)) - J.dense()
        # normwise backward error |M x - r| / (|M| |x| + |r|): a few units of float64 round-off
        # (elimination with growth factor <= 2, then the border's Schur complement). Worst over
        # 20 seeds x 3 scales x 6 shifts for n = 1..64: 5.7e-16 (kernels), 3.6e-16 (torch).
        # With a border column that does not sum to zero it reached 9e-12 at rates 1e8 and
        # shift 1e-2 (see linalg's docstring); master-equation Jacobians do not have one.
        res = (M @ x[..., None])[..., 0] - r
        denom = torch.linalg.matrix_norm(M, ord=np.inf) * x.abs().amax(-1) + r.abs().amax(-1)
        assert (res.abs().amax(-1) / denom).max() < 1e-14
        # and the same answer as pivoted dense LU, within the conditioning
        dense = shifted_solver(J.dense(), s)(r.T).T
        cond = torch.linalg.cond(M, p=np.inf)
        assert ((x - dense).abs().amax(-1) / dense.abs().amax(-1) / cond).max() < 1e-14


def test_arrow_solve_is_differentiable():
    n = 5
    J = _master_equation_arrow(2, n, 3.0, seed=1)
    parts = [t.clone().requires_grad_(True) for t in (J.sub, J.diag, J.sup, J.u, J.v, J.d)]
    s = torch.tensor([0.7, 4.0], dtype=torch.float64, requires_grad=True)
    r = torch.randn(n + 1, 2, dtype=torch.float64, requires_grad=True)

    def f(sub, diag, sup, u, v, d, s, r):  # keep the chain's end entries zero
        sub = torch.cat([torch.zeros_like(sub[:1]), sub[1:]])
        sup = torch.cat([sup[:-1], torch.zeros_like(sup[:1])])
        return ArrowTridiagonal(sub, diag, sup, u, v, d).shifted_solver(s)(r)

    assert torch.autograd.gradcheck(f, (*parts, s, r))


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_structured_and_dense_rodas4_agree():
    system = fs.make_system("birth-death", eps=1e-4)
    z0 = torch.tensor(np.concatenate(fs.random_initial_conditions(system, 16, seed=3), axis=1))
    from fastslow_sim.rosenbrock import solve

    outs = []
    # to t = 0.5 (was 2): 1,087 steps, past the fast transient (eps 1e-4) into the slow drift,
    # against 2,729; the two answers differ by 7e-15 (6e-15 at t = 2), a wrong solve by far more
    for structured in (True, False):
        field = system.torch_functions(structured=structured)
        out, status, stats = solve(field, z0, torch.tensor([0.0, 0.5]), rtol=1e-8, atol=1e-11)
        assert (status == 0).all()
        outs.append((out[-1], stats["naccept"], stats["nreject"]))
    # the same method with two linear solvers: equal to round-off amplified by the step control
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-10)
    # and the same steps: round-off of 7e-15 moves no step decision here (measured: equal counts
    # for all 16 trajectories, 308 to 1,087 accepted, none rejected); a solver that differed by
    # more would change the accepted or rejected counts before the answer's tolerance
    for k, name in ((1, "naccept"), (2, "nreject")):
        np.testing.assert_array_equal(np.asarray(outs[0][k]), np.asarray(outs[1][k]), err_msg=name)


def test_workspace_reuse_gives_the_fresh_answer(kernels):
    # the solver reuses buffers and views across factorisations of one shape (and drops them
    # when the batch width changes); each factorisation must still give its own answer
    workspace = {}
    s = torch.tensor([3.0, 50.0, 0.2, 7.0], dtype=torch.float64)
    for seed, (B, n, chain) in enumerate([(4, 16, False), (4, 16, True), (4, 16, True),
                                          (3, 16, False), (4, 7, True)]):  # fmt: skip
        J = _master_equation_arrow(B, n, 1e4, seed=seed, chain=chain)
        g = torch.Generator().manual_seed(seed)
        r, first = (torch.randn(n + 1, B, generator=g, dtype=torch.float64) for _ in range(2))
        with torch.no_grad():
            solve_ws, x_first_ws = J.shifted_solver(s[:B], first, workspace, kernels)
            x_ws = solve_ws(r).clone()
            solve, x_first = J.shifted_solver(s[:B], first, kernels=kernels)
            x = solve(r)
        torch.testing.assert_close(x_ws, x, rtol=0, atol=0)
        torch.testing.assert_close(x_first_ws, x_first, rtol=0, atol=0)
        dense = shifted_solver(J.dense(), s[:B])(r)
        torch.testing.assert_close(x, dense, rtol=1e-9, atol=0)
    assert len(workspace) == 1  # one shape kept at a time


def _mass_error(J, s, r, kernels):
    """`|sum_i k_i - sum_i r_i / s|` over the chain's states for `k = (s I - J)^{-1} r`, relative
    to `sum_i |k_i| + sum_i |r_i| / s` (exact sums), per trajectory."""
    n = J.diag.shape[0]
    with torch.no_grad():
        k = J.shifted_solver(s, kernels=kernels)(r.clone())
    out = []
    for b in range(k.shape[1]):
        kb, rb, sb = k[:n, b].numpy(), r[:n, b].numpy(), float(s[b])
        scale = np.abs(kb).sum() + np.abs(rb).sum() / sb
        out.append(abs(math.fsum(kb) - math.fsum(rb) / sb) / scale)
    return np.array(out)


@pytest.mark.parametrize("eps, y", [(1e-12, 13.0), (1e-12, 2.0), (1e-12, 117.0), (1e-8, 40.0)])
def test_a_chain_solve_keeps_the_mass(kernels, eps, y):
    """The chain block of a master equation's J (and its border column) has zero column sums,
    so the chain's unknowns of (s I - J) k = r sum to sum_i r_i / s. The birth-death chain at
    eps 1e-12 has up rates e^{4 (y - 1/2)} / eps against down rates 1 / eps (lopsided: 1e34 to
    1 at y = 13): elimination down the chain lost 1e-3 of the scale |k| + |r| / s on the slow
    manifold, all of it (relative error 1.0) at random states, 2e-6 at y = 2 (rodas4 from y0 =
    150 on the torch march ended 1.6e-5 off the simplex); with `chain_state` it is solved in
    partial sums around the heaviest state, kept to the round-off of the entries (measured
    1.2e-16 to 1.3e-16 in every case here), for the numba kernels and the torch operations
    alike."""
    system = fs.make_system("birth-death", eps=eps)
    field = system.torch_functions(structured=True)
    n = system.n_fast
    rng = np.random.default_rng(3)
    # on the slow manifold, and at random states on the simplex (heaviest state anywhere)
    xs = [system.critical_manifold(np.array([y])).reshape(-1)] + list(rng.dirichlet(np.ones(n), 5))
    z = torch.tensor(np.stack([np.concatenate([x, [y]]) for x in xs], axis=1))
    B = z.shape[1]
    J = field.jac(torch.cat([z, z], dim=1))  # right-hand sides f(z), and random ones
    r = torch.cat([field.fun(z), torch.tensor(rng.standard_normal((n + 1, B)) * 1e-3)], dim=1)
    assert J.chain_state is not None
    plain = ArrowTridiagonal(J.sub, J.diag, J.sup, J.u, J.v, J.d)  # the elimination down the chain
    for h in (1e-6, 1e-3):
        s = torch.full((2 * B,), 1.0 / (0.25 * h), dtype=torch.float64)
        assert _mass_error(J, s, r, kernels).max() < 1e-14
    if eps == 1e-12 and y == 13.0:  # where the elimination down the chain was far off
        assert _mass_error(plain, s, r, kernels).max() > 1e-6


def test_the_chain_solve_is_differentiable():
    """The torch form of the mass-keeping solve (autograd, torch.compile, CUDA) is
    differentiable in the rates (the diagonal follows from them), the border, s and r."""
    n = 5
    J = _master_equation_arrow(2, n, 3.0, seed=1, chain=True)
    rates = [J.sub[1:].clone().requires_grad_(True), J.sup[:-1].clone().requires_grad_(True)]
    parts = [t.clone().requires_grad_(True) for t in (J.v, J.d)]
    du = -torch.cumsum(J.u, 0)[:-1].clone().requires_grad_(True)  # the flux's derivative
    s = torch.tensor([0.7, 4.0], dtype=torch.float64, requires_grad=True)
    r = torch.randn(n + 1, 2, dtype=torch.float64, requires_grad=True)

    def f(up, down, du, v, d, s, r):
        A = ArrowTridiagonal.master_equation(up, down, du, v, d, J.chain_state)
        return A.shifted_solver(s)(r)

    assert torch.autograd.gradcheck(f, (*rates, du, *parts, s, r))
    # and the same answer as the elimination down the chain
    with torch.no_grad():
        x = J.shifted_solver(s)(r)
        plain = ArrowTridiagonal(J.sub, J.diag, J.sup, J.u, J.v, J.d).shifted_solver(s)(r)
    torch.testing.assert_close(x, plain, rtol=1e-12, atol=1e-14)


def test_the_chain_solve_does_not_overflow_where_the_answer_is_finite(kernels):
    """The heaviest state's unknown is about T = sum_i r_i / s; the rows next to it held rate *
    T, which overflowed to inf (and NaN in k) at rates 1e281 with s = 1e-24 and |r| ~ 1e4, where
    k (~1e28) is finite. They now enter divided by their pivots (g T, pm T, at most T). The
    solve is linear and scaling r by a power of two is exact, so the answer must be 2^40 times
    that for r 2^-40, where nothing overflows (the same arithmetic: `cpu_kernels.chain_solve`
    is the compiled march's solve too)."""
    n, B = 8, 3
    g = torch.Generator().manual_seed(5)
    up = torch.rand(n - 1, B, generator=g, dtype=torch.float64) * 1e281
    down = torch.rand(n - 1, B, generator=g, dtype=torch.float64)
    du = torch.randn(n - 1, B, generator=g, dtype=torch.float64)  # u_i = du_{i-1} - du_i
    x = torch.rand(n, B, generator=g, dtype=torch.float64)
    J = ArrowTridiagonal.master_equation(up, down, du, torch.randn(n, B, generator=g,
                                         dtype=torch.float64), -torch.ones(B, dtype=torch.float64),
                                         x / x.sum(0))  # fmt: skip
    s = torch.full((B,), 1e-24, dtype=torch.float64)
    r = torch.randn(n + 1, B, generator=g, dtype=torch.float64) * 1e4
    with torch.no_grad():
        solve = J.shifted_solver(s, kernels=kernels)
        k, k_small = solve(r.clone()), solve(r * 2.0**-40)
    assert torch.isfinite(k).all()
    assert torch.equal(k, k_small * 2.0**40)
    assert k[:n].abs().max() > 1e27  # the regime: T ~ 1e28, rate * T beyond float64


def _chain_parts(n, B, seed, decay=0.0):
    """A neighbour chain's rates, flux derivative, border and state, `(n-1, B)` / `(n, B)`, and
    the hand-built fields `sub, diag, sup, u` of its Jacobian with `-decay` on the diagonal."""
    g = torch.Generator().manual_seed(seed)
    up, down, du = (torch.rand(n - 1, B, generator=g, dtype=torch.float64) for _ in range(3))
    v = torch.randn(n, B, generator=g, dtype=torch.float64)
    d = -torch.rand(B, generator=g, dtype=torch.float64)
    x = torch.rand(n, B, generator=g, dtype=torch.float64)
    zero = torch.zeros(1, B, dtype=torch.float64)
    sub, sup = torch.cat([zero, up]), torch.cat([down, zero])
    diag = -(torch.cat([up, zero]) + torch.cat([zero, down])) - decay
    u = torch.cat([zero, du]) - torch.cat([du, zero])
    return (up, down, du, v, d, x / x.sum(0)), (sub, diag, sup, u)


def _solve_and_dense(J, s, seed, kernels):
    """`(got, want, M)`: `J.shifted_solver(s)` and `torch.linalg.solve` of `M = s I - J` (per
    batch entry) on the same random right-hand side of generator seed `seed`."""
    n1, B = J.dense().shape[-1], s.numel()
    r = torch.randn(n1, B, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    M = torch.diag_embed(s[:, None].expand(-1, n1)) - J.dense()
    want = torch.linalg.solve(M, r.T).T
    with torch.no_grad():
        got = J.shifted_solver(s, kernels=kernels)(r.clone())
    return got, want, M


def test_a_hand_built_chain_state_is_refused(kernels):
    """The mass-keeping solve takes `diag_i = -(sub_{i+1} + sup_{i-1})` and `sum_i u_i = 0` as
    given without reading them: a hand-built matrix with `chain_state` and a decay term on the
    diagonal was solved as if the decay were absent (0.34 off a dense solve here, torch and
    numba alike), silently. The constructor now refuses `chain_state`, whatever the entries;
    the same matrix without it is solved by the elimination down the chain, correctly."""
    n, B = 6, 4
    (up, down, du, v, d, x), (sub, diag, sup, u) = _chain_parts(n, B, seed=0, decay=0.7)
    with pytest.raises(fs.InputError, match=r"master_equation\(up, down, du, v, d, chain_state\)"):
        ArrowTridiagonal(sub, diag, sup, u, v, d, chain_state=x)
    consistent = diag + 0.7
    with pytest.raises(fs.InputError, match="with chain_state is a master equation's Jacobian"):
        ArrowTridiagonal(sub, consistent, sup, u, v, d, chain_state=x)
    J = ArrowTridiagonal(sub, diag, sup, u, v, d)
    got, want, _ = _solve_and_dense(J, torch.logspace(-1, 2, B, dtype=torch.float64), 1, kernels)
    # well conditioned (rates and decay of order 1, s >= 0.1): a few units of round-off
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 17])
def test_master_equation_is_consistent_and_matches_a_dense_solve(kernels, n):
    """`ArrowTridiagonal.master_equation` derives `diag` and `u` from the rates and the flux's
    derivative, with the operations `MasterEquationSystem.torch_functions` used before (so
    its Jacobian and the march's results are bit for bit those of before), and its solve (in
    the partial sums around the heaviest state) matches `torch.linalg.solve` of `s I - J`."""
    B = 5
    (up, down, du, v, d, x), (sub, diag, sup, u) = _chain_parts(n, B, seed=n)
    J = ArrowTridiagonal.master_equation(up, down, du, v, d, x)
    assert J.chain_state is x
    for got, want in ((J.sub, sub), (J.diag, diag), (J.sup, sup), (J.u, u)):
        assert torch.equal(got, want)
    # the columns of [T, u] sum to zero: each sums an entry and its negative (exact) and at
    # most one rounded sum of two rates, whose error is an ulp of the exit rate
    cols = J.dense()[:, :n, :].sum(1)
    assert (cols.abs() <= 2 * torch.finfo(torch.float64).eps).all()
    got, want, M = _solve_and_dense(J, torch.logspace(-2, 3, B, dtype=torch.float64), 2, kernels)
    # both backward stable (a few units of 1.1e-16): the forward difference is at most about
    # 1e-15 times the condition number of s I - J (up to 1e4 here, at s = 1e-2)
    cond = torch.linalg.cond(M, p=np.inf)
    assert ((got - want).abs().amax(0) / want.abs().amax(0) / cond).max() < 1e-14


def test_master_equation_checks_the_shapes():
    # a chain state longer than the rates would put the heaviest state past the last row (out
    # of bounds in the compiled kernels): refused, not solved
    (up, down, du, v, d, x), _ = _chain_parts(5, 3, seed=0)
    with pytest.raises(fs.InputError, match="up, down, du with n-1 rows and v with n"):
        ArrowTridiagonal.master_equation(up, down, du, v, d, torch.cat([x, x[:1]]))
    with pytest.raises(fs.InputError, match="got 4, 4, 3 and 5"):
        ArrowTridiagonal.master_equation(up, down, du[1:], v, d, x)
