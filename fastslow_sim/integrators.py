"""One entry point, `integrate(system, t_span, x0, y0, method=..., **options)`, over the string
registry `solvers.METHODS` (one module per back-end in `fastslow_sim/solvers/`):

- scipy (`radau`, `bdf`, `lsoda`: implicit/stiff, given the analytic Jacobian; `rk45`,
  `dop853`: explicit);
- torchdiffeq (`dopri5`, `dopri8`, `bosh3`, `adaptive_heun`: explicit, on the system's torch
  vector field, differentiable through `solvers.torchdiffeq_ode.odeint_system`);
- `rodas4` (the batched torch Rosenbrock march, `fastslow_sim.rosenbrock`);
- `multirate` (the map of DESIGN 3.3, blocks of slow time `H`, `P = 1/eps` tokens each).

`x0 (B, n)` or `y0 (B, m)` (or one `eps` per trajectory) make a batch: the dataset gains a
`batch` dimension with a status and statistics per trajectory, and one failing trajectory does
not stop the others. `rodas4` solves the batch in one march; the other methods row by row.

`method="auto"` measures stiffness at the start, `S = max_i |Re lambda_i(J(z0))| * (t1 - t0)`
with `J` the full Jacobian (whose fast eigenvalues scale as `1/eps`; above 1,024 unknowns a
Gershgorin bound on them, `stiffness_index`), and chooses by the cost
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
  Other systems keep LSODA. A batch takes `rodas4` at tolerances a hundred times tighter where
  the system has a torch form (one march for all trajectories; at the requested ones its error
  reached 7.4 times the tolerance at eps 1e-10, and a sweep cell, always a batch, missed what
  `integrate` met), LSODA row by row otherwise.

The dataset records the tolerances asked for (`rtol`, `atol`) and those the solver ran with
(`solver_rtol`, `solver_atol`; scipy's methods raise an rtol below 2.22e-14, 100 float64
epsilons, to it, said in the attribute `rtol_warning`). An explicit method needs at least about
`S / 3.3` steps for stability alone (the real stability interval of dopri5), so asking for one
when `S > 500` issues a `StiffnessWarning` with that cost estimate (DESIGN 4: dopri5 needs about
290,000 evaluations at `eps = 1e-3` on a 16-state birth-death system); one whose stable step is
below ten float64 spacings of the times near `t_end` (rates of 1e174, at `y0 = 100` on the birth-death chain) can
never reach it and is refused (`InputError`). On a batch, both judge the stiffest trajectory
(`S` of every one, named in the sentence; the dataset's `stiffness_index` is then the largest,
each one's in `stiffness_index_batch`) while `B N^3 <= 2^28` (`N = n + m`; 16,384 trajectories
of 17 unknowns take about 1.3 s), else the first only (the attribute `stiffness_judged` says
so); `auto` and the implicit methods, which need no such judgement, compute the first
trajectory's `S` only (the dataset's `stiffness_index`).

A failed solve does not raise: the dataset's `status` and `message` attributes say why, and the
states after the failure are NaN.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import warnings

import numpy as np
import xarray as xr

from ._version import __version__
from .errors import InputError
from .generators import domain_text, into_domain
from .solvers import ATOL_ANY, METHODS, SOLVER_ERRORS, Solution, check_max_steps
from .threads import check_threads, small_problem_threads, torch_threads
from .validation import number, positive
from .validation import t_span as check_t_span
from .wording import bytes_text, count_text, plural, short_repr

__all__ = [
    "integrate",
    "check_inputs",
    "integrate_batch",
    "trajectory_summary",
    "random_initial_conditions",
    "METHODS",
    "StiffnessWarning",
    "stiffness_index",
    "estimate_explicit_nfev",
]

STIFF_THRESHOLD = 500.0
RTOL, ATOL, N_EVAL = 1e-8, 1e-10, 401  # integrate's defaults (None there)
VERY_STIFF = 1e9  # S above which `auto` takes rodas4 (see the module docstring)
AUTO_RTOL_MIN = 100 * 2.0**-52  # scipy's smallest rtol
EPS_MIN = 1e-12
TIME_STEP_MIN = np.finfo(np.float64).tiny  # 2.2e-308: saved times closer lose digits


class StiffnessWarning(UserWarning):
    """An explicit method was asked for on a stiff problem."""


class IgnoredOptionWarning(UserWarning):
    """`method="auto"` picked a method that does not take options it was given (rodas4's)."""


class MassDriftWarning(UserWarning):
    """A trajectory's total probability `1^T x` drifted by more than the tolerance asked for."""


def stiffness_index(system, z0, t_span, eps=None):
    """`max |Re lambda(J(z0))| * (t1 - t0)`: how many unit-stability steps an explicit method
    needs. Above `EIG_MAX` unknowns, where the eigenvalues cost O(n^3) (42 s at 4,097), it is
    Gershgorin's bound `min(max_i sum_j |B_ij|, max_j sum_i |B_ij|) >= max |Re lambda|` on the
    balanced Jacobian `B = D^-1 J D` (same eigenvalues; the balancing keeps the slow row and
    column from inflating the bound), in O(n^2): 1.42 times the eigenvalue's on the default
    birth-death chain of 1,024 states. `z0 (B, n+m)` (with `eps (B,)`, one per row, or None:
    the system's) gives every row's, an array `(B,)`, from stacked Jacobians (16,384 of 17
    unknowns in about 1 s). The rates of the last Jacobian (or stack) are kept, keyed on its
    bytes, so that checking the inputs and then integrating them (`check_inputs` and
    `integrate`, as the CLI does) solves the eigenvalue problems once (1 s at 1,024 unknowns)."""
    z0 = np.asarray(z0, dtype=np.float64)
    N = z0.shape[-1]
    rows = max(1, JACOBIAN_CHUNK_BYTES // (8 * N * N))  # stacked Jacobians held at once

    def jacobians():  # (N, N) for one trajectory; chunks (k, N, N) of a stack
        if z0.ndim == 1:
            yield np.ascontiguousarray(system.jacobian(t_span[0], z0), dtype=np.float64)
            return
        for a in range(0, len(z0), rows):
            z = z0[a : a + rows]
            if eps is None:
                yield _stacked_jacobian(system, t_span[0], z)
                continue
            e = np.asarray(eps, dtype=np.float64)[a : a + rows]
            jac = np.empty((len(z), N, N))
            for value in np.unique(e):  # the top block is f's Jacobian over each row's eps
                jac[e == value] = _stacked_jacobian(system.with_eps(float(value)), t_span[0],
                                                    z[e == value])  # fmt: skip
            yield jac

    # built once where they fit in one chunk (every one trajectory and most batches) or where
    # the rate is Gershgorin's O(N^2) bound (computed in the hashing pass, about as cheap as a
    # second build), else twice, for the key and on a miss for the eigenvalues, never all held
    held = list(jacobians()) if z0.ndim == 1 or len(z0) <= rows else None
    digest = hashlib.blake2b()
    bounds = [] if held is None and N > EIG_MAX else None
    for jac in held or jacobians():
        digest.update(jac.tobytes())
        if bounds is not None:
            bounds.append(_max_rates(jac))
    key = (z0.shape, N > EIG_MAX, digest.digest())
    last = _LAST_RATE[0]  # one read of the (key, rate) pair: another thread may replace it
    if last is not None and last[0] == key:
        rate = last[1]
    else:
        rate = np.concatenate(bounds or [_max_rates(jac) for jac in held or jacobians()])
        _LAST_RATE[0] = (key, rate)
    if z0.ndim == 1:
        return float(rate[0] * (t_span[1] - t_span[0]))
    return rate * (t_span[1] - t_span[0])


def _stacked_jacobian(system, t, z):
    """`J(z_b)` of every row of `z (k, N)`, `(k, N, N)`: one stacked call where the system has
    all four Jacobian blocks, else (finite differences, whose step would depend on the other
    rows) or where that call fails or returns another shape (a user's blocks written for one
    state), row by row."""
    k, N = z.shape
    if all(getattr(system, b, None) is not None for b in ("f_x", "f_y", "g_x", "g_y")):
        try:
            jac = np.asarray(system.jacobian(t, z), dtype=np.float64)
        except (ValueError, IndexError, TypeError):
            jac = None
        if jac is not None and jac.shape == (k, N, N):
            return np.ascontiguousarray(jac)
    return np.stack([np.asarray(system.jacobian(t, row), dtype=np.float64) for row in z])


def _max_rates(jac):
    """`max |Re lambda|` of each Jacobian of `jac (N, N)` or `(k, N, N)` (Gershgorin's bound on
    the balanced one above `EIG_MAX` unknowns, `stiffness_index`), an array `(k,)`."""
    jac = jac.reshape(-1, *jac.shape[-2:])
    if not np.all(np.isfinite(jac)):  # eigvals would raise numpy's LinAlgError
        raise InputError(
            "the Jacobian of the system is not finite at the initial state, so its stiffness "
            "(by which auto chooses a method and every method is judged) cannot be measured; "
            "expected an initial state where f and g have finite derivatives."
        )
    if jac.shape[-1] <= EIG_MAX:
        return np.max(np.abs(np.linalg.eigvals(jac).real), axis=-1)
    import scipy.linalg

    out = np.empty(len(jac))
    for k, one in enumerate(jac):
        a = np.abs(scipy.linalg.matrix_balance(one, permute=False)[0])
        out[k] = min(a.sum(-1).max(), a.sum(-2).max())
    return out


_LAST_RATE = [None]  # (key, max |Re lambda| per Jacobian) of the last call, see stiffness_index
EIG_MAX = 1024
JACOBIAN_CHUNK_BYTES = 64 * 2**20  # stacked Jacobians per eigvals call, stiffness_index
# an explicit method's batch is judged at every trajectory while B N^3 (the eigenvalue problems'
# operations, up to a constant) stays below this (16,384 x 17 unknowns: about 1.3 s here), else
# at its first trajectory only, as `auto` and the implicit methods are (a batch of 32 x 4,097
# unknowns took 90 s more to judge every row than its solve took)
STIFFNESS_BATCH_WORK = 2**28


def estimate_explicit_nfev(method: str, stiffness: float) -> int:
    """Function evaluations an explicit method needs for stability alone: `stages * S / interval`."""
    interval, stages = METHODS[method].explicit_stability
    return int(stages * stiffness / interval)


def _stiffest(system, stiffness, eps) -> tuple[float, str]:
    """`(S, where)`: the largest of the stiffness indices (one, or one per trajectory) and where
    it is, `"eps=0.02"` or `"trajectory 2 of 8, the stiffest (batch index 1, eps=0.02)"`."""
    s = np.atleast_1d(stiffness)
    b = int(np.argmax(s))
    e = system.eps if eps is None else eps[b]
    if s.size == 1:
        return float(s[0]), f"eps={e:g}"
    return float(s[b]), f"trajectory {b + 1} of {s.size}, the stiffest (batch index {b}, eps={e:g})"


def _check_explicit_step(method, stiffness, where, t0, t1) -> None:
    """`InputError` where the largest stable step of the explicit `method`, `interval (t1 - t0)
    / S`, is below ten float64 spacings of the times near `t_end`, the smallest step a solver
    takes there: it could never reach `t_end` (the birth-death chain at y0 = 100, rates 1e174:
    a stable step of 1e-174; scipy's RK45 marched at t ~ 1e-170 for ever, DOP853 and
    torchdiffeq stopped). `where`: its eps, or which trajectory of a batch (`_stiffest`)."""
    interval = method.explicit_stability[0]
    step = interval * (t1 - t0) / stiffness
    floor = 10 * np.spacing(max(abs(t0), abs(t1)))
    if step < floor:
        raise InputError(
            f"the explicit method {method.name!r} is stable only with steps up to about "
            f"{step:.3g} (stiffness index {stiffness:.3g} over [{t0:g}, {t1:g}] at {where}), "
            f"below ten float64 spacings of the times near t_end ({floor:.3g}), so it cannot "
            f"reach t_end; expected a stiff method (rodas4, lsoda, bdf) or method='auto'."
        )


def check_eps_range(eps, method) -> None:
    """`InputError` unless the ODE solvers resolve `eps` (one value or an array) in float64."""
    if method == "multirate":  # P = 1/eps tokens per block, an integer a dataset can store
        from .multirate import block_tokens

        for e in np.unique(np.asarray(eps, dtype=np.float64)):
            block_tokens(float(e))
        return
    e = np.min(np.asarray(eps, dtype=np.float64))
    if e < EPS_MIN:
        from .systems import P_EXACT  # the bound `check_P_exact` states for multirate's P

        raise InputError(
            f"eps = {e:g} is below {EPS_MIN:g}, the smallest time-scale ratio the ODE solvers "
            f"resolve in float64 (the fast rates are the generator's times 1/eps); expected "
            f"eps >= {EPS_MIN:g}, or method 'multirate', which takes eps = 1/P for an integer "
            f"P at most 2**51 = {P_EXACT:,}, or a larger one below 2**63 that 1/P gives back "
            f"exactly, such as a power of two."
        )


def method_options(method: str, t_end, H=None, march=None, max_steps=None) -> dict:
    """The method's own options of `fastslow-sim integrate` (`--H`, `--march`, `--max-steps`;
    None: not given) as `integrate` takes them, checked as the command checks them: `H` only
    with multirate (a positive block length, at most `MAX_BLOCKS` blocks to `t_end`), `march`
    only with the rosenbrock methods and auto, `max_steps` with every method that counts its
    steps (not multirate). One `InputError` in the command's words otherwise."""
    kwargs = {}
    if H is not None:
        if method != "multirate":
            raise InputError(f"--H is the block length of --method multirate; got --method {method}.")
        kwargs["H"] = number("--H", H, 0.0, None, lo_open=True)
    if method == "multirate":  # one saved state per block, as many as --n-eval allows
        from .solvers.multirate import check_block_count

        check_block_count(t_end, kwargs.get("H"))
    if march is not None:
        takes = [m for m, entry in METHODS.items() if "march" in entry.options]
        if method != "auto" and method not in takes:
            raise InputError(f"--march chooses the march of {', '.join(takes)} (and of auto, "
                             f"where it picks rodas4); got --method {method}.")  # fmt: skip
        kwargs["march"] = march
    if max_steps is not None:
        if "max_steps" not in METHODS[method].options and method != "auto":
            raise InputError(f"--max-steps bounds the steps of the ODE solvers, and --method "
                             f"{method} counts none; expected no --max-steps with it.")  # fmt: skip
        kwargs["max_steps"] = check_max_steps(max_steps, "--max-steps")
    return kwargs


def random_initial_conditions(system, batch: int, seed=None):
    """`(x0 (batch, n), y0 (batch, m))` drawn with `numpy.random.default_rng(seed)`: `x0` uniform
    on the probability simplex (Dirichlet(1)), `y0` uniform in [0, 1] (what
    `fastslow-sim integrate --batch N --seed S` integrates). `batch` is an integer >= 0."""
    if isinstance(batch, bool):  # True is no count of trajectories
        raise InputError(f"batch must be an integer >= 0; got {batch!r}.")
    batch = int(number("batch", batch, lo=0, integer=True))
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(system.n_fast), batch), rng.uniform(
        0.0, 1.0, (batch, system.n_slow)
    )


def check_inputs(system, t_span=(0.0, 10.0), x0=None, y0=None, *, method: str = "auto",
                 rtol: float = 1e-8, atol: float = 1e-10, t_eval=None, n_eval: int | None = None,
                 eps=None, P=None, names: dict | None = None, **options):  # fmt: skip
    """What `integrate` refuses before any work, refused the same way (one `InputError`), so that
    a caller can check before it creates anything (the CLI's default output folder). Returns the
    inputs as `integrate` reads them: `(method entry, rtol, atol, (t0, t1), x0 (B, n), y0 (B, m),
    eps (B,) or None, t_eval, S)`: `S` the stiffness index of the first trajectory, or of every
    one, an array `(B,)`, for an explicit method on a batch (whose stiffest one is judged).
    `eps` or `P` as `integrate` takes them: one number checks `system.with_eps(...)` (and
    returns `eps` None), one per trajectory returns them as `eps (B,)`. `n_eval` None is 401.
    `names`: how a message calls an argument (`x0`, `y0`, `n_eval`, `max_steps`; the command
    line passes its option names, `{"y0": "--y0", ...}`)."""
    names = names or {}
    check_system(system)
    system, eps = run_eps(system, eps, P)
    chosen = _method(method, options)
    if "max_steps" in options:
        check_max_steps(options["max_steps"], names.get("max_steps", "max_steps"))
    if options.get("device") is not None:
        _check_device(options["device"])
    rtol = positive("rtol", rtol)
    atol = _check_atol(system, atol, chosen, names.get("atol", "atol"))
    t0, t1 = check_t_span(t_span)
    x0, y0, eps = _initial_states(system, x0, y0, eps, names)
    check_eps_range(system.eps if eps is None else eps, method)
    _check_field_shapes(system, x0[0], y0[0], names)
    for b in range(x0.shape[0]):
        _check_rates_finite(system if eps is None else system.with_eps(eps[b]), y0[b])
    _check_field_finite(system, np.concatenate([x0, y0], axis=1), eps, t0, names)
    t_eval_given = t_eval is not None
    if t_eval_given and n_eval is not None:  # n_eval would be dropped without a word
        raise InputError(f"give either t_eval (the saved times) or {names.get('n_eval', 'n_eval')} "
                         f"(how many, equally spaced), not both; got n_eval={n_eval!r} with "
                         f"t_eval.")  # fmt: skip
    n_eval = N_EVAL if n_eval is None else n_eval
    t_eval = _output_times(t0, t1, t_eval, n_eval, names.get("n_eval", "n_eval"))
    if method != "multirate":  # the map saves one state per block (`check_block_count`)
        check_output_size(system, x0.shape[0], len(t_eval))
    else:
        from .solvers.multirate import DEFAULT_H, block_rows, whole_blocks

        whole_blocks(t0, t1, options.get("H", DEFAULT_H))
        if t_eval_given:  # only block ends: the map has no state between them
            block_rows(t0, t1, options.get("H", DEFAULT_H), t_eval)
    z0 = np.concatenate([x0, y0], axis=1)
    explicit = method != "auto" and chosen.explicit_stability
    if explicit and 1 < len(z0) and len(z0) * z0.shape[1] ** 3 <= STIFFNESS_BATCH_WORK:
        # its stable step is the stiffest trajectory's
        stiffness = stiffness_index(system, z0, (t0, t1), eps)
    else:  # auto and the implicit methods read the first trajectory's only
        first = system if eps is None else system.with_eps(eps[0])
        stiffness = stiffness_index(first, z0[0], (t0, t1))
    if explicit and np.max(stiffness) > STIFF_THRESHOLD:
        _check_explicit_step(chosen, *_stiffest(system, stiffness, eps), t0, t1)
    return chosen, rtol, atol, (t0, t1), x0, y0, eps, t_eval, stiffness


def integrate(system, t_span=(0.0, 10.0), x0=None, y0=None, *, method: str = "auto",
              rtol: float | None = None, atol: float | None = None, t_eval=None,
              n_eval: int | None = None,
              eps=None, P=None, names: dict | None = None, threads: int | None = None,
              warn: bool = True, **options) -> xr.Dataset:  # fmt: skip
    """Integrate `eps dx/dt = f(x, y)`, `dy/dt = g(x, y)` over `t_span` from `(x0, y0)`.

    `x0 (n,)`, `y0 (m,)` give one trajectory; `x0 (B, n)` or `y0 (B, m)` (either may be shared)
    or `eps` of shape `(B,)` give a batch (see the module docstring). `eps` or `P = 1/eps` (one
    of them, DESIGN 2; neither: the system's): one number runs the system with it
    (`system.with_eps`, no batch dimension), a 1-D sequence (a list, an array, a torch tensor,
    whose values are copied) one per trajectory, recorded in `eps_batch` and `P_batch`; strings,
    bools and arrays of two or more dimensions are refused. `options` are the method's
    own (`METHODS[method].options`): `max_steps` (every method but multirate), `device`,
    `dense_output`, `linear_solver` (rodas4), `H` (multirate: blocks of slow time `H`, the state
    saved at block ends, or at those of them that `t_eval` names (another time is refused); the
    span must be a whole number of blocks; `rtol`, `atol` and `n_eval`, which the map cannot
    honour, are ignored with an `IgnoredOptionWarning` where given, and its dataset records no
    tolerance). Every method starts at `t_span[0]` from `(x0, y0)` and saves the states at the
    times of `t_eval` (which need not include `t_span[0]`; at least two, finite, increasing;
    not with `n_eval`). `rtol`, `atol`, `n_eval`: None takes the defaults 1e-8, 1e-10 and 401. `names`:
    how a refusal calls the arguments (`check_inputs`). `threads`: torch's intra-op threads
    during the solve (restored after); `None` chooses (`small_problem_threads`: one for a
    torch method's small problem on the CPU, else torch's own setting). `warn=False`: the
    run issues no warning of its own (`StiffnessWarning`, `IgnoredOptionWarning`,
    `MassDriftWarning`) and leaves the process's warning state alone; their sentences are in
    the attributes either way (`stiffness_warning`, `ignored_options_warning`,
    `mass_drift_warning`, `rtol_warning`, present only where the run would warn), so that a
    caller running several solves at once in threads (a sweep's cells) reads each run's own.

    Returns an `xarray.Dataset` with `x(time, state)`, `y(time, slow)`, and for master-equation
    systems `p_st(time, state)` = `p_st(Q(y(t)))`, `manifold_distance(time)` = `|x - p_st|_1`
    and `mass_error(time)` = `1^T x - 1`; the attributes hold the system, its parameters, `eps`,
    `P`, method, tolerances, solver statistics (`nfev`, `njev`, `nlu`), status and the solve's
    wall time (`wall_time_s`; rodas4 and rodas3 first make a one-step solve of the first
    trajectory, timed apart as `load_wall_time_s`: numba loads the compiled march's kernels
    then, and the torch march pays torch's first use).
    `stiffness_index` is `S = max |Re lambda(J(z0))| (t1 - t0)` of the first trajectory; for an
    explicit method on a batch, the largest over the trajectories (the attribute
    `stiffness_index_of` says which; each one's in the variable `stiffness_index_batch(batch)`)
    while `B N^3 <= STIFFNESS_BATCH_WORK`, else the first one's (the attribute
    `stiffness_judged` says so). A failed solve does not raise: `status` says why.
    """
    check_system(system)
    system, eps = run_eps(system, eps, P)  # one number: the system's eps; else one per row
    batched = any(v is not None and np.ndim(v) == 2 for v in (x0, y0)) or eps is not None
    if threads is not None:
        threads = check_threads(threads)
    # None: the default (RTOL, ATOL, N_EVAL); what the caller gave, the map says it ignored
    given = {k: v is not None for k, v in (("rtol", rtol), ("atol", atol), ("n_eval", n_eval))}
    t_eval_given = t_eval is not None
    rtol = RTOL if rtol is None else rtol
    atol = ATOL if atol is None else atol
    chosen, rtol, atol, (t0, t1), x0, y0, eps, t_eval, stiffness = check_inputs(
        system, t_span, x0, y0, method=method, rtol=rtol, atol=atol, t_eval=t_eval, n_eval=n_eval,
        eps=eps, names=names, **options,
    )  # fmt: skip
    B = x0.shape[0]
    z0 = np.concatenate([x0, y0], axis=1)

    solver_rtol, solver_atol = rtol, atol
    said = {}  # the warnings' sentences, also kept in the attributes
    if method == "auto":
        name, tighten = _auto_choice(system, stiffness, atol, batched)
        chosen = METHODS[name]
        solver_rtol, solver_atol = max(rtol / tighten, AUTO_RTOL_MIN), atol / tighten
        # rodas4's options (the ones auto accepts) reach LSODA only where it takes them (max_steps)
        ignored = sorted(set(options) - set(chosen.options))
        if ignored:
            said["ignored_options_warning"] = (
                f"auto picked {name} (stiffness index {stiffness:.3g}), which takes none of the "
                f"options {ignored}: they were ignored (they steer rodas4; pass "
                f"method='rodas4' to use them).")  # fmt: skip
            if warn:
                warnings.warn(said["ignored_options_warning"], IgnoredOptionWarning, stacklevel=2)
        options = {k: v for k, v in options.items() if k in chosen.options}
    elif method == "multirate":
        # the map takes no tolerance and saves one state per block: options it cannot honour
        # are said (not refused: a sweep's `--grid method=...` passes them to every method)
        ignored = [k for k in ("rtol", "atol", "n_eval") if given[k]]
        if ignored:
            said["ignored_options_warning"] = (
                f"method 'multirate' takes no tolerance and saves one state per block of H, so "
                f"the options {ignored} were ignored (the dataset records no rtol or atol).")  # fmt: skip
            if warn:
                warnings.warn(said["ignored_options_warning"], IgnoredOptionWarning, stacklevel=2)
    elif chosen.explicit_stability and np.max(stiffness) > STIFF_THRESHOLD:  # (step checked)
        worst, where = _stiffest(system, stiffness, eps)
        cost = estimate_explicit_nfev(chosen.name, worst)
        said["stiffness_warning"] = (
            f"the problem is stiff (stiffness index {worst:.3g} at {where}); the "
            f"explicit method {chosen.name!r} will need about {cost:.3g} function evaluations "
            f"for stability alone. Use a stiff method (radau, bdf, lsoda) or method='auto'.")  # fmt: skip
        if warn:
            warnings.warn(said["stiffness_warning"], StiffnessWarning, stacklevel=2)
    if solver_rtol < chosen.rtol_min:  # the solver would raise it: it runs with, and records, that
        said["rtol_warning"] = (
            f"rtol {solver_rtol:.3g} is below {chosen.rtol_min:.3g}, the smallest that "
            f"{chosen.name} runs with (100 float64 epsilons, scipy's floor): it ran with "
            f"{chosen.rtol_min:.3g} (the attribute solver_rtol).")  # fmt: skip
        solver_rtol = chosen.rtol_min
        if warn:
            warnings.warn(said["rtol_warning"], UserWarning, stacklevel=2)
    if chosen.needs_torch_form and not system.has_torch_form():
        raise InputError(
            f"method {chosen.name!r} needs a system with a torch form (a master-equation system "
            f"with one slow variable whose generator and slow law define their torch rates); "
            f"{system.name!r} has none."
        )

    if threads is None:
        threads = small_problem_threads(chosen.backend, step_elements(system, B),
                                        options.get("device"))  # fmt: skip
    # every method starts at t0 from (x0, y0) and saves at t_eval only: a t_eval after t0 gets
    # t0 in front for the solver, and its row is dropped below (the solvers start at their
    # first time). The multirate map marches whole blocks over [t0, t1] (`_multirate_rows`)
    multirate = chosen.name == "multirate"
    if multirate:
        t_solve = np.array([t0, t1])
    elif t_eval[0] > t0:
        t_solve = np.concatenate([[t0], t_eval])
    else:
        t_solve = t_eval
    load = None
    if chosen.prepare is not None and len(t_solve) >= 2:  # untimed: what a first call loads
        load = time.perf_counter()
        try:  # the solve below meets any error of this one, and reports it
            with torch_threads(threads), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                chosen.prepare(system, z0, t_solve, solver_rtol, solver_atol, eps=eps, **options)
        except (InputError, *SOLVER_ERRORS):
            pass
        load = time.perf_counter() - load
    start = time.perf_counter()
    try:
        with torch_threads(threads):
            sol = chosen.solve(system, z0, t_solve, solver_rtol, solver_atol, eps=eps, **options)
    except InputError:
        raise
    except SOLVER_ERRORS as err:  # a status, not an exception in the middle of a run
        text = f"{chosen.name} raised {type(err).__name__}: {err}"
        t_rows = t_solve
        if multirate:  # the map's rows are its block ends, as a finished run's
            from .solvers.multirate import DEFAULT_H, whole_blocks

            H = options.get("H", DEFAULT_H)
            t_rows = t0 + H * np.arange(whole_blocks(t0, t1, H) + 1)
        sol = Solution(np.full((len(t_rows), B, z0.shape[1]), np.nan), ["error"] * B,
                       [text] * B, {k: np.zeros(B, int) for k in ("nfev", "njev", "nlu")},
                       t=t_rows if multirate else None)  # fmt: skip
    wall = time.perf_counter() - start
    if multirate:
        t_out = sol.t if sol.t is not None else t_eval
        if t_eval_given and sol.t is not None:  # the block ends asked for
            from .solvers.multirate import DEFAULT_H, block_rows

            rows = block_rows(t0, t1, options.get("H", DEFAULT_H), t_eval)
            sol.z, t_out = sol.z[rows], sol.t[rows]
    else:
        if len(t_solve) > len(t_eval):  # drop the start that the solver was given
            sol.z = sol.z[1:]
            sol.t = None if sol.t is None else sol.t[1:]
        t_out = t_eval if sol.t is None else sol.t
    for b in range(B):  # never a success with NaN states
        if sol.status[b] == "success" and not np.all(np.isfinite(sol.z[:, b])):
            sol.status[b], sol.message[b] = "non_finite", "the solution became non-finite"
    attrs = {
        "method": chosen.name, "method_requested": method, "backend": chosen.backend,
        "rtol": rtol, "atol": atol if np.ndim(atol) == 0 else atol.tolist(),
        "solver_rtol": solver_rtol,
        "solver_atol": solver_atol if np.ndim(solver_atol) == 0 else solver_atol.tolist(),
        # the solver stops at its last time: a t_eval that ends before t1 ends the run there
        "t_start": t0, "t_end": float(t_solve[-1]), "stiffness_index": float(np.max(stiffness)),
        **sol.attrs, **said,
    }  # fmt: skip
    if load is not None:  # wall_time_s is the solve's alone
        attrs["load_wall_time_s"] = load
    if multirate:  # it ran with no tolerance: the record claims none
        for k in ("rtol", "atol", "solver_rtol", "solver_atol"):
            del attrs[k]
        attrs["tolerance"] = "none: the multirate map's fast propagation is exact per token"
    if chosen.backend == "torchdiffeq":
        attrs["differentiable"] = int(system.has_torch_form())
    x, y = system.split(np.moveaxis(sol.z, 1, 0))  # (B, T, .)
    if not batched:
        ds = _to_dataset(system, t_out, x[0], y[0], attrs={
            **attrs, **{k: int(v[0]) for k, v in sol.stats.items()},
            "status": sol.status[0], "message": sol.message[0], "wall_time_s": wall,
        })  # fmt: skip
        return _mass_drift(_finite_or_failed(ds), system, rtol, atol, warn)
    n_failed = sum(s != "success" for s in sol.status)
    ds = _to_dataset(system, t_out, x, y, attrs={
        **attrs, "batch_size": B,
        "status": "success" if not n_failed else f"{n_failed} of {plural(B, 'trajectory')} failed",
        "message": "per-trajectory status in the variable 'status'", "wall_time_s": wall,
        **{k: int(np.sum(sol.stats[k])) for k in ("nfev", "njev", "nlu") if k in sol.stats},
    }, batch=True)  # fmt: skip
    ds["status"] = ("batch", np.array(sol.status, dtype=object),
                    {"long_name": "solver status per trajectory"})  # fmt: skip
    ds["message"] = ("batch", np.array(sol.message, dtype=object),
                     {"long_name": "solver message per trajectory"})  # fmt: skip
    for k, v in sol.stats.items():
        ds[f"stat_{k}"] = ("batch", np.asarray(v), {"long_name": f"{k} per trajectory"})
    if np.ndim(stiffness):
        ds.attrs["stiffness_index_of"] = (
            f"{_stiffest(system, stiffness, eps)[1]}: every trajectory was judged for the "
            f"explicit method, each one's index in the variable stiffness_index_batch")
        ds["stiffness_index_batch"] = ("batch", stiffness, {
            "long_name": "stiffness index max |Re lambda(J(z0))| (t1 - t0) of each trajectory"})
    elif chosen.explicit_stability and method != "auto" and B > 1:
        N = z0.shape[1]
        ds.attrs["stiffness_judged"] = (
            f"at the first trajectory only (all {B:,} would take eigenvalue problems of about "
            f"B N^3 = {B * N**3:.3g} operations, above {STIFFNESS_BATCH_WORK:.3g}); a stiffer "
            f"later trajectory is not warned of")  # fmt: skip
    if eps is not None:  # the runs' eps, not the system's: each one's, and one where shared
        Ps = [system.with_eps(float(e)).P for e in eps]
        ds["eps_batch"] = ("batch", eps, {"long_name": "eps of each trajectory", "units": "1"})
        ds["P_batch"] = ("batch", np.array([-1 if p is None else p for p in Ps], dtype=np.int64),
                         {"long_name": "P = 1/eps of each trajectory; -1 when 1/eps is not an "
                                       "integer"})  # fmt: skip
        params = system.params()
        if np.all(eps == eps[0]):
            ds.attrs["eps"], ds.attrs["P"] = float(eps[0]), -1 if Ps[0] is None else Ps[0]
            params["eps"] = float(eps[0])
        else:
            ds.attrs["eps"], ds.attrs["P"] = float("nan"), -1
            params["eps"] = None
            ds.attrs["P_note"] = ("eps varies per trajectory (NaN here, P -1): each one's eps "
                                  "and P in the variables eps_batch and P_batch")  # fmt: skip
        ds.attrs["system_params"] = json.dumps(params, default=float)
    return _mass_drift(_finite_or_failed(ds), system, rtol, atol, warn)


def step_elements(system, batch: int) -> int:
    """The largest tensor of a torch step, in elements: `B n^2` for a generator that is not a
    neighbour chain (its rates and Jacobian are `(B, n, n)`), else `B (n + m)`."""
    from .generators import Generator

    gen = getattr(system, "generator", None)
    chain = gen is None or type(gen).chain_rates is not Generator.chain_rates
    n, m = system.n_fast, system.n_slow
    return batch * (n + m if chain else (n + m) ** 2)


def trajectory_summary(ds: xr.Dataset) -> dict:
    """The numbers a user looks at first, JSON-able: the method, tolerances, final state, its
    L1 distance to `p_st(y)` (the largest in a batch), the largest mass error, the statistics,
    the status (with counts per status in a batch) and the wall time."""
    a = ds.attrs
    out = {k: a[k] for k in ("eps", "method", "method_requested", "t_start", "t_end", "status",
                             "message", "wall_time_s")}  # fmt: skip
    # the multirate map records no tolerance (None here)
    out.update(rtol=a.get("rtol"), atol=a.get("atol"))
    if "load_wall_time_s" in a:  # loading compiled kernels, before the timed solve
        out["load_wall_time_s"] = a["load_wall_time_s"]
    if "eps_batch" in ds:  # one eps per trajectory: each one's (eps None where they differ)
        out["eps_batch"] = ds["eps_batch"].values.tolist()
        out["P_batch"] = [None if p == -1 else int(p) for p in ds["P_batch"].values.tolist()]
        if len(set(out["eps_batch"])) > 1:
            out["eps"] = None
    out.update(
        P=None if a["P"] == -1 else int(a["P"]),
        stiffness_index=a.get("stiffness_index", float("nan")),
        x_final=ds["x"].values[..., -1, :].tolist(),
        y_final=ds["y"].values[..., -1, :].tolist(),
        nfev=a["nfev"], njev=a["njev"], nlu=a["nlu"],
    )  # fmt: skip
    if "march" in a:  # the rosenbrock methods: which march ran
        out["march"] = a["march"]
    if "p_st" in ds:
        out["p_st_final"] = ds["p_st"].values[..., -1, :].tolist()
        out["manifold_distance_final"] = float(np.max(ds["manifold_distance"].values[..., -1]))
    if "mass_error" in ds:
        # NaN where a trajectory failed: its mass is not known, not zero
        out["mass_error_max"] = float(np.max(np.abs(ds["mass_error"].values)))
    if "mass_drift_warning" in a:
        out["mass_drift_warning"] = a["mass_drift_warning"]
    for k in ("stiffness_index_of", "stiffness_judged"):  # an explicit method's batch
        if k in a:
            out[k] = a[k]
    if "batch" in ds.dims:
        statuses = ds["status"].values.tolist()
        out["batch"] = len(statuses)
        out["status_counts"] = {k: statuses.count(k) for k in sorted(set(statuses))}
    # a dataset read back from a file holds numpy scalars and arrays in its attributes
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in out.items()}


