"""Slow-manifold analysis of master-equation systems (DESIGN 3.2; Tikhonov, Fenichel).

For `eps dx/dt = A(y) x` with `A = Q(y)^T`, and `dy/dt = g(x, y)`:

- critical manifold `h0(y) = p_st(Q(y))` (the paper's theorem, linear case);
- first-order correction `h1(y) = Z (dh0/dy) g(h0, y)`, `Z = (A - h0 1^T)^{-1}`, so that
  `A h1 = (dh0/dy) g(h0, y)` and `1^T h1 = 0`;
- reduced (QSS) system `dy/dt = g(h0(y), y)` and its first-order variant
  `dy/dt = g(h0 + eps h1, y)`;
- initial-layer duration `eps log(1/eps) / gap`, with `gap` the spectral gap of `Q(y0)`;
- `newton_critical_manifold`: an independent solve of `A(y) x = 0` on the simplex by Newton's
  method, to check the identity `phi(y) = p_st(y)` against GTH;
- `convergence`: errors after the initial layer as `eps` shrinks, and their log-log slopes
  (expected 1 for `|x - h0|`, 2 for `|x - h0 - eps h1|`, 1 for `|y - y_reduced|`).
"""

from __future__ import annotations

import time

import numpy as np
import xarray as xr

from ._version import __version__
from .errors import InputError
from .generators import domain_text, into_domain
from .stationary import require_square, stationary_derivative
from .wording import number_text, plural

__all__ = [
    "h0",
    "h1",
    "reduced_rhs",
    "integrate_reduced",
    "spectral_gap",
    "initial_layer_duration",
    "newton_critical_manifold",
    "identity_check",
    "convergence",
    "check_convergence",
    "manifold_curve",
]


def _require_me(system):
    if not hasattr(system, "generator"):
        raise InputError(
            f"system {system.name!r} is not a master-equation system; the slow-manifold analysis "
            f"needs a generator Q(y)."
        )
    if system.n_slow < 1:
        raise InputError(f"system {system.name!r} has no slow variable.")


def _slow(system, y):
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 0 or y.shape[-1] != system.n_slow:
        y = y[..., None]
    if not np.all(np.isfinite(y)):
        raise InputError(f"y must be finite; got {y.ravel()[~np.isfinite(y.ravel())][0]}.")
    lo, hi = system.generator.domain()
    if np.any(y < lo) or np.any(y > hi):
        raise InputError(
            f"y values from {float(np.min(y)):.15g} to {float(np.max(y)):.15g} leave "
            f"{domain_text(system.generator)}."
        )
    return y


def h0(system, y):
    """Critical manifold `h0(y) = p_st(Q(y))`, shape `(..., n)` (`system.critical_manifold`:
    transient states get no mass, several closed classes raise)."""
    _require_me(system)
    return system.critical_manifold(_slow(system, y))


def h1(system, y):
    """First-order correction `h1 = Z (dh0/dy) g(h0, y)`, shape `(..., n)`; no numerical derivatives.

    `dh0/dy = -Z (dQ/dy)^T h0` (DESIGN 3.1), so `h1 = -Z Z (dQ/dy)^T h0 . g`: two batched
    solves with `Q^T - h0 1^T` (`stationary_derivative`'s, then one more).
    """
    _require_me(system)
    y = _slow(system, y)
    Q = system.generator.rates(y)
    p = system.critical_manifold(y)
    dp = stationary_derivative(Q, system.generator.rates_dy(y), p)  # (..., n, m)
    r = np.einsum("...nm,...m->...n", dp, system.g(p, y))  # (dh0/dy) g(h0, y)
    M = np.swapaxes(Q, -1, -2) - p[..., :, None]
    return np.linalg.solve(M, r[..., None])[..., 0]


