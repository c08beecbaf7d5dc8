"""The compiled CPU kernels (numba) of the Rosenbrock solver against their torch formulas."""

import sys

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim import linalg
from fastslow_sim.linalg import ArrowTridiagonal
from fastslow_sim.rosenbrock import STATUS, solve

cpu_kernels = pytest.importorskip("fastslow_sim.cpu_kernels", reason="numba does not import")


def _arrow(B, n, seed, scale=1e4):
    g = torch.Generator().manual_seed(seed)
    up, down = (torch.rand(n, B, generator=g, dtype=torch.float64) * scale for _ in range(2))
    up[-1], down[-1] = 0, 0
    sub, sup = torch.roll(up, 1, 0), down
    diag = -(up + torch.roll(down, 1, 0))
    u = torch.randn(n, B, generator=g, dtype=torch.float64) * scale
    u -= u.mean(0)
    v = torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, B)  # stride 0, as c.expand
    return ArrowTridiagonal(sub, diag, sup, u, v, -torch.rand(B, generator=g, dtype=torch.float64))


def test_stage_kernels_match_the_torch_formulas():
    rng = np.random.default_rng(0)
    N, B = 17, 37
    K, y = rng.standard_normal((6, N, B)), rng.standard_normal((N, B))
    for i in range(1, 6):
        a = rng.standard_normal(i)
        out = np.empty((N, B))
        cpu_kernels.combine(y, K[:i], a, out)
        np.testing.assert_allclose(out, y + np.tensordot(a, K[:i], 1), rtol=1e-13, atol=1e-14)
    # the error norm: RMS of e / (atol + rtol max(|y0|, |y1|)) per trajectory
    e, y0, y1 = (rng.standard_normal((N, B)) for _ in range(3))
    out = np.empty(B)
    cpu_kernels.error_norm(e, y0, y1, 1e-6, 1e-9, out)
    want = np.sqrt(np.mean((e / (1e-9 + 1e-6 * np.maximum(abs(y0), abs(y1)))) ** 2, axis=0))
    np.testing.assert_allclose(out, want, rtol=1e-13)
    e[3, 5], y1[0, 7] = np.nan, np.nan
    cpu_kernels.error_norm(e, y0, y1, 1e-6, 1e-9, out)
    assert np.isnan(out[5]) and np.isnan(out[7]) and np.isfinite(np.delete(out, [5, 7])).all()


def test_error_norm_of_entries_whose_squares_overflow():
    # rates near 1e174 over atol 1e-10 (the birth-death chain at y = 100): scaled entries up to
    # 1e300, whose squares overflow; the norm of such a column is still finite: 1e300 times the
    # RMS of the column over 1e300, in the compiled kernel as in torch (control.error_norm)
    from fastslow_sim.rosenbrock.control import StepControl, rms

    rng = np.random.default_rng(1)
    N, B = 9, 6
    e = rng.standard_normal((N, B)) * np.array([1.0, 1e150, 1e200, 1e300, 1e300, 1e300])
    e[0, 4], e[1, 5] = np.inf, np.nan
    y0, y1 = rng.standard_normal((N, B)), rng.standard_normal((N, B))
    unit = 1e-9 + 1e-6 * np.maximum(abs(y0), abs(y1))
    m = np.abs(e / unit)[:, :4].max(0)
    want = m * np.sqrt(np.mean((e[:, :4] / unit[:, :4] / m) ** 2, axis=0))
    out = np.empty(B)
    cpu_kernels.error_norm(e, y0, y1, 1e-6, 1e-9, out)
    in_torch = StepControl().error_norm(*(torch.from_numpy(a) for a in (e, y0, y1)), 1e-6, 1e-9)
    for got in (out, in_torch.numpy()):
        np.testing.assert_allclose(got[:4], want, rtol=1e-14)
        assert got[4] == np.inf and np.isnan(got[5])
    # rms itself: exact on a column of equal entries at the top of the range, 0 on zeros
    q = torch.tensor([[1e308, 0.0], [1e308, 0.0]], dtype=torch.float64)
    assert rms(q, 0).tolist() == [1e308, 0.0]


def test_stage_solve_equals_the_solve_of_the_formed_right_hand_side():
    n, B = 16, 9
    J = _arrow(B, n, seed=3)
    s = torch.logspace(-1, 3, B, dtype=torch.float64)
    g = torch.Generator().manual_seed(4)
    f = torch.randn(n + 1, B, generator=g, dtype=torch.float64)
    K = torch.randn(3, n + 1, B, generator=g, dtype=torch.float64)
    c = np.array([0.3, -2.0, 5.0])
    inv_h = torch.rand(B, generator=g, dtype=torch.float64) * 10
    fac = J.shifted_solver(s, kernels=cpu_kernels)
    out = torch.empty(n + 1, B, dtype=torch.float64)
    fac.stage(f, K.numpy(), c, inv_h.numpy(), out=out)
    rhs = f + inv_h * torch.tensordot(torch.tensor(c), K, 1)
    torch.testing.assert_close(out, fac(rhs), rtol=1e-13, atol=0)
    # and the kernels' solve equals the torch operations' within round-off
    torch.testing.assert_close(out, J.shifted_solver(s)(rhs), rtol=1e-11, atol=0)


