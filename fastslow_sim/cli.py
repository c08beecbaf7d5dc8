"""The `fastslow-sim` command line: a thin layer that parses, validates, calls the library,
prints and saves (DESIGN 5).

Bad input ends in one sentence on stderr and exit status 2; a solver failure in exit status 1.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import click
import numpy as np

from . import __version__
from .errors import InputError
from .integrators import METHODS
from .systems import SYSTEMS

DEFAULT_RESULTS = Path("fastslow-results")


class _Group(click.Group):
    """Turns `InputError` from any command into one sentence and exit status 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as err:
            click.echo(f"Error: {err}", err=True)
            ctx.exit(2)


def _parse_eps_P(eps: str | None, P: str | None):
    """`(eps, P)` from the raw option strings, with one-sentence errors."""
    from .systems import resolve_eps

    if P is not None:
        try:
            value = float(P)
        except ValueError:
            raise InputError(f"--P must be a positive integer (P = 1/eps); got {P!r}.") from None
        if not math.isfinite(value) or not value.is_integer():
            raise InputError(f"--P must be a positive integer (P = 1/eps); got {P!r}.")
        P = int(value)
    if eps is not None:
        try:
            eps = float(eps)
        except ValueError:
            raise InputError(f"--eps must be a positive finite number; got {eps!r}.") from None
    return resolve_eps(eps, P)


def _parse_vector(text: str, name: str) -> np.ndarray:
    try:
        values = np.array([float(v) for v in text.replace(" ", "").split(",") if v != ""])
    except ValueError:
        raise InputError(
            f"{name} must be a comma-separated list of numbers; got {text!r}."
        ) from None
    if values.size == 0:
        raise InputError(f"{name} must hold at least one number; got {text!r}.")
    return values


def _fmt_vec(v, digits=4):
    return "[" + ", ".join(f"{float(a):.{digits}g}" for a in np.ravel(v)) + "]"


def _systems_help():
    return "; ".join(f"{k}: {d}" for k, (_, d) in SYSTEMS.items())


def _methods_help():
    return "; ".join(f"{k}: {m.description}" for k, m in METHODS.items())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fastslow-sim")
def main():
    """fastslow-sim: singularly perturbed fast-slow systems with eps = 1/P, master-equation
    generators and their stationary distributions.

    \b
    Start with:
      fastslow-sim integrate --eps 0.125
    which integrates the default 8-state birth-death system, prints a summary and writes a
    NetCDF dataset and a plot under ./fastslow-results/.
    """


