"""Parameter sweeps on dask.distributed: a grid over named parameters of one task, every cell
written once into one self-describing zarr store.

This layer sits above the tasks (DESIGN 5): a task is the library function that the CLI
command of the same name calls, wrapped to take one chunk of cells (a list of parameter dicts)
and return one small `xarray.Dataset` per cell. No task knows that it runs inside a sweep.

Store layout (`PATH`, a zarr v3 directory):

- the root group is the whole sweep as one Dataset: one dimension per swept parameter (in the
  order of `--grid`), the cell's own dimensions after them (`time`, `state`, ...; sizes that
  differ between cells are padded with NaN, -1 or ""), and per cell `status` ("done",
  "failed", "pending"), `message`, `cell_wall_time_s`, `worker` and `cell_key`; the task, the
  grid, the fixed options and the versions in the attributes. `xr.open_zarr(PATH)` reads it.
- `PATH/cells/KEY.npz`: each finished cell as its own file (arrays plus a JSON header of dims
  and attributes), the truth from which the root is rebuilt. A cell is written to a temporary
  name and hard-linked onto `KEY.npz`, which fails if the name exists: a cell is written once,
  and a killed process leaves at most a stray temporary file, never a cell that looks complete
  (a later run removes it once the cell is finished: `_remove_leftovers`). `KEY` hashes the task and the cell's full
  parameters, so re-running the same command finds its cells and runs only the missing ones. A
  run whose grid lacks a cell of the sweep the root holds (other fixed options, fewer values)
  is refused before any work (`_check_same_sweep`): the root it wrote would drop those cells.

Batched axes: cells of `integrate` that differ only in `seed` or `y0` (the initial condition)
and `eps`/`P` run as one rodas4 batch (eps per trajectory); every other task runs one cell per
dask task.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import re
import shlex
import shutil
import threading
import time
import uuid
import warnings
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ._version import __version__
from .errors import InputError
from .threads import usable_cpus
from .validation import as_int, no_underscore
from .wording import plural

__all__ = ["tasks", "parse_grid", "run_sweep", "run_cells", "open_sweep", "SweepError"]

FORMAT = 1  # of the store layout above
CELLS = "cells"
STATUS_DONE, STATUS_FAILED, STATUS_PENDING = "done", "failed", "pending"
CELL_SUFFIX = ".npz"
MAX_CELLS = 1_000_000  # cells of one sweep (each is a file under cells/), as integrate's --batch


class SweepError(RuntimeError):
    """A sweep ended with cells that did not finish (their messages are in the store)."""


class UnreadableCellError(InputError):
    """A cell file under the store's cells/ that is there but cannot be read (cut short,
    overwritten): the message names it and says what to do."""

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"the sweep cell file {self.path!r} cannot be read ({reason}); expected "
                         f"a cell file that a sweep wrote: rerun the same sweep, which computes "
                         f"the cell again.")  # fmt: skip


class UnreadableCellWarning(UserWarning):
    """`run_sweep` found a cell file it cannot read and computes the cell again."""


class UnrecordedDeviceWarning(UserWarning):
    """`run_sweep` reuses finished train-network cells of `--device auto` whose device kind
    was not recorded (a store from before cells recorded it, their run folders' summaries
    gone) beside cells it trains now: the sweep may mix device kinds."""


class CellInputError(InputError):
    """A cell of the grid is bad input: `values` are its swept values, `reason` the sentence of
    the task's own check, `flags` the fixed options that take part, each with its value
    (`--tokens 256`); the message names them all (`--grid eps=1e-13: eps = 1e-13 is ...`,
    `--grid batch_size=64 with --tokens 256: ...`)."""

    def __init__(self, values: dict, reason: str, flags: tuple = ()):
        self.values, self.reason = dict(values), reason
        cell = ", ".join(f"{k}={_text(v)}" for k, v in values.items())
        with_ = f" with {', '.join(flags)}" if flags else ""
        super().__init__(f"--grid {cell}{with_}: {reason}")


def _text(v) -> str:
    """`v` as the command line takes it: `--flag true`, `1e-13`, a text with spaces quoted as a
    shell would need it (`--corpus 'text:my file.txt'`, not a value that reads as two)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return shlex.quote(v) if isinstance(v, str) else str(v)


# ---------------------------------------------------------------------------------------------
# tasks


@dataclass(frozen=True)
class Option:
    """One parameter of a task: its type, default, and an optional check `(ok(value), expected)`."""

    type: type
    default: Any
    check: tuple[Callable[[Any], bool], str] | None = None
    choices: tuple | None = None
    sweepable: bool = True
    # the command's own reading of a value given as text (its sentence where it refuses it),
    # in place of `type`'s: integrate's --max-steps (`check_max_steps`)
    parse: Callable[[str], Any] | None = None
    # what a value stands for, where two spellings are one setting (train-network's tokens:
    # 500k and 500000): one value twice in a --grid is refused, and a rerun spelled otherwise
    # takes the store's spelling (`_spelled_as_stored`), so the cell keys stay the store's
    same: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Task:
    """A registry entry: `run(cells) -> [Dataset per cell]`; `group(cell)` says which cells may
    share one call (None: one cell per call)."""

    name: str
    options: dict[str, Option]
    run: Callable[[list[dict]], list[xr.Dataset]]
    group: Callable[[dict], Any] | None = None
    batched: tuple[str, ...] = ()
    inner_dims: tuple[str, ...] = ()
    needs_out: bool = False
    validate: Callable[[dict], None] | None = None  # the task's own checks of a cell, no work
    # the part of `validate` that needs nothing made first (train-network: its settings, not its
    # corpus): a refusal there is judged by it alone, so no corpus is made to name the option
    settings: Callable[[dict], None] | None = None
    claim: Callable[[dict], None] | None = None  # may a cell that is to run write its outputs?
    # defaults that depend on other parameters (manifold's, per system), set before the key
    defaults: Callable[[dict], dict] | None = None
    # the parameters as the cell's key holds them (a value that computes what the option's
    # absence computes, as that absence: `_integrate_key`), before `cell_key` hashes them
    key_params: Callable[[dict], dict] | None = None
    # a cell file of an older version with what it lacks, from what the cell says of itself
    # (its params), where that is known without guessing; applied as the store is built
    recorded: Callable[[xr.Dataset], xr.Dataset] | None = None
    description: str = ""
    aliases: dict[str, str] = field(default_factory=dict)


def _positive(v):
    return v is not None and math.isfinite(v) and v > 0


# -- integrate --------------------------------------------------------------------------------


def _integrate_options():
    from .integrators import METHODS
    from .systems import SYSTEMS

    return {
        "system": Option(str, "birth-death", choices=tuple(SYSTEMS)),
        "eps": Option(float, None, (_positive, "a positive finite number")),
        # P = 1/eps: the cell's checks (systems.resolve_eps) refuse a P that eps does not
        # give back exactly, as integrate does
        "P": Option(int, None, (lambda v: v is None or v >= 1, "a positive integer")),
        "t_end": Option(float, 5.0, (_positive, "a positive finite time")),
        "method": Option(str, "auto", choices=tuple(METHODS)),
        "rtol": Option(float, 1e-8, (lambda v: 100 * 2.0**-52 <= v < 1, "from 2.2e-14 to below 1")),
        "atol": Option(float, 1e-10, (lambda v: 0 < v <= 1, "a positive number at most 1")),
        "n_eval": Option(int, 401, (lambda v: 2 <= v <= 1_000_000, "an integer from 2 to 1,000,000")),
        "seed": Option(int, None, (lambda v: v is None or v >= 0, "a non-negative integer")),
        # the initial slow state (systems with one slow variable; x0 stays the system's own)
        "y0": Option(float, None),
        # integrate's --states, --H, --march and --max-steps: None (not given) is integrate's
        # default (the system's own states, H 0.01, march auto, the method's own budget);
        # checked by the cell as integrate checks them (`_validate_integrate`), and left out of
        # the key where they are the default (`_integrate_key`: older stores resume)
        "states": Option(int, None),
        "H": Option(float, None),
        "march": Option(str, None, choices=("auto", "torch", "compiled")),
        "max_steps": Option(int, None, parse=_max_steps),
    }  # fmt: skip


def _max_steps(text: str) -> int:
    from .solvers import check_max_steps

    return check_max_steps(text, "--max-steps")


def _cell_eps(cell) -> float:
    from .systems import resolve_eps

    return resolve_eps(cell.get("eps"), cell.get("P"))[0]


# how a cell's refusal calls integrate's arguments: the command's option names, as integrate's own
_INTEGRATE_NAMES = {"n_eval": "--n-eval", "atol": "--atol", "rtol": "--rtol",
                    "max_steps": "--max-steps"}  # fmt: skip


def _method_options(cell) -> dict:
    """The cell's --H, --march and --max-steps as `integrate` takes them, checked as
    `fastslow-sim integrate` checks them (`integrators.method_options`: H only with
    multirate, march only with rodas4, rodas3 and auto, max_steps with every method but
    multirate)."""
    from .integrators import method_options

    return method_options(cell["method"], cell["t_end"], cell.get("H"), cell.get("march"),
                          cell.get("max_steps"))  # fmt: skip


def _integrate_system(cell, eps: float):
    from .systems import make_system

    return make_system(cell["system"], eps=eps, states=cell.get("states"))


def _default_states(system: str) -> int | None:
    """The number of states `system` has where --states is not given (None: no such system,
    or one that takes no --states)."""
    import inspect

    from .systems import SYSTEMS

    if system not in SYSTEMS:
        return None
    n = inspect.signature(SYSTEMS[system][0]).parameters.get("n")
    return None if n is None else n.default


def _integrate_key(params: dict) -> dict:
    """The parameters of an integrate cell as its key holds them: states, H and march at the
    values integrate takes when they are not given (the system's own states, H 0.01, march
    auto) are as if not given (None, which `cell_key` leaves out), so a cell keeps the key it
    had before they were parameters, and `--grid states=8,16` over a store of birth-death
    cells (8 states) finds them. (max_steps has no one default: the method's, and auto's
    depends on the solver it picks.)"""
    from .solvers.multirate import DEFAULT_H

    p = dict(params)
    if p.get("states") is not None and p["states"] == _default_states(p.get("system")):
        p["states"] = None
    if p.get("H") is not None and p["H"] == DEFAULT_H:
        p["H"] = None
    if p.get("march") == "auto":
        p["march"] = None
    return p


def _validate_integrate(cell):
    """What `fastslow-sim integrate` checks of these values: exactly one of eps and P (DESIGN
    2), an eps that the method resolves, the system's own checks, the multirate map's blocks
    (one saved state each), and everything `integrate` refuses before any work
    (`check_inputs`: the method's atol floor, the saved times the span holds, ...), from the
    system's own initial condition (a seeded one is drawn on the simplex and in [0, 1])."""
    from .integrators import check_eps_range, check_inputs

    eps = _cell_eps(cell)
    check_eps_range(eps, cell["method"])
    options = _method_options(cell)
    y0 = cell.get("y0")
    if y0 is not None and cell.get("seed") is not None:
        raise InputError(f"y0 = {y0:g} sets the initial slow state and seed = {cell['seed']} "
                         f"draws a random one; expected one of them.")  # fmt: skip
    system = _integrate_system(cell, eps)
    if y0 is not None and system.n_slow != 1:
        raise InputError(f"y0 sets the one slow variable, and {cell['system']} has "
                         f"{system.n_slow}; expected no y0 with it.")  # fmt: skip
    gen = getattr(system, "generator", None)
    if y0 is not None and gen is not None:  # check_inputs says it of a vector, `y0=[200.0]`
        from .generators import domain_text

        lo, hi = gen.domain()
        if not lo <= y0 <= hi:
            raise InputError(f"y0 = {y0:g} is outside {domain_text(gen)}.")
    # multirate: its blocks are checked with --H (`_method_options`); the map takes no
    # tolerance and saves one state per block; a fixed --rtol/--atol/--n-eval is not refused
    # here (integrate refuses them): in a sweep they serve the other methods of a `--grid
    # method=...` comparison, and the multirate cells ignore them. --H, --march and
    # --max-steps are refused per cell as integrate refuses them (their defaults are "not
    # given", so a method comparison without them passes)
    check_inputs(system, (0.0, cell["t_end"]), y0=None if y0 is None else [y0],
                 method=cell["method"], rtol=cell["rtol"], atol=cell["atol"],
                 n_eval=cell["n_eval"], names=_INTEGRATE_NAMES, **options)  # fmt: skip


def _integrate_group(cell):
    """Cells that one batch call can run: for rodas4 and auto, the same except in seed, y0 (the
    initial condition) and eps (one march). Any other method solves a batch row by row and
    words one `stiffness_warning` for the whole batch (its stiffest row), so each of its cells
    is its own call: a cell's warning is then its own, whatever the grid's order."""
    batched = {"seed", "y0", "eps", "P"} if cell["method"] in ("auto", "rodas4") else set()
    return tuple(sorted((k, repr(v)) for k, v in cell.items() if k not in batched))


