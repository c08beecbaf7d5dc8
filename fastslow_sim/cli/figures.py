"""The figure commands: `figures` (the ODE figures) and `training-figures`."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from ..errors import InputError
from .common import DEFAULT_RESULTS, ode_command, use_agg


@click.command()
@click.option(
    "--out-dir",
    default="figures",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the figures.",
)
@click.option(
    "--results-dir",
    default=str(DEFAULT_RESULTS),
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the datasets behind them.",
)
@ode_command
def figures(out_dir, results_dir):
    """Regenerate every figure of the ODE analysis (computing the datasets first).

    Writes integrate-birth-death.png, equilibrium-manifold.png, convergence.png and
    nonlinear-branches.png; figures/README.md indexes them.
    """
    use_agg()
    from ..analysis import (
        plot_branches,
        plot_convergence,
        plot_equilibrium_manifold,
        plot_trajectory,
        save_figure,
    )
    from ..integrators import integrate as run_integrate
    from ..io import load_dataset, save_dataset
    from ..manifold import convergence as run_convergence
    from ..manifold import manifold_curve
    from ..nonlinear import family_for, manifold_dataset
    from ..systems import make_system

    out_dir, results_dir = Path(out_dir), Path(results_dir)
    for d in (out_dir, results_dir):
        if d.exists() and not d.is_dir():
            raise InputError(f"{str(d)!r} exists and is not a folder.")
        d.mkdir(parents=True, exist_ok=True)

    def step(name, make, plot):
        path = results_dir / f"{name}.nc"
        save_dataset(make(), path)
        save_figure(plot(load_dataset(path)), out_dir / f"{name}.png")
        click.echo(f"wrote {out_dir / (name + '.png')} (data {path})")

    step(
        "integrate-birth-death",
        lambda: run_integrate(make_system("birth-death", eps=0.125), (0, 5)),
        plot_trajectory,
    )
    runs = []
    for e in (0.1, 0.03, 0.01):
        path = results_dir / f"equilibrium-manifold-eps{e:g}.nc"
        save_dataset(run_integrate(make_system("birth-death", eps=e), (0, 3), n_eval=1201), path)
        runs.append(load_dataset(path))
    curve_path = results_dir / "equilibrium-manifold-curve.nc"
    save_dataset(
        manifold_curve(make_system("birth-death", eps=0.1), np.linspace(0.7, 1.0, 121)), curve_path
    )
    save_figure(
        plot_equilibrium_manifold(runs, load_dataset(curve_path), states=[5, 6, 7]),
        out_dir / "equilibrium-manifold.png",
    )
    click.echo(f"wrote {out_dir / 'equilibrium-manifold.png'}")
    step(
        "convergence",
        lambda: run_convergence(make_system("birth-death", eps=0.01), [0.02, 0.01, 0.005, 0.0025]),
        plot_convergence,
    )
    step(
        "nonlinear-branches",
        lambda: manifold_dataset(family_for("birth-death", 3.0), (-1.0, 1.5)),
        plot_branches,
    )



@click.command("training-figures")
@click.option(
    "--runs",
    "runs_dir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder holding reproduce-text/ and reproduce-me/ (from fastslow-sim reproduce).",
)
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(file_okay=False))
def training_figures(runs_dir, out_dir):
    """Figures of the ablation: gates per layer during training, validation loss per arm with
    seed spread, wall-clock per arm, and phi_theta against p_st(y) (reads saved runs only).

    \b
    Make the runs first:
      fastslow-sim reproduce --corpus text:PATH --out runs/reproduce-text
      fastslow-sim reproduce --corpus me --out runs/reproduce-me
      fastslow-sim phi-vs-pst runs/reproduce-me/*-seed0
      python scripts/phi_vs_pst_sweep.py   # runs/phi-sweep: TV against tokens and P
    """
    use_agg()
    from ..analysis import (
        plot_gates,
        plot_phi_vs_pst,
        plot_tv_sweep,
        plot_val_loss,
        plot_wall_clock,
        save_figure,
    )
    from ..io import load_dataset

    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    dirs = {name: runs_dir / f"reproduce-{name}" for name in ("text", "me")}
    dirs = {k: v for k, v in dirs.items() if (v / "ablation.nc").is_file()}
    if not dirs:
        raise InputError(
            f"no ablation results under {str(runs_dir)!r}; run fastslow-sim reproduce first."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    refs = {}
    if "me" in dirs:
        summary = json.loads(load_dataset(dirs["me"] / "ablation.nc").attrs["corpus_summary"])
        refs["me"] = {"oracle": summary["oracle_loss"], "Bayes floor": summary["bayes_floor_loss"],
                      "ignore-y": summary["ignore_y_loss"]}  # fmt: skip
    for name, draw in (("training-gates.png", lambda: plot_gates(dirs)),
                       ("training-val-loss.png", lambda: plot_val_loss(dirs, refs)),
                       ("training-wall-clock.png", lambda: plot_wall_clock(dirs))):  # fmt: skip
        save_figure(draw(), out_dir / name)
        click.echo(f"wrote {out_dir / name}")
    if "me" in dirs:
        results = {p.parent.name.rsplit("-seed", 1)[0]: json.loads(p.read_text())
                   for p in sorted(dirs["me"].glob("*-seed0/phi_vs_pst.json"))}  # fmt: skip
        if results:
            save_figure(plot_phi_vs_pst(results), out_dir / "phi-vs-pst.png")
            click.echo(f"wrote {out_dir / 'phi-vs-pst.png'}")
    sweep = runs_dir / "phi-sweep" / "phi_vs_pst_sweep.json"
    if sweep.is_file():
        save_figure(plot_tv_sweep(json.loads(sweep.read_text())), out_dir / "phi-vs-pst-sweep.png")
        click.echo(f"wrote {out_dir / 'phi-vs-pst-sweep.png'}")



COMMANDS = [figures, training_figures]