def reduced_rhs(system, y, order: int = 0):
    """`g(h0(y), y)` (order 0) or `g(h0(y) + eps h1(y), y)` (order 1)."""
    if order not in (0, 1):
        raise InputError(f"the reduced system has order 0 or 1; got order={order}.")
    y = _slow(system, y)
    x = h0(system, y)
    if order == 1:
        x = x + system.eps * h1(system, y)
    return system.g(x, y)


def integrate_reduced(system, t_eval, y0=None, order: int = 0, rtol=1e-11, atol=1e-13):
    """Integrate the reduced (QSS) system on `t_eval` from `y0`; returns `y` of shape `(T, m)`.

    `t_eval`: one or more finite times (a list or an array), strictly increasing or strictly
    decreasing; `y0` is the state at `t_eval[0]` (one time: `y` is `y0` alone). Its cost does
    not depend on `eps` (order 0); DOP853 at tight tolerance.
    """
    from scipy.integrate import solve_ivp

    _require_me(system)
    y0 = system.y0 if y0 is None else np.asarray(y0, dtype=np.float64).reshape(-1)
    given = t_eval
    try:
        t_eval = np.asarray(t_eval, dtype=np.float64)
    except (TypeError, ValueError):
        t_eval = np.array([[np.nan]])
    steps = np.diff(t_eval) if t_eval.ndim == 1 else np.zeros(0)
    if (t_eval.ndim != 1 or t_eval.size < 1 or not np.all(np.isfinite(t_eval))
            or not (np.all(steps > 0) or np.all(steps < 0))):  # fmt: skip
        shown = f"{t_eval.size} values" if t_eval.size > 8 else repr(given)
        raise InputError(
            f"t_eval must be one or more finite times, strictly increasing or decreasing; got "
            f"{shown}."
        )
    if np.shape(y0) != (system.n_slow,):
        raise InputError(
            f"y0 must have {plural(system.n_slow, 'entry')}, one per slow variable; got "
            f"{np.size(y0)}."
        )
    if t_eval.size == 1:  # no time to integrate over: the start alone
        return np.array(y0, dtype=np.float64).reshape(1, -1)
    # a stage within the tolerance outside the domain is at its end (y -> 0 in Michaelis-
    # Menten, used up, had a stage at y = -5e-15 refused)
    sol = solve_ivp(
        lambda t, y: reduced_rhs(system, into_domain(system.generator, y, atol, rtol), order),
        (t_eval[0], t_eval[-1]), y0, method="DOP853", t_eval=t_eval, rtol=rtol, atol=atol,
    )  # fmt: skip
    if sol.status != 0:
        raise RuntimeError(f"the reduced system failed: {sol.message}")
    return sol.y.T


def spectral_gap(Q) -> np.ndarray:
    """Smallest `|Re lambda|` over the non-zero eigenvalues of each generator `(..., n, n)`,
    `n >= 2` (a one-state generator has no non-zero eigenvalue: an `InputError`).

    A generator in detailed balance, `p_i q_ij = p_j q_ji` (every birth-death chain), has the
    eigenvalues of the symmetric `S = D^(1/2) Q D^(-1/2)`, `D = diag(p)`: `S_ii = q_ii`,
    `S_ij = sqrt(p_i / p_j) q_ij = sqrt(q_ij) sqrt(q_ji)`, built from the rates alone (no `p`,
    which spans hundreds of decades where the mass sits far from state 0). A tridiagonal `Q`
    takes it always (its eigenvalues depend on `q_i,i+1 q_i+1,i` only), solved by
    `scipy.linalg.eigvalsh_tridiagonal` (the two largest, `0` and `-gap`); another in detailed
    balance (checked in logs along a spanning tree, `_reversible`) by `numpy.linalg.eigvalsh`;
    both accurate to about `eps_mach |Q|`. Any other `Q` takes `numpy.linalg.eigvals` of `Q`
    itself, which a long chain far from balance may perturb badly (the non-symmetric route gave
    n = 400 birth-death chains a gap of 0.067 for 0.400).
    """
    q = np.asarray(Q, dtype=np.float64)
    require_square(q)
    n = q.shape[-1]
    if n == 1:
        raise InputError(
            f"a one-state generator (Q of shape {q.shape}) has no non-zero eigenvalue, so no "
            f"spectral gap; expected at least 2 states."
        )
    flat = q.reshape(-1, n, n)
    i = np.arange(n)
    far = np.abs(i[:, None] - i[None, :]) > 1  # entries off the three middle diagonals
    gap = np.empty(len(flat))
    for k, one in enumerate(flat):
        if not np.any(one[far]):
            gap[k] = _tridiagonal_gap(one)
        elif _reversible(one):
            off = np.sqrt(np.maximum(one, 0.0))
            S = off * off.T  # sqrt(q_ij) sqrt(q_ji): a product of rates of 1e200 overflows
            S[i, i] = np.diagonal(one)
            lam = np.linalg.eigvalsh(S)
            gap[k] = max(abs(lam[-1]), abs(lam[-2]))  # (0, -gap), the 0 within round-off
        else:
            re = np.sort(np.abs(np.linalg.eigvals(one).real))
            gap[k] = re[1]  # re[0] is the zero eigenvalue of an irreducible chain
    return gap.reshape(q.shape[:-2])[()]  # (one generator: a number, as eigvals' gave)


