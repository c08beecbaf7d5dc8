"""One entry point, `integrate(system, t_span, ...)`, over a string registry of methods.

Back-ends
- scipy (`radau`, `bdf`, `lsoda`: implicit/stiff, given the analytic Jacobian; `rk45`,
  `dop853`: explicit);
- torchdiffeq (`dopri5`, `dopri8`, `bosh3`, `adaptive_heun`: explicit, differentiable).

`method="auto"` measures stiffness at the start, `S = max_i |Re lambda_i(J(z0))| * (t1 - t0)`
with `J` the full Jacobian (whose fast eigenvalues scale as `1/eps`). An explicit method needs
at least about `S / 3.3` steps for stability alone (the real stability interval of dopri5), so
`S > 500` (more than ~150 steps, ~900 function evaluations just to stay stable) counts as stiff
and `auto` takes `radau`; otherwise `auto` takes `dop853`. Asking for an explicit method on a
stiff problem issues a `StiffnessWarning` with that cost estimate (DESIGN 4: dopri5 needs about
290,000 evaluations at `eps = 1e-3` on a 16-state birth-death system).

A failed solve does not raise: the dataset's `status` and `message` attributes say why, and the
states after the failure are NaN.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr

from . import __version__
from .errors import InputError

__all__ = ["integrate", "METHODS", "StiffnessWarning", "stiffness_index", "estimate_explicit_nfev"]

STIFF_THRESHOLD = 500.0
# real-axis stability interval and stages of each explicit method
_EXPLICIT = {
    "rk45": (3.3, 6),
    "dop853": (6.0, 12),
    "dopri5": (3.3, 6),
    "dopri8": (6.0, 13),
    "bosh3": (2.5, 3),
    "adaptive_heun": (2.0, 2),
}


@dataclass(frozen=True)
class Method:
    name: str
    backend: str  # "scipy" or "torchdiffeq"
    stiff: bool
    scipy_name: str | None = None
    description: str = ""


METHODS = {
    "auto": Method("auto", "auto", True, None, "radau if stiff, else dop853 (see module doc)"),
    "radau": Method("radau", "scipy", True, "Radau", "implicit Runge-Kutta, order 5, stiff"),
    "bdf": Method("bdf", "scipy", True, "BDF", "backward differentiation, orders 1-5, stiff"),
    "lsoda": Method("lsoda", "scipy", True, "LSODA", "Adams/BDF with automatic switching"),
    "rk45": Method("rk45", "scipy", False, "RK45", "explicit Dormand-Prince 5(4), non-stiff"),
    "dop853": Method("dop853", "scipy", False, "DOP853", "explicit order 8, non-stiff"),
    "dopri5": Method("dopri5", "torchdiffeq", False, None, "torchdiffeq dopri5, differentiable"),
    "dopri8": Method("dopri8", "torchdiffeq", False, None, "torchdiffeq dopri8, differentiable"),
    "bosh3": Method("bosh3", "torchdiffeq", False, None, "torchdiffeq Bogacki-Shampine 3(2)"),
    "adaptive_heun": Method("adaptive_heun", "torchdiffeq", False, None, "torchdiffeq Heun 2(1)"),
}


class StiffnessWarning(UserWarning):
    """An explicit method was asked for on a stiff problem."""


def stiffness_index(system, z0, t_span) -> float:
    """`max |Re lambda(J(z0))| * (t1 - t0)`: how many unit-stability steps an explicit method needs."""
    lam = np.linalg.eigvals(system.jacobian(t_span[0], z0))
    return float(np.max(np.abs(lam.real)) * (t_span[1] - t_span[0]))


def estimate_explicit_nfev(method: str, stiffness: float) -> int:
    """Function evaluations an explicit method needs for stability alone: `stages * S / interval`."""
    interval, stages = _EXPLICIT[method]
    return int(stages * stiffness / interval)


def _check_positive(name, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a positive finite number; got {value!r}.") from None
    if not np.isfinite(v) or v <= 0:
        raise InputError(f"{name} must be a positive finite number; got {value!r}.")
    return v


def _initial_state(system, x0, y0):
    x0 = system.x0 if x0 is None else x0
    y0 = system.y0 if y0 is None else y0
    if x0 is None or y0 is None:
        raise InputError(f"system {system.name!r} has no default x0/y0; pass both explicitly.")
    x0 = np.asarray(x0, dtype=np.float64).reshape(-1)
    y0 = np.asarray(y0, dtype=np.float64).reshape(-1)
    if x0.shape != (system.n_fast,):
        raise InputError(f"x0 must have {system.n_fast} entries; got {x0.shape[0]}.")
    if y0.shape != (system.n_slow,):
        raise InputError(f"y0 must have {system.n_slow} entries; got {y0.shape[0]}.")
    if not np.all(np.isfinite(x0)) or not np.all(np.isfinite(y0)):
        raise InputError(f"x0 and y0 must be finite; got x0={x0.tolist()}, y0={y0.tolist()}.")
    if system.conserves_mass and (np.any(x0 < 0) or abs(x0.sum() - 1.0) > 1e-12):
        raise InputError(
            f"x0 must be a probability vector (entries >= 0 summing to 1); got {x0.tolist()} "
            f"(sum {x0.sum():.12g})."
        )
    gen = getattr(system, "generator", None)
    if gen is not None:
        lo, hi = gen.domain()
        if np.any(y0 < lo) or np.any(y0 > hi):
            raise InputError(f"y0={y0.tolist()} is outside the generator's domain [{lo}, {hi}].")
    return x0, y0


def _solve_scipy(system, z0, t_span, t_eval, method, rtol, atol):
    from scipy.integrate import solve_ivp

    kwargs = {"jac": system.jacobian}
    if method.scipy_name in ("RK45", "DOP853"):
        kwargs = {}
    sol = solve_ivp(
        system.rhs, t_span, z0, method=method.scipy_name, t_eval=t_eval,
        rtol=rtol, atol=atol, **kwargs,
    )  # fmt: skip
    z = np.full((len(t_eval), len(z0)), np.nan)
    z[: sol.y.shape[1]] = sol.y.T
    status = "success" if sol.status == 0 else "failed"
    stats = {"nfev": int(sol.nfev), "njev": int(sol.njev), "nlu": int(sol.nlu)}
    return z, status, str(sol.message), stats


def _solve_torchdiffeq(system, z0, t_span, t_eval, method, rtol, atol, max_steps):
    import torch
    from torchdiffeq import odeint

    nfev = 0

    def func(t, z):
        nonlocal nfev
        nfev += 1
        return torch.from_numpy(system.rhs(float(t), z.detach().numpy()))

    z = np.full((len(t_eval), len(z0)), np.nan)
    try:
        out = odeint(
            func, torch.from_numpy(z0), torch.from_numpy(np.asarray(t_eval, dtype=np.float64)),
            rtol=rtol, atol=atol, method=method.name, options={"max_num_steps": max_steps},
        )  # fmt: skip
        z[:] = out.numpy()
        status, message = "success", "integration finished"
    except AssertionError as err:  # torchdiffeq reports failures by assert
        text = str(err)
        status = "max_steps" if "max_num_steps" in text else "step_underflow"
        message = f"torchdiffeq stopped: {text}"
    if status == "success" and not np.all(np.isfinite(z)):
        status, message = "non_finite", "the solution became non-finite"
    return z, status, message, {"nfev": nfev, "njev": 0, "nlu": 0}


def integrate(
    system,
    t_span=(0.0, 10.0),
    x0=None,
    y0=None,
    *,
    method: str = "auto",
    rtol: float = 1e-8,
    atol: float = 1e-10,
    t_eval=None,
    n_eval: int = 401,
    max_steps: int = 1_000_000,
) -> xr.Dataset:
    """Integrate `eps dx/dt = f(x, y)`, `dy/dt = g(x, y)` over `t_span` from `(x0, y0)`.

    Returns an `xarray.Dataset` with `x(time, state)`, `y(time, slow)`, and for master-equation
    systems `p_st(time, state)` = `p_st(Q(y(t)))`, `manifold_distance(time)` = `|x - p_st|_1`
    and `mass_error(time)` = `1^T x - 1`; the attributes hold the system, its parameters, `eps`,
    `P`, method, tolerances, solver statistics (`nfev`, `njev`, `nlu`), status and wall time.
    """
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; expected one of {list(METHODS)}.")
    rtol = _check_positive("rtol", rtol)
    if np.ndim(atol) == 0:
        atol = _check_positive("atol", atol)
    else:  # one absolute tolerance per component of z = [x, y]
        atol = np.asarray(atol, dtype=np.float64)
        if atol.shape != (system.n_fast + system.n_slow,) or not np.all(atol > 0):
            raise InputError(
                f"atol must be a positive number or {system.n_fast + system.n_slow} positive "
                f"numbers (one per component of [x, y]); got {atol.tolist()}."
            )
    try:
        t0, t1 = (float(v) for v in t_span)
    except (TypeError, ValueError):
        raise InputError(f"t_span must be two numbers (t0, t1); got {t_span!r}.") from None
    if not (np.isfinite(t0) and np.isfinite(t1)) or t1 <= t0:
        raise InputError(f"t_span must run forward (t0 < t1, both finite); got ({t0}, {t1}).")
    x0, y0 = _initial_state(system, x0, y0)
    z0 = np.concatenate([x0, y0])
    if t_eval is None:
        t_eval = np.linspace(t0, t1, int(n_eval))
    t_eval = np.asarray(t_eval, dtype=np.float64)
    if t_eval.ndim != 1 or t_eval.size < 2 or np.any(np.diff(t_eval) <= 0):
        raise InputError("t_eval must be an increasing 1-D sequence of at least two times.")
    if t_eval[0] < t0 or t_eval[-1] > t1:
        raise InputError(f"t_eval must lie inside t_span ({t0}, {t1}).")

    stiffness = stiffness_index(system, z0, (t0, t1))
    chosen = METHODS[method]
    if method == "auto":
        chosen = METHODS["radau" if stiffness > STIFF_THRESHOLD else "dop853"]
    elif not chosen.stiff and stiffness > STIFF_THRESHOLD:
        cost = estimate_explicit_nfev(chosen.name, stiffness)
        warnings.warn(
            f"the problem is stiff (stiffness index {stiffness:.3g} at eps={system.eps:g}); the "
            f"explicit method {chosen.name!r} will need about {cost:.3g} function evaluations "
            f"for stability alone. Use a stiff method (radau, bdf, lsoda) or method='auto'.",
            StiffnessWarning,
            stacklevel=2,
        )

    start = time.perf_counter()
    if chosen.backend == "scipy":
        z, status, message, stats = _solve_scipy(system, z0, (t0, t1), t_eval, chosen, rtol, atol)
    else:
        z, status, message, stats = _solve_torchdiffeq(
            system, z0, (t0, t1), t_eval, chosen, rtol, atol, max_steps
        )
    wall = time.perf_counter() - start
    if status == "success" and not np.all(np.isfinite(z)):
        status, message = "non_finite", "the solution became non-finite"

    x, y = system.split(z)
    return _to_dataset(
        system, t_eval, x, y,
        attrs={
            "method": chosen.name,
            "method_requested": method,
            "backend": chosen.backend,
            "rtol": rtol,
            "atol": atol if np.ndim(atol) == 0 else atol.tolist(),
            "t_start": t0,
            "t_end": t1,
            "stiffness_index": stiffness,
            **stats,
            "status": status,
            "message": message,
            "wall_time_s": wall,
        },
    )  # fmt: skip


def _to_dataset(system, t, x, y, attrs) -> xr.Dataset:
    """Label a trajectory as a Dataset; adds `p_st`, manifold distance and mass error for ME systems."""
    import json

    data = {
        "x": (("time", "state"), x, {"long_name": "fast variable (probability of each state)"}),
        "y": (("time", "slow"), y, {"long_name": "slow variable"}),
    }
    if hasattr(system, "critical_manifold"):
        ok = np.all(np.isfinite(y), axis=-1)
        p = np.full_like(x, np.nan)
        if np.any(ok):
            p[ok] = system.critical_manifold(y[ok])
        data["p_st"] = (
            ("time", "state"), p,
            {"long_name": "stationary distribution p_st(Q(y(t))), the critical manifold h0(y)"},
        )  # fmt: skip
        data["manifold_distance"] = (
            ("time",), np.abs(x - p).sum(-1), {"long_name": "L1 distance |x - p_st(y)|_1"}
        )  # fmt: skip

    if system.conserves_mass:
        data["mass_error"] = (
            ("time",), x.sum(-1) - 1.0, {"long_name": "total probability minus one, 1^T x - 1"}
        )  # fmt: skip
    eps = system.eps
    P = system.P
    ds = xr.Dataset(
        data,
        coords={
            "time": ("time", np.asarray(t), {"long_name": "slow time t", "units": "1"}),
            "state": np.arange(system.n_fast),
            "slow": np.arange(system.n_slow),
        },
        attrs={
            "title": f"fastslow-sim trajectory of the {system.name} system",
            "system": system.name,
            "system_params": json.dumps(system.params(), default=float),
            "eps": eps,
            "P": -1 if P is None else P,
            "P_note": "P = 1/eps; -1 when 1/eps is not an integer",
            **attrs,
            "fastslow_sim_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    return ds
