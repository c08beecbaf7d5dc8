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
    MAX_STEPS_HINT,
    Method,
    first_step,
    per_trajectory,
    register,
)


def odeint_system(system, z0, t, method="dopri5", rtol=1e-8, atol=1e-10, max_steps=1_000_000):
    """`z(t) (T, N)` (or `(T, B, N)` for `z0 (B, N)`) by torchdiffeq on the system's torch
    vector field, differentiable in `z0` and in any tensor parameter of the system."""
    from torchdiffeq import odeint

    field = system.torch_functions(z0.dtype, z0.device, structured=False)
    single = z0.ndim == 1

    def func(_t, z):
        zb = z[:, None] if single else z.T
        dz = field.fun(zb, None)
        return dz[:, 0] if single else dz.T

    return odeint(func, z0, t, rtol=rtol, atol=atol, method=method,
                  options={"max_num_steps": int(max_steps)})  # fmt: skip


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

        from torchdiffeq import odeint

        z = np.full((len(t_eval), len(z0)), np.nan)
        options = {"max_num_steps": int(max_steps)}
        # torchdiffeq's starting step squares f(z0) / atol: where that overflows (it made the
        # step 0: 'underflow in dt 0.0'), the same step computed without overflow
        h = first_step(system.rhs, t_eval[0], z0, t_eval[-1], order - 1, rtol, atol)
        if h is not None:
            options["first_step"] = h
        try:
            with torch.no_grad():
                out = odeint(func, torch.from_numpy(np.array(z0)), torch.from_numpy(t_eval),
                             rtol=rtol, atol=atol, method=name, options=options)  # fmt: skip
            z[:] = out.numpy()
            status, message = "success", "integration finished"
        except AssertionError as err:  # torchdiffeq reports failures by assert
            text = str(err)
            status = "max_steps" if "max_num_steps" in text else "step_underflow"
            message = f"torchdiffeq stopped: {text}"
            if status == "max_steps":  # torchdiffeq's 'max_num_steps exceeded (...)'
                message += (
                    f" (max_steps = {int(max_steps):,} steps between two saved times, "
                    f"the budget that bounds its work; {MAX_STEPS_HINT})"
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
