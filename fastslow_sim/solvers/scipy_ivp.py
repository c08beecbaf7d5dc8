"""scipy's `solve_ivp`: Radau, BDF and LSODA (implicit, given the system's analytic Jacobian),
RK45 and DOP853 (explicit).

The first step: scipy's own (`select_initial_step`, Hairer's; LSODA's in its Fortran) squares the
derivative over the tolerance, which overflows beyond 1e154 (rates near 1e174 over `atol` 1e-10:
the birth-death chain at y = 100) and makes it 0, so that the solver stopped with NaN or, LSODA,
marched at t = 0 for ever. Where that happens, `solvers.first_step` gives Hairer's step computed
without overflow; elsewhere scipy chooses, as before.

The Jacobian of Radau and BDF: scipy evaluates it again only when Newton's iteration fails (and
Radau also when it converges slowly in more than two iterations), never after a rejected or an
accepted step as Hairer's RADAU5 may. In a fast-slow system whose rates change by orders of
magnitude the Jacobian it keeps can be far too large: its Newton updates, divided by it, are then
tiny, so Newton's test on their size passes at once without solving the stage equations, and the
error estimate, solved with it too, passes as well. On the birth-death chain at `y0 = 100`
(coupling `(dQ/dy) x / eps` of y to x 1e174 at `x0` and ~1 on the manifold, rates 1e173 falling
to 1e3 as y decays) Radau rejected steps near 1e-77 at `t ~ 1e-74` for ever, and where the run
went on x stayed frozen in the top state as y fell: at t = 5 both methods were off the manifold by
0.019 and y off by 2e-4 at rtol 1e-10 (from `y0 = 30` at the default tolerances, bdf by 0.06 in x
and 3.5e-3 in y, radau by 4e-3 and 7e-5). Evaluating it after every accepted step (RADAU5's
`THET < 0`) fixed that but made every step factorise again, 3-5 times the cost on large
systems (radau on the default chain of 256 states over [0, 10]: 748 LU, where scipy's own rule
takes 100). Here BDF keeps a Jacobian after every accepted step (one real LU a step: 6.8 s at
1,024 states, 3.7 s with the stale test below), and Radau, whose complex factorisation makes
that rule cost 3-5 times, evaluates it again after an accepted step only:

- when scipy factorises again anyway (the step size changed): the new factorisation takes the
  Jacobian of the new point (O(n^2) next to its O(n^3));
- when the one in use no longer gives the change of `f` over the step (`_stale_jacobian`),
  `|df - J dz| > (|df| + |J dz|) / 2` in the error weights `atol + rtol |z|` (a max norm: no
  square to overflow): `J dz` is then off by about its own size, as on the chain where the
  rates fell by e^4 per unit of y;
- and at the latest `JAC_MAX_AGE = 10` accepted steps after the last one, in case the steps
  move the state only along directions where the old Jacobian is still right.

Why not the same rule for both (stop-28 review, measured): with the test and an age of 50, BDF
took 20 and 4 times the evaluations of a Jacobian per step on the random chain of 64 and 128
states, eps 1e-6, over [0, 20] (nfev 38,117 against 1,874; 39,114 against 9,991), and Radau
at an age of 50 lost mass to 3.5e-6 on the default chain at eps 1e-10 from y0 = 60 over
[0, 20] (1.1e-9 at an age of 10).
On the chain of 256 states over [0, 10] Radau takes 56 Jacobians and 110 LU (375 and 748 with
one a step, 12 and 100 by scipy's rule); y(5) from `y0 = 30` and `100` agrees with rodas4's to
about 3e-9 (radau) and 3e-7 (bdf). Still open: on that chain at eps 1e-10 from y0 = 150 Radau
loses mass to 5.9e-6 (3.1e-7 with a Jacobian a step), reported as success, and BDF from y0 = 60
fails there (status failed).

The work: every method stops after `max_steps` steps (status `max_steps`, the rodas4 and
torchdiffeq status), with a message that says how to raise it, so that no solve runs for ever.
"""

from __future__ import annotations

import numpy as np