def test_a_zero_pivot_gives_non_finite_values_not_an_exception():
    n, B = 4, 3
    J = _arrow(B, n, seed=5)
    s = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    J.diag[0, 1] = s[1]  # a zero pivot in trajectory 1
    J.sub[1, 1], J.sup[0, 1] = 0.0, 0.0
    x = J.shifted_solver(s, kernels=cpu_kernels)(torch.ones(n + 1, B, dtype=torch.float64))
    assert not torch.isfinite(x[:, 1]).all()
    assert torch.isfinite(x[:, [0, 2]]).all()


@pytest.mark.slow  # 11 s; the default suite sits near its 10 minutes
def test_rodas4_with_kernels_and_with_torch_operations_agree():
    system = fs.make_system("birth-death", eps=1e-4)
    z0 = torch.tensor(np.concatenate(fs.random_initial_conditions(system, 24, seed=11), axis=1))
    # to t = 1 (830 steps a trajectory on average; to 3 before, 1540, for the same agreement:
    # measured 1.5e-13 and equal step counts at t = 1, 2.5e-13 and equal at t = 3)
    t = torch.tensor([0.0, 0.5, 1.0])
    results = {}
    field = system.torch_functions()
    for kind in ("numba", "torch"):
        results[kind] = solve(field, z0, t, rtol=1e-8, atol=1e-11, linear_solver=f"arrow-{kind}")
    (out_k, status_k, stats_k), (out_t, status_t, stats_t) = results["numba"], results["torch"]
    assert (status_k == 0).all() and (status_t == 0).all()
    # the same method with round-off in another order: equal far below the tolerance
    torch.testing.assert_close(out_k, out_t, rtol=0, atol=1e-10)
    steps_k, steps_t = (
        stats_k["naccept"] + stats_k["nreject"],
        stats_t["naccept"] + stats_t["nreject"],
    )
    assert (steps_k - steps_t).abs().max() <= 2


def test_the_linear_solver_parameter(monkeypatch):
    resolve = linalg.linear_solver
    assert resolve("auto", "arrow", "cpu", grad=False).name == "arrow-numba"
    assert resolve("auto", "arrow", "cpu", grad=True).name == "arrow-torch"  # autograd records
    assert resolve("auto", "arrow", "cuda", grad=False).name == "arrow-torch"
    assert resolve("auto", "dense", "cpu", grad=False).name == "dense"
    assert resolve("dense", "arrow", "cpu", grad=False).name == "dense"  # converts the arrow
    for spec, structure, device, grad, fragment in [
        ("fast", "arrow", "cpu", False, "unknown linear solver 'fast'"),
        ("arrow-torch", "dense", "cpu", False, "needs an arrow-tridiagonal Jacobian"),
        ("arrow-numba", "arrow", "cuda", False, "runs on the CPU without autograd"),
        ("arrow-numba", "arrow", "cpu", True, "runs on the CPU without autograd"),
    ]:
        with pytest.raises(fs.InputError, match=fragment):
            resolve(spec, structure, device, grad)
    # the dense solver on an arrow Jacobian solves the same system
    J = _arrow(4, 6, seed=1)
    s = torch.full((4,), 2.0, dtype=torch.float64)
    r = torch.ones(7, 4, dtype=torch.float64)
    for name in ("dense", "arrow-torch", "arrow-numba"):
        x = linalg.LINEAR_SOLVERS[name].factor(J, s)(r)
        M = torch.diag_embed(s[:, None].expand(-1, 7)) - J.dense()
        torch.testing.assert_close(M @ x.T[..., None], r.T[..., None])
    # where numba does not import: "auto" falls back to the torch operations, "arrow-numba" says
    # why, and the import failing warns once, in words
    monkeypatch.delitem(linalg._KERNELS, "module", raising=False)
    monkeypatch.delattr(fs, "cpu_kernels")
    monkeypatch.setitem(sys.modules, "fastslow_sim.cpu_kernels", None)
    with pytest.warns(RuntimeWarning, match="compiled CPU kernels are unavailable"):
        assert linalg.compiled_kernels() is None
    assert resolve("auto", "arrow", "cpu", grad=False).name == "arrow-torch"
    with pytest.raises(fs.InputError, match="needs numba"):
        resolve("arrow-numba", "arrow", "cpu", grad=False)


def test_solver_outputs_are_ordinary_tensors():
    # the march runs in inference mode; what it returns must still take in-place updates and
    # autograd, and the system's functions must still run outside inference mode afterwards
    system = fs.make_system("two-state", eps=1e-3)
    field = system.torch_functions()
    fun, _ = field.batch_first()
    z0 = torch.tensor([[0.3, 0.7, 0.2], [0.9, 0.1, 0.8]], dtype=torch.float64)
    out, status, stats = solve(field, z0, torch.tensor([0.0, 1.0]))
    assert STATUS[int(status[0])] == "success"
    for t in (out, status, *(v for v in stats.values() if torch.is_tensor(v))):
        assert not t.is_inference()
    out.add_(1.0)
    out.requires_grad_(True)
    with torch.no_grad():
        torch.testing.assert_close(fun(z0), fun(z0.clone()))