@main.command()
@click.option(
    "--system",
    "system_name",
    default="birth-death",
    show_default=True,
    type=click.Choice(list(SYSTEMS)),
    help="Named system. " + _systems_help(),
)
@click.option("--eps", default=None, metavar="E", help="Time-scale ratio eps > 0 (eps = 1/P).")
@click.option("--P", "P", default=None, metavar="P", help="Positive integer P; eps = 1/P.")
@click.option("--t-end", default=5.0, show_default=True, type=float, help="End of slow time.")
@click.option(
    "--method",
    default="auto",
    show_default=True,
    type=click.Choice(list(METHODS)),
    help="Integration method. " + _methods_help(),
)
@click.option("--rtol", default=1e-8, show_default=True, type=float, help="Relative tolerance.")
@click.option("--atol", default=1e-10, show_default=True, type=float, help="Absolute tolerance.")
@click.option(
    "--x0",
    default=None,
    metavar="P0,P1,...",
    help="Initial fast state, a probability vector (default: all mass on state 0).",
)
@click.option("--y0", default=None, metavar="Y", help="Initial slow state (default per system).")
@click.option("--n-eval", default=401, show_default=True, type=int, help="Saved time points.")
@click.option(
    "--out",
    default=None,
    metavar="FILE.nc",
    help="NetCDF output [default: fastslow-results/integrate-SYSTEM-epsE.nc].",
)
@click.option(
    "--plot",
    "plot_path",
    default=None,
    metavar="FILE.png",
    help="Plot output [default: the --out path with .png].",
)
@click.option("--no-plot", is_flag=True, help="Do not write a plot.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def integrate(
    system_name, eps, P, t_end, method, rtol, atol, x0, y0, n_eval, out, plot_path, no_plot, as_json
):
    """Integrate a fast-slow system: eps dx/dt = Q(y)^T x, dy/dt = g(x, y).

    Prints the final state, its L1 distance to the critical manifold p_st(y), the solver
    statistics and the output paths; saves x(t), y(t), p_st(y(t)) and the run's parameters as
    a NetCDF dataset, and a plot of x_i(t) with p_st(y(t)) dashed, and y(t).

    \b
    Examples:
      fastslow-sim integrate --eps 0.125
      fastslow-sim integrate --system michaelis-menten --P 100 --t-end 5 --json
    """
    from .integrators import StiffnessWarning
    from .integrators import integrate as run_integrate
    from .io import check_writable, save_dataset
    from .systems import make_system

    e, _ = _parse_eps_P(eps, P)
    if not math.isfinite(t_end) or t_end <= 0:
        raise InputError(f"--t-end must be a positive finite time; got {t_end}.")
    if n_eval < 2:
        raise InputError(f"--n-eval must be at least 2; got {n_eval}.")
    system = make_system(system_name, eps=e)
    x0v = _parse_vector(x0, "--x0") if x0 is not None else None
    y0v = _parse_vector(y0, "--y0") if y0 is not None else None

    default_out = out is None
    if default_out:
        out = DEFAULT_RESULTS / f"integrate-{system_name}-eps{e:g}.nc"
    out = Path(out)
    if not no_plot and plot_path is None:
        plot_path = out.with_suffix(".png")
    if default_out:
        out.parent.mkdir(parents=True, exist_ok=True)
    check_writable(out, "dataset")
    if not no_plot:
        plot_path = check_writable(plot_path, "plot")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StiffnessWarning)
        ds = run_integrate(
            system, (0.0, t_end), x0v, y0v, method=method, rtol=rtol, atol=atol, n_eval=n_eval
        )
    for w in caught:
        if issubclass(w.category, StiffnessWarning):
            click.echo(f"Warning: {w.message}", err=True)

    save_dataset(ds, out)
    if not no_plot:
        from .analysis import plot_trajectory

        plot_trajectory(ds, plot_path)

    a = ds.attrs
    x_final = ds["x"].values[-1]
    y_final = ds["y"].values[-1]
    summary = {
        "system": system_name,
        "eps": a["eps"],
        "P": None if a["P"] == -1 else int(a["P"]),
        "method": a["method"],
        "method_requested": method,
        "stiffness_index": a["stiffness_index"],
        "t_end": t_end,
        "x_final": x_final.tolist(),
        "y_final": y_final.tolist(),
        "p_st_final": ds["p_st"].values[-1].tolist(),
        "manifold_distance_final": float(ds["manifold_distance"].values[-1]),
        "mass_error_max": float(np.nanmax(np.abs(ds["mass_error"].values))),
        "nfev": a["nfev"],
        "njev": a["njev"],
        "nlu": a["nlu"],
        "status": a["status"],
        "message": a["message"],
        "wall_time_s": a["wall_time_s"],
        "out": str(out),
        "plot": None if no_plot else str(plot_path),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        P_text = f" (P = {summary['P']})" if summary["P"] is not None else ""
        click.echo(f"{system_name}: eps = {e:g}{P_text}, t in [0, {t_end:g}]")
        click.echo(
            f"method      {a['method']} (requested {method}; stiffness index "
            f"{a['stiffness_index']:.3g}), rtol {rtol:g}, atol {atol:g}"
        )
        click.echo(f"status      {a['status']}: {a['message']}")
        click.echo(f"x(t_end)    {_fmt_vec(x_final)}")
        click.echo(f"p_st(y)     {_fmt_vec(summary['p_st_final'])}")
        click.echo(f"y(t_end)    {_fmt_vec(y_final, 6)}")
        click.echo(
            f"|x - p_st(y)|_1 at t_end = {summary['manifold_distance_final']:.3e}; "
            f"max |1^T x - 1| = {summary['mass_error_max']:.1e}"
        )
        click.echo(
            f"solver      nfev {a['nfev']}, njev {a['njev']}, nlu {a['nlu']}, "
            f"wall {a['wall_time_s']:.3f} s"
        )
        click.echo(f"dataset     {out}")
        if not no_plot:
            click.echo(f"plot        {plot_path}")
    if a["status"] != "success":
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