def integrate_batch(system, t_span, x0=None, y0=None, **kwargs) -> xr.Dataset:
    """`integrate` with a `batch` dimension even for one trajectory."""
    x0 = np.atleast_2d(np.asarray(system.x0 if x0 is None else x0, dtype=np.float64))
    return integrate(system, t_span, x0, y0, **kwargs)


def _method(method, options):
    """The registry entry of `method`, or `InputError`; checks the method's options."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; expected one of {list(METHODS)}.")
    entry = METHODS[method]
    allowed = set(entry.options)
    if method == "auto":  # auto may run rodas4 or lsoda: rodas4's options
        allowed = set(METHODS["rodas4"].options)
    unknown = sorted(set(options) - allowed)
    if unknown:
        takes = f"its options are {sorted(allowed)}" if allowed else "it takes none"
        raise InputError(f"method {method!r} takes no option {unknown[0]!r}; {takes}.")
    return entry


def _check_device(device) -> None:
    """`InputError` unless `device` names a torch device that this machine has."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"device must be a torch device such as 'cpu' or 'cuda'; got "
                         f"{device!r}.") from None  # fmt: skip
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {device!r} was requested, but no CUDA device is available "
                         f"here.")  # fmt: skip
    if kind not in ("cpu", "cuda"):
        raise InputError(f"device must be 'cpu' or a CUDA device ('cuda', 'cuda:0'); got "
                         f"{device!r}.")  # fmt: skip


