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

from ._version import __version__
from .bridge.variants import VARIANTS
from .errors import InputError
from .integrators import METHODS, random_initial_conditions
from .systems import SYSTEMS

DEFAULT_RESULTS = Path("fastslow-results")
MAX_N_EVAL = 1_000_000  # saved time points
MAX_BATCH = 1_000_000  # trajectories of --batch
RTOL_MIN = 100 * 2.0**-52
KAPPA_MAX = 30.0  # |kappa|: beyond, exp(kappa c.x) defeats the continuation of the branches


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


def _system_option(help_text: str):
    """The `--system` option (a named system, `birth-death` by default)."""
    return click.option("--system", "system_name", default="birth-death", show_default=True,
                        type=click.Choice(list(SYSTEMS)), help=help_text)  # fmt: skip


def _output_options(default_name: str):
    """The `--out`, `--plot`, `--no-plot` and `--json` options shared by the computing commands."""

    def decorate(f):
        options = [
            click.option("--out", default=None, metavar="FILE.nc",
                         help=f"NetCDF output [default: fastslow-results/{default_name}]."),
            click.option("--plot", "plot_path", default=None, metavar="FILE.png",
                         help="Plot output [default: the --out path with .png]."),
            click.option("--no-plot", is_flag=True, help="Do not write a plot."),
            click.option("--json", "as_json", is_flag=True,
                         help="Print one JSON object instead of text."),
        ]  # fmt: skip
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _use_agg():
    """Select matplotlib's non-interactive Agg backend: the CLI only writes figures to files
    (the analysis layer itself picks no backend, so that it also draws in notebooks)."""
    import matplotlib

    matplotlib.use("Agg")


def _output_paths(stem: str, out, plot_path, no_plot: bool):
    """Dataset and plot paths, checked before any work: defaults go to ./fastslow-results/."""
    from .io import check_writable

    if out is None:
        DEFAULT_RESULTS.mkdir(parents=True, exist_ok=True)
        out = DEFAULT_RESULTS / f"{stem}.nc"
    out = check_writable(out, "dataset")
    if no_plot:
        return out, None
    plot_path = out.with_suffix(".png") if plot_path is None else plot_path
    return out, check_writable(plot_path, "plot")


def _parse_eps_list(text: str) -> list[float]:
    values = _parse_vector(text, "--eps")
    if np.any(~np.isfinite(values)) or np.any(values <= 0):
        raise InputError(f"--eps values must be positive finite numbers; got {text!r}.")
    if values.size < 2:
        raise InputError(f"--eps needs at least two values to fit a slope; got {text!r}.")
    repeated = sorted({float(v) for v in values if np.count_nonzero(values == v) > 1})
    if repeated:
        raise InputError(
            f"--eps values must be distinct to fit a slope; {_fmt_vec(repeated)} repeated in "
            f"{text!r}."
        )
    return values.tolist()


def _check_range(name: str, value, lo=None, hi=None, *, integer=False, lo_open=False):
    """`InputError` (one sentence) unless `value` is finite and within `[lo, hi]`."""
    kind = "an integer" if integer else "a finite number"
    bounds = []
    if lo is not None:
        bounds.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        bounds.append(f"<= {hi:g}")
    ok = (
        math.isfinite(value)
        and (lo is None or (value > lo if lo_open else value >= lo))
        and (hi is None or value <= hi)
    )
    if not ok:
        raise InputError(f"{name} must be {kind} {' and '.join(bounds)}; got {value}.")
    return value


def _ode_command(f):
    """A solver or analysis failure (overflow, a stalled continuation, a singular matrix) ends in
    one sentence and exit status 1, never a traceback; bad input stays exit status 2."""
    import functools

    from .solvers import SOLVER_ERRORS

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except InputError:
            raise
        except SOLVER_ERRORS as err:
            text = " ".join(str(err).split()) or type(err).__name__
            click.echo(f"Error: the computation failed ({type(err).__name__}): {text}", err=True)
            sys.exit(1)

    return wrapper


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
@_system_option("Named system. " + _systems_help())
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
    "--batch",
    default=None,
    type=int,
    metavar="N",
    help="Integrate N random initial conditions (x0 uniform on the simplex, y0 uniform "
    "in [0, 1]) as one batch; 'auto' then takes the batched torch solver rodas4.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the --batch draw.")