def _tridiagonal_gap(q) -> float:
    """`spectral_gap` of one tridiagonal generator `q (n, n)` from its symmetrised form."""
    from scipy.linalg import eigvalsh_tridiagonal

    n = len(q)
    up, down = np.diagonal(q, 1), np.diagonal(q, -1)
    off = np.sqrt(np.maximum(up, 0.0)) * np.sqrt(np.maximum(down, 0.0))
    lam = eigvalsh_tridiagonal(np.diagonal(q).copy(), off, select="i", select_range=(n - 2, n - 1))
    return float(np.max(np.abs(lam)))  # (0, -gap), the 0 within round-off of either sign


REVERSIBLE_RTOL = 1e-12  # detailed balance's tolerance, per link of the tree, on log rates


def _reversible(q) -> bool:
    """Whether the irreducible generator `q (n, n)` is in detailed balance: `q_ij > 0` exactly
    where `q_ji > 0`, and `log p_j - log p_i = log q_ij - log q_ji` on a spanning tree from
    state 0 (no `p` itself, which may underflow) holds on every link, to `REVERSIBLE_RTOL`
    times the path's log rates."""
    from scipy.sparse.csgraph import breadth_first_order

    n = len(q)
    link = q > 0
    np.fill_diagonal(link, False)
    if not np.array_equal(link, link.T):
        return False
    order, parent = breadth_first_order(link, 0, directed=False, return_predecessors=True)
    if len(order) < n:  # reducible: the gap is 0 either way, eigvals says so
        return False
    with np.errstate(divide="ignore"):
        log_q = np.where(link, np.log(np.where(link, q, 1.0)), 0.0)
    phi, size = np.zeros(n), np.zeros(n)  # log p up to a constant; the sum of |log q| to it
    for v in order[1:]:
        u = parent[v]
        phi[v] = phi[u] + log_q[u, v] - log_q[v, u]
        size[v] = size[u] + abs(log_q[u, v]) + abs(log_q[v, u])
    miss = np.abs(phi[:, None] + log_q - phi[None, :] - log_q.T)
    scale = 1.0 + size[:, None] + size[None, :] + np.abs(log_q) + np.abs(log_q.T)
    return bool(np.all(miss[link] <= REVERSIBLE_RTOL * scale[link]))


