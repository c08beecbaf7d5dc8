"""Batched solves with `s I - J` for the Rosenbrock stages: arrow-tridiagonal against dense LU."""

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


def _master_equation_arrow(B, n, scale, seed):
    """The Jacobian shape of a neighbour chain: `T = Q^T * scale` (a generator's transpose:
    columns sum to zero), a dense bordering column `u` that sums to zero (as `d(Q^T x)/dy` does:
    the chain conserves probability), a dense row and a corner."""
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
    # stored chain-major: (n, B)
    return ArrowTridiagonal(*(t.T.contiguous() for t in (sub, diag, sup, u, v)), d)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 33])
def test_arrow_solve_is_backward_stable_against_dense_lu(n, kernels):
    # stiff to mild: rates up to 1e8 (eps = 1e-8) against shifts 1/(h gamma) from 1e-2 to 1e4
    for k, scale in enumerate([1.0, 1e4, 1e8]):
        J = _master_equation_arrow(6, n, scale, seed=10 * n + k)
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


def test_structured_and_dense_rodas4_agree():
    system = fs.make_system("birth-death", eps=1e-4)
    z0 = torch.tensor(np.concatenate(fs.random_initial_conditions(system, 16, seed=3), axis=1))
    from fastslow_sim.rosenbrock import solve

    outs = []
    for structured in (True, False):
        field = system.torch_functions(structured=structured)
        out, status, stats = solve(field, z0, torch.tensor([0.0, 2.0]), rtol=1e-8, atol=1e-11)
        assert (status == 0).all()
        outs.append((out[-1], stats["naccept"]))
    # the same method with two linear solvers: equal to round-off amplified by the step control
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-10)


def test_workspace_reuse_gives_the_fresh_answer(kernels):
    # the solver reuses buffers and views across factorisations of one shape (and drops them
    # when the batch width changes); each factorisation must still give its own answer
    workspace = {}
    s = torch.tensor([3.0, 50.0, 0.2, 7.0], dtype=torch.float64)
    for seed, (B, n) in enumerate([(4, 16), (4, 16), (3, 16), (4, 7)]):
        J = _master_equation_arrow(B, n, 1e4, seed=seed)
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