def _check_atol(system, atol, method, name="atol"):
    """`atol` (a number, or one per component of `[x, y]`), or `InputError` unless each is
    positive, finite and at least the method's floor (`Method.atol_min`, where it was tested)."""
    floor = method.atol_min
    at_least = f"at least {floor:g} with method {method.name!r} ({method.atol_why})"
    if floor == ATOL_ANY:  # the smallest positive float64: no floor
        at_least = "positive"
    if np.ndim(atol) == 0:
        atol = positive(name, atol)
        if atol < floor:
            raise InputError(f"{name} must be {at_least}; got {atol!r}.")
        return atol
    atol = np.asarray(atol, dtype=np.float64)  # one absolute tolerance per component of [x, y]
    N = system.n_fast + system.n_slow
    if atol.shape != (N,) or not np.all(np.isfinite(atol)) or not np.all(atol >= floor):
        raise InputError(
            f"{name} must be a number or {N} numbers (one per component of [x, y]), each "
            f"{at_least}; got {atol.tolist()}."
        )
    return atol


def _output_times(t0, t1, t_eval, n_eval, name="n_eval"):
    if t_eval is None:
        n_eval = number(f"{name} (saved times)", n_eval, 2, None, integer=True)
        t = np.linspace(t0, t1, n_eval)
        step = (t1 - t0) / (n_eval - 1)
        floor = max(TIME_STEP_MIN, 2 * np.spacing(max(abs(t0), abs(t1))))
        if step < floor or np.any(np.diff(t) <= 0):
            why = "twice the spacing of the floats there"
            if floor == TIME_STEP_MIN:
                why = "the smallest normal float64 (smaller times lose digits)"
            raise InputError(
                f"the span ({float(t0)!r}, {float(t1)!r}) is too short for {count_text(n_eval)} "
                f"distinct equally spaced saved times: their spacing {step:.3g} is below "
                f"{floor:.3g}, {why}; "
                f"expected a longer span or fewer saved times ({name})."
            )
        return t
    t_eval = np.asarray(t_eval, dtype=np.float64)
    if not np.all(np.isfinite(t_eval)):  # NaN passes the sortedness test below
        shown = t_eval.tolist() if t_eval.size <= 16 else f"{t_eval.size:,} times"
        raise InputError(f"t_eval must hold finite times; got {shown}.")
    if t_eval.ndim != 1 or t_eval.size < 2 or np.any(np.diff(t_eval) <= 0):
        shown = t_eval.tolist() if t_eval.size <= 16 else f"shape {t_eval.shape}"
        raise InputError(f"t_eval must be an increasing 1-D sequence of at least two times; "
                         f"got {shown}.")  # fmt: skip
    if t_eval[0] < t0 or t_eval[-1] > t1:
        raise InputError(f"t_eval must lie inside t_span ({t0}, {t1}).")
    return t_eval


