"""torchdiffeq's explicit methods on the system's torch vector field: differentiable.

`odeint_system` returns a torch tensor with its graph (gradients with respect to the initial
state, `eps` or tensor parameters of the generator); `integrate` calls it without a graph. A
system without a torch form runs on its numpy right-hand side, and its dataset says
`differentiable = 0`.
"""

from __future__ import annotations

import numpy as np

from . import (
    ATOL_TESTED,
    Method,
    first_step,
    max_steps_message,
    per_trajectory,
    register,
)

# torchdiffeq keeps its own bound on the steps between two saved times in an int32 (a larger one
# raised 'value cannot be converted to type int32 without overflow'); the budget here counts the
# whole run, and torchdiffeq's bound is set above it, up to this
_TORCHDIFFEQ_MAX_NUM_STEPS = 2**31 - 1


class MaxStepsError(RuntimeError):
    """A torchdiffeq run spent its `max_steps`; `t` is the time it had reached (the end of its
    last accepted step)."""

    def __init__(self, message, t):
        super().__init__(message)
        self.t = t


def _odeint_budgeted(func, z0, t, rtol, atol, method, options, max_steps, name):
    """torchdiffeq's `odeint` that raises `MaxStepsError` when it starts step `max_steps + 1` of
    the whole run (accepted or rejected, as rodas4 counts; torchdiffeq calls `callback_step` of
    `func` before each step it tries)."""
    from torchdiffeq import odeint

    max_steps = int(max_steps)
    steps = 0

    def callback_step(t0, _y0, _dt):
        nonlocal steps
        steps += 1
        if steps > max_steps:
            t_reached = float(t0)
            raise MaxStepsError(max_steps_message(name, max_steps, t_reached), t_reached)

    func.callback_step = callback_step
    options = {**options, "max_num_steps": min(max_steps + 1, _TORCHDIFFEQ_MAX_NUM_STEPS)}
    return odeint(func, z0, t, rtol=rtol, atol=atol, method=method, options=options)


def odeint_system(system, z0, t, method="dopri5", rtol=1e-8, atol=1e-10, max_steps=1_000_000):
    """`z(t) (T, N)` (or `(T, B, N)` for `z0 (B, N)`) by torchdiffeq on the system's torch
    vector field, differentiable in `z0` and in any tensor parameter of the system.

    `max_steps` bounds the steps (accepted or rejected) of the whole run, as for every method of
    `integrate`; a run that spends it raises `MaxStepsError` (a `RuntimeError` that says the time
    reached). Until 2026-12 it bounded the steps between two saved times (torchdiffeq's
    `max_num_steps`, an `AssertionError`), so that a run of T saved times could take up to
    (T - 1) max_steps steps."""
    field = system.torch_functions(z0.dtype, z0.device, structured=False)
    single = z0.ndim == 1

    def func(_t, z):
        zb = z[:, None] if single else z.T
        dz = field.fun(zb, None)
        return dz[:, 0] if single else dz.T

    return _odeint_budgeted(func, z0, t, rtol, atol, method, {}, max_steps, method)


def _solve_one(name, order):
    def solve_one(system, z0, t_eval, rtol, atol, max_steps=1_000_000):
        import torch

        nfev = 0
        if system.has_torch_form():
            field = system.torch_functions(structured=False)

            def rhs(z):
                return field.fun(z[:, None], None)[:, 0]
        else:  # numpy right-hand side: no gradient flows

            def rhs(z):
                return torch.from_numpy(system.rhs(0.0, z.numpy()))

        def func(_t, z):
            nonlocal nfev
            nfev += 1
            return rhs(z)

        z = np.full((len(t_eval), len(z0)), np.nan)
        options = {}
        # torchdiffeq's starting step squares f(z0) / atol: where that overflows (it made the
        # step 0: 'underflow in dt 0.0'), the same step computed without overflow
        h = first_step(system.rhs, t_eval[0], z0, t_eval[-1], order - 1, rtol, atol)
        if h is not None:
            options["first_step"] = h

        def run(times):
            with torch.no_grad():
                return _odeint_budgeted(func, torch.from_numpy(np.array(z0)),
                                        torch.from_numpy(times), rtol, atol, name, options,
                                        max_steps, name).numpy()  # fmt: skip

        try:
            z[:] = run(t_eval)
            status, message = "success", "integration finished"
        except MaxStepsError as spent:
            status, message = "max_steps", str(spent)
            # the saved times it passed, as the other methods keep them: torchdiffeq returns
            # nothing from a run that stops, so the run is repeated up to the last of them, with
            # the same steps (they do not depend on the last saved time), hence the same values
            passed = int(np.searchsorted(t_eval, spent.t, side="right"))
            z[0] = z0
            counted = nfev  # the run's evaluations: the repeat's are not the run's work
            if passed > 1:
                try:
                    z[:passed] = run(t_eval[:passed])
                except (MaxStepsError, AssertionError):  # not expected: the first run got there
                    z[1:passed] = np.nan
            nfev = counted
        except AssertionError as err:  # torchdiffeq reports failures by assert
            text = str(err)
            status = "max_steps" if "max_num_steps" in text else "step_underflow"
            message = f"torchdiffeq stopped: {text}"
            if status == "max_steps":  # torchdiffeq's own bound, 2**31 - 1 steps between two
                message += (  # saved times, reached before a budget above it
                    f" (torchdiffeq's own bound of {_TORCHDIFFEQ_MAX_NUM_STEPS:,} steps between "
                    f"two saved times)"
                )
        if status == "success" and not np.all(np.isfinite(z)):
            status, message = "non_finite", "the solution became non-finite"
        return z, status, message, {"nfev": nfev, "njev": 0, "nlu": 0}

    return per_trajectory(solve_one)


# the atol floor (`Method.atol_min`)
_ATOL_WHY = (
    "it was tested down to 1e-300; at 5e-324 from eps 1e-8 torchdiffeq stops with 'underflow in "
    "dt 0.0'"
)

for _name, _text, _stab, _order in [
    ("dopri5", "torchdiffeq Dormand-Prince 5(4)", (3.3, 6), 5),
    ("dopri8", "torchdiffeq Dormand-Prince 8(7)", (6.0, 13), 8),
    ("bosh3", "torchdiffeq Bogacki-Shampine 3(2)", (2.5, 3), 3),
    ("adaptive_heun", "torchdiffeq Heun 2(1)", (2.0, 2), 2),
]:
    register(Method(_name, "torchdiffeq", False, _text + "; differentiable (odeint_system)",
                    _solve_one(_name, _order), options=("max_steps",), differentiable=True,
                    explicit_stability=_stab, atol_min=ATOL_TESTED, atol_why=_ATOL_WHY))  # fmt: skip
