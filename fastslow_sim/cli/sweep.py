"""The `sweep` command: a grid over one task's parameters on dask.distributed, into one zarr
store (`fastslow_sim.sweep`)."""

from __future__ import annotations

import sys

import click
import numpy as np

from ..errors import InputError
from ..wording import plural
from .common import (
    INTEGER,
    check_cluster_options,
    in_runs,
    json_text,
    path_given,
    solver_warnings,
)


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("task", metavar="TASK")
@click.option("--grid", "grids", multiple=True, metavar="NAME=VALUES",
              help="A swept parameter: NAME=V1,V2,... or NAME=A:B (the integers A to B, both "
                   "included); repeat for each dimension.")
@click.option("--store", required=True, metavar="PATH.zarr", callback=path_given("zarr store"),
              help="The sweep's zarr store (a new path in an existing folder, or a store to "
                   "resume).")
@click.option("--workers", default=None, type=INTEGER, metavar="N",
              help="Worker processes of the local cluster, at most the CPUs this process may use "
                   "[default: those CPUs]; 0: in this process.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run on the existing dask cluster at ADDRESS (e.g. tcp://10.0.0.5:8786).")
@click.option("--chunk-size", default=None, type=INTEGER, metavar="K",
              help="Cells per dask task for batched tasks [default: the batch over the workers, <= 64].")