def _initial_states(system, x0, y0, eps, names=None):
    """`(x0 (B, n), y0 (B, m), eps (B,) or None)`, every row a valid initial state; `names` as
    `check_inputs`'s."""
    names = names or {}
    x_name, y_name = names.get("x0", "x0"), names.get("y0", "y0")
    for name, v, default in ((x_name, x0, system.x0), (y_name, y0, system.y0)):
        if v is None and default is None:
            raise InputError(
                f"the {system.name} system has no default initial state {name}; expected "
                f"{x_name} and {y_name} given (x0 of {plural(system.n_fast, 'entry', spec=',')}, "
                f"y0 of {plural(system.n_slow, 'entry', spec=',')})."
            )
        if v is not None and np.ndim(v) > 2:
            raise InputError(
                f"{name} must be one initial state (1-D) or a batch of them (2-D, one row per "
                f"trajectory); got an array of shape {tuple(np.shape(v))}."
            )
    x0 = np.atleast_2d(np.asarray(system.x0 if x0 is None else x0, dtype=np.float64))
    y0 = np.asarray(system.y0 if y0 is None else y0, dtype=np.float64)
    # a 2-D y0 given as (m, B) is read as (B, m); a 1-D y0 is one trajectory's slow state, so
    # [1, 2] on a system with one slow variable is refused (it ran silently from y0 = 1)
    if y0.ndim == 2 and y0.shape[-1] != system.n_slow and y0.shape[0] == system.n_slow:
        y0 = y0.T
    y0 = np.atleast_2d(y0)
    n_eps = 1 if eps is None else int(np.size(eps))
    for name, n in ((x_name, x0.shape[0]), (y_name, y0.shape[0]), ("eps", n_eps)):
        if n == 0:
            raise InputError(
                f"{name} holds no trajectories (a batch of 0 rows); expected at least one "
                f"initial state."
            )
    B = max(x0.shape[0], y0.shape[0], n_eps)
    if x0.shape[0] not in (1, B) or y0.shape[0] not in (1, B):
        raise InputError(
            f"{x_name} and {y_name} must have the same batch size (or 1); got "
            f"{count_text(x0.shape[0])} and {count_text(y0.shape[0])}."
        )
    x0, y0 = np.broadcast_to(x0, (B, x0.shape[1])), np.broadcast_to(y0, (B, y0.shape[1]))
    for b in range(B):
        _initial_state(system, x0[b], y0[b], x_name, y_name)
    if eps is not None:
        eps = np.asarray(eps, dtype=np.float64).reshape(-1)
        if eps.shape != (B,) or not np.all(np.isfinite(eps)) or np.any(eps <= 0):
            shown = f" (got {eps.tolist()})" if eps.size <= 16 else ""
            raise InputError(f"eps must hold {B} positive finite values, one per "
                             f"trajectory{shown}.")  # fmt: skip
    return np.ascontiguousarray(x0), np.ascontiguousarray(y0), eps