@click.option(
    "--H",
    "H",
    default=None,
    type=float,
    metavar="H",
    help="Slow time per block of the multirate map (--method multirate only) [default: 0.01]; "
    "--t-end must be a whole number of blocks.",
)
@_output_options("integrate-SYSTEM-epsE.nc")
@_ode_command
def integrate(
    system_name,
    eps,
    P,
    t_end,
    method,
    rtol,
    atol,
    x0,
    y0,
    n_eval,
    batch,
    seed,
    H,
    out,
    plot_path,
    no_plot,
    as_json,
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
    from .integrators import StiffnessWarning, check_eps_range
    from .integrators import integrate as run_integrate
    from .io import save_dataset
    from .systems import make_system

    e, _ = _parse_eps_P(eps, P)
    check_eps_range(e, method)
    if not math.isfinite(t_end) or t_end <= 0:
        raise InputError(f"--t-end must be a positive finite time; got {t_end}.")
    if n_eval < 2 or n_eval > MAX_N_EVAL:
        raise InputError(f"--n-eval must be an integer from 2 to {MAX_N_EVAL:,}; got {n_eval}.")
    if not (math.isfinite(rtol) and 0 < rtol < 1):
        raise InputError(f"--rtol must be a positive number below 1 (e.g. 1e-8); got {rtol}.")
    if rtol < RTOL_MIN:
        raise InputError(
            f"--rtol must be at least {RTOL_MIN:g} (100 ulps: below, no float64 solver can "
            f"meet it); got {rtol}."
        )
    if not (math.isfinite(atol) and 0 < atol <= 1):
        raise InputError(f"--atol must be a positive number at most 1 (e.g. 1e-10); got {atol}.")
    if seed < 0:
        raise InputError(f"--seed must be a non-negative integer; got {seed}.")
    kwargs = {}
    if H is not None:
        if method != "multirate":
            raise InputError(
                f"--H is the block length of --method multirate; got --method {method}."
            )
        kwargs["H"] = _check_range("--H", H, 0.0, None, lo_open=True)
    system = make_system(system_name, eps=e)
    x0v = _parse_vector(x0, "--x0") if x0 is not None else None
    y0v = _parse_vector(y0, "--y0") if y0 is not None else None
    if batch is not None:
        if batch < 1 or batch > MAX_BATCH:
            raise InputError(f"--batch must be an integer from 1 to {MAX_BATCH:,}; got {batch}.")
        if x0 is not None or y0 is not None:
            raise InputError("--batch draws random initial conditions; drop --x0 and --y0.")
        if method == "multirate":
            raise InputError("--batch integrates with the ODE solvers; drop --method multirate.")
        x0v, y0v = random_initial_conditions(system, batch, seed)

    out, plot_path = _output_paths(f"integrate-{system_name}-eps{e:g}", out, plot_path, no_plot)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StiffnessWarning)
        ds = run_integrate(
            system, (0.0, t_end), x0v, y0v, method=method, rtol=rtol, atol=atol, n_eval=n_eval,
            **kwargs,
        )  # fmt: skip
    for w in caught:
        if issubclass(w.category, StiffnessWarning):
            click.echo(f"Warning: {w.message}", err=True)

    save_dataset(ds, out)
    if not no_plot:
        _use_agg()
        from .analysis import plot_trajectory, save_figure

        save_figure(plot_trajectory(ds.isel(batch=0) if "batch" in ds.dims else ds), plot_path)

    a = ds.attrs
    batched = "batch" in ds.dims
    x_final = ds["x"].values[..., -1, :]
    y_final = ds["y"].values[..., -1, :]
    summary = {
        "system": system_name,
        "eps": a["eps"],
        "P": None if a["P"] == -1 else int(a["P"]),
        "method": a["method"],
        "method_requested": method,
        "stiffness_index": a.get("stiffness_index", float("nan")),
        "t_end": t_end,
        "x_final": x_final.tolist(),
        "y_final": y_final.tolist(),
        "p_st_final": ds["p_st"].values[..., -1, :].tolist(),
        "manifold_distance_final": float(np.max(ds["manifold_distance"].values[..., -1])),
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
    if batched:
        statuses = ds["status"].values.tolist()
        summary["batch"] = len(statuses)
        summary["status_counts"] = {k: statuses.count(k) for k in sorted(set(statuses))}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        P_text = f" (P = {summary['P']})" if summary["P"] is not None else ""
        click.echo(f"{system_name}: eps = {e:g}{P_text}, t in [0, {t_end:g}]")
        click.echo(
            f"method      {a['method']} (requested {method}; stiffness index "
            f"{summary['stiffness_index']:.3g}), rtol {rtol:g}, atol {atol:g}"
        )
        click.echo(f"status      {a['status']}: {a['message']}")
        if batched:
            click.echo(f"batch       {summary['batch']} trajectories: {summary['status_counts']}")
            click.echo(f"y(t_end)    from {np.nanmin(y_final):.6g} to {np.nanmax(y_final):.6g}")
        else:
            click.echo(f"x(t_end)    {_fmt_vec(x_final)}")
            click.echo(f"p_st(y)     {_fmt_vec(summary['p_st_final'])}")
            click.echo(f"y(t_end)    {_fmt_vec(y_final, 6)}")
        click.echo(
            f"|x - p_st(y)|_1 at t_end = {summary['manifold_distance_final']:.3e}"
            f"{' (largest in the batch)' if batched else ''}; "
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


@main.command()
@_system_option("Named system.")
@click.option(
    "--eps",
    "eps_list",
    default="0.02,0.01,0.005,0.0025",
    show_default=True,
    metavar="E1,E2,...",
    help="Values of eps (at least two).",
)
@click.option("--t-end", default=3.0, show_default=True, type=float, help="End of slow time.")
@_output_options("convergence-SYSTEM.nc")
@_ode_command
def convergence(system_name, eps_list, t_end, out, plot_path, no_plot, as_json):
    """Convergence in eps of the full system to its slow-manifold approximations.

    For each eps, integrates the full system at tight tolerance (Radau) and measures, after
    the initial layer (6 eps log(1/eps) / spectral gap), the largest |x - h0(y)|,
    |x - h0(y) - eps h1(y)| and |y - y_reduced|, then fits their log-log slopes
    (theory: 1, 2 and 1).

    \b
    Example:
      fastslow-sim convergence --system two-state --eps 0.02,0.01,0.005
    """
    from .io import save_dataset
    from .manifold import convergence as run_convergence
    from .systems import make_system

    values = _parse_eps_list(eps_list)
    if not math.isfinite(t_end) or t_end <= 0:
        raise InputError(f"--t-end must be a positive finite time; got {t_end}.")
    out, plot_path = _output_paths(f"convergence-{system_name}", out, plot_path, no_plot)
    system = make_system(system_name, eps=values[0])
    ds = run_convergence(system, values, t_end=t_end, progress=not as_json)
    save_dataset(ds, out)
    if plot_path is not None:
        _use_agg()
        from .analysis import plot_convergence, save_figure

        save_figure(plot_convergence(ds), plot_path)
    slopes = json.loads(ds.attrs["slopes"])
    if as_json:
        click.echo(json.dumps({
            "system": system_name,
            "eps": ds["eps"].values.tolist(),
            "errors": {k: ds[k].values.tolist() for k in ("err_h0", "err_h1", "err_y")},
            "slopes": slopes,
            "expected_slopes": {"err_h0": 1, "err_h1": 2, "err_y": 1},
            "t_end": t_end,
            "wall_time_s": ds.attrs["wall_time_s"],
            "out": str(out),
            "plot": None if plot_path is None else str(plot_path),
        }))  # fmt: skip
        return
    click.echo(f"{system_name}: errors after the initial layer, t in [t_layer, {t_end:g}]")
    click.echo(f"{'eps':>10} {'|x-h0|':>12} {'|x-h0-eps h1|':>14} {'|y-y_red|':>12} {'t_layer':>9}")
    for i, e in enumerate(ds["eps"].values):
        click.echo(
            f"{e:>10.4g} {ds['err_h0'].values[i]:>12.3e} {ds['err_h1'].values[i]:>14.3e} "
            f"{ds['err_y'].values[i]:>12.3e} {ds['t_layer'].values[i]:>9.3g}"
        )
    click.echo(
        f"{'slope':>10} {slopes['err_h0']:>12.3f} {slopes['err_h1']:>14.3f} "
        f"{slopes['err_y']:>12.3f}   (theory 1, 2, 1)"
    )
    click.echo(f"dataset     {out}")
    if plot_path is not None:
        click.echo(f"plot        {plot_path}")


@main.command()
@_system_option("Named system; only birth-death has a non-linear family (kappa != 0).")
@click.option(
    "--kappa",
    default=3.0,
    show_default=True,
    type=float,
    help="Strength of the x-dependence: up rate exp(4 (y - 1/2) + kappa c.x).",
)
@click.option(
    "--y-range",
    nargs=2,
    type=float,
    default=(-1.0, 1.5),
    show_default=True,
    metavar="A B",
    help="Range of the slow variable to trace.",
)
@click.option(
    "--osc-eps",
    default=0.01,
    show_default=True,
    type=float,
    help="eps of the relaxation-oscillation run (only when the manifold folds).",
)
@_output_options("manifold-SYSTEM-kappaK.nc")
@_ode_command
def manifold(system_name, kappa, y_range, osc_eps, out, plot_path, no_plot, as_json):
    """Critical manifold Q(x, y)^T x = 0: branches, folds, stability, and the gap to the
    paper's linear identity phi(y) = p_st(Q(x_ref, y)) (x_ref uniform).

    Also checks the identity itself: for the linear system (kappa = 0), Newton's method on
    Q(y)^T x = 0, 1^T x = 1 (no GTH) against GTH's p_st over the y range. When the manifold
    folds, integrates the full system with g = 1/2 - c.x to show the relaxation oscillation.

    \b
    Examples:
      fastslow-sim manifold --kappa 0
      fastslow-sim manifold --kappa 3 --y-range -1 1.5 --json
    """
    from .integrators import EPS_MIN
    from .io import save_dataset
    from .manifold import identity_check
    from .nonlinear import check_y_range, family_for, manifold_dataset
    from .systems import make_system

    if not math.isfinite(kappa):
        raise InputError(f"--kappa must be a finite number; got {kappa}.")
    _check_range("--kappa", kappa, -KAPPA_MAX, KAPPA_MAX)
    if not math.isfinite(osc_eps) or osc_eps <= 0:
        raise InputError(f"--osc-eps must be a positive finite number; got {osc_eps}.")
    _check_range("--osc-eps", osc_eps, EPS_MIN, 1.0)
    family = family_for(system_name, kappa)
    a, b = check_y_range(family, y_range)
    out, plot_path = _output_paths(
        f"manifold-{system_name}-kappa{kappa:g}", out, plot_path, no_plot
    )
    ds = manifold_dataset(family, (a, b), osc_eps=osc_eps)
    check = identity_check(make_system(system_name, eps=0.1), np.linspace(a, b, 101))
    ds.attrs["identity_max_abs_diff"] = check["max_abs_diff"]
    save_dataset(ds, out)
    if plot_path is not None:
        _use_agg()
        from .analysis import plot_branches, save_figure

        save_figure(plot_branches(ds), plot_path)
    branches = json.loads(ds.attrs["branches"])
    folds = json.loads(ds.attrs["folds"])
    osc = None
    if "osc_y_min" in ds.attrs:
        osc = {k: ds.attrs[f"osc_{k}"] for k in ("eps", "status", "y_min", "y_max", "period")}
    if as_json:
        click.echo(json.dumps({
            "system": system_name, "kappa": kappa, "y_range": [a, b], "branches": branches,
            "folds": folds, "gap": ds.attrs["gap"],
            "identity_max_abs_diff": check["max_abs_diff"], "oscillation": osc,
            "out": str(out), "plot": None if plot_path is None else str(plot_path),
        }))  # fmt: skip
        return
    click.echo(f"{system_name}, kappa = {kappa:g}, y in [{a:g}, {b:g}]")
    click.echo(
        f"identity check (kappa = 0): max |x_newton(y) - p_st(y)| = "
        f"{check['max_abs_diff']:.2e} over {check['n_y']} values of y"
    )
    for br in branches:
        kind = "stable" if br["stable"] else "repelling"
        click.echo(
            f"branch {br['index']}: y in [{br['y_min']:.4f}, {br['y_max']:.4f}], mean c.x in "
            f"[{br['mean_min']:.3f}, {br['mean_max']:.3f}], {kind} "
            f"(max Re lambda {br['max_real_eigenvalue']:.3g})"
        )
    for f in folds:
        click.echo(f"fold at y = {f['y']:.6f}, mean c.x = {f['mean']:.4f}")
    click.echo(f"gap = max |phi(y) - p_st(Q(x_ref, y))| = {ds.attrs['gap']:.4f}")
    if osc is not None:
        click.echo(
            f"relaxation oscillation (g = 1/2 - c.x, eps = {osc['eps']:g}): y in "
            f"[{osc['y_min']:.4f}, {osc['y_max']:.4f}], period {osc['period']:.3f}"
        )
    click.echo(f"dataset     {out}")
    if plot_path is not None:
        click.echo(f"plot        {plot_path}")


@main.command()
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
@_ode_command
def figures(out_dir, results_dir):
    """Regenerate every figure of the ODE analysis (computing the datasets first).

    Writes integrate-birth-death.png, equilibrium-manifold.png, convergence.png and
    nonlinear-branches.png; figures/README.md indexes them.
    """
    _use_agg()
    from .analysis import (
        plot_branches,
        plot_convergence,
        plot_equilibrium_manifold,
        plot_trajectory,
        save_figure,
    )
    from .integrators import integrate as run_integrate
    from .io import load_dataset, save_dataset
    from .manifold import convergence as run_convergence
    from .manifold import manifold_curve
    from .nonlinear import family_for, manifold_dataset
    from .systems import make_system

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


@main.command()
@click.option("--markdown", is_flag=True, help="Print a Markdown table.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def mapping(markdown, as_json):
    """How the ODE maps onto the attention network, row by row: the ODE object, its network
    counterpart, whether the correspondence is exact or an analogy, and the gap."""
    from .bridge.mapping import MAPPING, render_mapping

    if as_json:
        click.echo(json.dumps(MAPPING, indent=1))
    else:
        click.echo(render_mapping("markdown" if markdown else "text"))


@main.command()
@click.argument("spec", metavar="me|me:NAME=VALUE,...|random|text:PATH")
@click.option("--P", "P", default="8", show_default=True, help="Block length of the me corpus.")
@click.option(
    "--context",
    default=256,
    show_default=True,
    type=int,
    help="Window length T of the me corpus's reference losses (the training context).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def corpus(spec, P, context, as_json):
    """Statistics of a corpus and, for the master-equation corpus, its three reference losses
    on the validation windows of length T (block-aligned, the targets the network is scored
    on): the oracle with y known, the Bayes floor (the best predictor from the window's past
    tokens: an exact filter over the slow state) and the best predictor that ignores y.

    \b
    Examples:
      fastslow-sim corpus me
      fastslow-sim corpus me:tokens=3M,beta=6 --json
      fastslow-sim corpus text:../shared/data/tinyshakespeare.txt --json
    """
    from .corpora import load_corpus

    _, P_int = _parse_eps_P(None, P)
    if context < 1:
        raise InputError(f"--context must be a positive integer; got {context}.")
    c = load_corpus(spec, P=P_int, context=context)
    info = c.summary()
    if as_json:
        click.echo(json.dumps(info, default=float))
        return
    click.echo(
        f"corpus {info['corpus']}: {info['tokens']:,} tokens (train {info['train_tokens']:,}, "
        f"validation {info['val_tokens']:,}), vocabulary {info['vocab_size']}"
    )
    if "oracle_loss" in info:
        click.echo(f"reference losses on {info['reference_windows']} validation windows of "
                   f"{info['reference_context']} targets (nats/token):")  # fmt: skip
        click.echo(f"  oracle (y known)                   {info['oracle_loss']:.4f}")
        click.echo(f"  Bayes floor (past tokens only)     {info['bayes_floor_loss']:.4f}")
        click.echo(f"  ignore-y (fixed transition matrix) {info['ignore_y_loss']:.4f}")
        click.echo(f"  uniform                            {info['uniform_loss']:.4f}")
        click.echo(f"  learnable gap ignore-y - floor     {info['loss_gap']:.4f}")
        click.echo(
            f"y from {info['y_p05']:.3f} to {info['y_p95']:.3f} (5th to 95th percentile), "
            f"forgets its start within {info['y_memory_blocks']} blocks; P = {info['P']}"
        )
    if "note" in info:
        click.echo(f"note: {info['note']}")
    if "floor_loss" in info:
        click.echo(f"floor loss ln V = {info['floor_loss']:.4f}")


def _train_options(f):
    options = [
        click.option("--corpus", "corpus_spec", default="me", show_default=True,
                     metavar="me|random|text:PATH", help="Training corpus."),
        click.option("--tokens", default="500k", show_default=True,
                     help="Training tokens per run: 500k, 2M or a plain integer."),
        click.option("--P", "P", default="8", show_default=True, help="Pooling ratio (eps = 1/P)."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda."),
        click.option("--batch-size", default=8, show_default=True, type=int),
        click.option("--context", "block_size", default=256, show_default=True, type=int,
                     help="Context length T."),
        click.option("--compile", "use_compile", is_flag=True, help="Use torch.compile."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def _base_config(P, device, batch_size, block_size, use_compile):
    _, P_int = _parse_eps_P(None, P)
    return {"P": P_int, "device": device, "batch_size": batch_size, "block_size": block_size,
            "compile": use_compile}  # fmt: skip


@main.command("train-network")
@click.option(
    "--variant",
    default="coupled",
    show_default=True,
    type=click.Choice(list(VARIANTS)),
)
@_train_options
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--out", default=None, metavar="DIR", help="Run folder [default: runs/VARIANT-CORPUS-seedS]."
)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --out.")
@click.option(
    "--checkpoint-every",
    "ckpt_interval",
    default=50,
    show_default=True,
    type=int,
    metavar="STEPS",
    help="Write DIR/ckpt.pt every STEPS steps (and at the end).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def train_network(
    variant,
    corpus_spec,
    tokens,
    P,
    device,
    batch_size,
    block_size,
    use_compile,
    seed,
    out,
    resume,
    ckpt_interval,
    as_json,
):
    """Train the fast-slow network (AdamW, warm-up and cosine decay, clipping, bf16 on CUDA).

    Logs loss, learning rate, tokens/s and every layer's gate tanh(alpha) per step, and the
    validation loss every 50 steps, to DIR/train.nc; checkpoints atomically to DIR/ckpt.pt;
    writes DIR/summary.json. Under torchrun it trains with DDP.

    \b
    Examples:
      fastslow-sim train-network
      fastslow-sim train-network --variant dense --corpus text:input.txt --tokens 2M
    """
    from .training import TrainConfig, TrainingDivergedError, parse_tokens, train

    n_tokens = parse_tokens(tokens)
    base = _base_config(P, device, batch_size, block_size, use_compile)
    if out is None:
        tag = "text" if corpus_spec.startswith("text:") else corpus_spec
        out = f"runs/{variant}-{tag}-seed{seed}"
    if seed < 0:
        raise InputError(f"--seed must be a non-negative integer; got {seed}.")
    cfg = TrainConfig(variant=variant, corpus=corpus_spec, tokens=n_tokens, seed=seed, out=out,
                      resume=resume, progress=not as_json, ckpt_interval=ckpt_interval, **base)  # fmt: skip
    try:
        summary = train(cfg)
    except TrainingDivergedError as err:
        click.echo(f"Error: {err}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(summary, default=float))
        return
    click.echo(
        f"{variant} on {corpus_spec}: {summary['tokens']:,} tokens in {summary['steps']} steps, "
        f"{summary['wall_time_s']:.1f} s, {summary['tokens_per_s']:,.0f} tokens/s"
    )
    val = (
        "not evaluated (stopped early)"
        if summary["val_loss"] is None
        else f"{summary['val_loss']:.4f}"
    )
    click.echo(
        f"train loss {summary['train_loss']:.4f}, validation loss {val} (every aligned window)"
    )
    ref = summary.get("reference_losses")
    if ref:
        click.echo(f"references: oracle {ref['oracle_loss']:.4f}, Bayes floor "
                   f"{ref['bayes_floor_loss']:.4f}, ignore-y {ref['ignore_y_loss']:.4f}")  # fmt: skip
    gates = ", ".join(f"{g:+.4f}" if isinstance(g, float) else "channels" for g in summary["gates"])
    click.echo(f"gates tanh(alpha) per layer: {gates}")
    click.echo(f"run folder  {out} (train.nc, summary.json, ckpt.pt)")


@main.command()
@_train_options
@click.option("--seeds", default=5, show_default=True, type=int, help="Seeds per arm.")
@click.option(
    "--arms",
    "--variants",
    "arms",
    show_default=True,
    default="dense,dense-matched,coupled,frozen-gate,frozen-slow",
    help="Comma-separated arms.",
)
@click.option(
    "--margin",
    default=0.01,
    show_default=True,
    type=float,
    help="Equivalence margin in nats/token for the verdicts.",
)
@click.option("--out", default=None, metavar="DIR", help="Folder [default: runs/reproduce-CORPUS].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def reproduce(
    corpus_spec,
    tokens,
    P,
    device,
    batch_size,
    block_size,
    use_compile,
    seeds,
    arms,
    margin,
    out,
    as_json,
):
    """The ablation: every arm for every seed, each seed's arms on the same data order.

    \b
    Arms: dense; dense-matched (dense, deepened to coupled's parameter count within 1%);
    coupled (slow path and gate trained); frozen-gate (slow path computed, gate pinned at 0:
    the dense model plus wasted compute); frozen-slow (slow weights frozen at init, gate
    trained).

    Prints parameters, training FLOPs per token, validation loss per seed (every aligned
    validation window), gates and throughput per arm; then paired per-seed differences with a
    t-based 95% interval (df = seeds - 1) and a verdict: "equivalent" when the interval lies
    within +-margin, "differs" when it excludes 0, else "inconclusive". Saves DIR/ablation.nc
    and one run folder per (arm, seed).

    \b
    Examples:
      fastslow-sim reproduce --corpus me
      fastslow-sim reproduce --corpus text:../shared/data/tinyshakespeare.txt --seeds 5
    """
    from .training import ARMS, parse_tokens
    from .training import reproduce as run_reproduce

    n_tokens = parse_tokens(tokens)
    names = [v.strip() for v in arms.split(",") if v.strip()]
    bad = [v for v in names if v not in ARMS]
    if bad or not names or len(set(names)) != len(names):
        raise InputError(f"--arms must name distinct arms among {list(ARMS)}; got {arms!r}.")
    if seeds < 1:
        raise InputError(f"--seeds must be a positive integer; got {seeds}.")
    base = _base_config(P, device, batch_size, block_size, use_compile)
    base["progress"] = not as_json
    tag = "text" if corpus_spec.startswith("text:") else corpus_spec.split(":")[0]
    out = out or f"runs/reproduce-{tag}"
    log = (lambda *a: None) if as_json else click.echo
    table = run_reproduce(corpus_spec, n_tokens, seeds, names, out, base, margin=margin, log=log)
    if as_json:
        click.echo(json.dumps({"corpus": corpus_spec, "tokens": n_tokens, "seeds": seeds, **table,
                               "out": out}, default=float))  # fmt: skip
        return
    click.echo(_format_ablation(table, corpus_spec, n_tokens, seeds))
    click.echo(f"dataset     {Path(out) / 'ablation.nc'}")


def _format_ablation(table, corpus_spec, tokens, seeds) -> str:
    lines = [f"ablation on {corpus_spec}, {tokens:,} tokens per run, {seeds} seeds",
             "| arm | layers | params | train FLOPs/token | val loss mean ± sd | |tanh(alpha)| per layer | tokens/s | wall / dense |",
             "|---|---:|---:|---:|---|---|---:|---:|"]  # fmt: skip
    for arm, r in table["arms"].items():
        v = np.array(r["val_loss"])
        sd = float(v.std(ddof=1)) if len(v) > 1 else float("nan")
        gates = (
            " ".join(f"{g:.4f}" for g in r["gate_abs_per_layer"])
            if arm not in ("dense", "dense-matched")
            else "-"
        )
        ratio = "" if r["wall_ratio_to_dense"] is None else f"{r['wall_ratio_to_dense']:.3f}"
        lines.append(f"| {arm} | {r['n_layer']} | {r['params']:,} | {r['flops_per_token'] / 1e6:.2f} M | "
                     f"{v.mean():.4f} ± {sd:.4f} | {gates} | {r['tokens_per_s']:,.0f} | {ratio} |")  # fmt: skip
    ref = table.get("references")
    if ref:
        lines.append(f"references (same windows): oracle {ref['oracle_loss']:.4f}, Bayes floor "
                     f"{ref['bayes_floor_loss']:.4f}, ignore-y {ref['ignore_y_loss']:.4f}")  # fmt: skip
    m = table["margin"]
    lines += [f"paired differences a - b over seeds (nats/token), t-based 95% interval, margin ±{m}:",
              "| a - b | mean | 95% interval | df | verdict |", "|---|---:|---|---:|---|"]  # fmt: skip
    for c in table["comparisons"]:
        lo, hi = c["ci95"]
        note = " (excludes 0)" if c["verdict"] == "equivalent" and c["excludes_zero"] else ""
        lines.append(f"| {c['a']} - {c['b']} | {c['mean_diff']:+.4f} | [{lo:+.4f}, {hi:+.4f}] | "
                     f"{c['df']} | {c['verdict']}{note} |")  # fmt: skip
    return "\n".join(lines)


@main.command("phi-vs-pst")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(), metavar="RUN_DIR...")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per run.")
def phi_vs_pst_cmd(run_dirs, as_json):
    """How close each run's phi_theta is to p_st(y) on the me corpus: mean total-variation
    distance (± standard error across validation windows) to p_st(y_b) of the block being
    predicted, through the model's own next-token distribution late in the block (where the
    chain has mixed; every arm) and through a probe on the last layer's gated slow state
    (slow-path arms), beside the baselines (the Bayes filter read out the same two ways, the
    previous block's histogram, corpus frequencies, uniform). Writes RUN_DIR/phi_vs_pst.json.

    \b
    Example:
      fastslow-sim phi-vs-pst runs/reproduce-me/coupled-seed0 runs/reproduce-me/dense-matched-seed0
    """
    from .probe import READOUTS, phi_vs_pst

    results = [phi_vs_pst(d) for d in run_dirs]
    if as_json:
        for r in results:
            click.echo(json.dumps({k: v for k, v in r.items() if k != "binned"}))
        return
    cols = [c for c in READOUTS if c != "y known"]
    click.echo("mean TV distance to p_st(y_b) ± s.e. (validation blocks; y known: 0)")
    click.echo("| run | arm | tokens | P | " + " | ".join(cols) + " |")
    click.echo("|---|---|---:|---:|" + "---:|" * len(cols))
    for r in results:
        cells = [f"{r['tv'][c]['mean']:.4f} ± {r['tv'][c]['se']:.4f}" if c in r["tv"] else "-"
                 for c in cols]  # fmt: skip
        click.echo(
            f"| {r['run']} | {r['arm']} | {r['tokens']:,} | {r['P']} | " + " | ".join(cells) + " |"
        )


@main.command("training-figures")
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
    _use_agg()
    from .analysis import (
        plot_gates,
        plot_phi_vs_pst,
        plot_tv_sweep,
        plot_val_loss,
        plot_wall_clock,
        save_figure,
    )
    from .io import load_dataset

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


if __name__ == "__main__":  # pragma: no cover
    main()