def _run_integrate(cells):
    """One `integrate` call for the chunk: `x0, y0` of shape `(B, n)` (cell `b`'s initial
    condition is what `fastslow-sim integrate --batch 1 --seed S` integrates; a y0: the
    system's x0 with that slow state; neither: the system's own), one eps per trajectory where
    the chunk mixes them. Each cell keeps its own drift of the total probability against its
    budget (`integrators.mass_drift_budget`, the rule of `MassDriftWarning`) and the chunk's
    `StiffnessWarning` (`stiffness_warning`); the run issues no warning (`warn=False`)."""
    from .integrators import (
        integrate,
        integrate_batch,
        mass_drift_budget,
        mass_drift_text,
        random_initial_conditions,
    )
    c0 = cells[0]
    eps = [_cell_eps(c) for c in cells]
    system = _integrate_system(c0, eps[0])
    x0, y0 = [], []
    for c in cells:
        if c.get("y0") is not None:
            x0.append(np.atleast_2d(system.x0))
            y0.append(np.array([[c["y0"]]], dtype=np.float64))
        elif c.get("seed") is None:
            x0.append(np.atleast_2d(system.x0))
            y0.append(np.asarray(system.y0, dtype=np.float64).reshape(1, -1))
        else:
            a, b = random_initial_conditions(system, 1, c["seed"])
            x0.append(a)
            y0.append(b)
    x0, y0 = np.concatenate(x0), np.concatenate(y0)
    kw = dict(method=c0["method"], rtol=c0["rtol"], atol=c0["atol"], n_eval=c0["n_eval"], warn=False,
              **_method_options(c0))  # fmt: skip
    if len(set(eps)) > 1:
        ds = integrate_batch(system, (0.0, c0["t_end"]), x0, y0, eps=eps, **kw)
    else:
        ds = integrate(system, (0.0, c0["t_end"]), x0, y0, **kw)
    if "mass_error" in ds:
        # the tolerances the cells asked for (a multirate dataset records none)
        drift, budget, over, tol, nfev = mass_drift_budget(ds, system, c0["rtol"],
                                                           c0["atol"])  # fmt: skip
    out = []
    keep = [v for v in ("x", "y", "p_st", "manifold_distance", "mass_error") if v in ds]
    stats = [v for v in ds.data_vars if v.startswith("stat_")]
    for b in range(len(cells)):
        cell = ds[keep + stats].isel(batch=b)
        cell["x0"] = ("state", x0[b], {"long_name": "initial fast state"})
        cell["y0"] = ("slow", y0[b], {"long_name": "initial slow state"})
        cell["solver_status"] = ((), str(ds["status"].values[b]), {"long_name": "solver status"})
        cell["solver_message"] = ((), _sweep_message(str(ds["message"].values[b]),
                                                 str(ds.attrs["method"])),
                                  {"long_name": "solver message"})  # fmt: skip
        cell["method"] = ((), str(ds.attrs["method"]), {"long_name": "method that ran"})
        cell["march"] = ((), str(ds.attrs.get("march", "")), {
            "long_name": "march that ran (rodas4, rodas3: compiled or torch; '' for the other "
                         "methods, and in cells written before it was kept)"})  # fmt: skip
        cell["eps_used"] = ((), eps[b], {"long_name": "time-scale ratio eps = 1/P"})
        cell["stiffness_warning"] = ((), str(ds.attrs.get("stiffness_warning", "")), {
            "long_name": "the StiffnessWarning of the cell's run, an explicit method on a stiff "
                         "problem ('' where none; cells written before it was kept: '' too)"})
        if "mass_error" in ds:
            cell["mass_drift"] = ((), float(drift[b]), {
                "long_name": "drift of the total probability, max_t |1^T x(t) - 1^T x(0)|"})
            cell["mass_drift_budget"] = ((), float(budget[b]), {
                "long_name": "budget of mass_drift: 10 max(rtol + sum(atol), n 2^-52 nfev)"})
            text = mass_drift_text(drift[b], budget[b], tol, nfev[b]) if over[b] else ""
            _drift_vars(cell, text)
        out.append(cell.drop_vars("batch", errors="ignore"))
    return out


# the solvers' advice to raise the budget, in a cell's message, as a sweep takes it: fixed
# (--max-steps N) or swept (--grid max_steps=...)
SWEEP_RAISE_HINT = ("raise it with --max-steps N or --grid max_steps=N1,N2,... (max_steps in "
                    "Python) if the run is slow but advancing")
# ... and, where the method that ran is an explicit one, a stiff method (one that ran out of
# steps already, rodas4 as auto takes it for a batch, was told to sweep one)
SWEEP_MAX_STEPS_HINT = f"{SWEEP_RAISE_HINT}, or sweep a stiff method (--method radau, --grid method=...)"


def _sweep_message(text: str, method: str) -> str:
    """A solver's message as a sweep cell keeps it: `SWEEP_MAX_STEPS_HINT` where `method`, the
    method that ran, is explicit (`explicit_stability` in `solvers.METHODS`), else
    `SWEEP_RAISE_HINT`."""
    from .solvers import MAX_STEPS_HINT, METHODS

    entry = METHODS.get(method)
    hint = SWEEP_MAX_STEPS_HINT if entry is not None and entry.explicit_stability else SWEEP_RAISE_HINT
    text = text.replace(f"{MAX_STEPS_HINT} if the run is slow but advancing", hint)
    return text.replace(MAX_STEPS_HINT, hint)


UNRECORDED_NOTE = ("where mass_drift_checked is False (cells written before the drift was "
                   "recorded, failed cells without data), False here means unknown, not "
                   "checked; so do '' in mass_drift_warning and NaN in mass_drift")


def _drift_vars(cell: xr.Dataset, text: str) -> None:
    """The cell's `mass_drift_warned` (a boolean) and `mass_drift_warning` (the warning's
    sentence, "" where none): whether its run would issue a `MassDriftWarning` (the
    `mass_drift_warning` attribute of its result: the run issues none, `warn=False`), and
    what it says; `mass_drift_checked` True (False, the store's fill, in cells without it)."""
    cell["mass_drift_checked"] = ((), True, {
        "long_name": "True where the cell recorded its drift check (mass_drift_warned); False: "
                     "not recorded (a cell written before it was, or failed without data)"})  # fmt: skip
    cell["mass_drift_warned"] = ((), bool(text), {
        "long_name": "True where the cell's run warned (MassDriftWarning): its total probability "
                     "1^T x drifted beyond its budget while the solver reported success "
                     "(mass_drift_warning says by how much); False where it did not, or was "
                     "not recorded (see note)",
        "note": UNRECORDED_NOTE})  # fmt: skip
    cell["mass_drift_warning"] = ((), text, {"long_name": "the cell's MassDriftWarning ('' where none)"})


# -- convergence ------------------------------------------------------------------------------


def _convergence_args(c) -> tuple:
    """`(system, eps values)` of a convergence cell; `InputError` unless the eps list is numbers."""
    from .systems import make_system
    from .validation import number_list

    values = number_list(str(c["eps"]), "eps")
    if len(values) < 2:
        raise InputError(f"eps must list at least two values to fit a slope; got {c['eps']!r}.")
    return make_system(c["system"], eps=values[0]), values


def _validate_convergence(cell):
    from .manifold import check_convergence

    check_convergence(*_convergence_args(cell), t_end=cell["t_end"])


def _run_convergence(cells):
    from .manifold import convergence

    (c,) = cells
    system, values = _convergence_args(c)
    ds = convergence(system, values, t_end=c["t_end"], progress=False, warn=False)
    notes = json.loads(ds.attrs["slope_notes"])
    for k in ("err_h0", "err_h1", "err_y"):
        ds[f"slope_{k}"] = ((), float(ds.attrs[f"slope_{k}"]), {"long_name": f"log-log slope of {k}"})
        # NaN above where the errors sit at the solver's floor; the reason ('' if determined)
        ds[f"slope_{k}_note"] = ((), notes.get(k, ""), {"long_name": f"why slope_{k} is NaN"})
    _drift_vars(ds, ds.attrs.get("mass_drift_warning", ""))
    return [ds[[v for v in ds.data_vars]]]


# -- manifold ---------------------------------------------------------------------------------


def _manifold_defaults(c) -> dict:
    """The cell with `fastslow-sim manifold`'s per-system defaults where kappa, y_min or y_max
    is unset (None): kappa 3 for birth-death, else 0; y from -1 to 1.5 cut to the system's
    domain. Resolved before the key, so a cell is keyed by what it computes (a default
    birth-death cell keeps the key it had when kappa 3 and -1..1.5 were the options' own)."""
    from .nonlinear import default_kappa, default_y_range, family_for

    c = dict(c)
    if c["kappa"] is None:
        c["kappa"] = default_kappa(c["system"])
    if c["y_min"] is None or c["y_max"] is None:
        try:
            lo, hi = default_y_range(family_for(c["system"], c["kappa"]))
        except InputError:  # a kappa the system does not take: the cell's check names it
            return c
        c["y_min"] = lo if c["y_min"] is None else c["y_min"]
        c["y_max"] = hi if c["y_max"] is None else c["y_max"]
    return c


def _manifold_args(c) -> tuple:
    """`(family, (A, B))` of a manifold cell, checked as `fastslow-sim manifold` checks them."""
    from .nonlinear import check_y_range, family_for

    c = _manifold_defaults(c)
    family = family_for(c["system"], c["kappa"])
    return family, check_y_range(family, (c["y_min"], c["y_max"]))


def _validate_manifold(cell):
    _manifold_args(cell)


def _osc_eps_min() -> float:
    from .nonlinear import OSC_EPS_MIN  # imported when a cell is checked, not with the module

    return OSC_EPS_MIN


def _run_manifold(cells):
    """What `fastslow-sim manifold` computes, as numbers: branches, folds, the gap to the
    linear identity, the identity check and, when it folds, the relaxation oscillation."""
    from .manifold import identity_check
    from .nonlinear import manifold_dataset
    from .systems import make_system

    c = _manifold_defaults(cells[0])  # what the cell runs with (make_cells resolved them)
    family, (a, b) = _manifold_args(c)
    ds = manifold_dataset(family, (a, b), osc_eps=c["osc_eps"], warn=False)
    check = identity_check(make_system(c["system"], eps=0.1), np.linspace(a, b, 101))
    folds = json.loads(ds.attrs["folds"])
    cell = ds[[v for v in ds.data_vars if not v.startswith("osc_")]]
    over = "sup over the curve" if ds.attrs["gap_kind"] == "sup" else "max over the sampled points"
    cell["gap"] = ((), float(ds.attrs["gap"]),
                   {"long_name": f"{over} of max_i |phi_i(y) - p_st,i(Q(x_ref, y))|"})  # fmt: skip
    cell["identity_max_abs_diff"] = ((), float(check["max_abs_diff"]),
                                     {"long_name": "max |x_newton(y) - p_st(y)| at kappa = 0"})  # fmt: skip
    cell["n_branches"] = ((), len(json.loads(ds.attrs["branches"])), {"long_name": "branches"})
    cell["fold_y"] = ("fold", np.array([f["y"] for f in folds], dtype=np.float64),
                      {"long_name": "slow variable at each fold"})  # fmt: skip
    cell["osc_period"] = ((), float(ds.attrs.get("osc_period", np.nan)),
                          {"long_name": "period of the relaxation oscillation (NaN: no fold, or fewer "
                                         "than two maxima of y in the run's second half)"})  # fmt: skip
    # what the cell ran with: the store's options hold null where manifold's per-system
    # default was taken (`_manifold_defaults`), and a swept kappa is a coordinate of its own
    for name, what in _MANIFOLD_USED:
        cell[f"{name}_used"] = _used_var(what, c[name])
    _drift_vars(cell, ds.attrs.get("mass_drift_warning", ""))
    return [cell]


_MANIFOLD_USED = (("kappa", "kappa"), ("y_min", "lower end of the y range"),
                  ("y_max", "upper end of the y range"))  # fmt: skip


def _used_var(what: str, value) -> tuple:
    return ((), float(value), {"long_name": f"{what} the cell ran with (NaN: the cell did not "
                                            f"finish, or did not record it)"})  # fmt: skip