def check_system(system) -> None:
    """`InputError` unless `system` is a system (`FastSlowSystem` or one with its interface)."""
    if isinstance(system, str):
        raise InputError(f"system must be a system object, not a name; got {system!r}, expected "
                         f"fs.make_system({system!r}, eps=...) to build it.")  # fmt: skip
    if not all(hasattr(system, a) for a in ("f", "g", "n_fast", "n_slow", "eps", "rhs",
                                            "jacobian", "with_eps")):  # fmt: skip
        raise InputError(f"system must be a FastSlowSystem (fs.make_system(name, eps=...) or "
                         f"fs.FastSlowSystem(f, g, ...)); got {short_repr(system)}.")  # fmt: skip


def run_eps(system, eps=None, P=None):
    """`(system, eps)` of a run from `integrate`'s `eps` or `P` (DESIGN 2: one of them, or
    neither: the system's): one number runs `system.with_eps(...)` and gives `eps` None; a 1-D
    sequence (a list, an array, a torch tensor, whose values are copied) gives one per
    trajectory, `eps (B,)` (each checked in `_initial_states`); anything else is refused."""
    from .systems import resolve_eps

    if eps is not None and P is not None:
        resolve_eps(eps, P)  # its sentence: give either eps or P, not both
    if eps is None and P is None:
        return system, None
    name, value = ("eps", eps) if eps is not None else ("P", P)
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor: its values
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (str, bytes)):  # resolve_eps reads the CLI's text; integrate no text
        raise InputError(f"{name} must be a number or a 1-D sequence of numbers, one per "
                         f"trajectory; got the text {name}={value!r}.")  # fmt: skip
    if np.ndim(value) == 0:  # resolve_eps refuses bools and a P that is no positive integer
        return system.with_eps(**{name: value}), None
    expected = (f"{name} must be a positive finite number or a 1-D sequence of them, one per "
                f"trajectory" if name == "eps" else
                "P must be a positive integer or a 1-D sequence of them, one per trajectory "
                "(eps = 1/P)")  # fmt: skip
    seq = isinstance(value, (list, tuple))
    if seq and any(isinstance(v, (bool, np.bool_, str, bytes)) for v in value):
        raise InputError(f"{expected}; got {name}={short_repr(value)}.")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):  # ragged
        raise InputError(f"{expected}; got {name}={short_repr(value)}.") from None
    if arr.ndim == 1 and arr.dtype.kind == "O":  # Fractions, Decimals: numbers numpy keeps whole
        try:
            arr = arr.astype(np.float64) if name == "eps" else arr
        except (TypeError, ValueError):
            pass
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iuf" + ("O" if name == "P" else "")):
        raise InputError(f"{expected}; got {name}={short_repr(value)}.")
    if name == "P":
        return system, np.array([resolve_eps(P=p)[0] for p in arr.tolist()], dtype=np.float64)
    return system, arr.astype(np.float64)


