"""Published test problems, each against its published or closed-form reference."""

import numpy as np
import pytest
from scipy.special import lambertw

import fastslow_sim as fs
from fastslow_sim import manifold as mf


def test_michaelis_menten_reduced_solution_is_schnell_mendoza():
    """QSS substrate s(t) = K_M W[(s0/K_M) exp((s0 - V t)/K_M)], V = k2 (per enzyme).

    Reference: S. Schnell and C. Mendoza, "Closed form solution for time-dependent enzyme
    kinetics", J. Theor. Biol. 187, 207-212 (1997). Our substrate is measured per enzyme and
    time in units of 1/E0, so the QSS law is dy/dt = -k2 y / (K_M + y).
    """
    system = fs.make_system("michaelis-menten", eps=0.01)
    gen = system.generator
    t = np.linspace(0.0, 6.0, 61)
    y0 = float(system.y0[0])

    def closed_form(t):
        return gen.K_M * lambertw((y0 / gen.K_M) * np.exp((y0 - gen.k2 * t) / gen.K_M)).real

    y_red = mf.integrate_reduced(system, t, rtol=1e-13, atol=1e-15)[:, 0]
    np.testing.assert_allclose(y_red, closed_form(t), rtol=1e-10)

    # the full system approaches it as eps = E0/S0 shrinks, with an O(eps) error
    errs = []
    eps_values = np.array([0.02, 0.01, 0.005])
    for eps in eps_values:
        ds = fs.integrate(
            system.with_eps(eps), (0, 6), method="radau", rtol=1e-10, atol=1e-12, t_eval=t
        )
        errs.append(np.max(np.abs(ds["y"].values[:, 0] - closed_form(t))))
    slope = np.polyfit(np.log(eps_values), np.log(errs), 1)[0]
    assert errs[-1] < 2e-2 and abs(slope - 1.0) < 0.15


def test_davis_skodje_exact_solution_and_slow_manifold():
    """Davis-Skodje: y1' = -y1, y2' = -g y2 + ((g - 1) y1 + g y1^2)/(1 + y1)^2.

    Reference: M. J. Davis and R. T. Skodje, J. Chem. Phys. 111, 859 (1999). The curve
    y2 = y1/(1 + y1) is an exact invariant (slow) manifold; with w = y2 - y1/(1+y1),
    w' = -g w, so y2(t) = z(t) + (y2(0) - z(0)) e^{-g t}, z = y1/(1 + y1), y1 = y1(0) e^{-t}.
    As a fast-slow system: x = y2, y = y1, eps = 1/g.
    """
    gamma = 100.0
    eps = 1.0 / gamma
    system = fs.FastSlowSystem(
        f=lambda x, y: -x + ((1 - eps) * y + y**2) / (1 + y) ** 2,
        g=lambda x, y: -y,
        n_fast=1, n_slow=1, eps=eps,
        f_x=lambda x, y: -np.ones(x.shape + (1,)),
        f_y=lambda x, y: ((1 - eps) + (1 + eps) * y)[..., None] / (1 + y)[..., None] ** 3,
        g_x=lambda x, y: np.zeros(x.shape + (1,)),
        g_y=lambda x, y: -np.ones(y.shape + (1,)),
        x0=np.array([0.0]), y0=np.array([2.0]),
    )  # fmt: skip
    ds = fs.integrate(system, (0, 3), method="radau", rtol=1e-11, atol=1e-13)
    t = ds["time"].values
    y1 = 2.0 * np.exp(-t)
    z = y1 / (1 + y1)
    y2 = z + (0.0 - 2.0 / 3.0) * np.exp(-gamma * t)
    np.testing.assert_allclose(ds["y"].values[:, 0], y1, rtol=1e-8)
    np.testing.assert_allclose(ds["x"].values[:, 0], y2, atol=1e-8)
    late = t > 0.3  # e^{-30}: on the manifold to round-off
    assert np.max(np.abs(ds["x"].values[late, 0] - z[late])) < 1e-9