def initial_layer_duration(system, y0=None, factor: float = 1.0) -> float:
    """`factor * eps * max(log(1/eps), 1) / gap(Q(y0))`: time for the fast transient to decay
    to `O(eps)`.

    The fast transient decays as `exp(-gap t / eps)`, so after `eps log(1/eps) / gap` it is
    `O(eps)` (DESIGN 3.2). The clamp `max(log(1/eps), 1)` acts only for `eps > 1/e` (eps = 0.5,
    the largest `check_convergence` takes, has `log 2 = 0.69`): there `eps log(1/eps)` is
    shorter than one fast relaxation time `eps / gap`, so the layer lasts at least that long
    before `convergence` starts measuring errors; for smaller eps it is the formula itself.
    """
    _require_me(system)
    y0 = system.y0 if y0 is None else y0
    gap = float(spectral_gap(system.generator.rates(_slow(system, y0))))
    eps = system.eps
    return factor * eps * max(np.log(1.0 / eps), 1.0) / gap


def newton_critical_manifold(f, f_x, y, x_init, tol=1e-15, max_iter=50):
    """Solve `f(x, y) = 0`, `1^T x = 1` by Newton's method for each row of `y`.

    The last equation of `f` is replaced by the normalisation (the fast field of a master
    equation conserves mass, so its equations are dependent). Returns `(x, iterations)`.
    """
    x = np.array(np.broadcast_to(x_init, y.shape[:-1] + (np.shape(x_init)[-1],)), dtype=float)
    n = x.shape[-1]
    for it in range(1, max_iter + 1):
        F = f(x, y)
        F[..., n - 1] = x.sum(-1) - 1.0
        J = f_x(x, y).copy()
        J[..., n - 1, :] = 1.0
        dx = np.linalg.solve(J, -F[..., None])[..., 0]
        x = x + dx
        if np.max(np.abs(dx)) <= tol * max(1.0, np.max(np.abs(x))):
            return x, it
    return x, max_iter


def identity_check(system, y_values) -> dict:
    """Largest `|x_newton(y) - p_st(y)|` over `y_values`: the paper's identity, checked independently.

    Newton starts from the uniform distribution and never calls GTH; `p_st` comes from GTH.
    """
    _require_me(system)
    y = _slow(system, np.asarray(y_values, dtype=np.float64))
    n = system.n_fast
    x_newton, iters = newton_critical_manifold(system.f, system.f_x, y, np.full(n, 1.0 / n))
    p = h0(system, y)
    return {
        "system": system.name,
        "max_abs_diff": float(np.max(np.abs(x_newton - p))),
        "newton_iterations": int(iters),
        "n_y": int(y.shape[0]),
        "y_min": float(y.min()),
        "y_max": float(y.max()),
    }


CONVERGENCE_EPS_MIN = 1e-5
CONVERGENCE_EPS_MAX = 0.5
# The slow variable of every named system relaxes at a rate of order 1 (g = c.x - y; the
# substrate of michaelis-menten), so after t ~ 10 the run sits at its equilibrium, where the
# errors are the solver's, not eps's; the explicit reduced solve's cost grows in proportion to
# t_end there (cycle: 3 s at 1e3, 36 s at 1e4 per run; 1e300 never ends), and the 1501 saved
# points spaced t_end / 1500 apart stop resolving the relaxation (0.67 apart at 1e3).
CONVERGENCE_T_END_MAX = 1e3
# A slope is fitted only where every error lies above this many times its floor (the solver's
# tolerance and round-off): a log-error off by at most log(1.1) then moves a slope fitted over a
# factor-8 range of eps by at most 2 log(1.1) / log 8 < 0.1.
CONVERGENCE_FLOOR_FACTOR = 10.0
_CONVERGENCE_KEYS = ("err_h0", "err_h1", "err_y")