def _check_field_shapes(system, x, y, names=None) -> None:
    """`InputError` unless `f(x0, y0)` holds `n_fast` values and `g(x0, y0)` `n_slow` (a
    custom `f` of the wrong length ended in numpy's LinAlgError under radau)."""
    names = names or {}
    point = f"{names.get('x0', 'x0')}, {names.get('y0', 'y0')}"
    for name, fun, size, what in (("f", system.f, system.n_fast, "fast"),
                                  ("g", system.g, system.n_slow, "slow")):  # fmt: skip
        with np.errstate(all="ignore"):
            shape = np.shape(fun(x, y))
        if shape != (size,):
            got = plural(shape[0], "value") if len(shape) == 1 else f"an array of shape {shape}"
            raise InputError(
                f"{name}({point}) of the {system.name} system must return "
                f"{plural(size, 'value', spec=',')}, one per {what} variable (n_{what} = "
                f"{size:,}); got {got}."
            )


def _initial_state(system, x0, y0, x_name="x0", y_name="y0"):
    x0 = np.asarray(x0, dtype=np.float64).reshape(-1)
    y0 = np.asarray(y0, dtype=np.float64).reshape(-1)
    for name, v, size, what in [(x_name, x0, system.n_fast, "state"),
                                (y_name, y0, system.n_slow, "slow variable")]:  # fmt: skip
        if v.shape != (size,):
            raise InputError(
                f"{name} must have {plural(size, 'entry', spec=',')}, one per {what} "
                f"of the {system.name} system; got {count_text(v.size)}"
                + (f" ({v.tolist()})." if v.size <= 16 else ".")
            )
    bad = [(name, v) for name, v in ((x_name, x0), (y_name, y0)) if not np.all(np.isfinite(v))]
    if bad:  # only the one at fault is named: `--y0 nan` does not blame the default --x0
        raise InputError(" and ".join(name for name, _ in bad) + " must be finite; got "
                         + ", ".join(f"{name}={v.tolist()}" for name, v in bad) + ".")
    if system.conserves_mass and (np.any(x0 < 0) or abs(x0.sum() - 1.0) > 1e-12):
        raise InputError(
            f"{x_name} must be a probability vector (entries >= 0 summing to 1); got "
            f"{x0.tolist()} (sum {x0.sum():.12g})."
        )
    gen = getattr(system, "generator", None)
    if gen is not None:
        lo, hi = gen.domain()
        if np.any(y0 < lo) or np.any(y0 > hi):
            raise InputError(f"{y_name}={y0.tolist()} is outside {domain_text(gen)}.")
    return x0, y0


