"""Extending the toolkit from outside the package: a new generator and a new solver method,
written here, work with every part that should take them (issue 14: systems own their vector
fields, solvers are registry entries); torchdiffeq's methods are differentiable."""

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.generators import Generator, from_off_diagonal
from fastslow_sim.solvers import METHODS, Method, per_trajectory, register
from fastslow_sim.systems import LinearSlowLaw, MasterEquationSystem


def _slow(y):
    """`y (..., 1)` (or a scalar) as `(...)`, the convention of the package's generators."""
    y = np.asarray(y, dtype=np.float64)
    return y[..., 0] if y.ndim and y.shape[-1] == 1 else y


@dataclass
class Triangle(Generator):
    """Three states on a ring, `Q_ij(y) = k_ij exp(s_ij y)`: no neighbour-chain structure, so the
    torch solvers take its dense form."""

    name: str = field(default="triangle", init=False, repr=False)

    def __post_init__(self):
        self.k = np.array([[0, 1.0, 0.5], [0.3, 0, 2.0], [1.5, 0.2, 0]])
        self.s = np.array([[0, 1.0, -0.5], [0.5, 0, 1.5], [-1.0, 0.3, 0]])

    @property
    def n_states(self):
        return 3

    def rates(self, y):
        return from_off_diagonal(self.k * np.exp(self.s * _slow(y)[..., None, None]))

    def rates_dy(self, y):
        off = self.k * self.s * np.exp(self.s * _slow(y)[..., None, None])
        off[..., [0, 1, 2], [0, 1, 2]] = -off.sum(-1)
        return off[..., None, :, :]

    def torch_off_diagonal(self, y):
        k = torch.as_tensor(self.k, dtype=y.dtype)
        s = torch.as_tensor(self.s, dtype=y.dtype)
        off = k * torch.exp(s * y[:, :1, None])
        return off, off * s


@dataclass
class SquareChain(Generator):
    """A 5-state neighbour chain with up rate `1 + y^2` and down rate 1, given only as chain
    rates in torch: the torch solvers take its arrow-tridiagonal form."""

    n: int = 5
    name: str = field(default="square-chain", init=False, repr=False)

    @property
    def n_states(self):
        return self.n

    def rates(self, y):
        y = _slow(y)
        q = np.zeros(y.shape + (self.n, self.n))
        i = np.arange(self.n - 1)
        q[..., i, i + 1] = (1 + y**2)[..., None]
        q[..., i + 1, i] = 1.0
        return from_off_diagonal(q)

    def rates_dy(self, y):
        y = _slow(y)
        d = np.zeros(y.shape + (1, self.n, self.n))
        i = np.arange(self.n - 1)
        d[..., 0, i, i + 1] = (2 * y)[..., None]
        d[..., 0, i, i] = -(2 * y)[..., None]
        return d

    def chain_rates(self, dtype=None, device="cpu", batch_last=False, scale=None):
        scale = 1.0 if scale is None else scale
        link = (self.n - 1, 1) if batch_last else (1, self.n - 1)
        down = torch.full(link, scale, dtype=dtype or torch.float64, device=device)

        def rates(y, derivative=True):
            up = (scale * (1 + y**2)).expand(*((self.n - 1, -1) if batch_last else (-1, self.n - 1)))
            return up, down, ((2 * scale * y).expand_as(up) if derivative else None)

        return rates


def _system(gen, eps):
    n = gen.n_states
    return MasterEquationSystem(gen, LinearSlowLaw(np.arange(n) / (n - 1)), eps,
                                x0=np.eye(n)[0], y0=np.array([0.4]))  # fmt: skip


_REFERENCE = {}


def _reference(system):
    if system.name not in _REFERENCE:
        _REFERENCE[system.name] = fs.integrate(system, (0, 0.5), method="radau", rtol=1e-12,
                                               atol=1e-14, n_eval=3)  # fmt: skip
    return _REFERENCE[system.name]


@pytest.mark.parametrize("gen", [Triangle(), SquareChain()], ids=["dense", "chain"])
@pytest.mark.parametrize("method", [m for m in METHODS])
def test_a_generator_written_outside_the_package_runs_with_every_method(gen, method):
    system = _system(gen, 0.125)  # P = 8 for the multirate map; mildly stiff for the others
    kwargs = {"H": 0.01} if method == "multirate" else {}
    rtol = 1e-5 if method == "adaptive_heun" else 1e-7  # order 2: 1e-7 takes 1e5 steps
    ds = fs.integrate(system, (0, 0.5), method=method, rtol=rtol, atol=rtol * 1e-3, n_eval=3,
                      **kwargs)  # fmt: skip
    assert ds.attrs["status"] == "success"
    y, y_ref = ds["y"].values[-1, 0], _reference(system)["y"].values[-1, 0]
    # the map is first order in H (DESIGN 3.3): its error at H = 0.01 is O(1e-3); every ODE
    # solver lands within 100 rtol of the tight Radau solution
    assert abs(y - y_ref) < (2e-2 if method == "multirate" else 100 * rtol)
    assert np.max(np.abs(ds["mass_error"].values)) < 1e-10