def _manifold_recorded(ds: xr.Dataset) -> xr.Dataset:
    """A finished manifold cell with kappa_used, y_min_used and y_max_used: a cell written
    before cells recorded them (which left them NaN in the store) has them from its own
    params (the cell file's `params` attribute), resolved by `_manifold_defaults` exactly as
    `_run_manifold` resolves them for its run (a value the params hold is the one it ran with;
    a null one, manifold's default for the cell's system). A cell whose params do not say
    is left without them (NaN in the store: not recorded)."""
    missing = [(n, what) for n, what in _MANIFOLD_USED if f"{n}_used" not in ds]
    if not missing or "status" not in ds or str(ds["status"].values) != STATUS_DONE:
        return ds
    try:
        c = _manifold_defaults(json.loads(ds.attrs["params"]))
    except (KeyError, TypeError, ValueError, InputError):  # no params, or not a manifold's
        return ds
    ds = ds.copy()
    for name, what in missing:
        v = c.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            ds[f"{name}_used"] = _used_var(what, v)
    return ds


# -- train-network ----------------------------------------------------------------------------


def _train_options():
    from dataclasses import fields

    from .training import ARMS, MAX_SEED, TrainConfig

    skip = {"out", "resume", "progress", "stop_after_steps", "arm", "corpus", "tokens"}
    opts = {
        "arm": Option(str, "", choices=("",) + tuple(ARMS)),
        "corpus": Option(str, "me"),
        "tokens": Option(str, "500k", same=_tokens_count),
    }
    for f in fields(TrainConfig):
        if f.name in skip:
            continue
        typ = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str,
                                                         "bool": bool, "int | None": int,
                                                         }.get(str(f.type), str)  # fmt: skip
        opts[f.name] = Option(typ, f.default)
    # seed is left out of the cells' checks (one check stands for every seed): checked here,
    # with train's own rule, before any cell runs (a bad seed was a failed cell, exit 1)
    opts["seed"] = Option(int, opts["seed"].default, (lambda v: 0 <= v <= MAX_SEED,
                          f"an integer from 0 to {MAX_SEED:,} (the data order's generator takes "
                          f"seed x 1000 + rank)"))  # fmt: skip
    opts["variant"] = Option(str, "coupled", choices=("dense", "coupled", "frozen-gate", "frozen-slow"))
    opts["device"] = Option(str, "auto")
    opts["out"] = Option(str, "", sweepable=False)
    return opts


def _tokens_count(text):
    """The count a `--tokens` value stands for (`500k`, `500000` and `0.5M`: 500000); a value
    that is no count as it is (the cell's own checks refuse it, in their words)."""
    from .training import parse_tokens

    try:
        return parse_tokens(text)
    except InputError:
        return text


def _train_config(c) -> tuple:
    """`(TrainConfig, corpus)` of a train-network cell (the `arm`, when given, sets the variant
    and the depth as in `reproduce`)."""
    from .corpora import load_corpus
    from .training import TrainConfig, arm_config

    fields = _train_fields(c)
    corpus = load_corpus(c["corpus"], P=c["P"], context=c["block_size"])
    if c["arm"]:
        fields.update(arm_config(c["arm"], {k: v for k, v in fields.items() if k != "variant"},
                                 corpus.vocab_size))  # fmt: skip
    return TrainConfig(**fields), corpus


def _train_fields(c) -> dict:
    """The `TrainConfig` fields of a train-network cell, before its `arm` sets any."""
    from .training import parse_tokens

    fields = {k: v for k, v in c.items() if k not in ("arm", "tokens")}
    return {**fields, "tokens": parse_tokens(c["tokens"]), "progress": False}


def _validate_train_settings(cell):
    """The settings of a train-network cell, before its corpus is made (the default me corpus
    takes about 14 s); an arm sets only the variant and the depth, which `_validate_train`
    checks."""
    from .training import TrainConfig, _validate

    _validate(TrainConfig(**_train_fields(cell)))


def _validate_train(cell):
    from .training import check_config

    _validate_train_settings(cell)
    check_config(*_train_config(cell))


def _claim_train(cell):
    """A cell's run folder may hold a run of its own configuration only (reused, or trained
    again if unfinished), never another's, which training would replace."""
    from .training import check_run_folder

    check_run_folder(cell["out"], same_as=lambda: _train_config(cell), here=False)


def _run_train(cells):
    """`train` of one network; a finished run of the same configuration in its folder is reused."""
    from .training import TOKENS_PER_S_LONG_NAME as TOKENS_NAME
    from .training import WALL_LONG_NAME as WALL_NAME
    from .training import _finished_run, check_run_folder, gate_size, recorded_device_kind, train

    (c,) = cells
    cfg, corpus = _train_config(c)
    s = _finished_run(cfg, corpus)
    reused = s is not None
    if not reused:  # judged here, where it trains: a finished run made on another device kind
        check_run_folder(cfg.out, same_as=lambda: (cfg, corpus))  # is refused, not trained over
    s = s or train(cfg, corpus, log=lambda *a: None)
    gates = [float(np.mean(g)) for g in s["gates"]]
    cell = xr.Dataset(
        {
            "val_loss": ((), np.float64(np.nan if s["val_loss"] is None else s["val_loss"]),
                         {"long_name": "validation loss, every aligned window", "units": "nats/token"}),
            "train_loss": ((), np.float64(np.nan if s["train_loss"] is None else s["train_loss"]),
                           {"long_name": "training loss, mean of the last 10 steps", "units": "nats/token"}),
            "train_wall_time_s": ((), float(s["wall_time_s"]), {"long_name": WALL_NAME, "units": "s"}),
            "tokens_per_s": ((), float(s["tokens_per_s"] or np.nan), {"long_name": TOKENS_NAME, "units": "tokens/s"}),
            "params": ((), int(s["params"]), {"long_name": "parameters"}),
            "flops_per_token_train": ((), float(s["flops_per_token_train"]),
                                      {"long_name": "training FLOPs per token (forward + backward)"}),
            "n_layer": ((), int(s["n_layer"]), {"long_name": "layers"}),
            "steps": ((), int(s["steps"]), {"long_name": "optimizer steps"}),
            "tokens": ((), int(s["tokens"]), _TOKENS_ATTRS),
            "gate": ("layer", np.array(gates, dtype=np.float64),
                     {"long_name": "final tanh(alpha) per layer (channel gates: their mean)"}),
            "gate_abs": ("layer", np.array([gate_size(g) for g in s["gates"]], dtype=np.float64),
                         _GATE_ABS_ATTRS),
            "run_dir": ((), str(cfg.out), {"long_name": "run folder (train.nc, summary.json, ckpt.pt)"}),
            "reused": ((), int(reused), {"long_name": "1: a finished run in the folder was reused"}),
            "device_kind": ((), recorded_device_kind(s.get("device")),
                            {"long_name": "kind of device the run trained on (cuda: bf16 autocast, "
                                          "cpu: float32; '' where not recorded)"}),
        }
    )  # fmt: skip
    return [cell]


def _train_recorded(ds: xr.Dataset) -> xr.Dataset:
    """A train-network cell with `gate_abs` and, finished, `tokens`, where one written before
    cells recorded them lacks them: `gate_abs` is `|gate|` (a scalar gate's size), `tokens`
    (-1 in the store, as if not trained) come from its own steps and params, steps x
    batch_size x block_size (a cell trains in one process, and no arm changes the batch)."""
    if "gate" in ds and "gate_abs" not in ds:  # the size of a scalar gate; |mean| of a channel one
        ds = ds.copy()
        ds["gate_abs"] = (ds["gate"].dims, np.abs(ds["gate"].values), _GATE_ABS_ATTRS)
    if "tokens" in ds or "steps" not in ds or "status" not in ds \
            or str(ds["status"].values) != STATUS_DONE:  # fmt: skip
        return ds
    try:
        c = json.loads(ds.attrs["params"])
        per_step = int(c["batch_size"]) * int(c["block_size"])
    except (KeyError, TypeError, ValueError):  # no params: left unrecorded
        return ds
    ds = ds.copy()
    ds["tokens"] = ((), int(ds["steps"].values) * per_step, _TOKENS_ATTRS)
    return ds


_TOKENS_ATTRS = {"long_name": "tokens trained (whole steps)", "units": "tokens"}
_GATE_ABS_ATTRS = {"long_name": "final |tanh(alpha)| per layer (channel gates: mean over "
                                "channels; in cells written before it was kept, |gate|)"}


def _auto_device_kind() -> str:
    """Where `--device auto` trains in this process (a worker's, run there by `client.run`)."""
    from .training import _device

    return _device("auto").type


def _held_train_kind(params: dict, ds: xr.Dataset) -> str | None:
    """The device kind of the finished train-network cell `ds` where its worker chose it
    (`--device auto`; an explicit device is part of the key), else None: its `device_kind`,
    or in a cell written before that was recorded its run folder's ("" where neither says)."""
    if params.get("device") != "auto":
        return None
    if "device_kind" in ds:
        return str(ds["device_kind"].values)
    try:
        summary = json.loads((Path(str(ds["run_dir"].values)) / "summary.json").read_text())
        from .training import recorded_device_kind

        return recorded_device_kind(summary.get("device"))
    except (OSError, ValueError, KeyError, AttributeError):
        return ""


def _check_held_kinds(grid: dict, held: list, kinds: set) -> None:
    """`CellInputError` for the first finished cell of `held` (`[(params, kind)]`) made on
    another device kind than `kinds`, those where this sweep's workers train: reused, it
    would sit beside cells trained otherwise (CUDA in bf16, the CPU in float32), which
    training refuses of a run folder too (`training._computed_otherwise`); recomputed, its
    worker would find that run in the cell's folder and refuse it. A cell whose kind was not
    recorded ("") is not judged: nothing says it differs, and no sweep could be run where it
    was made (`_warn_unrecorded` says it is reused)."""
    for params, kind in held:
        if not kind or {kind} == kinds:
            continue
        want = " and ".join(sorted(kinds))
        where = "here" if len(kinds) == 1 else "on the cluster's workers"
        raise CellInputError({k: params[k] for k in grid},
                             f"the store holds this cell trained on {kind}, and --device auto "
                             f"trains on {want} {where}, so reusing it would mix device kinds in "
                             f"one sweep; expected the sweep run where auto trains on {kind}, or "
                             f"an explicit --device with another --store and --runs-dir.")  # fmt: skip


def _warn_unrecorded(held: list) -> None:
    """One `UnrecordedDeviceWarning` naming how many finished cells of `held` (`[(params,
    kind)]`) have no recorded device kind: reused as they are (their `device_kind` stays ''
    in the store, "not recorded"), beside the cells this sweep trains."""
    n = sum(1 for _, kind in held if not kind)
    if n:
        its, them = ("its run folder", "it is") if n == 1 else ("their run folders", "they are")
        warnings.warn(f"{plural(n, 'finished cell')} in the store trained on a device whose "
                      f"kind was not recorded (no device_kind in the cell, no summary.json in "
                      f"{its}); {them} reused, so this sweep may mix device kinds (CUDA trains "
                      f"in bf16 autocast, the CPU in float32).",
                      UnrecordedDeviceWarning, stacklevel=3)  # fmt: skip


def _tasks() -> dict[str, Task]:
    return {
        "integrate": Task(
            "integrate", _integrate_options(), _run_integrate, group=_integrate_group,
            batched=("seed", "y0", "eps", "P"), inner_dims=("time", "state", "slow"),
            validate=_validate_integrate, key_params=_integrate_key,
            description="one trajectory per cell (seed: the initial condition of "
                        "`integrate --batch 1 --seed S`; y0: the system's x0 with that slow "
                        "state; neither: the system's own)",
        ),
        "convergence": Task(
            "convergence",
            {"system": _integrate_options()["system"],
             "eps": Option(str, "0.01,0.005,0.0025,0.00125", sweepable=False),
             "t_end": Option(float, 3.0, (_positive, "a positive finite time"))},
            _run_convergence, inner_dims=("eps",), validate=_validate_convergence,
            description="errors to the slow manifold and their slopes in eps",
        ),
        "manifold": Task(
            "manifold",
            {"system": _integrate_options()["system"],
             # None: `fastslow-sim manifold`'s per-system defaults (`_manifold_defaults`)
             "kappa": Option(float, None, (lambda v: abs(v) <= 30, "a number from -30 to 30")),
             "y_min": Option(float, None), "y_max": Option(float, None),
             "osc_eps": Option(float, 0.01, (lambda v: _osc_eps_min() <= v <= 1, "from 1e-9 to 1"))},
            _run_manifold, inner_dims=("point", "state", "fold"), validate=_validate_manifold,
            defaults=_manifold_defaults, recorded=_manifold_recorded,
            description="branches, folds and the gap to the linear identity (kappa, y_min, "
                        "y_max: manifold's defaults per system, kappa 3 for birth-death else 0, "
                        "y from -1 to 1.5 cut to the system's domain)",
        ),
        "train-network": Task(
            "train-network", _train_options(), _run_train, needs_out=True, inner_dims=("layer",),
            recorded=_train_recorded,
            validate=_validate_train, claim=_claim_train, aliases={"context": "block_size"},
            settings=_validate_train_settings,
            description="one training run per cell (arm: as in reproduce)",
        ),
    }  # fmt: skip