def _auto_choice(system, stiffness, atol, batched=False) -> tuple[str, float]:
    """`(method, tolerance factor)` of `method="auto"` (rule and measurements: module doc)."""
    torch_ok = np.ndim(atol) == 0 and system.has_torch_form()
    # a batch takes rodas4's factor too, as one very stiff run does (1.0 missed 7-fold)
    if torch_ok and (batched or stiffness > VERY_STIFF):
        return "rodas4", 100.0
    return "lsoda", 10.0


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


def _check_field_finite(system, z0, eps, t0, names=None) -> None:
    """`InputError` unless the right-hand side `[f / eps, g]` is finite at every initial state
    `z0 (B, N)` (each with its own `eps`, if given): no solver can start from a state outside
    the domain of `f` or `g` (a custom system's `sqrt(y - 2)` at `y = 1`; it ended in numpy's
    LinAlgError from the stiffness index's eigenvalues), so it is refused as bad input, before
    any work, as non-finite initial states and rates are. One stacked call where the system
    takes the batch, else row by row."""
    names = names or {}
    e = np.full(len(z0), system.eps) if eps is None else np.asarray(eps, dtype=np.float64)
    for value in np.unique(e):
        one = system if eps is None else system.with_eps(float(value))
        rows = np.flatnonzero(e == value)
        z = z0[rows]
        with np.errstate(all="ignore"):
            try:
                v = np.asarray(one.rhs(t0, z), dtype=np.float64)
            except (ValueError, IndexError, TypeError):
                v = None
            if v is None or v.shape != z.shape:  # a user's f and g written for one state
                v = np.stack([np.asarray(one.rhs(t0, r), dtype=np.float64).reshape(-1)
                              for r in z])  # fmt: skip
        bad = ~np.all(np.isfinite(v), axis=-1)
        if bad.any():
            k = int(np.argmax(bad))
            x, y = system.split(z[k])
            which = f" (batch index {int(rows[k])})" if len(z0) > 1 else ""
            raise InputError(
                f"f or g of the {system.name} system is not finite at the initial state "
                f"{names.get('x0', 'x0')}={x.tolist()}, {names.get('y0', 'y0')}={y.tolist()}"
                f"{which} (eps = {value:g}); expected an initial state where both are finite."
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
            ds.attrs["status"] = f"{n_bad} of {plural(status.size, 'trajectory')} failed"
    elif ds.attrs.get("status") == "success":
        counts = ", ".join(f"{k} ({int((~np.isfinite(ds[k])).sum())})" for k in bad)
        ds.attrs["status"] = "non_finite"
        ds.attrs["message"] = f"non-finite values in the dataset: {counts}"
    return ds


MASS_DRIFT_FACTOR = 10.0  # `_mass_drift`'s budget over the tolerance and the round-off


def _mass_drift(ds: xr.Dataset, system, rtol: float, atol, warn: bool = True) -> xr.Dataset:
    """Warn (`MassDriftWarning`, unless not `warn`; the attribute `mass_drift_warning` either
    way) where a successful trajectory's drift of the total probability, `max_t |1^T x(t) - 1^T x(0)|`, exceeds its
    budget `10 max(rtol + sum_i atol_i, n u nfev)` (chain states `i`, `u` = 2^-52, `nfev` the
    trajectory's evaluations of f).

    Every method keeps the linear invariant `1^T x` but for round-off (`1^T Q = 0`: a stage's
    matrix `I - h gamma J` has the column sums of `I`, also with a stale or approximate `J`), and
    the invariant is a neutral direction, so round-off there adds up: about `n u` per
    evaluation, measured 0.01-0.8 `n u nfev` with lsoda and rodas4 at rtol 1e-11 to 1e-13 on a
    64-state random chain (11-200 times `rtol + sum atol`: tight tolerances alone do not warn).
    The factor 10 over the tolerance of the sum is the usual gap between a global and a local
    error. Beyond both, the arithmetic lost accuracy (`fastslow-sim integrate --eps 1e-12 --y0
    150 --method radau`: 2.7e-6, about 250 times rtol + sum atol and 120,000 times
    `n u nfev`), which the status alone would call a success."""
    if "mass_error" not in ds:
        return ds
    drift, budget, over, tol, nfev = mass_drift_budget(ds, system, rtol, atol)
    if not over.any():
        return ds
    batched = "batch" in ds.dims
    worst = int(np.argmax(np.where(over, drift, -1.0)))
    which = (f" in {count_text(int(over.sum()))} of {plural(over.size, 'trajectory')}"
             if batched else "")  # fmt: skip
    text = mass_drift_text(drift[worst], budget[worst], tol, nfev[worst], which)
    ds.attrs["mass_drift_warning"] = text
    if warn:
        warnings.warn(text, MassDriftWarning, stacklevel=3)
    return ds


def mass_drift_budget(ds: xr.Dataset, system, rtol: float, atol) -> tuple:
    """`(drift, budget, over, tol, nfev)` of `_mass_drift`, one entry per trajectory (a
    dataset without a batch has one): the drift `max_t |1^T x(t) - 1^T x(0)|`, its budget,
    whether a successful trajectory exceeds it, the tolerance of the sum and the evaluations."""
    n = system.n_fast
    atol_x = np.broadcast_to(np.asarray(atol, dtype=np.float64), (n + system.n_slow,))[:n]
    tol = rtol + float(np.sum(atol_x))
    batched = "batch" in ds.dims
    error = ds["mass_error"].values  # (batch, time) or (time,)
    drift = np.atleast_1d(np.abs(error - error[..., :1]).max(axis=-1, initial=0.0))
    nfev = ds["stat_nfev"].values if "stat_nfev" in ds else np.atleast_1d(ds.attrs["nfev"])
    budget = MASS_DRIFT_FACTOR * np.maximum(tol, n * 2.0**-52 * nfev.astype(np.float64))
    ok = np.atleast_1d(ds["status"].values == "success" if batched
                       else ds.attrs["status"] == "success")  # fmt: skip
    over = ok & (drift > budget)  # a NaN drift is a failure's, said by its status
    return drift, budget, over, tol, nfev


def mass_drift_text(drift: float, budget: float, tol: float, nfev, which: str = "") -> str:
    """The `MassDriftWarning` sentence for a drift beyond its budget (`which`: in how many
    trajectories of a batch, or "")."""
    return (f"the total probability 1^T x drifted by up to {drift:.2g}{which}, more "
            f"than its budget {budget:.2g} (10 times the larger of rtol + sum(atol) = "
            f"{tol:.2g} and the round-off of {int(nfev):,} evaluations of f): every "
            f"method keeps 1^T x up to round-off, so the solver's arithmetic (an implicit "
            f"method's linear solves) lost accuracy; the status still says success.")  # fmt: skip


P_ST_CHUNK_BYTES = 64 * 2**20  # generators per critical_manifold call in _to_dataset


def p_st_flops(system, points: int) -> float:
    """Floating-point operations of the dataset's `p_st(y(t))` at `points` saved states: one GTH
    elimination, `n^3/3`, each; about `10 n` on a neighbour chain (`chain_stationary`); 0 for
    systems without a critical manifold."""
    if not hasattr(system, "critical_manifold"):
        return 0.0
    n = system.n_fast
    return points * (10.0 * n if getattr(system, "chain_p_st", False) else n**3 / 3)


def physical_memory() -> float:
    """This machine's memory in bytes (`inf` where the system does not say)."""
    import os

    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return float("inf")


def output_bytes(system, batch: int, times: int) -> float:
    """Bytes held at once for a result of `batch` trajectories at `times` saved times: the
    solver's states `[x, y]`, and the dataset's `x`, `y`, `p_st` with the temporary `x - p_st`,
    `manifold_distance` and `mass_error` (float64, `_to_dataset`)."""
    n, m = system.n_fast, system.n_slow
    manifold = 2 * n + 1 if hasattr(system, "critical_manifold") else 0
    per_point = 2 * (n + m) + manifold + int(system.conserves_mass)
    return 8.0 * batch * times * per_point


def check_output_size(system, batch: int, times: int, names=("batch", "n_eval")) -> None:
    """`InputError` before any work when the result of `batch` trajectories at `times` saved
    times cannot fit in this machine's memory (`output_bytes`); `names` are the options that set
    them, for the sentence."""
    need, have = output_bytes(system, batch, times), physical_memory()
    if need > have:
        raise InputError(
            f"{count_text(batch)} {'trajectory' if batch == 1 else 'trajectories'} at "
            f"{count_text(times)} saved times of {system.n_fast + system.n_slow:,} variables "
            f"{'needs' if batch == 1 else 'need'} about {bytes_text(need)} of memory for the "
            f"solution and its dataset, more than this machine's {bytes_text(have)}; expected "
            f"fewer trajectories ({names[0]}) or saved times ({names[1]})."
        )


def _within_tolerance_of_the_domain(system, y, attrs):
    """`y` for `p_st(y)`: within the solver's tolerance of the generator's domain set to its end
    (`generators.into_domain`), so that a run that ends at an end of the domain, as
    Michaelis-Menten's y -> 0, is not a failure for the round-off that took it past."""
    family = getattr(system, "generator", None)
    if family is None:
        return y
    atol = attrs.get("solver_atol", 0.0)
    if np.ndim(atol):
        atol = np.asarray(atol, dtype=np.float64)[system.n_fast :]
    return into_domain(family, y, atol, attrs.get("solver_rtol", 0.0))


def _to_dataset(system, t, x, y, attrs, batch: bool = False) -> xr.Dataset:
    """Label a trajectory as a Dataset; adds `p_st`, manifold distance and mass error for ME systems."""
    lead = ("batch", "time") if batch else ("time",)
    data = {
        "x": ((*lead, "state"), x, {"long_name": "fast variable (probability of each state)"}),
        "y": ((*lead, "slow"), y, {"long_name": "slow variable"}),
    }
    if hasattr(system, "critical_manifold"):
        ok = np.all(np.isfinite(y), axis=-1)
        y_in = _within_tolerance_of_the_domain(system, y, attrs)
        p = np.full_like(x, np.nan)
        where = np.nonzero(ok)
        # in chunks of saved points: all of them at once would hold (batch, time, n, n) rates,
        # 3.4 GB for 256 trajectories of 64 states at 401 points (a neighbour chain holds a few
        # (n,) arrays per point instead)
        n = x.shape[-1]
        rows = max(1, P_ST_CHUNK_BYTES // (64 * n if getattr(system, "chain_p_st", False)
                                           else 8 * n**2))  # fmt: skip
        for a in range(0, where[0].size, rows):
            idx = tuple(w[a : a + rows] for w in where)
            try:
                p[idx] = system.critical_manifold(y_in[idx])
            except InputError:  # rates beyond the float range at some y: left NaN, flagged
                for i in zip(*idx):
                    with contextlib.suppress(InputError):
                        p[i] = system.critical_manifold(y_in[i])
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