from ..validation import positive_int
from . import (
    ATOL_ANY,
    ATOL_TESTED,
    Method,
    first_step,
    max_steps_message,
    per_trajectory,
    register,
)

_UROUND = 2.0**-52
# solve_ivp raises a smaller rtol to this, with a warning (scipy's `validate_tol`, `100 * EPS`)
RTOL_MIN = 100 * np.finfo(np.float64).eps


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
    with np.errstate(divide="ignore"):  # log s, finite where s = |f0| / w overflows
        log_s = float(np.max(np.log(np.abs(f0)) - np.log(rtol * np.abs(z0) + atol)))
    terms = [-np.log(tol) - 2 * np.log(w0)] + ([np.log(tol) + 2 * log_s] if s > 0 else [])
    h0 = float(np.exp(-0.5 * np.logaddexp.reduce(terms)))
    return min(h0, tdist) if h0 > 0 else tdist


# a bound on the work, not on accuracy: 16 times the most steps of an ordinary run (the README's
# commands and the tests': lsoda 12,267 over t in [0, 20], radau 8,406 on VDPOL at rtol 1e-10);
# it lets an explicit method run to a stiffness index of 6.6e5 (rk45's step 3.3 / S), and at 0.1
# to 0.7 ms a step (radau, 9 states) a run that spends it stops within about two minutes
MAX_STEPS = 200_000


# the Jacobian of radau and bdf is evaluated again at the latest this many accepted steps after
# the last evaluation (see the module docstring)
JAC_MAX_AGE = 10


def _stale_jacobian(jac, dz, df, z_old, z_new, rtol, atol) -> bool:
    """Whether the Jacobian `jac` in use fails to give the change `df` of the right-hand side over
    a step `dz` from `z_old` to `z_new`: `|df - jac dz| > (|df| + |jac dz|) / 2` in the max norm
    weighted by `atol + rtol max(|z_old|, |z_new|)`, the solver's error weights (or not finite)."""
    w = atol + rtol * np.maximum(np.abs(z_old), np.abs(z_new))
    with np.errstate(all="ignore"):
        jdz = jac @ dz
        miss = np.max(np.abs((df - jdz) / w))
        size = np.max(np.abs(df / w)) + np.max(np.abs(jdz / w))
    return not (np.isfinite(miss) and miss <= 0.5 * size)


