"""One entry point, `integrate(system, t_span, ...)`, over a string registry of methods.

Back-ends
- scipy (`radau`, `bdf`, `lsoda`: implicit/stiff, given the analytic Jacobian; `rk45`,
  `dop853`: explicit);
- torchdiffeq (`dopri5`, `dopri8`, `bosh3`, `adaptive_heun`: explicit, differentiable).

`method="auto"` measures stiffness at the start, `S = max_i |Re lambda_i(J(z0))| * (t1 - t0)`
with `J` the full Jacobian (whose fast eigenvalues scale as `1/eps`), and chooses by the cost
measured in `scripts/bench_auto.py` (birth-death, rtol 1e-8, atol 1e-10, 401 output times):

- `S <= 1e9` (eps down to about 1e-8 on unit rates): LSODA, run at tolerances ten times
  tighter than asked. LSODA switches between Adams (non-stiff) and BDF (stiff) by itself and
  was the cheapest from eps 0.5 to 1e-6 (400-1,100 evaluations); at the tighter tolerances its
  error on the output grid stayed within the requested one (0.13-0.42 of it), where DOP853 at
  the requested tolerance missed it 7-730-fold and Radau's cost grows without bound below 1e-7.
- `S > 1e9`: RODAS4 (the torch solver, master-equation systems with one slow variable) at
  tolerances a hundred times tighter (thirty left its error at 1.33 times the tolerance from
  eps 1e-8 to 1e-10): its cost hardly depends on eps (7,600-11,400 evaluations from 1e-8 to
  1e-12) where LSODA's explodes (116,000 evaluations and 600 times the tolerance at 1e-12).
  Other systems keep LSODA.

The dataset records the tolerances asked for (`rtol`, `atol`) and those the solver ran with
(`solver_rtol`, `solver_atol`). An explicit method needs at least about `S / 3.3` steps for
stability alone (the real stability interval of dopri5), so asking for one when `S > 500` issues
a `StiffnessWarning` with that cost estimate (DESIGN 4: dopri5 needs about 290,000 evaluations
at `eps = 1e-3` on a 16-state birth-death system).

A failed solve does not raise: the dataset's `status` and `message` attributes say why, and the
states after the failure are NaN.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr

from ._version import __version__
from .errors import InputError

__all__ = [
    "integrate",
    "integrate_batch",
    "random_initial_conditions",
    "METHODS",
    "StiffnessWarning",
    "stiffness_index",
    "estimate_explicit_nfev",
]

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
    "auto": Method(
        "auto",
        "auto",
        True,
        None,
        "lsoda at 10x tighter tolerances; rodas4 at 100x tighter when very stiff (S > 1e9)",
    ),  # fmt: skip
    "radau": Method("radau", "scipy", True, "Radau", "implicit Runge-Kutta, order 5, stiff"),
    "bdf": Method("bdf", "scipy", True, "BDF", "backward differentiation, orders 1-5, stiff"),
    "lsoda": Method("lsoda", "scipy", True, "LSODA", "Adams/BDF with automatic switching"),
    "rk45": Method("rk45", "scipy", False, "RK45", "explicit Dormand-Prince 5(4), non-stiff"),
    "dop853": Method("dop853", "scipy", False, "DOP853", "explicit order 8, non-stiff"),
    "dopri5": Method("dopri5", "torchdiffeq", False, None, "torchdiffeq dopri5, differentiable"),
    "dopri8": Method("dopri8", "torchdiffeq", False, None, "torchdiffeq dopri8, differentiable"),
    "bosh3": Method("bosh3", "torchdiffeq", False, None, "torchdiffeq Bogacki-Shampine 3(2)"),
    "adaptive_heun": Method("adaptive_heun", "torchdiffeq", False, None, "torchdiffeq Heun 2(1)"),
    "multirate": Method(
        "multirate",
        "multirate",
        True,
        None,
        "multirate map of DESIGN 3.3: exact fast propagation per token, one slow step per block H",
    ),
    "rodas4": Method(
        "rodas4",
        "torch",
        True,
        None,
        "batched torch RODAS4, stiff, one step size per trajectory, CPU or CUDA",
    ),
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


def _check_t_span(t_span) -> tuple[float, float]:
    """`(t0, t1)` as floats, or `InputError` unless they are finite and run forward."""
    try:
        t0, t1 = (float(v) for v in t_span)
    except (TypeError, ValueError):
        raise InputError(f"t_span must be two numbers (t0, t1); got {t_span!r}.") from None
    if not (np.isfinite(t0) and np.isfinite(t1)) or t1 <= t0:
        raise InputError(f"t_span must run forward (t0 < t1, both finite); got ({t0}, {t1}).")
    return t0, t1


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
    H: float = 0.01,
    tokens_per_block: int | None = None,
) -> xr.Dataset:
    """Integrate `eps dx/dt = f(x, y)`, `dy/dt = g(x, y)` over `t_span` from `(x0, y0)`.

    `method="multirate"` runs the multirate map with blocks of slow time `H` and
    `tokens_per_block` tokens (default: the system's `P = 1/eps`), saving the state at block ends
    (`t_eval` is ignored); the span must be a whole number of blocks.

    Returns an `xarray.Dataset` with `x(time, state)`, `y(time, slow)`, and for master-equation
    systems `p_st(time, state)` = `p_st(Q(y(t)))`, `manifold_distance(time)` = `|x - p_st|_1`
    and `mass_error(time)` = `1^T x - 1`; the attributes hold the system, its parameters, `eps`,
    `P`, method, tolerances, solver statistics (`nfev`, `njev`, `nlu`), status and wall time.
    """
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; expected one of {list(METHODS)}.")
    if (x0 is not None and np.ndim(x0) == 2) or (y0 is not None and np.ndim(y0) == 2):
        return integrate_batch(system, t_span, x0, y0, method=method, rtol=rtol, atol=atol,
                               t_eval=t_eval, n_eval=n_eval, max_steps=max_steps)  # fmt: skip
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
    t0, t1 = _check_t_span(t_span)
    x0, y0 = _initial_state(system, x0, y0)
    z0 = np.concatenate([x0, y0])
    if t_eval is None:
        t_eval = np.linspace(t0, t1, int(n_eval))
    t_eval = np.asarray(t_eval, dtype=np.float64)
    if t_eval.ndim != 1 or t_eval.size < 2 or np.any(np.diff(t_eval) <= 0):
        raise InputError("t_eval must be an increasing 1-D sequence of at least two times.")
    if t_eval[0] < t0 or t_eval[-1] > t1:
        raise InputError(f"t_eval must lie inside t_span ({t0}, {t1}).")

    check_eps_range(system.eps, method)
    _check_rates_finite(system, y0)
    stiffness = stiffness_index(system, z0, (t0, t1))
    chosen = METHODS[method]
    solver_rtol, solver_atol = rtol, atol
    if method == "auto":
        name, tighten = _auto_choice(system, stiffness, atol)
        chosen = METHODS[name]
        solver_rtol, solver_atol = max(rtol / tighten, AUTO_RTOL_MIN), atol / tighten
    elif not chosen.stiff and stiffness > STIFF_THRESHOLD:
        cost = estimate_explicit_nfev(chosen.name, stiffness)
        warnings.warn(
            f"the problem is stiff (stiffness index {stiffness:.3g} at eps={system.eps:g}); the "
            f"explicit method {chosen.name!r} will need about {cost:.3g} function evaluations "
            f"for stability alone. Use a stiff method (radau, bdf, lsoda) or method='auto'.",
            StiffnessWarning,
            stacklevel=2,
        )

    if chosen.backend == "multirate":
        n_blocks = _whole_blocks(t0, t1, H)
        t_eval = t0 + H * np.arange(n_blocks + 1)
    start = time.perf_counter()
    try:
        if chosen.backend == "multirate":
            from .multirate import multirate_map

            run = multirate_map(system, H, n_blocks, tokens_per_block, x0, y0, tokens=False)
            z = np.concatenate([run["x_blocks"], run["y_blocks"]], axis=1)
            status, message = (
                "success",
                f"{n_blocks} blocks of slow time H={H:g}, {run['P']} tokens each",
            )
            stats = {"nfev": n_blocks, "njev": 0, "nlu": 0, "H": H, "tokens_per_block": run["P"]}
        elif chosen.backend == "scipy":
            z, status, message, stats = _solve_scipy(system, z0, (t0, t1), t_eval, chosen,
                                                     solver_rtol, solver_atol)  # fmt: skip
        elif chosen.backend == "torch":
            from .rosenbrock import STATUS as _STATUS  # torch: imported only where it is used

            zb, codes, st = _solve_rodas4(system, z0[None], t_eval, solver_rtol, solver_atol,
                                          max_steps)  # fmt: skip
            z, status = zb[:, 0], _STATUS[int(codes[0])]
            message = "integration finished" if status == "success" else f"rodas4 stopped: {status}"
            stats = {k: int(v[0]) for k, v in st.items() if k != "iterations"}
        else:
            z, status, message, stats = _solve_torchdiffeq(
                system, z0, (t0, t1), t_eval, chosen, rtol, atol, max_steps
            )
    except InputError:
        raise
    except SOLVER_ERRORS as err:  # a status, not an exception in the middle of a run
        z = np.full((len(t_eval), len(z0)), np.nan)
        status, message = "error", f"{chosen.name} raised {type(err).__name__}: {err}"
        stats = {"nfev": 0, "njev": 0, "nlu": 0}
    wall = time.perf_counter() - start
    if status == "success" and not np.all(np.isfinite(z)):
        status, message = "non_finite", "the solution became non-finite"

    x, y = system.split(z)
    return _finite_or_failed(_to_dataset(
        system, t_eval, x, y,
        attrs={
            "method": chosen.name,
            "method_requested": method,
            "backend": chosen.backend,
            "rtol": rtol,
            "atol": atol if np.ndim(atol) == 0 else atol.tolist(),
            "solver_rtol": solver_rtol,
            "solver_atol": solver_atol if np.ndim(solver_atol) == 0 else solver_atol.tolist(),
            "t_start": t0,
            "t_end": t1,
            "stiffness_index": stiffness,
            **stats,
            "status": status,
            "message": message,
            "wall_time_s": wall,
        },
    ))  # fmt: skip


VERY_STIFF = 1e9  # S above which `auto` takes rodas4 (see the module docstring)
AUTO_RTOL_MIN = 100 * 2.0**-52  # scipy's smallest rtol


def _auto_choice(system, stiffness, atol) -> tuple[str, float]:
    """`(method, tolerance factor)` of `method="auto"` (rule and measurements: module doc)."""
    if stiffness > VERY_STIFF and np.ndim(atol) == 0 and _has_torch_form(system):
        return "rodas4", 100.0
    return "lsoda", 10.0


def _has_torch_form(system) -> bool:
    """Whether `torch_functions` (hence rodas4) supports `system`."""
    from .systems import LinearSlowLaw, MichaelisMentenSlowLaw

    law = getattr(system, "slow_law", None)
    return (hasattr(system, "generator") and system.n_slow == 1
            and isinstance(law, (LinearSlowLaw, MichaelisMentenSlowLaw)))  # fmt: skip


# what a back-end may raise on a hard problem (overflow, a singular matrix, a stalled solver)
SOLVER_ERRORS = (ValueError, ArithmeticError, RuntimeError, np.linalg.LinAlgError)

EPS_MIN = 1e-12


def check_eps_range(eps, method) -> None:
    """`InputError` unless the ODE solvers resolve `eps` (one value or an array) in float64."""
    e = np.min(np.asarray(eps, dtype=np.float64))
    if method != "multirate" and e < EPS_MIN:
        raise InputError(
            f"eps = {e:g} is below {EPS_MIN:g}, the smallest time-scale ratio the ODE solvers "
            f"resolve in float64 (the fast rates are the generator's times 1/eps); expected "
            f"eps >= {EPS_MIN:g}, or method 'multirate', which takes any eps."
        )


def _check_rates_finite(system, y0) -> None:
    """`InputError` unless a master-equation system's rates (over `eps`) are finite at `y0`."""
    gen = getattr(system, "generator", None)
    if gen is None:
        return
    with np.errstate(all="ignore"):
        q = gen.rates(np.asarray(y0).reshape(-1, system.n_slow)) / system.eps
    if not np.all(np.isfinite(q)):
        raise InputError(
            f"the rates of the {system.name} generator over eps = {system.eps:g} are not finite "
            f"at y0 = {np.asarray(y0).ravel().tolist()}; expected y0 where they are."
        )


def _finite_or_failed(ds: xr.Dataset) -> xr.Dataset:
    """Never a success with non-finite values: name the variable and mark the failure."""
    bad = [k for k in ds.data_vars if ds[k].dtype.kind == "f" and not np.isfinite(ds[k]).all()]
    if not bad:
        return ds
    if "batch" in ds.dims and "status" in ds:
        status = ds["status"].values.copy()
        for b in range(ds.sizes["batch"]):
            if status[b] == "success" and any(
                not np.isfinite(ds[k].isel(batch=b)).all() for k in bad
            ):
                status[b] = "non_finite"
        ds["status"] = ("batch", status, ds["status"].attrs)
        n_bad = int(np.sum(status != "success"))
        if n_bad:
            ds.attrs["status"] = f"{n_bad} of {status.size} trajectories failed"
    elif ds.attrs.get("status") == "success":
        counts = ", ".join(f"{k} ({int((~np.isfinite(ds[k])).sum())})" for k in bad)
        ds.attrs["status"] = "non_finite"
        ds.attrs["message"] = f"non-finite values in the dataset: {counts}"
    return ds


def _whole_blocks(t0, t1, H) -> int:
    """The number of blocks of slow time `H` in `[t0, t1]`, or `InputError` unless it is whole."""
    H = _check_positive("H", H)
    blocks = (t1 - t0) / H
    n = int(round(blocks))
    if n < 1 or abs(blocks - n) > 1e-9 * max(blocks, 1.0):
        raise InputError(
            f"the span {t1 - t0:g} is not a whole number of blocks of H = {H:g} ({blocks:.6g} "
            f"blocks); expected a span that is a multiple of H, such as {max(n, 1) * H:g}."
        )
    return n


def torch_functions(system, dtype=None, device="cpu", eps=None, structured=True):
    """`(fun, jac)` in torch for the stacked state `z = [x, y]` of a master-equation system.

    `fun(z, idx)` is `[Q(y)^T x / eps, g(x, y)]` for the trajectories `idx`; `jac(z, idx)` is
    analytic: `[[Q^T / eps, (dQ/dy)^T x / eps], [g_x, g_y]]`. For a neighbour chain (two-state,
    birth-death, Michaelis-Menten) and `structured=True`, `jac` returns it as an
    `ArrowTridiagonal` (`Q^T` is tridiagonal), which the solver factors in O(n) vector operations;
    otherwise as a dense `(b, n+1, n+1)` tensor. `eps` may be a tensor of shape `(B,)`: one
    time-scale ratio per trajectory. For the chains, `fun.batch_last` and `jac.batch_last` take
    `z (n+1, b)` (each state one contiguous row), the layout `rodas4_solve` works in.
    """
    import torch
    import torch.nn.functional as F

    from .generators import chain_divergence, torch_apply_transpose, torch_chain_rates, torch_rates
    from .linalg import ArrowTridiagonal, keep_one
    from .systems import LinearSlowLaw, MichaelisMentenSlowLaw

    dtype = dtype or torch.float64
    if not hasattr(system, "generator") or system.n_slow != 1:
        raise InputError(
            f"the torch solver supports master-equation systems with one slow variable; got {system.name!r}."
        )
    gen, law, n = system.generator, system.slow_law, system.n_fast
    inv_e = 1.0 / torch.as_tensor(system.eps if eps is None else eps, dtype=dtype, device=device)
    inv_e = inv_e.reshape(-1, 1)  # (B, 1) or (1, 1)
    c = torch.as_tensor(law.c, dtype=dtype, device=device)[:, None]  # (n, 1)
    # slow law: g (b, 1), g_x (b, n), g_y (b,); batch last: g (1, b), g_x (n, b), g_y (b,)
    if isinstance(law, LinearSlowLaw):

        def g(x, y, batch_last=False):
            return torch.add((c.T @ x if batch_last else x @ c) + law.b, y, alpha=-law.a)

        def g_xy(x, y, batch_last=False):
            B = x.shape[1 if batch_last else 0]
            g_y = torch.full((B,), -law.a, dtype=dtype, device=device)
            return (c.expand(n, B), g_y) if batch_last else (c.T.expand(B, n), g_y)

    elif isinstance(law, MichaelisMentenSlowLaw):
        k1, km1 = law.generator.k1, law.generator.k_minus1

        def g(x, y, batch_last=False):
            f = c.T @ x if batch_last else x @ c
            return km1 * f - k1 * y * (1 - f)

        def g_xy(x, y, batch_last=False):
            if batch_last:
                return (k1 * y + km1) * c, -k1 * (1 - (c.T @ x)[0])
            return (k1 * y + km1) * c.T, -k1 * (1 - (x @ c)[:, 0])

    else:
        raise InputError(f"slow law {type(law).__name__} has no torch version.")

    def ratio(idx):
        return inv_e if (idx is None or inv_e.shape[0] == 1) else inv_e[idx]

    # one eps for the whole batch is folded into the chain's rate constants
    folded = inv_e.numel() == 1 and not inv_e.requires_grad
    chain = torch_chain_rates(
        gen, dtype, device, batch_last=True, scale=float(inv_e) if folded else None
    )
    if chain is not None:
        # the neighbour chains are written batch last, `z (n+1, b)`: each state is one contiguous
        # row, which is the layout the solver's elimination down the chain works in
        cT = c.T.contiguous()  # (1, n)
        plain_linear = (
            isinstance(law, LinearSlowLaw) and isinstance(law.a, (int, float)) and law.b == 0
        )

        def g_batch_last(x, y):  # (1, b)
            if plain_linear:  # c.x - a y in one operation
                return torch.addmm(y, cT, x, beta=-law.a)
            return g(x, y, True)

        padded = {}  # a buffer (n+1, b) whose first and last rows stay zero, with its views

        def zero_ended(b):
            P = torch.zeros((n + 1, b), dtype=dtype, device=device)
            return P[1:n], P[1:], P[:-1]

        def fun_batch_last(z, idx=None):
            x, y = z[:n], z[n:]
            up, down, _ = chain(y, derivative=False)
            if torch.is_grad_enabled() or torch.compiler.is_compiling():
                flux = torch.mul(up, x[:-1]).addcmul_(down, x[1:], value=-1)  # net i -> i+1
                if not folded:
                    flux = flux * ratio(idx).T
                return torch.cat([chain_divergence(flux, batch_last=True), g_batch_last(x, y)])
            # without autograd: the same into preallocated rows, no concatenation
            b = z.shape[1]
            # a buffer made in inference mode cannot be written outside it: one kept per mode
            kind = "inference" if torch.is_inference_mode_enabled() else "padded"
            inner, hi, lo = keep_one(padded, (kind, b), lambda: zero_ended(b))
            back = torch.mul(down, x[1:], out=inner).addcmul_(up, x[:-1], value=-1)  # i+1 -> i
            if not folded:
                back.mul_(ratio(idx).T)
            out = torch.empty_like(z)
            torch.sub(hi, lo, out=out[:n])  # dx_i/dt = flux_{i-1} - flux_i
            out[n:] = g_batch_last(x, y)
            return out

        def fun(z, idx=None):
            return fun_batch_last(z.T, idx).T

        fun.batch_last = fun_batch_last
    else:

        def fun(z, idx=None):
            x, y = z[:, :n], z[:, n:]
            return torch.cat([torch_apply_transpose(gen, y, x) * ratio(idx), g(x, y)], dim=-1)

    if chain is not None and structured:

        def jac_batch_last(z, idx=None):
            x, y = z[:n], z[n:]
            up, down, dup = chain(y)
            up, down = up.expand(n - 1, -1), down.expand(n - 1, z.shape[1])
            if not folded:
                r = ratio(idx).T  # (1, b)
                up, down, dup = up * r, down * r, dup * r
            sub = F.pad(up, (0, 0, 1, 0))  # T[i, i-1]: rate i-1 -> i
            sup = F.pad(down, (0, 0, 0, 1))  # T[i, i+1]: rate i+1 -> i
            diag = -(F.pad(up, (0, 0, 0, 1)) + F.pad(down, (0, 0, 1, 0)))  # minus exit rates
            u = chain_divergence(dup * x[:-1], batch_last=True)  # d(Q^T x)/dy / eps
            v, d = g_xy(x, y, True)
            return ArrowTridiagonal(sub, diag, sup, u, v, d)

        def jac(z, idx=None):
            return jac_batch_last(z.T, idx)

        jac.batch_last = jac_batch_last

    else:

        def jac(z, idx=None):
            r = ratio(idx)
            x, y = z[:, :n], z[:, n:]
            Q, dQ = torch_rates(gen, y, derivative=True)
            fy = torch.einsum("bji,bj->bi", dQ, x)  # d(Q^T x)/dy
            top = torch.cat([Q.transpose(1, 2), fy[:, :, None]], dim=-1) * r[:, :, None]
            v, d = g_xy(x, y)
            bottom = torch.cat([v, d[:, None]], dim=-1)[:, None, :]
            return torch.cat([top, bottom], dim=1)

    return fun, jac


def _solve_rodas4(system, z0, t_eval, rtol, atol, max_steps, device="cpu", eps=None):
    """Batched RODAS4 on `z0 (B, n+m)`; returns numpy `(z (T, B, n+m), status codes, stats)`."""
    import torch

    from .rosenbrock import rodas4_solve

    if np.ndim(atol) != 0:
        raise InputError("rodas4 takes one scalar atol.")
    fun, jac = torch_functions(system, torch.float64, device, eps)
    z, codes, stats = rodas4_solve(
        fun, jac, torch.as_tensor(z0, dtype=torch.float64, device=device),
        torch.as_tensor(t_eval, dtype=torch.float64), rtol=rtol, atol=atol, max_steps=max_steps,
    )  # fmt: skip
    return (z.cpu().numpy(), codes.cpu().numpy(),
            {k: (v.cpu().numpy() if hasattr(v, "cpu") else v) for k, v in stats.items()})  # fmt: skip


def random_initial_conditions(system, batch: int, seed=None):
    """`(x0 (batch, n), y0 (batch, m))` drawn with `numpy.random.default_rng(seed)`: `x0` uniform
    on the probability simplex (Dirichlet(1)), `y0` uniform in [0, 1] (what
    `fastslow-sim integrate --batch N --seed S` integrates)."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(system.n_fast), batch), rng.uniform(
        0.0, 1.0, (batch, system.n_slow)
    )


def integrate_batch(system, t_span, x0, y0, *, method="auto", rtol=1e-8, atol=1e-10, t_eval=None,
                    n_eval=401, max_steps=1_000_000, eps=None, device="cpu") -> xr.Dataset:  # fmt: skip
    """Integrate a batch of initial conditions `x0 (B, n)`, `y0 (B, m)` (either may be shared)
    and optionally one `eps` per trajectory; `auto` takes the batched torch RODAS4.

    The dataset gains a `batch` dimension; `status(batch)` and the statistics are per
    trajectory, and one failing trajectory does not stop the others.
    """
    rtol = _check_positive("rtol", rtol)
    atol = _check_positive("atol", atol)
    t0, t1 = _check_t_span(t_span)
    x0 = np.atleast_2d(np.asarray(system.x0 if x0 is None else x0, dtype=np.float64))
    y0 = np.atleast_2d(np.asarray(system.y0 if y0 is None else y0, dtype=np.float64))
    if y0.shape[-1] != system.n_slow and y0.shape[0] == system.n_slow:
        y0 = y0.T
    n_eps = 1 if eps is None else int(np.size(eps))
    B = max(x0.shape[0], y0.shape[0], n_eps)
    if B < 1 or x0.shape[0] not in (1, B) or y0.shape[0] not in (1, B):
        raise InputError(
            f"x0 and y0 must have the same batch size (or 1); got {x0.shape[0]} and {y0.shape[0]}."
        )
    x0, y0 = np.broadcast_to(x0, (B, x0.shape[1])), np.broadcast_to(y0, (B, y0.shape[1]))
    for b in range(B):  # every row must be a valid initial state
        _initial_state(system, x0[b], y0[b])
    if eps is not None:
        eps = np.asarray(eps, dtype=np.float64).reshape(-1)
        if eps.shape != (B,) or not np.all(np.isfinite(eps)) or np.any(eps <= 0):
            raise InputError(f"eps must hold {B} positive finite values, one per trajectory.")
    check_eps_range(system.eps if eps is None else eps, method)
    for b in range(B):
        _check_rates_finite(system if eps is None else system.with_eps(eps[b]), y0[b])
    t_eval = (
        np.linspace(t0, t1, int(n_eval)) if t_eval is None else np.asarray(t_eval, dtype=np.float64)
    )
    chosen = METHODS["rodas4" if method == "auto" else method]
    z0 = np.concatenate([x0, y0], axis=1)
    start = time.perf_counter()
    if chosen.backend == "torch":
        from .rosenbrock import STATUS as _STATUS  # torch: imported only where it is used

        z, codes, stats = _solve_rodas4(system, z0, t_eval, rtol, atol, max_steps, device, eps)
        status = [_STATUS[int(c)] for c in codes]
        stats.pop("iterations", None)
    else:
        if eps is not None:
            raise InputError("one eps per trajectory needs method 'rodas4' (or 'auto').")
        runs = [integrate(system, (t0, t1), x0[b], y0[b], method=method, rtol=rtol, atol=atol,
                          t_eval=t_eval, max_steps=max_steps) for b in range(B)]  # fmt: skip
        z = np.stack([np.concatenate([r["x"].values, r["y"].values], axis=1) for r in runs], axis=1)
        status = [r.attrs["status"] for r in runs]
        stats = {k: np.array([r.attrs[k] for r in runs]) for k in ("nfev", "njev", "nlu")}
    wall = time.perf_counter() - start
    x, y = z[..., : system.n_fast], z[..., system.n_fast :]  # (T, B, .)
    ds = _to_dataset(system, t_eval, np.moveaxis(x, 1, 0), np.moveaxis(y, 1, 0), attrs={
        "method": chosen.name, "method_requested": method, "backend": chosen.backend, "rtol": rtol,
        "atol": atol, "t_start": t0, "t_end": t1, "batch_size": B,
        "stiffness_index": stiffness_index(system, z0[0], (t0, t1)),
        "status": "success" if all(s == "success" for s in status) else
                  f"{sum(s != 'success' for s in status)} of {B} trajectories failed",
        "message": "per-trajectory status in the variable 'status'", "wall_time_s": wall,
        "nfev": int(np.sum(stats["nfev"])), "njev": int(np.sum(stats["njev"])), "nlu": int(np.sum(stats["nlu"])),
    }, batch=True)  # fmt: skip
    ds["status"] = (
        "batch",
        np.array(status, dtype=object),
        {"long_name": "solver status per trajectory"},
    )
    for k, v in stats.items():
        ds[f"stat_{k}"] = ("batch", np.asarray(v), {"long_name": f"{k} per trajectory"})
    if eps is not None:
        ds["eps_batch"] = ("batch", eps, {"long_name": "eps of each trajectory"})
    return _finite_or_failed(ds)


def _to_dataset(system, t, x, y, attrs, batch: bool = False) -> xr.Dataset:
    """Label a trajectory as a Dataset; adds `p_st`, manifold distance and mass error for ME systems."""
    import json

    lead = ("batch", "time") if batch else ("time",)
    data = {
        "x": ((*lead, "state"), x, {"long_name": "fast variable (probability of each state)"}),
        "y": ((*lead, "slow"), y, {"long_name": "slow variable"}),
    }
    if hasattr(system, "critical_manifold"):
        ok = np.all(np.isfinite(y), axis=-1)
        p = np.full_like(x, np.nan)
        if np.any(ok):
            try:
                p[ok] = system.critical_manifold(y[ok])
            except InputError:  # rates beyond the float range at some y: left NaN, flagged
                for i in zip(*np.nonzero(ok)):
                    with contextlib.suppress(InputError):
                        p[i] = system.critical_manifold(y[i])
        data["p_st"] = (
            (*lead, "state"), p,
            {"long_name": "stationary distribution p_st(Q(y(t))), the critical manifold h0(y)"},
        )  # fmt: skip
        data["manifold_distance"] = (
            lead, np.abs(x - p).sum(-1), {"long_name": "L1 distance |x - p_st(y)|_1"}
        )  # fmt: skip
    if system.conserves_mass:
        data["mass_error"] = (
            lead, x.sum(-1) - 1.0, {"long_name": "total probability minus one, 1^T x - 1"}
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
