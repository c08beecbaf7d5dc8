"""scipy's `solve_ivp`: Radau, BDF and LSODA (implicit, given the system's analytic Jacobian),
RK45 and DOP853 (explicit).

The first step: scipy's own (`select_initial_step`, Hairer's; LSODA's in its Fortran) squares the
derivative over the tolerance, which overflows beyond 1e154 (rates near 1e174 over `atol` 1e-10:
the birth-death chain at y = 100) and makes it 0, so that the solver stopped with NaN or, LSODA,
marched at t = 0 for ever. Where that happens, `solvers.first_step` gives Hairer's step computed
without overflow; elsewhere scipy chooses, as before.

Radau's Jacobian: scipy's Radau evaluates it again only when Newton's iteration converges slowly
or fails, never when the error test rejects a step, which Hairer's RADAU5 does (Solving ODEs II,
IV.8). In a fast-slow system the Jacobian's coupling of the slow variable to the fast ones,
`(dQ/dy) x / eps`, follows `x`: on the birth-death chain at `y0 = 100` it is 1e174 at `x0` (all
mass in state 0) and about 1 on the slow manifold. scipy kept the one from `t = 0` after the layer;
its error estimate, solved with that matrix, amplified rounding to rejections without end (the step
near 1e-77 at `t ~ 1e-74`, the mass drifting 1e-6). Here, as in RADAU5, a step that was rejected
evaluates the Jacobian again (for the next step) unless it is current.

The work: every method stops after `max_steps` steps (status `max_steps`, the rodas4 and
torchdiffeq status), with a message that says how to raise it, so that no solve runs for ever.
"""

from __future__ import annotations

import numpy as np

from ..validation import positive_int
from . import Method, first_step, per_trajectory, register

# a bound on the work, not on accuracy: 16 times the most steps of an ordinary run (the README's
# commands and the tests': lsoda 12,267 over t in [0, 20], radau 8,406 on VDPOL at rtol 1e-10);
# it lets an explicit method run to a stiffness index of 6.6e5 (rk45's step 3.3 / S), and at 0.1
# to 0.7 ms a step (radau, 9 states) a run that spends it stops within about two minutes
MAX_STEPS = 200_000


def _budgeted(solver_class, name, max_steps):
    """`solver_class` (a scipy `OdeSolver`) that fails after `max_steps` steps (and says so in
    `spent`, a one-element list) and, Radau, evaluates its Jacobian again after a rejected step
    (see the module docstring)."""
    spent = [False]

    class Solver(solver_class):
        def _step_impl(self):
            self._steps = getattr(self, "_steps", 0) + 1
            if self._steps > max_steps:
                spent[0] = True
                return False, (
                    f"{name} stopped after max_steps = {max_steps} steps at t = {self.t:.6g}, "
                    f"the budget that bounds its work; raise it with integrate(..., "
                    f"max_steps=N) if the run is slow but advancing."
                )
            if solver_class.__name__ != "Radau":
                return super()._step_impl()
            h_tried, t = self.h_abs, self.t
            success, message = super()._step_impl()
            # a step shorter than the one tried, and not cut at t_bound, was rejected
            if (success and self.t != self.t_bound and abs(self.t - t) < h_tried
                    and not self.current_jac):  # fmt: skip
                self.J = self.jac(self.t, self.y, self.f)
                self.current_jac = True
                self.LU_real = self.LU_complex = None
            return success, message

    Solver.__name__ = solver_class.__name__
    return Solver, spent


def _solve_one(name, scipy_name, explicit, order):
    def solve_one(system, z0, t_eval, rtol, atol, max_steps=None):
        import scipy.integrate
        from scipy.integrate import solve_ivp

        max_steps = positive_int("max_steps", MAX_STEPS if max_steps is None else max_steps)
        solver, spent = _budgeted(getattr(scipy.integrate, scipy_name), name, max_steps)
        kwargs = {} if explicit else {"jac": system.jacobian}
        t0, t1 = t_eval[0], t_eval[-1]
        h = first_step(system.rhs, t0, z0, t1, order, rtol, atol)
        if h is not None:
            kwargs["first_step"] = h
        sol = solve_ivp(system.rhs, (t0, t1), z0, method=solver, t_eval=t_eval, rtol=rtol,
                        atol=atol, **kwargs)  # fmt: skip
        z = np.full((len(t_eval), len(z0)), np.nan)
        if len(sol.t):  # (sol.y is an empty list when no output time was reached)
            z[: len(sol.t)] = np.asarray(sol.y).T
        status = "success" if sol.status == 0 else "failed"
        if spent[0]:
            status = "max_steps"
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
    register(Method(_name, "scipy", _stiff, _text, _solve_one(_name, _scipy, not _stiff, _order),
                    options=("max_steps",), explicit_stability=_stab))  # fmt: skip
