"""scipy's `solve_ivp`: Radau, BDF and LSODA (implicit, given the system's analytic Jacobian),
RK45 and DOP853 (explicit).

The first step: scipy's own (`select_initial_step`, Hairer's; LSODA's in its Fortran) squares the
derivative over the tolerance, which overflows beyond 1e154 (rates near 1e174 over `atol` 1e-10:
the birth-death chain at y = 100) and makes it 0, so that the solver stopped with NaN or, LSODA,
marched at t = 0 for ever. Where that happens, `solvers.first_step` gives Hairer's step computed
without overflow; elsewhere scipy chooses, as before.
"""

from __future__ import annotations

import numpy as np

from . import Method, first_step, per_trajectory, register

_UROUND = 2.0**-52


def lsoda_first_step(f0, z0, t0, t1, rtol, atol) -> float | None:
    """LSODA's first step where its own choice breaks in float64, else `None` (LSODA then
    chooses it, as always).

    ODEPACK's LSODA starts with `h0 = 1/sqrt(1/(tol w0^2) + tol s^2)`, `w0 = max(|t0|, |t1|)`,
    `tol = rtol` clipped to `[100 uround, 1e-3]` and `s = max_i |f0_i| / (rtol |z0_i| + atol_i)`.
    When `1/(tol w0^2)` overflows (a span below about 1e-147 at rtol 1e-9) or `s^2` does (a slope
    over the error weight beyond 1.3e154: atol 1e-160 on a state entry at zero), `h0` is
    `1/sqrt(inf) = 0` and LSODA steps by zero forever. The same formula is evaluated here in
    logarithms, which do not overflow, and handed to LSODA as its first step (at most the span;
    LSODA adapts the steps after it)."""
    tol = np.float64(min(max(rtol, 100 * _UROUND), 1e-3))
    w0, tdist = np.float64(max(abs(t0), abs(t1))), float(t1 - t0)
    with np.errstate(all="ignore"):
        s = float(np.max(np.abs(f0) / (rtol * np.abs(z0) + atol)))
        direct = 1.0 / (tol * w0 * w0) + tol * s * s
    if np.isfinite(direct) and direct > 0 and 1.0 / np.sqrt(direct) > 0:
        return None
    terms = [-np.log(tol) - 2 * np.log(w0)] + ([np.log(tol) + 2 * np.log(s)] if s > 0 else [])
    h0 = float(np.exp(-0.5 * np.logaddexp.reduce(terms)))
    return min(h0, tdist) if h0 > 0 else tdist


def _solve_one(scipy_name, explicit, order):
    def solve_one(system, z0, t_eval, rtol, atol):
        from scipy.integrate import solve_ivp

        kwargs = {} if explicit else {"jac": system.jacobian}
        t0, t1 = t_eval[0], t_eval[-1]
        starts = 0  # right-hand sides evaluated here to choose the first step, counted in nfev

        def rhs(t, z):
            nonlocal starts
            starts += 1
            return system.rhs(t, z)

        # each method's own starting-step formula, evaluated without overflow where its own
        # evaluation overflows (rates near 1e174; for LSODA also spans below 1e-147)
        if scipy_name == "LSODA":
            h = lsoda_first_step(rhs(t0, z0), z0, t0, t1, rtol, atol)
        else:  # scipy's select_initial_step (Hairer's) for RK45, DOP853, BDF and Radau
            h = first_step(rhs, t0, z0, t1, order, rtol, atol)
        if h is not None:
            kwargs["first_step"] = h
        sol = solve_ivp(system.rhs, (t0, t1), z0, method=scipy_name, t_eval=t_eval, rtol=rtol,
                        atol=atol, **kwargs)  # fmt: skip
        z = np.full((len(t_eval), len(z0)), np.nan)
        if len(sol.t):  # (sol.y is an empty list when no output time was reached)
            z[: len(sol.t)] = np.asarray(sol.y).T
        status = "success" if sol.status == 0 else "failed"
        stats = {"nfev": int(sol.nfev) + starts, "njev": int(sol.njev), "nlu": int(sol.nlu)}
        return z, status, str(sol.message), stats

    return per_trajectory(solve_one)


# the order that scipy's starting step takes: its error estimator's (Radau 3, BDF 1, RK45 4,
# DOP853 7); LSODA, which starts at order 1, 1
for _name, _scipy, _stiff, _text, _stab, _order in [
    ("radau", "Radau", True, "implicit Runge-Kutta, order 5, stiff", None, 3),
    ("bdf", "BDF", True, "backward differentiation, orders 1-5, stiff", None, 1),
    ("lsoda", "LSODA", True, "Adams/BDF with automatic switching", None, 1),
    ("rk45", "RK45", False, "explicit Dormand-Prince 5(4), non-stiff", (3.3, 6), 4),
    ("dop853", "DOP853", False, "explicit order 8, non-stiff", (6.0, 12), 7),
]:
    register(Method(_name, "scipy", _stiff, _text, _solve_one(_scipy, not _stiff, _order),
                    explicit_stability=_stab))  # fmt: skip