def test_the_torch_forms_of_the_new_generators_match_their_numpy_rates():
    y = torch.tensor([[0.3], [-0.8]], dtype=torch.float64)
    for gen in (Triangle(), SquareChain()):
        Q, dQ = gen.torch_rates(y, derivative=True)
        np.testing.assert_allclose(Q.numpy(), gen.rates(y.numpy()), rtol=1e-14)
        np.testing.assert_allclose(dQ.numpy(), gen.rates_dy(y.numpy())[:, 0], rtol=1e-14)
    assert _system(SquareChain(), 0.1).torch_functions().structure == "arrow"
    assert _system(Triangle(), 0.1).torch_functions().structure == "dense"


def _implicit_euler_one(system, z0, t_eval, rtol, atol, steps_per_output=200):
    """Fixed-step backward Euler with Newton on the system's numpy Jacobian (a toy method)."""
    z, out = z0.copy(), [z0.copy()]
    for t0, t1 in zip(t_eval[:-1], t_eval[1:]):
        h = (t1 - t0) / steps_per_output
        for _ in range(steps_per_output):
            w = z.copy()
            for _ in range(3):
                w -= np.linalg.solve(np.eye(z.size) - h * system.jacobian(0, w),
                                     w - z - h * system.rhs(0, w))  # fmt: skip
            z = w
        out.append(z.copy())
    return np.array(out), "success", "done", {"nfev": 3 * steps_per_output * (len(t_eval) - 1)}


@pytest.fixture
def implicit_euler():
    register(Method("implicit-euler", "numpy", True, "backward Euler, fixed steps",
                    per_trajectory(_implicit_euler_one), options=("steps_per_output",)))  # fmt: skip
    yield
    del METHODS["implicit-euler"]


def test_a_solver_method_registered_outside_the_package(implicit_euler):
    system = fs.make_system("birth-death", eps=0.1)
    x0, y0 = fs.random_initial_conditions(system, 3, seed=0)
    ds = fs.integrate(system, (0, 1), x0, y0, method="implicit-euler", n_eval=3,
                      steps_per_output=100)  # fmt: skip
    ref = fs.integrate(system, (0, 1), x0, y0, method="radau", rtol=1e-11, atol=1e-13, n_eval=3)
    err = np.abs(ds["y"].values - ref["y"].values).max()
    assert ds.attrs["method"] == "implicit-euler" and list(ds["status"].values) == ["success"] * 3
    assert 1e-6 < err < 1e-2  # first order at h = 1/200: an O(h) error, not round-off
    with pytest.raises(fs.InputError, match="takes no option 'H'"):
        fs.integrate(system, (0, 1), method="implicit-euler", H=0.1)


def test_torchdiffeq_methods_are_differentiable():
    from fastslow_sim.solvers.torchdiffeq_ode import odeint_system

    system = fs.make_system("birth-death", eps=0.2)
    t = torch.tensor([0.0, 0.5], dtype=torch.float64)

    def final_y(y0, rtol=1e-10):
        z0 = torch.cat([torch.as_tensor(system.x0, dtype=torch.float64), y0])
        return odeint_system(system, z0, t, "dopri5", rtol=rtol, atol=rtol * 1e-2)[-1, -1]

    y0 = torch.tensor([0.6], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(final_y(y0), y0)
    d = 1e-5
    with torch.no_grad():
        y_plus, y_minus = (torch.tensor([0.6 + s * d], dtype=torch.float64) for s in (1, -1))
        fd = (final_y(y_plus) - final_y(y_minus)) / (2 * d)
    assert 0 < float(grad) and abs(float(grad) - float(fd)) <= 1e-6 * abs(float(fd))
    ds = fs.integrate(system, (0, 0.5), method="dopri5", n_eval=3)
    assert ds.attrs["differentiable"] == 1


def test_odeint_system_max_steps_bounds_the_whole_run():
    """odeint_system's max_steps was torchdiffeq's bound between two saved times: over 101
    saved times of the two-state system (eps 0.5; 60 dopri5 steps in all, at most 2 between two
    saved times) max_steps=5 let it finish. It now bounds the whole run and says where it
    stopped; a budget beyond torchdiffeq's int32 bound (2**40) no longer fails ('value cannot be
    converted to type int32 without overflow', status error in integrate)."""
    from fastslow_sim.solvers.torchdiffeq_ode import MaxStepsError, odeint_system

    system = fs.make_system("two-state", eps=0.5)
    z0 = torch.tensor([1.0, 0.0, 0.9], dtype=torch.float64)
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    full = odeint_system(system, z0, t, max_steps=2**40)
    assert full.shape == (101, 3) and torch.isfinite(full).all()
    with pytest.raises(MaxStepsError, match=r"^dopri5 stopped after max_steps = 5 steps at t = "):
        odeint_system(system, z0, t, max_steps=5)
    ds = fs.integrate(system, (0, 1), method="dopri5", max_steps=2**40, n_eval=5)
    assert ds.attrs["status"] == "success", ds.attrs["message"]
