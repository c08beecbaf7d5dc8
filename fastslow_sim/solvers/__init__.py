"""The registry of integration methods, one module per back-end (torchdiffeq's string registry,
diffrax's status per trajectory).

A back-end module of this package registers its methods with `register(Method(...))`; every
module here is imported when the registry is first read, so a new method is one new file. A
method's `solve(system, z0 (B, N), t_eval, rtol, atol, eps=None, **options) -> Solution` takes a
batch; `per_trajectory` makes one from a solver of one trajectory. Back-end modules import their
libraries (torch, torchdiffeq, scipy.integrate) inside the functions, so reading the registry
imports none of them.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

__all__ = ["Method", "Solution", "METHODS", "register", "per_trajectory", "first_step",
           "SOLVER_ERRORS", "check_max_steps", "MAX_STEPS_HINT", "max_steps_message"]  # fmt: skip

# what a back-end may raise on a hard problem (overflow, a singular matrix, a stalled solver):
# reported as the trajectory's status, not raised in the middle of a batch
SOLVER_ERRORS = (ValueError, ArithmeticError, RuntimeError, np.linalg.LinAlgError)


# the largest budget of steps: the compiled rodas4 march counts its steps in a 64-bit integer
MAX_STEPS_MAX = 2**63 - 1
# how a message that a method spent its budget of steps says to raise it, from either interface
MAX_STEPS_HINT = "raise it with --max-steps N on the command line, max_steps=N in Python"


def max_steps_message(name: str, max_steps: int, t: float) -> str:
    """What every method that counts its steps itself says when it spent `max_steps` of them
    over the whole run, stopping at time `t`."""
    return (
        f"{name} stopped after max_steps = {max_steps:,} steps at t = {t:.6g}, the budget that "
        f"bounds its work; {MAX_STEPS_HINT} if the run is slow but advancing."
    )


def _beyond_int64_written_short(value) -> bool:
    """Whether `value` is text of a positive number of 1e19 or more in an exponent form
    (`as_int` never expands those)."""
    from ..validation import as_int

    try:
        as_int(str(value))
    except OverflowError:
        return not str(value).strip().startswith("-")
    except ValueError:
        return False
    return False


def check_max_steps(value, name: str = "max_steps") -> int:
    """`value` as a budget of steps, or `InputError` unless it is an integer from 1 to
    `MAX_STEPS_MAX`; `name` is how the message calls it (`--max-steps` on the command line)."""
    from ..validation import positive_int

    try:  # exactly: through float, 2**63 - 1 was refused and large budgets rounded
        steps = positive_int(name, value)
    except InputError:
        if not _beyond_int64_written_short(value):
            raise
        steps = MAX_STEPS_MAX + 1  # 1e30: refused below with the bound
    if steps > MAX_STEPS_MAX:
        raise InputError(
            f"{name} must be at most 2**63 - 1 = {MAX_STEPS_MAX:,} (the rodas4 march counts its "
            f"steps in a 64-bit integer); got {value!r}."
        )
    return steps


@dataclass
class Solution:
    """What a back-end returns: `z (T, B, N)` at the output times `t` (the ones asked for unless
    the method sets its own), a status and message per trajectory, statistics as `(B,)` arrays,
    and attributes of the run (such as the multirate map's `H`)."""

    z: np.ndarray
    status: list
    message: list
    stats: dict
    t: np.ndarray | None = None
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    name: str
    backend: str  # the library that runs it, recorded in every dataset
    stiff: bool
    description: str
    solve: Callable | None = None  # None for "auto", which integrate resolves
    options: tuple = ()  # the method's own keyword options of `integrate`
    differentiable: bool = False  # gradients flow through its torch form (`odeint_system`)
    needs_torch_form: bool = False  # the system must provide torch rates
    explicit_stability: tuple | None = None  # (real stability interval, stages) when explicit
    # the smallest absolute tolerance `integrate` accepts for the method, and why: where it was
    # tested (tests/test_integrate.py runs each at it). A method that
    # says nothing keeps 1e-150, the bound every method had before they were tested lower
    atol_min: float = 1e-150
    atol_why: str = "the smallest at which methods without a measured floor are accepted"
    # `prepare(system, z0, t_eval, rtol, atol, eps=None, **options)`: loads what the method's
    # first solve in a process would (compiled kernels), so that `wall_time_s` times the solve
    prepare: Callable | None = None
    # the smallest rtol the solver runs with: it raises a smaller one to this (scipy's methods,
    # to 100 float64 epsilons, 2.22e-14); `integrate` passes the raised one and records it
    rtol_min: float = 0.0


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add `method` to `METHODS` (the `--method` choices of a CLI made after it)."""
    if method.name in METHODS:
        raise InputError(f"method {method.name!r} is registered twice.")
    METHODS[method.name] = method
    return method


# the order of `--method` choices and of `--help`: the default first, then stiff, explicit, others
_ORDER = {"auto": 0, "radau": 1, "bdf": 2, "lsoda": 3, "rk45": 4, "dop853": 5, "dopri5": 6,
          "dopri8": 7, "bosh3": 8, "adaptive_heun": 9, "multirate": 10, "rodas4": 11, "rodas3": 12}  # fmt: skip

# the floors of `Method.atol_min`, measured on the default birth-death run (eps 0.125), a batch, a
# span of 1e-3, all mass on the last state and eps 1e-8 (at 1e-155, 1e-200, 1e-250, 1e-300,
# 1e-305, 2.2e-308 and 5e-324; tests/test_integrate.py runs every method at its floor)
ATOL_ANY = 5e-324  # the smallest positive float64: every atol is accepted
ATOL_TESTED = 1e-300  # the floor of the methods that fail somewhere below it (their `atol_why`)


register(Method(
    "auto", "auto", True,
    "lsoda at 10x tighter tolerances; rodas4 at 100x tighter when very stiff (S > 1e9); "
    "a batch takes rodas4 at 100x tighter where the system has a torch form",
    atol_min=ATOL_TESTED,
    atol_why="it was tested down to 1e-300, where lsoda runs at 1e-301 and rodas4 at 1e-302; at "
    "5e-324 lsoda runs at atol 0 and fails",
))  # fmt: skip


def per_trajectory(solve_one):
    """A batch `solve` from `solve_one(system, z0 (N,), t_eval, rtol, atol, **options) ->
    (z (T, N), status, message, stats dict)`: the rows one by one, each with its own `eps`; a
    row whose solver raises gets status `error` and NaN states, and the others go on."""

    def solve(system, z0, t_eval, rtol, atol, eps=None, **options):
        B, T = z0.shape[0], len(t_eval)
        z = np.full((T, B, z0.shape[1]), np.nan)
        status, message, stats = [], [], []
        for b in range(B):
            one = system if eps is None else system.with_eps(float(eps[b]))
            try:
                z[:, b], st, msg, s = solve_one(one, z0[b], t_eval, rtol, atol, **options)
            except InputError:
                raise
            except SOLVER_ERRORS as err:
                st, msg, s = "error", f"{type(err).__name__}: {err}", {}
            status.append(st)
            message.append(msg)
            stats.append(s)
        keys = sorted({k for s in stats for k in s}) or ["nfev", "njev", "nlu"]
        return Solution(z, status, message,
                        {k: np.array([s.get(k, 0) for s in stats]) for k in keys})  # fmt: skip

    return solve


_LOG_MAX = math.log(np.finfo(np.float64).max)


def _log(v):
    return math.log(v) if v > 0 else -math.inf


def log_norm(v, scale) -> float:
    """`log(sqrt(mean((v / scale)^2)))` computed in logarithms, finite where `v / scale` itself
    overflows (`-inf` where `v` is zero)."""
    with np.errstate(divide="ignore"):
        a = np.log(np.abs(v)) - np.log(scale)
    return float(0.5 * (np.logaddexp.reduce(2 * a) - math.log(a.size)))


def first_step(fun, t0, z0, t1, order, rtol, atol):
    """Hairer's starting step (Solving ODEs I, II.4; scipy's `select_initial_step`, torchdiffeq's
    `_select_initial_step`, for an error estimator of `order`) with its
    norms computed without overflow (`rosenbrock.control.rms`) and its second-derivative
    estimate in logarithms, or `None` where theirs computes it without overflow (the same step).
    Theirs squares `f(z0) / atol`, which overflows beyond 1e154 (rates near 1e174 over `atol`
    1e-10, or unit rates over `atol` 1e-300), and gives a first step of 0: NaN, or no progress."""

    def norm(v):  # the scaled RMS norm, and whether scipy's sum of squares overflows
        with np.errstate(over="ignore"):  # (inf where |v| / scale is beyond float64)
            q = np.asarray(v / scale, dtype=np.float64)
            squares = float(q @ q)
        if squares < math.inf or math.isnan(squares):
            return math.sqrt(squares / q.size), False
        import torch  # (only here: the scipy methods need no torch)

        from ..rosenbrock.control import rms

        return float(rms(torch.from_numpy(q), 0)), True

    scale = atol + np.abs(z0) * rtol
    f0 = np.asarray(fun(t0, z0), dtype=np.float64)
    (d0, over0), (d1, over1) = norm(z0), norm(f0)
    # |f(z0)| / atol beyond float64 itself (rates near 1e298 over atol 1e-10: the birth-death
    # chain from y = 172 to its edge 177.02) is inf, and 0.01 d0 / d1 then 0: in logarithms
    log_d1 = _log(d1) if d1 < math.inf else log_norm(f0, scale)
    h0 = min(1e-6 if d0 < 1e-5 or d1 < 1e-5 else math.exp(math.log(0.01 * d0) - log_d1), t1 - t0)
    if not h0 > 0:  # below float64's smallest number: scipy says what fails
        return None
    f1 = np.asarray(fun(t0 + h0, z0 + h0 * f0), dtype=np.float64)
    r2, over2 = norm(f1 - f0)
    # d2 = r2 / h0, the second derivative's size (1e358 at y = 100), in logarithms
    log_d2 = (_log(r2) if r2 < math.inf else log_norm(f1 - f0, scale)) - math.log(h0)
    if not (over0 or over1 or over2 or log_d2 >= _LOG_MAX):
        return None
    if d1 <= 1e-15 and log_d2 <= math.log(1e-15):
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = math.exp((math.log(0.01) - max(log_d1, log_d2)) / (order + 1))
    return min(100 * h0, h1, t1 - t0)


# every back-end module of this package registers its methods when imported (cheap: none imports
# its library at the top)
for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

_found = sorted(METHODS.items(), key=lambda kv: (_ORDER.get(kv[0], len(_ORDER)), kv[0]))
METHODS.clear()
METHODS.update(_found)