def check_convergence(system, eps_values, t_end: float = 3.0, layer_factor: float = 6.0,
                      rtol: float = 1e-11, name: str = "t_end") -> tuple[np.ndarray, list[float]]:  # fmt: skip
    """The checks of `convergence`, before any integration: `(eps values, largest first; the
    initial layer's duration at each)`, or `InputError`. Each layer is one eigenvalue problem
    of `Q(y0)` (`initial_layer_duration`), so every eps is checked before the first solve.
    `name` is what the messages call `t_end` (the command line's `--t-end`)."""
    _require_me(system)
    eps_values = np.asarray(eps_values, dtype=np.float64).reshape(-1)
    if eps_values.size < 2:
        raise InputError(f"convergence needs at least two eps values; got {eps_values.tolist()}.")
    if not np.all(np.isfinite(eps_values)) or np.any(eps_values <= 0):
        raise InputError(f"eps values must be positive and finite; got {eps_values.tolist()}.")
    if np.unique(eps_values).size != eps_values.size:
        raise InputError(f"eps values must be distinct to fit a slope; got {eps_values.tolist()}.")
    if eps_values.min() < CONVERGENCE_EPS_MIN or eps_values.max() > CONVERGENCE_EPS_MAX:
        raise InputError(
            f"eps values must lie in [{CONVERGENCE_EPS_MIN:g}, {CONVERGENCE_EPS_MAX:g}] (below, the eps^2 error "
            f"of h0 + eps h1 sinks under the solver tolerance rtol = {rtol:g}); got "
            f"{eps_values.tolist()}."
        )
    if not np.isfinite(t_end) or t_end <= 0:
        raise InputError(f"{name} must be a positive finite time; got {number_text(t_end)}.")
    if t_end > CONVERGENCE_T_END_MAX:
        raise InputError(
            f"{name}={number_text(t_end)} is beyond {CONVERGENCE_T_END_MAX:g}: the slow "
            f"variable settles by t of order 10, so a longer run adds only equilibrium, where "
            f"the errors are the solver's round-off, at a cost that grows with {name}; expected "
            f"{name} <= {CONVERGENCE_T_END_MAX:g}."
        )
    eps_values = np.sort(eps_values)[::-1]
    t_layers = []
    for eps in eps_values:
        t_layer = initial_layer_duration(system.with_eps(eps), factor=layer_factor)
        if t_layer >= 0.5 * t_end:  # the errors are measured after the layer, on [t_layer, t_end]
            need = _round_up(2.0 * t_layer)
            longer = f" or {name} above {need:g}" if need <= CONVERGENCE_T_END_MAX else ""
            raise InputError(
                f"eps={eps:g} is too large for {name}={number_text(t_end)}: the initial layer "
                f"lasts about {t_layer:.3g}, and must last less than half of {name} "
                f"({number_text(0.5 * t_end)}); expected smaller eps{longer}."
            )
        t_layers.append(t_layer)
    return eps_values, t_layers


def _round_up(x: float, digits: int = 4) -> float:
    """`x` rounded up to `digits` significant digits: a bound a message states, any value above
    which passes (`x` rounded to nearest may lie below `x`, and a value between would not)."""
    r = float(f"{x:.{digits}g}")
    while r <= x:
        r = float(f"{r + 10.0 ** (np.floor(np.log10(r)) - digits + 1):.{digits}g}")
    return r


def _fit_slopes(eps_values, errs: dict, floors: dict) -> tuple[dict, dict, dict]:
    """Log-log slopes of the errors against eps, `(slopes fitted over every eps, slopes between
    the two smallest eps, notes)`: NaN, with the reason in `notes`, where an error lies within
    `CONVERGENCE_FLOOR_FACTOR` times its floor (there the solver's error, not eps, may set it,
    and a fitted number would be noise). `eps_values` come largest first."""
    slopes, last, notes = {}, {}, {}
    log_eps = np.log(eps_values)
    for k in _CONVERGENCE_KEYS:
        err = np.asarray(errs[k], dtype=np.float64)
        low = ~(err > CONVERGENCE_FLOOR_FACTOR * floors[k])  # NaN counts as low
        if np.any(low):
            i = int(np.argmax(low))
            slopes[k] = last[k] = float("nan")
            notes[k] = (
                f"not determined: the error at eps={eps_values[i]:g} ({err[i]:.3g}) is not above "
                f"{CONVERGENCE_FLOOR_FACTOR:g} times its floor {floors[k]:.2g} (the solver's "
                f"tolerance and round-off), so the solver, not eps, may set it"
            )
        else:
            log_err = np.log(err)
            slopes[k] = float(np.polyfit(log_eps, log_err, 1)[0])
            last[k] = float((log_err[-1] - log_err[-2]) / (log_eps[-1] - log_eps[-2]))
    return slopes, last, notes