def _robertson():
    k1, k2, k3 = 0.04, 1e4, 3e7

    def f(x, y):  # fast: x = y2
        return (k1 * y[..., 0] - k2 * x[..., 0] * y[..., 1] - k3 * x[..., 0] ** 2)[..., None]

    def g(x, y):  # slow: y = (y1, y3)
        return np.stack([-k1 * y[..., 0] + k2 * x[..., 0] * y[..., 1], k3 * x[..., 0] ** 2], -1)

    def f_x(x, y):
        return (-k2 * y[..., 1] - 2 * k3 * x[..., 0])[..., None, None]

    def f_y(x, y):
        return np.stack([np.full_like(x[..., 0], k1), -k2 * x[..., 0]], -1)[..., None, :]

    def g_x(x, y):
        return np.stack([k2 * y[..., 1], 2 * k3 * x[..., 0]], -1)[..., :, None]

    def g_y(x, y):
        out = np.zeros(x.shape[:-1] + (2, 2))
        out[..., 0, 0] = -k1
        out[..., 0, 1] = k2 * x[..., 0]
        return out

    return fs.FastSlowSystem(f=f, g=g, n_fast=1, n_slow=2, eps=1.0, f_x=f_x, f_y=f_y, g_x=g_x,
                             g_y=g_y, x0=np.array([0.0]), y0=np.array([1.0, 0.0]))  # fmt: skip


def test_robertson_to_1e11_against_the_ivp_test_set():
    """ROBER from the Test Set for IVP Solvers (F. Mazzia and F. Iavernaro / C. Magherini,
    University of Bari, release 2.4): reference at t = 1e11,
    y = (0.2083340149701255e-07, 0.8333360770334713e-13, 0.9999999791665050)."""
    ref = np.array([0.2083340149701255e-07, 0.8333360770334713e-13, 0.9999999791665050])
    ds = fs.integrate(_robertson(), (0, 1e11), method="radau", rtol=1e-10,
                      atol=[1e-22, 1e-14, 1e-14], t_eval=np.array([0.0, 1e11]))  # fmt: skip
    assert ds.attrs["status"] == "success"
    got = np.array([ds["y"].values[-1, 0], ds["x"].values[-1, 0], ds["y"].values[-1, 1]])
    assert np.max(np.abs(got - ref) / ref) <= 1e-4
    # mass y1 + y2 + y3 = 1 is conserved
    assert abs(got.sum() - 1.0) < 1e-12


def test_stiff_van_der_pol_against_hairer_reference():
    """VDPOL (eps = 1e-6, y(0) = (2, 0), t in [0, 2]) from the Test Set for IVP Solvers, whose
    reference was computed by Hairer's RADAU5 in quadruple precision:
    y(2) = (0.1706167732170483e+01, -0.8928097010247975e+00).
    As a fast-slow system: y = y1 (slow), x = y2 (fast), eps y2' = (1 - y1^2) y2 - y1."""
    eps = 1e-6
    system = fs.FastSlowSystem(
        f=lambda x, y: (1 - y**2) * x - y,
        g=lambda x, y: x,
        n_fast=1, n_slow=1, eps=eps,
        f_x=lambda x, y: (1 - y**2)[..., None],
        f_y=lambda x, y: (-2 * y * x - 1)[..., None],
        g_x=lambda x, y: np.ones(x.shape + (1,)),
        g_y=lambda x, y: np.zeros(y.shape + (1,)),
        x0=np.array([0.0]), y0=np.array([2.0]),
    )  # fmt: skip
    ds = fs.integrate(
        system, (0, 2), method="radau", rtol=1e-10, atol=1e-10, t_eval=np.array([0, 2.0])
    )
    assert ds.attrs["status"] == "success"
    assert ds["y"].values[-1, 0] == pytest.approx(0.1706167732170483e01, rel=1e-9)
    assert ds["x"].values[-1, 0] == pytest.approx(-0.8928097010247975e00, rel=1e-9)