def _budgeted(solver_class, name, max_steps):
    """`solver_class` (a scipy `OdeSolver`) that fails after `max_steps` steps (and says so in
    `spent`, a one-element list) and, Radau and BDF, evaluates its Jacobian again after an
    accepted step where it is stale (see the module docstring)."""
    spent = [False]
    radau = solver_class.__name__ == "Radau"
    implicit = solver_class.__name__ in ("Radau", "BDF")

    class Solver(solver_class):
        def _step_impl(self):
            self._steps = getattr(self, "_steps", 0) + 1
            if self._steps > max_steps:
                spent[0] = True
                return False, max_steps_message(name, max_steps, self.t)
            if not implicit or self.jac is None:
                return super()._step_impl()
            z_old, f_old = self.y.copy(), (self.f if radau else None)  # Radau keeps f
            try:
                success, message = super()._step_impl()
            except ValueError as err:  # scipy's LU of a matrix that overflowed
                if "infs or NaNs" not in str(err):
                    raise
                return False, self._overflow_message()
            if success:
                self._check_jacobian(z_old, f_old)
            return success, message

        def _overflow_message(self):
            """What overflowed where, in place of scipy's 'array must not contain infs or NaNs'
            (radau on the birth-death chain from y = 176, where |z| atol / |f| is below 1e-307,
            steps whose 1/h, times the Jacobian's scale, is beyond float64)."""
            with np.errstate(all="ignore"):
                size, inv = float(np.max(np.abs(self.J))), 1.0 / self.h_abs
            # a subnormal h (4.97e-309 from y0 = 170 at eps 1e-12) has 1/h beyond float64: a bound
            inv_text = f"1/h = {inv:.3g}" if np.isfinite(inv) else "1/h above 1.8e308"
            return (
                f"{name} stopped at t = {self.t:.6g}: its Newton iteration overflowed float64 "
                f"(largest 1.8e308) with steps h near {self.h_abs:.3g} ({inv_text}) and "
                f"a Jacobian of entries up to {size:.3g}; the rates are too close to the float "
                f"range for this method."
            )

        def _check_jacobian(self, z_old, f_old):
            """After an accepted step: a fresh Jacobian where it is stale (module docstring)."""
            self._jac_age = getattr(self, "_jac_age", 0) + 1
            if radau and self.current_jac:  # scipy evaluated it at this point
                self._jac_age = 0
                return
            refactor = (self.LU_real if radau else self.LU) is None
            # BDF: a Jacobian every accepted step (one real LU a step); with the test below it
            # took 7-27 times the evaluations on the random chain of 64-128 states over [0, 20]
            if radau and not refactor and self._jac_age < JAC_MAX_AGE:
                dz = self.y - z_old
                if not _stale_jacobian(self.J, dz, self.f - f_old, z_old, self.y,
                                       self.rtol, self.atol):  # fmt: skip
                    return
            self._jac_age = 0
            if radau:
                self.J = self.jac(self.t, self.y, self.f)
                self.current_jac = True
                self.LU_real = self.LU_complex = None
            else:
                self.J = self.jac(self.t, self.y)
                self.LU = None

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
        sol = solve_ivp(system.rhs, (t0, t1), z0, method=solver, t_eval=t_eval, rtol=rtol,
                        atol=atol, **kwargs)  # fmt: skip
        z = np.full((len(t_eval), len(z0)), np.nan)
        if len(sol.t):  # (sol.y is an empty list when no output time was reached)
            z[: len(sol.t)] = np.asarray(sol.y).T
        status = "success" if sol.status == 0 else "failed"
        if spent[0]:
            status = "max_steps"
        stats = {"nfev": int(sol.nfev) + starts, "njev": int(sol.njev), "nlu": int(sol.nlu)}
        return z, status, str(sol.message), stats

    return per_trajectory(solve_one)


# the order that scipy's starting step takes: its error estimator's (Radau 3, BDF 1, RK45 4,
# DOP853 7); LSODA, which starts at order 1, 1
# the atol floors (`Method.atol_min`): DOP853's error norm squares the error over atol
# (`np.linalg.norm(err / scale) ** 2`), and round-off over atol then overflows
_DOP853_WHY = (
    "it was tested down to 1e-155; at 1e-170 on the default run its error norm, the error over "
    "atol squared, overflows float64 and the run fails"
)
_FLOORS = {
    "radau": (ATOL_TESTED, "it was tested down to 1e-300; at 2.2e-308 from eps 1e-8 its Newton "
              "iteration overflows float64 and the run fails"),
    "bdf": (ATOL_TESTED, "it was tested down to 1e-300; at 5e-324 from eps 1e-8 its Newton "
            "iteration overflows float64 and the run fails"),
    "lsoda": (ATOL_TESTED, "it was tested down to 1e-300; at 5e-324 it takes no step from t = 0 "
              "and the run fails"),
    "dop853": (1e-155, _DOP853_WHY),
    "rk45": (ATOL_ANY, "it was tested down to 5e-324, the smallest positive float64"),
}  # fmt: skip

for _name, _scipy, _stiff, _text, _stab, _order in [
    ("radau", "Radau", True, "implicit Runge-Kutta, order 5, stiff", None, 3),
    ("bdf", "BDF", True, "backward differentiation, orders 1-5, stiff", None, 1),
    ("lsoda", "LSODA", True, "Adams/BDF with automatic switching", None, 1),
    ("rk45", "RK45", False, "explicit Dormand-Prince 5(4), non-stiff", (3.3, 6), 4),
    ("dop853", "DOP853", False, "explicit order 8, non-stiff", (6.0, 12), 7),
]:
    register(Method(_name, "scipy", _stiff, _text, _solve_one(_name, _scipy, not _stiff, _order),
                    options=("max_steps",), explicit_stability=_stab,
                    atol_min=_FLOORS[_name][0], atol_why=_FLOORS[_name][1],
                    rtol_min=RTOL_MIN))  # fmt: skip