@click.option("--retry-failed", is_flag=True, help="Run the cells that failed before again.")
@click.option("--runs-dir", default=None, metavar="DIR", callback=path_given("folder"),
              help="train-network: folder of the run folders [default: PATH-runs].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.pass_context
def sweep(ctx, task, grids, store, workers, scheduler, chunk_size, retry_failed, runs_dir, as_json):
    """Run TASK (integrate, convergence, manifold or train-network) over a grid of its
    parameters on dask.distributed; every cell lands in one zarr store (xr.open_zarr(PATH)).

    The task's own options pass through with the command's names, fixed (--t-end 5) or swept
    (--grid t_end=1,5): integrate needs --eps or --P, and takes --states, --H, --march and
    --max-steps, refused per cell where integrate refuses them (--H but with --method
    multirate, --march but with rodas4, rodas3 or auto, --max-steps with multirate);
    manifold's --y-range A B sets --y-min A --y-max B; train-network also takes --arm and the
    training settings --n-layer, --n-embd, --lr, ...; a name the task does not have is an
    error. Every cell is
    checked by the task's own checks before any runs: a bad value is one sentence naming the
    cell (exit status 2). Re-running the same command runs only the
    cells that are missing (more --grid values or parameters extend the store; other fixed
    options or fewer values are refused, before any work, as the store's dataset would lose
    the cells of its own); a failed cell records its status and message and the sweep goes on
    (exit status 1 at the end). Cells of integrate that differ only in seed, y0 and eps (or P)
    run as one rodas4 batch; a cell with seed S integrates the initial condition of
    `integrate --batch 1 --seed S`, one with y0 Y that of `integrate --y0 Y` (neither: the
    system's own). A manifold cell takes `fastslow-sim manifold`'s defaults for its system
    where --kappa, --y-min or --y-max is not given: kappa 3 for birth-death, else 0; y from
    -1 to 1.5 cut to the system's domain (michaelis-menten: 0 to 1.5). A cell of integrate,
    convergence or manifold whose run drifted in its total probability (a MassDriftWarning,
    of any of its solves) keeps it (mass_drift_warned,
    mass_drift_warning), an integrate cell of an explicit method on a stiff problem its
    StiffnessWarning (stiffness_warning), and the command ends with one Warning line for
    each kind: how many cells warned, and the first.

    \b
    Examples:
      fastslow-sim sweep integrate --grid eps=1e-1,1e-2,1e-3 --grid system=birth-death,cycle \\
          --grid seed=0:4 --store runs/sweep.zarr --t-end 5
      fastslow-sim sweep manifold --grid kappa=0,1,2,3 --store runs/kappa.zarr --workers 2
      fastslow-sim sweep train-network --grid arm=dense,coupled --grid seed=0:2 \\
          --store runs/arms.zarr --tokens 100k --scheduler tcp://127.0.0.1:8786
    """
    from ..sweep import get_task, option_key, run_sweep

    t = get_task(task)
    check_cluster_options(workers, scheduler)
    options, args = {}, list(ctx.args)
    while args:
        word = args.pop(0)
        if not word.startswith("--") or word == "--":
            raise InputError(f"unexpected argument {word!r}; task options are --NAME VALUE.")
        name, eq, value = word[2:].partition("=")
        if t.name == "manifold" and name.replace("_", "-") == "y-range":  # manifold's --y-range A B
            options.update(_y_range(word, eq, args, options, grids))
            continue
        if not eq and (not args or args[0].startswith("--")):  # a flag: the task's own, or none
            if t.options[option_key(t, name)].type is not bool:  # refuses a name it lacks
                raise InputError(f"option --{name} needs a value.")
            value = "true"
        elif not eq:
            value = args.pop(0)
        options[name] = value
    # the cells issue no warning: each keeps its own in the store, said below from there; the
    # sweep's own (a cell file it cannot read, computed again) is one line as it is issued
    with solver_warnings():
        res = run_sweep(task, list(grids), options, store, workers=workers, scheduler=scheduler,
                        chunk_size=chunk_size, retry_failed=retry_failed, runs_dir=runs_dir,
                        parents=in_runs(store),  # runs/ is made; other folders must exist
                        progress=not as_json, log=(lambda *a: None) if as_json else click.echo,
                        attrs={"command": " ".join(["fastslow-sim", "sweep", *sys.argv[2:]])})  # fmt: skip
    ds = res.pop("dataset")
    drifted = _warned_cells(ds, "mass_drift_warning")
    stiff = _warned_cells(ds, "stiffness_warning")
    failed = [(k, str(m)) for k, s, m in zip(ds["cell_key"].values.ravel(), ds["status"].values.ravel(),
                                             ds["message"].values.ravel()) if s == "failed"]  # fmt: skip
    if as_json:
        click.echo(json_text({**res, "dims": dict(ds.sizes), "failed": failed[:20],
                              "mass_drift": drifted[:20], "stiffness": stiff[:20]}))  # fmt: skip
    else:
        click.echo(f"{task}: {plural(res['n_cells'], 'cell')} over {', '.join(ds.attrs['swept'])}; "
                   f"{res['n_skipped']} already in the store, {res['n_run']} run, "
                   f"{res['n_failed']} failed, {res['n_pending']} pending")  # fmt: skip
        for key, msg in failed[:5]:
            click.echo(f"failed      {key}: {msg}")
        click.echo(f"store       {res['store']} (xarray.open_zarr)")
    if stiff:  # the cells' StiffnessWarning, in integrate's one-line form
        click.echo(f"Warning: {plural(len(stiff), 'cell')} of {res['n_cells']:,} warned that "
                   f"the problem is stiff for its explicit method (stiffness_warning in the "
                   f"store); the first, {_cell_text(stiff[0])}: {stiff[0]['warning']}", err=True)  # fmt: skip
    if drifted:  # the cells' MassDriftWarning, in integrate's one-line form
        click.echo(f"Warning: {plural(res['n_mass_drift'], 'cell')} of {res['n_cells']:,} warned "
                   f"of a drift of the total probability (mass_drift_warned in the store); the "
                   f"first, {_cell_text(drifted[0])}: {drifted[0]['warning']}", err=True)  # fmt: skip
    if res["n_failed"] or res["n_pending"]:
        sys.exit(1)


def _y_range(word: str, eq: str, args: list, options: dict, grids) -> dict:
    """`{"y-min": A, "y-max": B}` from manifold's own `--y-range A B` (its two values taken from
    `args`), or `InputError` naming what to give instead: two numbers, no `=`, and neither
    --y-min nor --y-max beside it, fixed or swept, and A < B."""
    from ..validation import number

    fix = "expected --y-range A B (two numbers), or --y-min A --y-max B"
    if eq:
        raise InputError(f"{word} is not how --y-range takes its ends; {fix}.")
    if len(args) < 2 or any(a.startswith("--") for a in args[:2]):
        raise InputError(f"option --y-range needs two values, A B; {fix}.")
    if any(k.replace("_", "-") in ("y-min", "y-max", "y-range") for k in options) or any(
        a.partition("=")[0].replace("_", "-") in ("--y-min", "--y-max", "--y-range") for a in args
    ):
        raise InputError("--y-range A B sets y-min and y-max; expected either --y-range or "
                         "--y-min/--y-max, once.")  # fmt: skip
    swept = [n for g in grids if (n := g.partition("=")[0].strip().replace("-", "_"))
             in ("y_min", "y_max")]  # fmt: skip
    if swept:
        other = {"y_min": "--y-max B", "y_max": "--y-min A"}
        instead = f"{other[swept[0]]} beside it" if len(swept) == 1 else "no --y-range"
        raise InputError(f"--y-range A B fixes y_min and y_max, and --grid {swept[0]}=... sweeps "
                         f"{swept[0]}; expected {instead}.")  # fmt: skip
    a, b = args.pop(0), args.pop(0)
    lo, hi = (number("--y-range", v) for v in (a, b))
    if not lo < hi:
        raise InputError(f"--y-range A B needs A < B; got {a} {b}.")
    return {"y-min": a, "y-max": b}


def _warned_cells(ds, var: str) -> list[dict]:
    """`[{"cell_key", "cell" (its swept values), "warning"}]` of the cells whose warning text
    `var` (`mass_drift_warning`, `stiffness_warning`) is not empty, in the grid's order."""
    if var not in ds:
        return []
    texts = ds[var].values
    out = []
    for idx in zip(*np.nonzero(texts != "")):
        values = {k: _value(ds[k].values[i]) for k, i in zip(ds.attrs["swept"], idx)}
        out.append({"cell_key": str(ds["cell_key"].values[idx]), "cell": values,
                    "warning": str(texts[idx])})  # fmt: skip
    return out


def _cell_text(warned: dict) -> str:
    """`y0=150, seed=3`: a cell's swept values."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in warned["cell"].items())  # fmt: skip


def _value(v):
    return v.item() if hasattr(v, "item") else v


COMMANDS = [sweep]
