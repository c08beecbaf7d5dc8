"""scipy's `solve_ivp`: Radau, BDF and LSODA (implicit, given the system's analytic Jacobian),
RK45 and DOP853 (explicit)."""

from __future__ import annotations

import numpy as np

from . import Method, per_trajectory, register


def _solve_one(scipy_name, explicit):
    def solve_one(system, z0, t_eval, rtol, atol):
        from scipy.integrate import solve_ivp

        kwargs = {} if explicit else {"jac": system.jacobian}
        sol = solve_ivp(system.rhs, (t_eval[0], t_eval[-1]), z0, method=scipy_name,
                        t_eval=t_eval, rtol=rtol, atol=atol, **kwargs)  # fmt: skip
        z = np.full((len(t_eval), len(z0)), np.nan)
        z[: sol.y.shape[1]] = sol.y.T
        status = "success" if sol.status == 0 else "failed"
        stats = {"nfev": int(sol.nfev), "njev": int(sol.njev), "nlu": int(sol.nlu)}
        return z, status, str(sol.message), stats

    return per_trajectory(solve_one)


for _name, _scipy, _stiff, _text, _stab in [
    ("radau", "Radau", True, "implicit Runge-Kutta, order 5, stiff", None),
    ("bdf", "BDF", True, "backward differentiation, orders 1-5, stiff", None),
    ("lsoda", "LSODA", True, "Adams/BDF with automatic switching", None),
    ("rk45", "RK45", False, "explicit Dormand-Prince 5(4), non-stiff", (3.3, 6)),
    ("dop853", "DOP853", False, "explicit order 8, non-stiff", (6.0, 12)),
]:
    register(Method(_name, "scipy", _stiff, _text, _solve_one(_scipy, not _stiff),
                    explicit_stability=_stab))  # fmt: skip