def _json_number(v: float):
    return v if np.isfinite(v) else None  # strict JSON has no NaN


def convergence(
    system,
    eps_values,
    t_end: float = 3.0,
    n_eval: int = 1501,
    layer_factor: float = 6.0,
    rtol: float = 1e-11,
    atol: float = 1e-13,
    progress: bool = False,
    warn: bool = True,
) -> xr.Dataset:
    """Errors of the full system against the slow-manifold approximations as `eps` shrinks.

    For each `eps`, the full system is integrated (Radau, analytic Jacobian, tight tolerance)
    and compared with `h0(y(t))`, `h0(y(t)) + eps h1(y(t))` and the reduced trajectory
    `y_reduced(t)` started at the same `y0`, on one window `t >= t_window` for every eps:
    `t_window` is the longest initial layer, that of the largest eps (`layer_factor * eps
    log(1/eps) / gap`). Max norms over time and components. The errors fall along the
    trajectory, so a window that started later for larger eps (each eps's own layer) compared
    each eps at a different time and bent the slopes (cycle: 0.71, 1.72, 0.71).

    `attrs["slopes"]` holds the log-log slopes fitted over every eps (expected 1, 2, 1; the
    next order bends them where eps is not yet small: birth-death 1.16, 2.26, 1.02 on 0.02 to
    0.0025), `attrs["slopes_smallest_pair"]` those between the two smallest eps, the closest
    to the limit (birth-death 1.07, 2.11, 1.01 there); a slope whose errors
    reach within `CONVERGENCE_FLOOR_FACTOR` times their floor (`rtol * max|.| + atol` plus
    round-off) is NaN (null in the JSON), and `attrs["slope_notes"]` says why.

    `attrs["mass_drift_warning"]` (present only where one warned) is the `MassDriftWarning` of
    its runs, with the eps it came from; `warn=False` issues none (`integrate`'s `warn`).
    """
    from .integrators import integrate

    eps_values, t_layers = check_convergence(system, eps_values, t_end, layer_factor, rtol)
    t_window = max(t_layers)
    t = np.linspace(0.0, t_end, n_eval)
    keep = t >= t_window
    y_red = integrate_reduced(system, t)[keep]
    errs = {"err_h0": [], "err_h1": [], "err_y": [], "nfev": []}
    drifts = []  # (eps, MassDriftWarning sentence) of each run that drifted
    x_scale = y_scale = 0.0
    start = time.perf_counter()
    iterator = eps_values
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc="convergence", unit="eps", total=eps_values.size)
    for eps in iterator:
        s = system.with_eps(eps)
        ds = integrate(s, (0.0, t_end), method="radau", rtol=rtol, atol=atol, t_eval=t, warn=warn)
        if "mass_drift_warning" in ds.attrs:
            drifts.append((float(eps), ds.attrs["mass_drift_warning"]))
        if ds.attrs["status"] != "success":
            raise RuntimeError(f"the full system failed at eps={eps:g}: {ds.attrs['message']}")
        x, y = ds["x"].values[keep], ds["y"].values[keep]
        y_in = into_domain(s.generator, y, atol, rtol)  # (a run ending at its edge)
        x0 = h0(s, y_in)
        x1 = x0 + eps * h1(s, y_in)
        errs["err_h0"].append(np.max(np.abs(x - x0)))
        errs["err_h1"].append(np.max(np.abs(x - x1)))
        errs["err_y"].append(np.max(np.abs(y - y_red)))
        errs["nfev"].append(ds.attrs["nfev"])
        x_scale = max(x_scale, float(np.max(np.abs(x))))
        y_scale = max(y_scale, float(np.max(np.abs(y))), float(np.max(np.abs(y_red))))
    # the solver holds each component to rtol |.| + atol; h0 + eps h1 sums n terms (round-off);
    # y and y_reduced come from two solves
    unit = np.finfo(np.float64).eps
    x_floor = rtol * x_scale + atol + system.n_fast * unit * x_scale
    y_floor = 2 * (rtol * y_scale + atol) + unit * y_scale
    floors = {"err_h0": x_floor, "err_h1": x_floor, "err_y": y_floor}
    slopes, last, notes = _fit_slopes(eps_values, errs, floors)
    import json

    drift = {"mass_drift_warning": drift_summary(drifts)} if drifts else {}
    return xr.Dataset(
        {
            "err_h0": (
                "eps",
                np.array(errs["err_h0"]),
                {"long_name": "max |x - h0(y)| after the layer"},
            ),
            "err_h1": (
                "eps",
                np.array(errs["err_h1"]),
                {"long_name": "max |x - h0(y) - eps h1(y)|"},
            ),
            "err_y": ("eps", np.array(errs["err_y"]), {"long_name": "max |y - y_reduced|"}),
            "t_layer": (
                "eps",
                np.array(t_layers),
                {"long_name": "initial layer duration at this eps"},
            ),
            "nfev": (
                "eps",
                np.array(errs["nfev"]),
                {"long_name": "function evaluations, full system"},
            ),
        },
        coords={"eps": eps_values},
        attrs={
            "title": f"convergence in eps of the {system.name} system",
            "system": system.name,
            # the runs' eps are the coordinate `eps`, so the system's own is left out
            "system_params": json.dumps({k: v for k, v in system.params().items() if k != "eps"},
                                        default=float),  # fmt: skip
            "t_end": t_end,
            "t_window": t_window,
            "layer_factor": layer_factor,
            "rtol": rtol,
            "atol": atol,
            "slopes": json.dumps({k: _json_number(v) for k, v in slopes.items()}),
            "slope_err_h0": slopes["err_h0"],
            "slope_err_h1": slopes["err_h1"],
            "slope_err_y": slopes["err_y"],
            "slopes_smallest_pair": json.dumps({k: _json_number(v) for k, v in last.items()}),
            "slope_notes": json.dumps(notes),
            "error_floors": json.dumps(floors),
            "floor_factor": CONVERGENCE_FLOOR_FACTOR,
            "expected_slopes": json.dumps({"err_h0": 1, "err_h1": 2, "err_y": 1}),
            "wall_time_s": time.perf_counter() - start,
            "fastslow_sim_version": __version__,
            **drift,
        },
    )


def drift_summary(drifts: list) -> str:
    """One sentence of the `MassDriftWarning`s of several runs, `[(eps, sentence)]`: the one's
    own, with its eps; of several, how many and the first."""
    (eps, text), n = drifts[0], len(drifts)
    if n == 1:
        return f"at eps = {eps:g}, {text}"
    return f"{n} runs warned; the first, at eps = {eps:g}: {text}"


def manifold_curve(system, y_grid) -> xr.Dataset:
    """`h0(y)` and `h1(y)` on a grid of `y`, as a dataset (for plots of the equilibrium manifold)."""
    import json

    y_grid = np.asarray(y_grid, dtype=np.float64).reshape(-1)
    return xr.Dataset(
        {
            "h0": (
                ("y_grid", "state"),
                h0(system, y_grid),
                {"long_name": "critical manifold p_st(Q(y))"},
            ),
            "h1": (
                ("y_grid", "state"),
                h1(system, y_grid),
                {"long_name": "first-order correction h1(y)"},
            ),
        },
        coords={"y_grid": y_grid, "state": np.arange(system.n_fast)},
        attrs={
            "system": system.name,
            "eps": system.eps,
            "system_params": json.dumps(system.params(), default=float),
        },  # fmt: skip
    )
