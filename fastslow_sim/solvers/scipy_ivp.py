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


def _solve_one(scipy_name, explicit, order):
    def solve_one(system, z0, t_eval, rtol, atol):
        from scipy.integrate import solve_ivp

        kwargs = {} if explicit else {"jac": system.jacobian}
        t0, t1 = t_eval[0], t_eval[-1]
        h = first_step(system.rhs, t0, z0, t1, order, rtol, atol)
        if h is not None:
            kwargs["first_step"] = h
        sol = solve_ivp(system.rhs, (t0, t1), z0, method=scipy_name, t_eval=t_eval, rtol=rtol,
                        atol=atol, **kwargs)  # fmt: skip
        z = np.full((len(t_eval), len(z0)), np.nan)
        if len(sol.t):  # (sol.y is an empty list when no output time was reached)
            z[: len(sol.t)] = np.asarray(sol.y).T
        status = "success" if sol.status == 0 else "failed"
        stats = {"nfev": int(sol.nfev), "njev": int(sol.njev), "nlu": int(sol.nlu)}
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