TASK_NAMES = ("integrate", "convergence", "manifold", "train-network")


@functools.cache
def tasks() -> dict[str, Task]:
    """The registry, built on first use (the options read the systems and methods registries)."""
    return _tasks()


def get_task(name: str) -> Task:
    if name not in TASK_NAMES:
        raise InputError(f"unknown sweep task {name!r}; expected one of {list(TASK_NAMES)}.")
    return tasks()[name]


# ---------------------------------------------------------------------------------------------
# grid


def option_key(task: Task, name: str) -> str:
    """The parameter of `task` that `name` (`t-end`, `t_end`, an alias) names, or `InputError`
    naming it and the task's parameters."""
    key = name.replace("-", "_")
    key = task.aliases.get(key, key)
    if key not in task.options:
        names = ", ".join(sorted(k.replace("_", "-") for k, o in task.options.items() if k != "out"))
        raise InputError(f"{name!r} is not a parameter of the {task.name} task; expected one of "
                         f"{names}.")  # fmt: skip
    return key


def _typed(task: Task, name: str, text, where: str):
    """`text` as the option's type, checked; `InputError` naming it otherwise."""
    opt = task.options[name]
    if text is None:
        return None
    if not isinstance(text, str):
        value = text
    elif opt.parse is not None:
        try:
            value = opt.parse(text)
        except InputError as err:  # a sentence that names its option already is said as it is
            said = str(err).startswith(f"{where} ")
            raise InputError(str(err) if said else f"{where}: {err}") from None
    elif opt.type is bool:
        low = text.strip().lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise InputError(f"{where}: {name} must be true or false; got {text!r}.")
        value = low in ("true", "1", "yes")
    else:
        if opt.type in (int, float):
            no_underscore(f"{where}: {name}", text)
        try:
            value = opt.type(text.strip()) if opt.type is not int else as_int(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(opt.type, "a string")
            raise InputError(f"{where}: {name} must be {kind}; got {text!r}.") from None
        except OverflowError:
            value = None
        if opt.type is int and (value is None or not INT_MIN <= value <= INT_MAX):
            raise InputError(_int64_text(where, name, text))
    if opt.type is float and value is not None and not math.isfinite(value):
        raise InputError(f"{where}: {name} must be finite; got {text!r}.")
    if isinstance(value, float) and value == 0.0:  # -0 is 0: one cell (key), not two
        value = 0.0
    if opt.choices is not None and value not in opt.choices:
        raise InputError(f"{where}: {name} must be one of {list(opt.choices)}; got {value!r}.")
    if opt.check is not None and value is not None and not opt.check[0](value):
        raise InputError(f"{where}: {name} must be {opt.check[1]}; got {value!r}.")
    return value


INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # integer parameters: the store's int64 coordinates


def _int64_text(where: str, name: str, text) -> str:
    return (f"{where}: {name} must be an integer from -2**63 to 2**63 - 1 ({INT_MAX:,}), which "
            f"the store keeps as 64-bit integers; got {str(text).strip()!r}.")  # fmt: skip


def parse_grid(task: str | Task, specs) -> dict[str, list]:
    """`["eps=1e-1,1e-2", "seed=0:4"]` -> `{"eps": [0.1, 0.01], "seed": [0, 1, 2, 3, 4]}`.

    `NAME=V1,V2,...` lists values; an item `a:b` is the integers a to b *inclusive*; values take
    the type of the task's option (float, int, str) and are checked as the command checks them.
    """
    task = get_task(task) if isinstance(task, str) else task
    grid: dict[str, list] = {}
    for spec in specs:
        name, sep, values = str(spec).partition("=")
        if not sep or not name.strip() or not values.strip():
            raise InputError(f"--grid takes NAME=V1,V2,... or NAME=A:B; got {spec!r}.")
        key = option_key(task, name.strip())
        if key in grid:
            raise InputError(f"--grid names {name.strip()!r} twice; expected each parameter once.")
        if not task.options[key].sweepable:
            raise InputError(f"{name.strip()!r} cannot be swept in {task.name}; pass it as "
                             f"--{name.strip().replace('_', '-')} instead.")  # fmt: skip
        out = []
        # values this key may have before the grid passes MAX_CELLS: checked before a range is
        # expanded, so that no list longer than the cap is ever built
        room = MAX_CELLS // math.prod(len(v) for v in grid.values())
        for item in values.split(","):
            item = item.strip()
            if not item:
                raise InputError(f"--grid {spec!r} has an empty value; expected V1,V2,....")
            a, colon, b = item.partition(":")
            if colon and task.options[key].type in (int, float):
                for end in (a, b):
                    no_underscore(f"--grid {spec!r}: {key}", end)
                try:
                    lo, hi = as_int(a), as_int(b)
                except ValueError:
                    raise InputError(f"--grid {spec!r}: a range is A:B with integers A <= B "
                                     f"(both included); got {item!r}.") from None  # fmt: skip
                except OverflowError:
                    lo = hi = None
                if lo is None or (lo <= hi and not (INT_MIN <= lo and hi <= INT_MAX)):
                    raise InputError(_int64_text(f"--grid {spec!r}", key, item))
                if hi < lo:
                    raise InputError(f"--grid {spec!r}: a range is A:B with A <= B (both "
                                     f"included); got {item!r}.")  # fmt: skip
                if len(out) + hi - lo + 1 > room:
                    raise InputError(f"--grid {spec!r}: the range {item!r} holds {hi - lo + 1:,} "
                                     f"values, which makes the grid more than {MAX_CELLS:,} "
                                     f"cells, the most a sweep has.")  # fmt: skip
                out += [_typed(task, key, str(v), f"--grid {spec!r}") for v in range(lo, hi + 1)]
            else:
                if len(out) + 1 > room:
                    raise InputError(f"--grid {spec!r} makes the grid more than {MAX_CELLS:,} "
                                     f"cells, the most a sweep has.")  # fmt: skip
                out.append(_typed(task, key, item, f"--grid {spec!r}"))
        same = task.options[key].same or (lambda v: v)
        if len({repr(same(v)) for v in out}) != len(out):
            raise InputError(f"--grid {spec!r} repeats a value; expected distinct values.")
        grid[key] = out
    if not grid:
        raise InputError("a sweep needs at least one --grid NAME=VALUES.")
    clash = [k for k in grid if k in task.inner_dims]
    if clash:
        raise InputError(f"{clash[0]!r} is a dimension of each {task.name} cell and cannot be "
                         f"swept.")  # fmt: skip
    return grid


def parse_options(task: str | Task, options: dict | None, grid: dict | None = None) -> dict:
    """The task's fixed options: defaults updated by `options` (strings are typed and checked).
    An option that `grid` also sweeps is refused (the grid's values silently won)."""
    task = get_task(task) if isinstance(task, str) else task
    fixed = {k: o.default for k, o in task.options.items()}
    for name, value in (options or {}).items():
        key = option_key(task, name)
        flag = f"--{name.replace('_', '-')}"
        if grid is not None and key in grid:
            raise InputError(f"{flag} {value} sets {key}, which --grid {key}=... sweeps; expected "
                             f"{key} either fixed ({flag}) or swept (--grid), not both.")  # fmt: skip
        fixed[key] = _typed(task, key, value, flag)
    return fixed


# parameters added after stores were written, per task: unset (None), they are left out of the
# key, so that the cells written before them keep their keys (and a rerun finds them); a task's
# `key_params` says which values count as unset (integrate: `_integrate_key`)
_KEY_SKIPS_NONE = {"integrate": frozenset({"y0", "states", "H", "march", "max_steps"})}


def _key_skips_at(task: str) -> dict:
    """Parameters whose default is not None, added after stores were written: left out of the
    key at the value the cells before them had (train-network: `training._ADDED_LATER`, the
    same list that reads runs saved before them)."""
    from .training import _ADDED_LATER

    return _ADDED_LATER if task == "train-network" else {}


def cell_key(task: str, params: dict, fingerprints: dict | None = None) -> str:
    """A stable name for a cell: the hash of the task and every parameter (not the folder),
    and of a `text:` corpus's contents (`corpus_fingerprint`): a cell made on other contents
    of the file is not taken as done. `fingerprints`: `{corpus spec: fingerprint}` already read
    (one read per sweep, not per cell; a spec read here is added to it)."""
    params = _key_params(task, params, {} if fingerprints is None else fingerprints)
    text = json.dumps({"task": task, "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _key_params(task: str, params: dict, fingerprints: dict) -> dict:
    """What of `params` a cell's key holds: after the task's `key_params`, without the run
    folder and the options left out where None, and with a `text:` corpus's `corpus_sha256`."""
    from .corpora import corpus_fingerprint

    known = tasks().get(task)
    if known is not None and known.key_params is not None:
        params = known.key_params(params)
    skips, at = _KEY_SKIPS_NONE.get(task, frozenset()), _key_skips_at(task)
    params = {k: v for k, v in params.items() if k != "out" and not (k in skips and v is None)
              and not (k in at and not isinstance(v, bool) and v == at[k])}  # fmt: skip
    spec = params.get("corpus")
    if isinstance(spec, str) and spec.startswith("text:"):
        if spec not in fingerprints:
            fingerprints[spec] = corpus_fingerprint(spec)
        params["corpus_sha256"] = fingerprints[spec]
    return params


def _float_text(v: float) -> str:
    """`v` in a folder name: `:g` (the names sweeps have always had) where that reads back as
    `v`, else the shortest text that does (`repr`): `lr=0.0010000001` was `lr0.001`, the folder
    of `lr=0.001` too, and its run replaced the other's."""
    text = f"{v:g}"
    return text if v != v or float(text) == v else repr(v)


def _label(grid: dict, values) -> str:
    """Folder name of a cell from its swept values: `coupled-seed0` for arm=coupled, seed=0."""
    parts = []
    for k, v in zip(grid, values):
        text = _float_text(v) if isinstance(v, float) else str(v)
        parts.append(text if k in ("arm", "variant", "system") else f"{k}{text}")
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in "-".join(parts))


def _swept(grid: dict, values) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in zip(grid, values))


def _check_labels(grid: dict, labelled: list) -> None:
    """Two cells never share a run folder (the second run replaced the first): values that
    differ only in characters a folder name does not keep (`text:a/b`, `text:a_b`), or only in
    case (one folder on a case-insensitive file system), are refused before any work."""
    seen = {}
    for label, values in labelled:  # [(folder name, swept values)]
        other = seen.setdefault(label.casefold(), (label, values))
        if other[1] is not values:
            how = ("" if other[0] == label else ", on a file system that ignores case "
                   "(macOS, Windows)")  # fmt: skip
            raise InputError(f"--grid cells {_swept(grid, other[1])} and {_swept(grid, values)} "
                             f"would share the run folder {other[0]!r}{how}, so one run would "
                             f"replace the other; expected swept values that give distinct folder "
                             f"names (a name keeps letters, digits and -_.+, writes any other "
                             f"character as _, and may not tell case apart).")  # fmt: skip


def make_cells(task: Task, grid: dict, fixed: dict, runs_dir=None) -> list[tuple[tuple, str, dict]]:
    """`[(grid index, key, params)]` for every cell, in C order over the grid, each checked by
    the task's own checks (`CellInputError` naming the cell's values at the first bad one)."""
    cells = []
    fingerprints = {}  # a text corpus's contents, read once for every cell of this sweep
    checked = set()  # the checks never look at seed (checked by its option) or the run folder
    shape = [range(len(v)) for v in grid.values()]
    combos = [(idx, [grid[k][i] for k, i in zip(grid, idx)]) for idx in itertools.product(*shape)]
    labels = [_label(grid, values) for _, values in combos] if task.needs_out else None
    if labels is not None:  # every cell's folder is its own, checked before any cell is checked
        _check_labels(grid, [(label, values) for label, (_, values) in zip(labels, combos)])
    for n, (idx, values) in enumerate(combos):
        params = {**fixed, **dict(zip(grid, values))}
        if task.defaults is not None:
            params = task.defaults(params)
        if labels is not None:
            params["out"] = str(Path(runs_dir) / labels[n])
        what = repr(sorted((k, repr(v)) for k, v in params.items() if k not in ("seed", "out")))
        if task.validate is not None and what not in checked:
            _check_cell(task, grid, params, others_passed=bool(checked))
            checked.add(what)
        cells.append((idx, cell_key(task.name, params, fingerprints), params))
    return cells


def _refusal(check, params: dict) -> str | None:
    """The sentence with which `check` refuses `params`, or None where it accepts them."""
    try:
        check(params)
    except CellInputError:
        raise
    except InputError as err:
        return str(err)
    return None


def _flag(task: Task, key: str) -> str:
    """The option's name on the command line (its alias where it has one: `--context`)."""
    alias = next((a for a, k in task.aliases.items() if k == key), key)
    return f"--{alias.replace('_', '-')}"


def _check_cell(task: Task, grid: dict, params: dict, claim: bool = False,
                others_passed: bool = False):
    """`task.validate(params)` (`task.claim`, of the cell's run folder, with `claim`); its
    refusal names what is at fault: the fixed options without which the cell passes, alone
    (`--min-lr: ...`) where the grid plays no part (no other cell passed, and changing any one
    swept value gives the same sentence), else beside the cell's swept values (`--grid
    kappa=1 with --system: ...`)."""
    check = task.claim if claim else task.validate
    reason = None
    if not claim and task.settings is not None:  # refused there: judged there, nothing made
        reason = _refusal(task.settings, params)
        check = task.validate if reason is None else task.settings
    reason = reason or _refusal(check, params)
    if reason is None:
        return
    values = {k: params[k] for k in grid}
    if claim:  # the folder is named by the swept values
        raise CellInputError(values, reason)
    # a fixed option set away from its default is at fault when resetting it alone passes (the
    # corpus is not reset: loading the default one may take seconds, and a bad corpus says so).
    # With two bad fixed options neither passes alone, and the cell is named, as before: "sets
    # another sentence" would name options whose default is not valid here (--eps, --context)
    keys = [
        k for k, opt in task.options.items()
        if k not in grid and k not in ("out", "corpus") and opt.sweepable
        and params.get(k, opt.default) != opt.default
        and _refusal(check, {**params, k: opt.default}) is None
    ]  # fmt: skip
    flags = tuple(_flag(task, k) for k in keys)
    if flags and not others_passed and all(
        _refusal(check, {**params, k: v}) == reason
        for k, vs in grid.items() if k != "seed" for v in vs if v != params[k]
    ):  # fmt: skip
        # a sentence that names its one option already is said as it is (integrate's own)
        said = len(flags) == 1 and reason.startswith(f"{flags[0]} ")
        raise InputError(reason if said else f"{', '.join(flags)}: {reason}")
    # beside the cell, each with its value: `--grid states=2 with --system cycle` (2 is
    # birth-death's own), where `with --system` left the user to guess why
    raise CellInputError(values, reason, tuple(f"{_flag(task, k)} {_text(params[k])}" for k in keys))


def _chunks(task: Task, todo: list, chunk_size: int) -> list[list]:
    if task.group is None:
        return [[c] for c in todo]
    groups: dict = {}
    for c in todo:
        groups.setdefault(task.group(c[2]), []).append(c)
    return [g[i : i + chunk_size] for g in groups.values() for i in range(0, len(g), chunk_size)]


# ---------------------------------------------------------------------------------------------
# running cells (on a worker, or in this process)


def _limit_threads():
    """torch's intra-op threads from OMP_NUM_THREADS (set per worker by `run_sweep`)."""
    n = os.environ.get("OMP_NUM_THREADS")
    if n and n.isdigit() and int(n) > 0:
        import torch

        if torch.get_num_threads() != int(n):
            torch.set_num_threads(int(n))


def _who() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _dump_cell(ds: xr.Dataset, f):
    """A cell as one `.npz`: numeric arrays as entries, and a JSON header with every variable's
    dims and attributes and the string values (an h5netcdf file was 0.5 s a cell here)."""
    header = {"attrs": ds.attrs, "vars": {}}
    arrays = {}
    for kind, group in (("coord", ds.coords), ("data", ds.data_vars)):
        for name, var in group.items():
            entry = {"kind": kind, "dims": list(var.dims), "attrs": var.attrs}
            if var.dtype.kind in "OUS":
                entry["strings"] = np.asarray(var.values, dtype=str).tolist()
            else:
                arrays[f"{kind}/{name}"] = np.asarray(var.values)
            header["vars"][name] = entry
    text = json.dumps(header, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    np.savez(f, __header__=np.frombuffer(text.encode(), dtype=np.uint8), **arrays)


def _load_cell(path) -> xr.Dataset:
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(z["__header__"].tobytes().decode())
        coords, data = {}, {}
        for name, e in header["vars"].items():
            values = np.array(e["strings"], dtype=object) if "strings" in e else z[f"{e['kind']}/{name}"]
            (coords if e["kind"] == "coord" else data)[name] = (tuple(e["dims"]), values, e["attrs"])
    return xr.Dataset(data, coords=coords, attrs=header["attrs"])


def _write_cell(ds: xr.Dataset, cells_dir: Path, key: str) -> bool:
    """Write `cells_dir/KEY.npz` once: to a temporary file, then a hard link onto the name,
    which fails if it exists. Returns False when another attempt had already written it."""
    final = cells_dir / f"{key}{CELL_SUFFIX}"
    tmp = cells_dir / f".{key}.{uuid.uuid4().hex[:8]}.part"
    try:
        with open(tmp, "wb") as f:
            _dump_cell(ds, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            return False
        except FileNotFoundError:
            if final.exists():  # another run finished the cell and `_remove_leftovers` took ours
                return False
            raise
        return True
    except OSError as err:  # a write or fsync names no file: the cell it was writing
        _named(err, tmp)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def _named(err: OSError, path) -> OSError:
    """`err` with `path` as its file name when it names none (a failed write or fsync), so that
    `run_sweep` can tell a write into the store from any other OSError (standard output that is
    full, a file that `on_chunk` writes)."""
    if err.filename is None:
        err.filename = str(path)
    return err


def _cell_dataset(result: xr.Dataset | None, key, params, status, message, wall, run_id):
    ds = xr.Dataset() if result is None else result.copy()
    ds.attrs = {"cell_key": key, "params": json.dumps(params, default=str), "run_id": run_id,
                "fastslow_sim_version": __version__}  # fmt: skip
    ds["status"] = ((), status, {"long_name": "cell status: done, failed or pending"})
    ds["message"] = ((), message, {"long_name": "error message of a failed cell"})
    ds["cell_wall_time_s"] = ((), float(wall), {"long_name": "wall-clock of the cell's chunk "
                                                "per cell", "units": "s"})  # fmt: skip
    ds["worker"] = ((), _who(), {"long_name": "dask worker (or process) that ran the cell"})
    ds["run_id"] = ((), run_id, {"long_name": "id of the sweep run that wrote the cell"})
    return ds


def _judged(result: xr.Dataset) -> tuple:
    """`(result, status, message)`: a cell whose solver did not succeed is a failed cell (its
    data kept), as `fastslow-sim integrate` exits 1 on it."""
    if "solver_status" in result and str(result["solver_status"].values) != "success":
        status = str(result["solver_status"].values)
        text = str(result["solver_message"].values) if "solver_message" in result else ""
        return result, STATUS_FAILED, f"solver status {status}" + (f": {text}" if text else "")
    return result, STATUS_DONE, ""


def _one_cell_at_a_time() -> bool:
    """Whether this process runs one cell at a time, so that `run_cells` may silence the
    process's warnings while its cell runs (`warnings.catch_warnings` changes and restores
    process-wide state: two threads inside it at once leave each other's filters wrong):
    the main thread (`run_sweep`'s own process, `workers=0`) or a dask worker of one thread
    (`run_sweep`'s local cluster). A worker of several threads (`dask worker`, which
    `--scheduler` may reach) is left alone."""
    if threading.current_thread() is threading.main_thread():
        return True
    try:
        from distributed import get_worker

        return get_worker().state.nthreads == 1
    except (ImportError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def _quiet_if_alone():
    """Warnings silenced inside the block where `_one_cell_at_a_time`, else left alone."""
    if not _one_cell_at_a_time():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def run_cells(task_name: str, cells: list, cells_dir, run_id: str = "") -> list[tuple[str, str]]:
    """Run one chunk of cells `[(index, key, params)]` and write each; returns `[(key, status)]`
    with status "done", "failed" or "exists" (another attempt wrote it first, or before).

    A chunk whose call fails runs again cell by cell, so that one bad cell fails alone."""
    _limit_threads()
    task = get_task(task_name)
    cells_dir = Path(cells_dir)
    cells = [c for c in cells if not (cells_dir / f"{c[1]}{CELL_SUFFIX}").exists()]
    if not cells:
        return []
    # the tasks' own warnings (MassDriftWarning, StiffnessWarning) are not issued but kept on
    # their results (`warn=False`), so each cell reads its own; others (numpy's, a solver's
    # notes) are silenced only where no other cell shares the process's warning state
    start = time.perf_counter()
    try:
        with _quiet_if_alone():
            results = [_judged(r) for r in task.run([c[2] for c in cells])]
    except Exception as err:  # noqa: BLE001 - a failed cell is recorded, the sweep goes on
        if len(cells) > 1:
            out = []
            for c in cells:
                out += run_cells(task_name, [c], cells_dir, run_id)
            return out
        results = [(None, STATUS_FAILED, _error_text(err))]
    wall = (time.perf_counter() - start) / len(cells)
    out = []
    for (_, key, params), (res, status, message) in zip(cells, results):
        ds = _cell_dataset(res, key, params, status, message, wall, run_id)
        out.append((key, status if _write_cell(ds, cells_dir, key) else "exists"))
    return out


# ---------------------------------------------------------------------------------------------
# the store


_PART_NAME = re.compile(r"\.([0-9a-f]{20})\.[0-9a-f]{8}\.part")  # `_write_cell`'s temporary file
_CELL_NAME = re.compile(rf"[0-9a-f]{{20}}\.npz|{_PART_NAME.pattern}")
_ZARR_META = ("zarr.json", ".zgroup", ".zattrs", ".zmetadata")  # what to_zarr puts at the root


def _root_attrs(store: Path) -> dict | None:
    """The root group's attributes when they are a sweep root this project wrote (its format
    marker, task and version), else None (no root, an unreadable one, or another's)."""
    try:
        attrs = json.loads((store / "zarr.json").read_text())["attributes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(attrs, dict) or not all(k in attrs for k in ("fastslow_sweep_format", "task",
                                                                   "fastslow_sim_version")):
        return None
    return attrs


def _is_zarr_array(path: Path) -> bool:
    """`path` is a zarr array folder (its own zarr.json says so), as to_zarr writes each variable."""
    try:
        return json.loads((path / "zarr.json").read_text()).get("node_type") == "array"
    except (OSError, ValueError, AttributeError):
        return False


def _root_entries(store: Path) -> set[str]:
    """The top-level entries of `store` that the project wrote as its root group: the zarr
    metadata files and the arrays that the previous root names (or, when it cannot be read, the
    folders that are zarr arrays). Anything else at the top is someone else's and is kept."""
    names = {n for n in _ZARR_META if (store / n).is_file()}
    try:
        meta = json.loads((store / "zarr.json").read_text())["consolidated_metadata"]["metadata"]
        known = {k for k in meta if "/" not in k}
    except (OSError, ValueError, KeyError, TypeError):
        known = set()
    for entry in store.iterdir():
        if entry.name == CELLS or entry.is_symlink() or not entry.is_dir():
            continue
        if (entry.name in known or not known) and _is_zarr_array(entry):
            names.add(entry.name)
    return names


def _interrupted_store(store: Path) -> bool:
    """A store whose root was never written (or was being written): `cells/` holding only
    files named as the project writes its cells, and at the top nothing but the root's own."""
    cells = store / CELLS
    if cells.is_symlink() or not cells.is_dir():
        return False
    if not all(e.is_file() and _CELL_NAME.fullmatch(e.name) for e in cells.iterdir()):
        return False
    return all(e.name == CELLS or e.name in _root_entries(store) for e in store.iterdir())


def _check_store(store: Path, task: str, parents: bool = False) -> Path:
    from .io import _special, check_parent
    from .validation import folder

    if store.is_symlink() and not store.exists():
        raise InputError(f"--store {str(store)!r} is a dangling symbolic link; expected a new or "
                         f"existing sweep folder (PATH.zarr).")  # fmt: skip
    if store.exists() and not store.is_dir():
        kind = _special(store) or "file"
        raise InputError(f"--store {str(store)!r} is a {kind}; expected a new or existing sweep "
                         f"folder (PATH.zarr).")  # fmt: skip
    if not store.exists():  # the folders above it are the user's to make, as for every --out
        folder(store, "sweep store")
        if not parents:
            check_parent(store, "sweep store")
    if not store.is_dir() or not any(store.iterdir()):
        return store
    attrs = _root_attrs(store)
    if attrs is None and not _interrupted_store(store):
        raise InputError(f"--store {str(store)!r} exists and is not a sweep store; expected a "
                         f"new path or one written by fastslow-sim sweep.")  # fmt: skip
    held = None if attrs is None else attrs["task"]
    if held is not None and held != task:
        raise InputError(f"--store {str(store)!r} holds a sweep of {held}; expected a new store "
                         f"or one of {task} (its root group would be replaced).")  # fmt: skip
    return store


def _keyed(task: Task, params: dict, fingerprints: dict) -> tuple:
    """`_key_params` as a comparable tuple, a `text:` corpus by its contents alone where its file
    can be read (its spelling is not configuration), so that two calls name one cell where
    their keys would."""
    out = _key_params(task.name, params, fingerprints)
    sha = out.pop("corpus_sha256", None)
    if sha:
        out["corpus"] = ("text", sha)
    return tuple(sorted(out.items(), key=lambda kv: kv[0]))


def _setting(task: Task, key: str, grid: dict, fixed: dict) -> str:
    """How a sweep sets `key`: `--grid eps=0.1,0.05`, `--t-end 0.5`, or `no --kappa`."""
    if key in grid:
        values = [_text(v) for v in grid[key]]
        more = f",... ({len(values):,} values)" if len(values) > 6 else ""
        return f"--grid {key}={','.join(values[:6])}{more}"
    value = fixed.get(key, task.options[key].default if key in task.options else None)
    return f"no {_flag(task, key)}" if value is None else f"{_flag(task, key)} {_text(value)}"


def _check_same_sweep(store: Path, task: Task, grid: dict, fixed: dict, cells: list) -> None:
    """A store's root group is rebuilt from this call's grid and options: where the sweep it
    holds has a cell that this call's grid lacks (another fixed option, `--t-end 1` after
    `--t-end 0.5`, or a grid without some of its values), the root would silently drop those
    cells' results (kept only as files under cells/). Refused in one sentence naming the first
    option that differs, before any work. The same options resume; a grid with more values or
    more swept parameters whose values include the store's extends it; a cell whose key changed
    without any option doing so (a `text:` corpus edited since) runs again; a cell the root
    lists as pending (a run stopped before it finished) holds nothing to lose."""
    attrs = _root_attrs(store)
    if attrs is None or attrs.get("task") != task.name:
        return
    pending = None  # cell -> whether it holds no result (listed pending, and no cell file)
    try:
        with xr.open_zarr(store) as root:
            keys = np.asarray(root["cell_key"].values, dtype=object)
            status = (np.asarray(root["status"].values, dtype=object) if "status" in root
                      else np.full(keys.shape, STATUS_DONE, dtype=object))  # fmt: skip
            coords = {d: {v: i for i, v in enumerate(root[d].values.tolist())}
                      for d in root["cell_key"].dims}  # fmt: skip
        # the root is rewritten only when a run ends: a killed run's finished cells are listed
        # pending, and their files say they are done
        empty = np.array([s == STATUS_PENDING and not (store / CELLS / f"{k}.npz").exists()
                          for k, s in zip(keys.ravel(), status.ravel())],
                         dtype=bool).reshape(keys.shape)  # fmt: skip
        held = set(keys[~empty].ravel().tolist())

        def pending(values: dict) -> bool:
            try:
                return bool(empty[tuple(coords[d][values[d]] for d in coords)])
            except (KeyError, IndexError, TypeError):  # not a cell of the root: judged held
                return False
    except Exception:  # a root that cannot be read: judged by its attributes alone
        held = None
    if held is not None and held <= {key for _, key, _ in cells}:
        return
    stored = _stored_sweep(attrs)
    if stored is None:
        return  # no grid to compare with: the root is rebuilt as before
    old_grid, old_fixed = stored
    names = list(task.options)
    old_grid = {k: v for k, v in old_grid.items() if k in names}
    base = {k: o.default for k, o in task.options.items()}
    base.update({k: v for k, v in old_fixed.items() if k in names and k not in old_grid})
    fingerprints = {}
    new = [_keyed(task, params, fingerprints) for _, _, params in cells]
    have = set(new)
    new_values = {k: set() for k in names}  # the values this call's cells give each option,
    for t in set(new):  # as their keys hold them (None: left out of the key)
        d = dict(t)
        for k in names:
            new_values[k].add(d.get(k))
    for combo in itertools.product(*old_grid.values()):
        if pending is not None and pending(dict(zip(old_grid, combo))):
            continue  # nothing to lose: the run that listed it stopped before its result
        params = {**base, **dict(zip(old_grid, combo))}
        if task.defaults is not None:
            params = task.defaults(params)
        old = _keyed(task, params, fingerprints)
        if old in have:
            continue
        olds = dict(old)
        order = list(old_grid) + [k for k in names if k not in old_grid]
        first = next((k for k in order if olds.get(k) not in new_values[k]), None)
        if first is not None:
            what = (f"with {_setting(task, first, old_grid, old_fixed)}, and this one has "
                    f"{_setting(task, first, grid, fixed)}")  # fmt: skip
        else:  # no one option differs: the cell's combination of values
            cell = ", ".join(f"{k}={_text(v)}" for k, v in zip(old_grid, combo))
            what = f"with the cell {cell}, which this one lacks"
        raise InputError(f"--store {str(store)!r} holds a sweep of {task.name} {what}; expected "
                         f"a new store, or that sweep's options to resume it (a --grid with more "
                         f"values extends it): its root group would lose the cells this one "
                         f"lacks.")  # fmt: skip


def _stored_sweep(attrs: dict | None) -> tuple[dict, dict] | None:
    """`(grid, fixed options)` of the sweep a store's root attributes record; None where there
    is no root, or its record cannot be read (a grid is a dict of non-empty lists)."""
    try:
        grid, fixed = json.loads(attrs["grid"]), json.loads(attrs.get("options", "{}"))
        assert isinstance(grid, dict) and isinstance(fixed, dict)
        assert all(isinstance(v, list) and v for v in grid.values())
    except (KeyError, TypeError, ValueError, AssertionError):
        return None
    return grid, fixed


def _spelled_as_stored(task: Task, store: Path, grid: dict, fixed: dict) -> tuple[dict, dict]:
    """`grid` and `fixed` with each value of an option that has `same` spelled as the store's
    sweep spelled it where both stand for one setting (`--tokens 500000` over a store made
    with `--tokens 500k`, `--grid tokens=0.3k,1m` over one with `300,1000000`): the cells and
    their keys are the store's, not another sweep's."""
    stored = _stored_sweep(_root_attrs(store))
    if stored is None:
        return grid, fixed
    old_grid, old_fixed = stored
    grid, fixed = dict(grid), dict(fixed)
    for key, opt in task.options.items():
        if opt.same is None:
            continue
        if key in grid and key in old_grid:
            stored = {repr(opt.same(v)): v for v in old_grid[key]}
            grid[key] = [stored.get(repr(opt.same(v)), v) for v in grid[key]]
        elif key in fixed and key in old_fixed and key not in old_grid \
                and opt.same(fixed[key]) == opt.same(old_fixed[key]):  # fmt: skip
            fixed[key] = old_fixed[key]
    return grid, fixed


def _check_runs_dir(task: Task, runs_dir, store: Path, parents: bool = False) -> Path | None:
    """The folder of a train-network sweep's run folders (default `PATH-runs` beside the
    store), checked as the store is: a folder or a new path in an existing folder."""
    from .io import check_parent
    from .validation import folder

    if not task.needs_out:
        if runs_dir is not None:
            raise InputError(f"--runs-dir {str(runs_dir)!r} is for the run folders of "
                             f"train-network; the {task.name} task writes none.")  # fmt: skip
        return None
    runs_dir = Path(runs_dir) if runs_dir is not None else store.with_name(store.stem + "-runs")
    if _inside(runs_dir, store) or _inside(os.path.realpath(runs_dir), os.path.realpath(store)):
        raise InputError(f"--runs-dir {str(runs_dir)!r} lies inside the sweep store "
                         f"{str(store)!r}; expected a folder outside it (a store that fails is "
                         f"cleaned up, and the run folders must not go with it).")  # fmt: skip
    folder(runs_dir, "runs folder")
    if not runs_dir.exists() and not parents:
        check_parent(runs_dir, "runs folder")
    return runs_dir


def _create_store(store: Path, parents: bool = False) -> bool:
    """Make the store's folder (unless it exists) and its cells/; True when this call made the
    folder: decided by the mkdir itself, so that a store another run made meanwhile is never
    taken for this run's (and cleaned up as such). A folder it made is removed when its cells/
    cannot be made."""
    made = False
    try:
        try:
            store.mkdir(parents=parents)
            made = True
        except FileExistsError:  # it was there (`_check_store`), or another run made it meanwhile
            pass
        (store / CELLS).mkdir(exist_ok=True)
        return made
    except OSError as err:
        from .io import creation_error

        made_err = creation_error(_named(err, store), store, "sweep store")  # while it is there
        _remove_new(store, made)
        if isinstance(made_err, OSError):  # says all there is to say (`run_sweep` adds nothing)
            made_err = _StoreNotMadeError(made_err.errno, made_err.strerror, made_err.filename)
        raise made_err from None
    except BaseException:
        _remove_new(store, made)
        raise


def _remove_new(store: Path, made: bool):
    if made:
        with contextlib.suppress(OSError):
            store.rmdir()  # only when empty


class _StoreNotMadeError(OSError):
    """The store's folder (or its cells/) could not be made: a full disk, an I/O error."""


def _read_cell(path: Path) -> xr.Dataset | None:
    """The cell file `path`; None when there is none, an `UnreadableCellError` naming it when it
    is there but cannot be read."""
    try:
        return _load_cell(path)
    except FileNotFoundError:
        return None
    except OSError as err:  # a read that failed (EIO) names no file: the cell it was reading
        _named(err, path)
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, KeyError, TypeError,
            AttributeError, IndexError) as err:  # fmt: skip
        # what a file cut short or overwritten raises (ValueError: no .npz, or its header no
        # JSON; the rest: a header of another form), not a MemoryError, which would have the
        # caller remove a whole cell (numpy's own text of a file that is no .npz suggests
        # loading it with pickle: the type alone is said)
        raise UnreadableCellError(path, f"not a whole .npz file: {type(err).__name__}") from None


def _fill(dtype):
    if dtype.kind == "f":
        return np.nan
    if dtype.kind in "iu":
        return -1
    if dtype.kind == "b":
        return False
    return ""


def _without_grid_copies(loaded: dict, grid: dict) -> dict:
    """The cells without a variable of a swept parameter's name (`method`, `n_layer`), which
    would collide with the grid's coordinate: dropped where every cell holds its own swept
    value (the coordinate says it), else kept as `NAME_cell` (e.g. the method that ran where
    `auto` was swept)."""
    clash = {v for ds in loaded.values() for v in ds.data_vars if v in grid}
    if not clash:
        return loaded
    pos = {k: i for i, k in enumerate(grid)}

    def same(ds, idx, v):
        a = ds[v].values
        return a.ndim == 0 and a.item() == grid[v][idx[pos[v]]]

    drop = {v for v in clash if all(v not in ds or same(ds, idx, v) for idx, ds in loaded.items())}
    out = {}
    for idx, ds in loaded.items():
        ds = ds.drop_vars([v for v in drop if v in ds])
        for v in clash - drop:
            if v in ds:
                ds[v].attrs = {**ds[v].attrs, "note": f"the cell's own {v}; the swept value is "
                                                      f"the coordinate {v}"}  # fmt: skip
                ds = ds.rename({v: f"{v}_cell"})
        out[idx] = ds
    return out


def consolidate(store, task: Task, grid: dict, fixed: dict, cells: list, attrs=None) -> xr.Dataset:
    """Build the sweep's Dataset from its cell files and write it as the store's root group."""
    store = Path(store)
    shape = tuple(len(v) for v in grid.values())
    loaded = {}
    for idx, key, _ in cells:
        ds = _read_cell(store / CELLS / f"{key}{CELL_SUFFIX}")
        if ds is not None:
            loaded[idx] = ds if task.recorded is None else task.recorded(ds)
    loaded = _without_grid_copies(loaded, grid)
    names, dims, sizes, dtypes, vattrs, coords = [], {}, {}, {}, {}, {}
    for ds in loaded.values():
        for v in ds.data_vars:
            if v not in dims:
                names.append(v)
                dims[v], dtypes[v], vattrs[v] = ds[v].dims, ds[v].dtype, dict(ds[v].attrs)
            elif dtypes[v].kind in "iu" and ds[v].dtype.kind == "f":
                dtypes[v] = ds[v].dtype
        for d, n in ds.sizes.items():
            sizes[d] = max(sizes.get(d, 0), n)
        for c in ds.coords:
            coords.setdefault(c, []).append(ds[c])
    for v in ("status", "message", "cell_wall_time_s", "worker", "run_id"):
        if v not in dims:
            names.append(v)
            dims[v] = ()
            dtypes[v] = np.dtype(float) if v == "cell_wall_time_s" else np.dtype(object)
            vattrs[v] = {}
    data = {}
    for v in names:
        full = shape + tuple(sizes[d] for d in dims[v])
        kind = np.dtype(object) if dtypes[v].kind in "OUS" else dtypes[v]
        fill = STATUS_PENDING if v == "status" else _fill(kind)
        arr = np.full(full, fill, dtype=kind)
        for idx, ds in loaded.items():
            if v in ds:
                a = ds[v].values
                arr[idx + tuple(slice(0, n) for n in a.shape)] = a
        if kind.kind == "O":  # Python str, which zarr stores as variable-length strings
            arr = np.array([str(a) for a in arr.ravel()], dtype=object).reshape(arr.shape)
        data[v] = (tuple(grid) + dims[v], arr, vattrs[v])
    keys = np.empty(shape, dtype=object)
    for idx, key, _ in cells:
        keys[idx] = key
    data["cell_key"] = (tuple(grid), keys, {"long_name": "cell file under cells/ (KEY.npz)"})
    coord_vars = {}
    for k, vals in grid.items():
        arr = np.array(vals, dtype=object if isinstance(vals[0], str) else None)
        coord_vars[k] = (k, arr, {"long_name": f"swept parameter {k}"})
    for c, arrays in coords.items():
        ref = max(arrays, key=lambda a: a.size)
        if all(a.dims == ref.dims and np.array_equal(a.values, ref.values[: a.size]) for a in arrays):
            coord_vars[c] = (ref.dims, ref.values, dict(ref.attrs))  # shorter ones are its prefix
        else:  # differs between cells (e.g. time when t_end is swept): a variable per cell
            arr = np.full(shape + (sizes[c],), np.nan)
            for idx, ds in loaded.items():
                if c in ds.coords:
                    arr[idx + (slice(0, ds.sizes[c]),)] = ds[c].values
            data[c] = (tuple(grid) + (c,), arr, dict(ref.attrs))
    status = data["status"][1]
    counts = {s: int(np.count_nonzero(status == s)) for s in (STATUS_DONE, STATUS_FAILED, STATUS_PENDING)}
    drift = {}
    if "mass_drift_warned" in data:  # cells written before it was recorded count as not warned
        drift = {"n_mass_drift": int(np.count_nonzero(data["mass_drift_warned"][1] == True))}  # noqa: E712
    out = xr.Dataset(data, coords=coord_vars, attrs={
        "title": f"fastslow-sim sweep of {task.name} over {', '.join(grid)}",
        "fastslow_sweep_format": FORMAT,
        "task": task.name,
        "grid": json.dumps(grid),
        "swept": list(grid),
        "options": json.dumps({k: v for k, v in fixed.items() if k not in grid}, default=str),
        "batched_axes": list(task.batched),
        "n_cells": len(cells), "n_done": counts[STATUS_DONE], "n_failed": counts[STATUS_FAILED],
        "n_pending": counts[STATUS_PENDING], **drift,
        "layout": "one dimension per swept parameter, then the cell's own; status/message per "
                  "cell; cells/KEY.npz holds each finished cell",
        **_versions(), **(attrs or {}),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip
    _write_root(out, store)
    return out


def _versions() -> dict:
    import dask
    import distributed
    import zarr

    return {"fastslow_sim_version": __version__, "xarray_version": xr.__version__,
            "zarr_version": zarr.__version__, "dask_version": dask.__version__,
            "distributed_version": distributed.__version__}  # fmt: skip


def _write_root(ds: xr.Dataset, store: Path):
    """Replace the root group (the entries the project wrote as the previous root, never
    cells/ nor a file someone else put there) by `ds`. Not atomic: the cells are the truth,
    and a run that dies here leaves a root that the next run rebuilds. An OSError that names
    no file (a failed write) is raised naming `store`."""
    try:
        _replace_root(ds, store)
    except OSError as err:
        _named(err, store)
        raise


def _replace_root(ds: xr.Dataset, store: Path):
    for name in _root_entries(store):
        entry = store / name
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    before = {e.name for e in store.iterdir()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: cells/ is not a zarr node; consolidated is not v3
            ds.to_zarr(store, mode="a", consolidated=True)
    except BaseException:
        # a root cut short (a full disk) read as finished: an array whose chunks are missing
        # reads as its fill value. What this write made goes (its metadata files and a folder
        # per variable, nothing else); the cells rebuild it next run
        for entry in store.iterdir():
            if entry.name not in before and (entry.name in _ZARR_META or entry.name in ds.variables):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()
        raise


def open_sweep(store) -> xr.Dataset:
    """The sweep in `store`, loaded (`xr.open_zarr` gives the same, lazily)."""
    store = Path(store)
    if not (store / CELLS).is_dir():
        raise InputError(f"no sweep store at {str(store)!r}.")
    with xr.open_zarr(store) as ds:
        return ds.load()


# ---------------------------------------------------------------------------------------------
# the engine


def _local_cluster(workers: int, threads: int | None = None):
    """Local cluster of `workers` processes, one task each; OMP/MKL/torch threads per worker =
    `threads` (default cores // workers, so that BLAS and torch do not oversubscribe)."""
    from distributed import LocalCluster

    threads = threads or max(1, usable_cpus() // workers)
    env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                        dashboard_address="127.0.0.1:0", host="127.0.0.1", env=env,
                        silence_logs=logging.ERROR)  # fmt: skip


def check_scheduler_address(scheduler: str) -> None:
    """`InputError` (one sentence naming it) for a `--scheduler` that is no dask address, as
    `bogus`, `tcp://bogus` (no port), `foo://1.2.3.4:5` or an empty one, and for one that is
    not tcp (`inproc://x`, `tls://...`): distributed raised a traceback for these, where an
    unreachable address was refused."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends, get_backend

    expected = "expected SCHEME://HOST:PORT, as tcp://127.0.0.1:8786, the address a `dask scheduler` prints"
    try:
        scheme, location = parse_address(scheduler)
    except (ValueError, TypeError):
        raise InputError(f"--scheduler {scheduler!r} is not a dask scheduler address; {expected}.") from None
    try:
        get_backend(scheme)
    except ValueError:
        raise InputError(f"--scheduler {scheduler!r} has an unknown scheme {scheme!r} (known: "
                         f"{', '.join(sorted(backends))}); {expected}.") from None  # fmt: skip
    if scheme != "tcp":  # inproc, tls, ucx, ws: an in-process address, or security and
        # transport settings that sweeps do not take (each raised a traceback from distributed)
        raise InputError(f"--scheduler {scheduler!r} uses the scheme {scheme!r}, which sweeps do "
                         f"not set up (they connect over tcp, without TLS); {expected}.")  # fmt: skip
    try:
        parse_host_port(location)
    except (ValueError, TypeError):
        raise InputError(f"--scheduler {scheduler!r} has no valid HOST:PORT; "
                         f"{expected}.") from None  # fmt: skip


@contextlib.contextmanager
def _client(workers, scheduler, client, threads=None):
    if client is not None:
        yield client
        return
    from distributed import Client

    if scheduler is not None:
        try:
            c = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as err:
            raise InputError(f"cannot reach the dask scheduler at {scheduler!r} ({type(err).__name__}); "
                             f"expected the address of a running `dask scheduler`.") from None  # fmt: skip
        with c:
            yield c
        return
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # not the nanny's notes on closing its workers
    try:
        with _started_cluster(workers, threads) as cluster, Client(cluster) as c:
            try:
                yield c
            except KeyboardInterrupt:
                quiet.setLevel(logging.CRITICAL + 1)  # closing on Ctrl-C: "Interrupted." only
                raise
    finally:
        quiet.setLevel(level)


@contextlib.contextmanager
def _ctrl_c_polled():
    """While the main thread waits on the workers' results: a Ctrl-C only noted (a SIGINT
    handler that raises nothing), for the wait loop to raise as KeyboardInterrupt at its next
    poll (`_raise_polled_ctrl_c`, 50 ms apart). Python's own handler raises wherever the main
    thread is, and one raised inside a gc callback (distributed's `GCDiagnosis`, run at every
    collection) is printed as "Exception ignored" and dropped: the sweep ran on to its end
    and exited 0. The block's end raises a Ctrl-C noted after the last poll."""
    import signal

    old = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(old):
        yield  # no Python handler to stand in for: another thread, SIGINT ignored (`nohup`,
        return  # a background job) or a handler installed outside Python
    _CTRL_C.clear()
    signal.signal(signal.SIGINT, lambda signum, frame: _CTRL_C.set())
    try:
        yield
        _raise_polled_ctrl_c()
    finally:
        signal.signal(signal.SIGINT, old)
        _CTRL_C.clear()


_CTRL_C = threading.Event()  # set by `_ctrl_c_polled`'s SIGINT handler


def _raise_polled_ctrl_c():
    """KeyboardInterrupt, once, for a Ctrl-C that `_ctrl_c_polled` noted."""
    if _CTRL_C.is_set():
        _CTRL_C.clear()
        raise KeyboardInterrupt


@contextlib.contextmanager
def _started_cluster(workers, threads=None):
    """`_local_cluster`, its worker processes ignoring SIGINT: Ctrl-C reaches the whole
    process group, and workers still importing each printed a KeyboardInterrupt traceback;
    they are shut down by this process instead. Only an ignored SIGINT survives the exec of
    a spawned process (a blocked one does not: Python 3.11 unblocks it), so SIGINT is ignored
    here from the start until the workers are spawned (a Ctrl-C in that fraction of a second
    is lost), while a thread starts the cluster, so that the cluster is never left
    half-started (its atexit close raised a traceback). On Ctrl-C during the rest of the
    start-up, this waits for it to end, closes the cluster (distributed's log silenced) and
    re-raises. A worker that the nanny restarts later starts with Python's default SIGINT and
    may print its own traceback on a Ctrl-C."""
    import multiprocessing
    import signal
    import threading
    import time

    box = {}

    def start():
        try:
            box["cluster"] = _local_cluster(workers, threads)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    import distributed  # noqa: F401  (imported here, not in the window where SIGINT is ignored)

    # a handler installed outside Python reads as None and could not be put back: left alone
    main = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is not None  # fmt: skip
    before = len(multiprocessing.active_children())
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        starter = threading.Thread(target=start, name="fastslow-sim cluster start", daemon=True)
        starter.start()
        spawned = time.monotonic() + 60.0
        while (starter.is_alive() and time.monotonic() < spawned
               and len(multiprocessing.active_children()) < before + workers):  # fmt: skip
            time.sleep(0.01)
    finally:
        if main:
            signal.signal(signal.SIGINT, handler)
    try:
        while starter.is_alive():
            starter.join(0.1)
    except KeyboardInterrupt:
        logging.getLogger("distributed").setLevel(logging.CRITICAL + 1)
        while starter.is_alive():  # the start cannot be cut short: wait, then close it
            try:
                starter.join(0.1)
            except KeyboardInterrupt:
                pass
        if "cluster" in box:
            box["cluster"].close()
        raise
    if "error" in box:
        raise box["error"]
    with box["cluster"] as cluster:
        yield cluster


def run_sweep(task: str, grid: dict | list, options: dict | None = None, store="sweep.zarr", *,
              workers: int | None = None, scheduler: str | None = None, client=None,
              chunk_size: int | None = None, retry_failed: bool = False, runs_dir=None,
              progress: bool = True, log=print, attrs: dict | None = None,
              threads: int | None = None, on_chunk: Callable | None = None,
              parents: bool = False, same_sweep: bool = True) -> dict:  # fmt: skip
    """Run every missing cell of `grid` (a dict, or `--grid` strings) of `task` and return
    `{"dataset", "store", "n_cells", "n_skipped", "n_run", "n_failed", "dashboard"}`.

    `workers=0` runs the cells in this process (no dask); `workers=N` on a local cluster of N
    processes, at most the CPUs this process may use (`threads.usable_cpus`, also the
    default; more is an `InputError`); `scheduler=ADDRESS` (or `client`) on an existing
    cluster. Each dask task is one chunk: up to `chunk_size` cells of one batch (`integrate`,
    default: the batch split evenly over the workers, at most 64: a rodas4 batch costs about
    as much as one of its trajectories, so smaller chunks only add work) or one cell. `threads`: OMP,
    MKL and torch threads of each local worker (default: cores // workers). `on_chunk(results,
    chunk)` is called as each chunk finishes. The store's folder must exist (`--store a/b/c.zarr`
    does not make a/b) unless `parents` (a caller whose own output folder holds the store, as
    `reproduce --out DIR` holds DIR/sweep.zarr); nothing is written before every check passed.
    `same_sweep=False`: a store whose root holds cells this grid lacks is not refused
    (`_check_same_sweep`; `reproduce` judges its folder by its own ablation.nc).
    A write into the store that fails (a full disk) is an `OSError` naming the store: a new
    store in which no cell finished is removed, else the finished cells stay (a root group cut
    short is removed, never left to read as finished) and the same call, once there is room,
    resumes from them.
    """
    t = get_task(task)
    grid = parse_grid(t, grid) if isinstance(grid, (list, tuple)) else parse_grid(
        t, [f"{k}={','.join(map(str, v))}" for k, v in grid.items()])  # fmt: skip
    fixed = parse_options(t, options, grid)
    if workers is not None and workers < 0:
        raise InputError(f"--workers must be a non-negative integer; got {workers}.")
    local = scheduler is None and client is None
    # 40 workers on 2 cores did not finish 2 cells in 55 s; each process holds about 80 MB. Two
    # stay allowed on one CPU (scripts/check_wheel.sh and the tests run two workers)
    if local and workers is not None and workers > (limit := max(2, cpus := usable_cpus())):
        than = (f"the {plural(cpus, 'CPU')} this process may use" if cpus >= 2 else
                "2 (the 1 CPU this process may use takes two at most)")  # fmt: skip
        raise InputError(f"--workers {workers:,} asks for more local worker processes than "
                         f"{than}; expected at most {limit} (or --scheduler ADDRESS, a cluster "
                         f"of its own).")  # fmt: skip
    if chunk_size is not None and chunk_size < 1:
        raise InputError(f"--chunk-size must be a positive integer; got {chunk_size}.")
    if scheduler is not None and client is None:
        check_scheduler_address(scheduler)
    store = _check_store(Path(store), t.name, parents)
    runs_dir = _check_runs_dir(t, runs_dir, store, parents)
    grid, fixed = _spelled_as_stored(t, store, grid, fixed)
    cells = make_cells(t, grid, fixed, runs_dir)
    cells_dir = store / CELLS
    todo, retry, unreadable = [], set(), {}  # the cells to run; the files of failed, damaged ones
    held = []  # finished train cells whose worker chose the device: [(params, device kind)]
    for cell in cells:
        path = cells_dir / f"{cell[1]}{CELL_SUFFIX}"
        try:
            ds = _read_cell(path)
        except UnreadableCellError as err:
            # a cell is written whole (a temporary file linked onto its name), so a file that
            # cannot be read is no finished cell but one damaged since: it runs again
            unreadable[path] = err
            todo.append(cell)
            continue
        if ds is None:
            todo.append(cell)
        elif retry_failed and str(ds["status"].values) == STATUS_FAILED:
            retry.add(path)
            todo.append(cell)
        elif t.name == "train-network" and str(ds["status"].values) == STATUS_DONE:
            kind = _held_train_kind(cell[2], ds)
            if kind is not None:
                held.append((cell[2], kind))
    # judged only where cells are to train beside the held ones (a finished store re-run trains
    # none, and needs no cluster); a local sweep's workers are processes of this machine
    held = held if todo else []
    if held and local:  # before anything is written
        _check_held_kinds(grid, held, {_auto_device_kind()})
    if t.claim is not None:  # before anything is written: the cells that run, not those held
        for _, _, params in todo:
            _check_cell(t, grid, params, claim=True)
    if same_sweep:  # `reproduce` judges its own folder (`_check_held_ablation`)
        _check_same_sweep(store, t, grid, fixed, cells)  # before anything is written
    for path in retry:
        path.unlink()
    for path, err in unreadable.items():  # the store's own file (checked by `_check_store`)
        warnings.warn(f"the sweep cell file {err.path!r} cannot be read ({err.reason}), so it "
                      f"is no finished cell; it is removed and the cell computed again.",
                      UnreadableCellWarning, stacklevel=2)  # fmt: skip
        path.unlink(missing_ok=True)
    run_id = uuid.uuid4().hex[:12]
    attrs = {**(attrs or {}), "run_id": run_id}
    summary = {"store": str(store), "n_cells": len(cells), "n_skipped": len(cells) - len(todo),
               "n_run": 0, "n_failed": 0, "dashboard": None}  # fmt: skip
    here = workers == 0 and scheduler is None and client is None
    if workers is None and scheduler is None and client is None:
        workers = usable_cpus()
    created = False  # this run made the store's folder (`_create_store` says)
    try:
        with contextlib.ExitStack() as stack:
            # the cluster first: an unreachable scheduler, like bad input, leaves nothing behind
            c = None if here or not todo else stack.enter_context(
                _client(workers, scheduler, client, threads))  # fmt: skip
            kinds = set(c.run(_auto_device_kind).values()) if held and not local else set()
            if kinds:  # the cluster's workers decide where auto trains (none connected: the
                _check_held_kinds(grid, held, kinds)  # cells they train record their kind)
            _warn_unrecorded(held)  # every check passed: they are reused
            try:
                created = _create_store(store, parents)
                consolidate(store, t, grid, fixed, cells, attrs)
            except BaseException:
                if created:  # a store that failed as it was made is no store: nothing is left
                    _remove_made(store)  # no cell is this run's yet: another's are kept
                raise
            try:
                if c is None:
                    _drive(t, _chunks(t, todo, chunk_size or 64), cells_dir, run_id, None,
                           progress, summary, on_chunk)  # fmt: skip
                else:
                    nw = max(1, len(c.scheduler_info(n_workers=-1).get("workers", {}))
                             or (workers or 1))  # fmt: skip
                    size = chunk_size or max(1, min(64, math.ceil(len(todo) / nw)))
                    summary["dashboard"] = _dashboard(c)
                    log(f"dask: {plural(nw, 'worker')} at {c.scheduler.address}"
                        + (f", dashboard {summary['dashboard']}" if summary["dashboard"] else ""))
                    _drive(t, _chunks(t, todo, size), cells_dir, run_id, c, progress, summary,
                           on_chunk)  # fmt: skip
            finally:
                summary["dataset"] = consolidate(store, t, grid, fixed, cells, attrs)
    except OSError as err:  # a write into the store failed (a full disk): one sentence naming it
        # (only that: every write into the store names its file (`_named`); an error naming no
        # file (a full standard output that `log` writes to, a hang-up, a cluster that cannot
        # start, a write of `on_chunk`) or a file elsewhere is raised as it is, and the store
        # is left alone)
        from .io import WRITE_FAILED

        ours = err.filename is not None and _inside(err.filename, store)
        if isinstance(err, _StoreNotMadeError) or err.errno not in WRITE_FAILED or not ours:
            raise
        raise _store_failed(err, store, created, run_id, [c[1] for c in todo]) from None
    ds = summary["dataset"]
    summary["n_failed"] = int(ds.attrs["n_failed"])
    summary["n_pending"] = int(ds.attrs["n_pending"])
    summary["n_mass_drift"] = int(ds.attrs.get("n_mass_drift", 0))
    summary["n_leftovers_removed"] = _remove_leftovers(cells_dir)
    return summary


PART_STALE_S = 600.0  # `_remove_leftovers`: a temporary cell file untouched this long is left over


def _remove_leftovers(cells_dir: Path, now: float | None = None) -> int:
    """Remove the temporary files (`.KEY.HEX.part`) that killed writers left in `cells_dir`,
    and return how many went. Run as each sweep run finishes (a resumed run included).

    The rule: a temporary file goes only when its cell is finished (`KEY.npz` exists) and it
    was last modified more than `PART_STALE_S` (10 minutes) ago. A writer (`_write_cell`)
    writes and fsyncs its temporary file in well under a second, then links it onto `KEY.npz`
    and removes it; so one that is finished and untouched for ten minutes has no live writer.
    Even a writer of a concurrent run that is still busy with it loses nothing: the cell is
    written already, and `_write_cell` takes a temporary file that vanished under an existing
    `KEY.npz` as "another run wrote it first". A temporary file whose cell is not finished is
    kept, whatever its age (its writer may be stalled, not gone; the run that finishes the cell
    later removes it). Nothing that is not named as `_write_cell` names its files is touched.
    A file that cannot be removed (or listed) is left, silently: the run's own work is done."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(cells_dir))
    except OSError:
        return 0
    for entry in entries:
        m = _PART_NAME.fullmatch(entry.name)
        if m is None:
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime <= PART_STALE_S:
                continue
            if not (Path(cells_dir) / f"{m.group(1)}{CELL_SUFFIX}").is_file():
                continue
            os.unlink(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


def _inside(name, store: Path) -> bool:
    try:
        return Path(os.path.abspath(name)).is_relative_to(os.path.abspath(store))
    except (TypeError, ValueError):
        return False


def _store_failed(err: OSError, store: Path, created: bool, run_id: str = "",
                  keys=()) -> OSError:  # fmt: skip
    """`err` (a write into the store that failed) as an OSError naming `store` and what is left
    of it: a store this run made that holds no finished cell is removed (nothing of value); the
    finished cells are kept (the same command, rerun once there is room or the device is
    checked (EIO), resumes from them; a root cut short is gone). `run_id` and `keys`: the run
    and the cells it ran, of which `_remove_made` removes those it wrote."""
    cells = sorted((store / CELLS).glob(f"*{CELL_SUFFIX}")) if (store / CELLS).is_dir() else []
    if created and not cells:
        _remove_made(store, run_id, keys)
        left = ("no cell had finished: the new store is removed" if not store.exists() else
                "no cell had finished: what this run wrote in the store is removed")  # fmt: skip
    else:
        fix = "check the device" if err.errno == errno.EIO else "free space"  # it says I/O error
        left = (f"{plural(len(cells), 'finished cell', spec=',')} kept in the store; {fix}, "
                f"then rerun the same command: it resumes from the finished cells")  # fmt: skip
    text = err.strerror or os.strerror(err.errno or 0) or type(err).__name__
    return OSError(err.errno, f"{text} ({left})", str(store))


def _remove_made(store: Path, run_id: str = "", keys=()):
    """Remove what a run wrote in the store it made: the root group's entries, the cell files
    of `keys` that run `run_id` wrote (their own run_id says so), then cells/ and the store if
    that left them empty. Anything else in it (a folder someone put there meanwhile, the cells
    and temporary files of another run writing into the same store) is kept, and so are the
    folders that hold it."""
    if store.is_symlink() or not store.is_dir():
        return
    for name in _root_entries(store):
        entry = store / name
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    cells = store / CELLS
    if run_id and cells.is_dir() and not cells.is_symlink():
        for key in keys:
            entry = cells / f"{key}{CELL_SUFFIX}"
            if entry.is_file() and not entry.is_symlink() and _cell_run(entry) == run_id:
                entry.unlink(missing_ok=True)
    for folder in (cells, store):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def _cell_run(path: Path) -> str | None:
    """The id of the run that wrote the cell file `path`; None when it cannot be read."""
    try:
        return _load_cell(path).attrs.get("run_id")
    except Exception:  # noqa: BLE001 - a cell that cannot be read is not known to be this run's
        return None


def _dashboard(c) -> str | None:
    """The dashboard's address when the scheduler serves one (it needs bokeh)."""
    try:
        import bokeh  # noqa: F401

        return c.dashboard_link if "dashboard" in c.scheduler_info().get("services", {}) else None
    except Exception:  # noqa: BLE001 - the dashboard is optional
        return None


def _drive(task: Task, chunks, cells_dir, run_id, client, progress, summary, on_chunk):
    """Run the chunks (on `client`, or here) with a progress bar of finished cells."""
    from tqdm import tqdm

    n = sum(len(ch) for ch in chunks)
    bar = tqdm(total=n, unit="cell", desc=f"sweep {task.name}", disable=not progress,
               dynamic_ncols=True)  # fmt: skip

    failed = 0

    def account(results, chunk):
        nonlocal failed
        summary["n_run"] += sum(s in (STATUS_DONE, STATUS_FAILED) for _, s in results)
        failed += sum(s == STATUS_FAILED for _, s in results)
        bar.update(len(chunk))
        if failed:
            bar.set_postfix(failed=failed)
        if on_chunk is not None:
            on_chunk(results, chunk)

    try:
        if client is None:
            for ch in chunks:
                account(run_cells(task.name, ch, cells_dir, run_id), ch)
            return
        from distributed import as_completed

        futures = {}
        for ch in chunks:
            f = client.submit(run_cells, task.name, ch, str(cells_dir), run_id, pure=False,
                              key=f"sweep-{task.name}-{ch[0][1]}-{run_id}")  # fmt: skip
            futures[f] = ch
        done = as_completed(futures)
        with _ctrl_c_polled():
            while not done.is_empty():
                batch = done.next_batch(block=False)
                if not batch:
                    _raise_polled_ctrl_c()
                    time.sleep(0.05)
                for f in batch:
                    ch = futures[f]
                    try:
                        results = f.result()
                    except Exception as err:  # noqa: BLE001 - e.g. KilledWorker: the cells fail, the sweep goes on
                        results = []
                        for _, key, params in ch:
                            ds = _cell_dataset(None, key, params, STATUS_FAILED, _error_text(err), 0.0, run_id)
                            results.append((key, STATUS_FAILED if _write_cell(ds, Path(cells_dir), key) else "exists"))
                    account(results, ch)
    finally:
        bar.close()
