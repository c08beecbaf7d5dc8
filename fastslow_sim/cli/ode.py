"""The ODE commands: `integrate`, `convergence`, `manifold`, `mapping`."""

from __future__ import annotations

import json
import math

import click
import numpy as np

from ..errors import InputError
from ..integrators import (
    METHODS,
    random_initial_conditions,
    trajectory_summary,
)
from ..manifold import CONVERGENCE_EPS_MAX, CONVERGENCE_EPS_MIN
from ..validation import number
from ..wording import count_text, plural
from .common import (
    INTEGER,
    KAPPA_MAX,
    MAX_BATCH,
    MAX_N_EVAL,
    NUMBER,
    RTOL_MIN,
    echo_summary,
    exit_on_failure,
    fmt_vec,
    json_text,
    methods_help,
    name_number,
    ode_command,
    output_options,
    output_paths,
    parse_eps_list,
    parse_eps_P,
    parse_vector,
    range_text,
    system_option,
    systems_help,
    use_agg,
)
from .common import unsigned_zero as _num  # a number without a sign where it rounds to 0

# how integrate's messages call the library's arguments from the command line (`check_inputs`)
OPTION_NAMES = {"x0": "--x0", "y0": "--y0", "n_eval": "--n-eval", "max_steps": "--max-steps",
                "atol": "--atol"}  # fmt: skip
SEED_MAX = 2**63 - 1  # the dataset's seed attribute is a 64-bit integer
P_ST_WARN_FLOPS = 3e11  # about 25-60 s of GTH (scripts/bench_stationary.py)
# the compiled GTH (n^3/3 operations), 2 cores: 512 states, and 4,096 (in panels, dgemm)
GTH_FLOPS_PER_S = (5e9, 13e9)


def _minutes(seconds: float) -> str:
    m = seconds / 60
    return f"{m:.2g}" if m < 10 else f"{m:,.0f}"


@click.command()
@system_option("Named system. " + systems_help())
@click.option("--eps", default=None, metavar="E", help="Time-scale ratio eps > 0 (eps = 1/P).")
@click.option("--P", "P", default=None, metavar="P", help="Positive integer P; eps = 1/P.")
@click.option("--t-end", default=5.0, show_default=True, type=NUMBER, help="End of slow time.")
@click.option(
    "--method",
    default="auto",
    show_default=True,
    type=click.Choice(list(METHODS)),
    help="Integration method. " + methods_help(),
)
@click.option("--rtol", default=1e-8, show_default=True, type=NUMBER, help="Relative tolerance.")
@click.option("--atol", default=1e-10, show_default=True, type=NUMBER, help="Absolute tolerance.")
@click.option(
    "--x0",
    default=None,
    metavar="P0,P1,...",
    help="Initial fast state, a probability vector (default: all mass on state 0).",
)
@click.option("--y0", default=None, metavar="Y", help="Initial slow state (default per system).")
@click.option("--n-eval", default=401, show_default=True, type=INTEGER, help="Saved time points.")
@click.option(
    "--batch",
    default=None,
    type=INTEGER,
    metavar="N",
    help="Integrate N random initial conditions (x0 uniform on the simplex, y0 uniform "
    "in [0, 1]) as one batch; 'auto' then takes the batched torch solver rodas4.",
)
@click.option(
    "--seed",
    default=None,
    type=INTEGER,
    metavar="S",
    help="Seed of the --batch draw, from 0 to 2**63 - 1 (--batch only) [default: 0].",
)
@click.option(
    "--states",
    default=None,
    type=INTEGER,
    metavar="N",
    help="Number of states of the system (every system but two-state), up to 4,096 "
    "[default: per system]. The neighbour chains (birth-death, michaelis-menten) take seconds "
    "at 4,096; cycle and random need a dense elimination per saved point for p_st (O(n^3): "
    "about 2 s a point at 4,096 on an idle 2-core machine, announced before the run when it "
    "adds up to minutes).",
)
@click.option(
    "--H",
    "H",
    default=None,
    type=NUMBER,
    metavar="H",
    help="Slow time per block of the multirate map (--method multirate only) [default: 0.01]; "
    "--t-end must be a whole number of blocks.",
)
@click.option(
    "--march",
    default=None,
    type=click.Choice(["auto", "torch", "compiled"]),
    help="March of the rosenbrock methods (rodas4, rodas3) [default: auto]: 'compiled' runs the "
    "whole per-trajectory march in numba (neighbour chains with one slow variable, on the CPU), "
    "'torch' the torch march (any system with a torch form, CPU or CUDA); auto takes the "
    "compiled one where it applies.",
)
@click.option(
    "--max-steps",
    default=None,
    metavar="N",
    help="Budget of steps, a positive integer (every method but multirate): of each trajectory "
    "for the scipy methods [default: 200,000], rodas4 and torchdiffeq's [default: 1,000,000]; "
    "a run that spends it ends with the status max_steps.",
)
@output_options("integrate-SYSTEM-epsE.nc")
@ode_command
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
    states,
    H,
    march,
    max_steps,
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
      fastslow-sim integrate --eps 1e-4 --states 16 --batch 1024 --method rodas4
    """
    from ..integrators import (
        check_eps_range,
        check_inputs,
        check_output_size,
        method_options,
        p_st_flops,
    )
    from ..integrators import integrate as run_integrate
    from ..io import save_dataset
    from ..systems import make_system

    e, _ = parse_eps_P(eps, P)
    check_eps_range(e, method)
    if not math.isfinite(t_end) or t_end <= 0:
        raise InputError(f"--t-end must be a positive finite time; got {t_end}.")
    if n_eval < 2 or n_eval > MAX_N_EVAL:
        raise InputError(
            f"--n-eval must be an integer from 2 to {MAX_N_EVAL:,}; got {count_text(n_eval)}."
        )
    if not (math.isfinite(rtol) and 0 < rtol < 1):
        raise InputError(f"--rtol must be a positive number below 1 (e.g. 1e-8); got {rtol}.")
    if rtol < RTOL_MIN:
        raise InputError(
            f"--rtol must be at least {RTOL_MIN:g} (100 ulps: below, no float64 solver can "
            f"meet it); got {rtol}."
        )
    if not (math.isfinite(atol) and 0 < atol <= 1):
        raise InputError(f"--atol must be a positive number at most 1 (e.g. 1e-10); got {atol}.")
    if seed is not None and batch is None:
        raise InputError(
            f"--seed seeds the random initial conditions of --batch, and no --batch was given "
            f"(got --seed {seed}); expected --batch N with it, or no --seed."
        )
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise InputError(
            f"--seed must be a non-negative integer at most 2**63 - 1 = {SEED_MAX:,} (a 64-bit "
            f"integer, as the dataset stores it); got {seed:,}."
        )
    kwargs = method_options(method, t_end, H, march, max_steps)
    if method == "multirate":  # the map ran with them ignored (501 states for --n-eval 3)
        given = [f"--{name.replace('_', '-')}" for name in ("rtol", "atol", "n_eval")
                 if _given(name)]  # fmt: skip
        if given:
            raise InputError(
                f"{' and '.join(given)} {'sets' if len(given) == 1 else 'set'} the ODE "
                f"solvers' {_MULTIRATE_IGNORES[given[0]] if len(given) == 1 else 'tolerances and saved times'}, "
                f"and --method multirate takes no tolerance and saves one state per block of --H; "
                f"expected no {' or '.join(given)} with it."
            )
    system = make_system(system_name, eps=e, states=states)
    x0v = parse_vector(x0, "--x0") if x0 is not None else None
    y0v = parse_vector(y0, "--y0") if y0 is not None else None
    if batch is not None:
        if batch < 1 or batch > MAX_BATCH:
            raise InputError(
                f"--batch must be an integer from 1 to {MAX_BATCH:,}; got {count_text(batch)}."
            )
        if x0 is not None or y0 is not None:
            raise InputError("--batch draws random initial conditions; drop --x0 and --y0.")
        if method == "multirate":
            raise InputError("--batch integrates with the ODE solvers; drop --method multirate.")
    if method != "multirate":  # before the draw, which is as large as the initial states
        check_output_size(system, batch or 1, n_eval, ("--batch", "--n-eval"))
    if batch is not None:
        seed = 0 if seed is None else seed
        x0v, y0v = random_initial_conditions(system, batch, seed)

    # everything integrate refuses, refused before the default output folder is made
    check_inputs(system, (0.0, t_end), x0v, y0v, method=method, rtol=rtol, atol=atol,
                 n_eval=n_eval, names=OPTION_NAMES, **kwargs)  # fmt: skip
    out, plot_path = output_paths(f"integrate-{system_name}-eps{name_number(e)}", out, plot_path,
                                   no_plot)  # fmt: skip
    points = (batch or 1) * n_eval
    work = p_st_flops(system, points)
    if work > P_ST_WARN_FLOPS:  # said before the run, which takes that long
        click.echo(f"Warning: p_st(y(t)) at {points:,} saved states of a {system.n_fast}-state "
                   f"chain is about {work:.2g} floating-point operations (a GTH elimination, "
                   f"n^3/3, each; {_minutes(work / GTH_FLOPS_PER_S[1])} to "
                   f"{_minutes(work / GTH_FLOPS_PER_S[0])} minutes at the {GTH_FLOPS_PER_S[0] / 1e9:g}-"
                   f"{GTH_FLOPS_PER_S[1] / 1e9:g} GFLOP/s of "
                   f"this project's 2-core build machine); --n-eval sets how many states are "
                   f"saved.", err=True)  # fmt: skip

    # its warnings are one line each, as they are issued (`ode_command`: `solver_warnings`)
    if method != "multirate":  # (refused above where given: the map takes none of them)
        kwargs.update(rtol=rtol, atol=atol, n_eval=n_eval)
    ds = run_integrate(system, (0.0, t_end), x0v, y0v, method=method, **kwargs)
    if batch is not None:  # the initial conditions came from this seed: save it with them
        ds.attrs["seed"] = seed

    save_dataset(ds, out)
    if not no_plot:
        use_agg()
        from ..analysis import plot_trajectory, save_figure

        # a batch: its first trajectory, titled as trajectory 0 of N with its own status
        one = ds.assign_coords(batch=np.arange(ds.sizes["batch"])).isel(batch=0) \
            if "batch" in ds.dims else ds  # fmt: skip
        save_figure(plot_trajectory(one), plot_path)

    summary = {"system": system_name, **trajectory_summary(ds), "out": str(out),
               "plot": None if no_plot else str(plot_path)}  # fmt: skip
    echo_summary(summary, as_json, _integrate_lines)
    exit_on_failure(summary["status"])


# what the options the multirate map does not take set for the ODE solvers
_MULTIRATE_IGNORES = {"--rtol": "relative tolerance", "--atol": "absolute tolerance",
                      "--n-eval": "saved times"}  # fmt: skip


def _given(name: str) -> bool:
    """Whether the option `name` of the running command was set by the user (its default does not
    count)."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def _integrate_lines(r: dict) -> list:
    batched = "batch" in r
    P_text = f" (P = {r['P']})" if r["P"] is not None else ""
    y = np.asarray(r["y_final"], dtype=float)
    lines = [
        f"{r['system']}: eps = {r['eps']:g}{P_text}, t in [{r['t_start']:g}, {r['t_end']:g}]",
        f"method      {r['method']} (requested {r['method_requested']}; "
        f"{'largest ' if 'stiffness_index_of' in r else ''}stiffness index "
        f"{r['stiffness_index']:.3g}), "
        + ("no tolerance (the map's fast propagation is exact per token)"
           if r["method"] == "multirate" else f"rtol {r['rtol']:g}, atol {r['atol']:g}")
        + (f", {r['march']} march" if "march" in r else ""),
        f"status      {r['status']}: {r['message']}",
    ]
    if "stiffness_judged" in r:
        lines.append(f"stiffness   judged {r['stiffness_judged']}")
    if batched:
        done = np.all(np.isfinite(y), axis=-1)  # a failed trajectory has no y(t_end)
        of = "" if done.all() else f" (the {int(done.sum()):,} that reached t_end)"
        lines += [f"batch       {plural(r['batch'], 'trajectory')}: {r['status_counts']}",
                  f"y(t_end)    from {np.nanmin(y):.6g} to {np.nanmax(y):.6g}{of}"
                  if done.any() else "y(t_end)    none (no trajectory reached t_end)"]  # fmt: skip
    else:
        lines += [f"x(t_end)    {fmt_vec(r['x_final'])}", f"p_st(y)     {fmt_vec(r['p_st_final'])}",
                  f"y(t_end)    {fmt_vec(y, 6)}"]  # fmt: skip
    lines += [
        f"|x - p_st(y)|_1 at t_end = {r['manifold_distance_final']:.3e}"
        f"{' (largest in the batch)' if batched else ''}; "
        f"max |1^T x - 1| = {r['mass_error_max']:.1e}",
        f"solver      nfev {r['nfev']}, njev {r['njev']}, nlu {r['nlu']}, "
        f"wall {r['wall_time_s']:.3f} s{_load_text(r)}",
        f"dataset     {r['out']}",
    ]
    return lines + ([f"plot        {r['plot']}"] if r["plot"] else [])


@click.command()
@system_option("Named system.")
@click.option(
    "--eps",
    "eps_list",
    default="0.01,0.005,0.0025,0.00125",
    show_default=True,
    metavar="E1,E2,...",
    help=f"Values of eps (at least two, distinct, each from {CONVERGENCE_EPS_MIN:g} to "
    f"{CONVERGENCE_EPS_MAX:g}; the initial layer of the largest must last less than half of "
    "--t-end).",
)
@click.option(
    "--t-end", default=3.0, show_default=True, type=NUMBER, help="End of slow time (at most 1000)."
)
@output_options("convergence-SYSTEM.nc")
@ode_command
def convergence(system_name, eps_list, t_end, out, plot_path, no_plot, as_json):
    """Convergence in eps of the full system to its slow-manifold approximations.

    For each eps, integrates the full system at tight tolerance (Radau) and measures, after
    the initial layer of the largest eps (6 eps log(1/eps) / spectral gap; one window for
    every eps), the largest |x - h0(y)|, |x - h0(y) - eps h1(y)| and |y - y_reduced|, then
    fits their log-log slopes (theory: 1, 2 and 1), over every eps and between the two
    smallest (the closest to the limit eps -> 0). A slope whose errors come within 10x of
    the solver's tolerance and round-off is reported as n/d (null in the JSON), with the
    reason. --t-end is at most 1000.

    \b
    Example:
      fastslow-sim convergence --system two-state --eps 0.02,0.01,0.005
    """
    from ..io import save_dataset
    from ..manifold import check_convergence
    from ..manifold import convergence as run_convergence
    from ..systems import make_system

    values = parse_eps_list(eps_list)
    if not math.isfinite(t_end) or t_end <= 0:
        raise InputError(f"--t-end must be a positive finite time; got {t_end}.")
    system = make_system(system_name, eps=values[0])
    check_convergence(system, values, t_end, name="--t-end")  # before the default folder is made
    out, plot_path = output_paths(f"convergence-{system_name}", out, plot_path, no_plot)
    ds = run_convergence(system, values, t_end=t_end, progress=not as_json)
    save_dataset(ds, out)
    if plot_path is not None:
        use_agg()
        from ..analysis import plot_convergence, save_figure

        save_figure(plot_convergence(ds), plot_path)
    slopes = json.loads(ds.attrs["slopes"])  # null where not determined
    notes = json.loads(ds.attrs["slope_notes"])
    if as_json:
        click.echo(json_text({
            "system": system_name,
            "eps": ds["eps"].values.tolist(),
            "errors": {k: ds[k].values.tolist() for k in ("err_h0", "err_h1", "err_y")},
            "slopes": slopes,
            "slopes_smallest_pair": json.loads(ds.attrs["slopes_smallest_pair"]),
            "slope_notes": notes,
            "expected_slopes": {"err_h0": 1, "err_h1": 2, "err_y": 1},
            "t_window": ds.attrs["t_window"],
            "t_end": t_end,
            "wall_time_s": ds.attrs["wall_time_s"],
            "out": str(out),
            "plot": None if plot_path is None else str(plot_path),
        }))  # fmt: skip
        return
    click.echo(
        f"{system_name}: errors after the initial layer of the largest eps, "
        f"t in [{ds.attrs['t_window']:.3g}, {t_end:g}] for every eps"
    )
    click.echo(f"{'eps':>10} {'|x-h0|':>12} {'|x-h0-eps h1|':>14} {'|y-y_red|':>12} {'t_layer':>9}")
    for i, e in enumerate(ds["eps"].values):
        click.echo(
            f"{e:>10.4g} {ds['err_h0'].values[i]:>12.3e} {ds['err_h1'].values[i]:>14.3e} "
            f"{ds['err_y'].values[i]:>12.3e} {ds['t_layer'].values[i]:>9.3g}"
        )
    last = json.loads(ds.attrs["slopes_smallest_pair"])
    for label, row in (("slope", slopes), ("last pair", last)):
        shown = {k: "n/d" if v is None else f"{v:.3f}" for k, v in row.items()}
        click.echo(
            f"{label:>10} {shown['err_h0']:>12} {shown['err_h1']:>14} {shown['err_y']:>12}"
            "   (theory 1, 2, 1)"
        )
    names = {"err_h0": "|x-h0|", "err_h1": "|x-h0-eps h1|", "err_y": "|y-y_red|"}
    for k, note in notes.items():
        click.echo(f"slope of {names[k]} {note}")
    click.echo(f"dataset     {out}")
    if plot_path is not None:
        click.echo(f"plot        {plot_path}")


@click.command()
@system_option("Named system; only birth-death has a non-linear family (kappa != 0).")
@click.option(
    "--kappa",
    default=None,
    type=NUMBER,
    help="Strength of the x-dependence: up rate exp(4 (y - 1/2) + kappa c.x)  [default: 3 for "
    "birth-death; 0, the only value, for the linear systems]",
)
@click.option(
    "--y-range",
    nargs=2,
    type=NUMBER,
    default=None,
    metavar="A B",
    help="Range of the slow variable to trace  [default: -1 1.5, cut to the system's domain "
    "(michaelis-menten: 0 1.5)]",
)
@click.option(
    "--osc-eps",
    default=0.01,
    show_default=True,
    type=NUMBER,
    help="eps of the relaxation-oscillation run (only when the manifold folds), from 1e-9 to 1.",
)
@output_options("manifold-SYSTEM-kappaK.nc")
@ode_command
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
    from ..io import save_dataset
    from ..manifold import identity_check
    from ..nonlinear import (
        OSC_EPS_MIN,
        check_y_range,
        default_kappa,
        default_y_range,
        family_for,
        manifold_dataset,
    )
    from ..systems import make_system

    if kappa is None:
        kappa = default_kappa(system_name)
    if not math.isfinite(kappa):
        raise InputError(f"--kappa must be a finite number; got {kappa}.")
    number("--kappa", kappa, -KAPPA_MAX, KAPPA_MAX)
    kappa = float(kappa) + 0.0  # -0 is 0: "kappa = -0" and manifold-...-kappa-0.nc otherwise
    if not math.isfinite(osc_eps) or osc_eps <= 0:
        raise InputError(f"--osc-eps must be a positive finite number; got {osc_eps}.")
    number("--osc-eps", osc_eps, OSC_EPS_MIN, 1.0)
    family = family_for(system_name, kappa)
    if y_range is None:  # the default range, cut to the domain (michaelis-menten: y >= 0)
        y_range = default_y_range(family)
    a, b = check_y_range(family, y_range)
    out, plot_path = output_paths(
        f"manifold-{system_name}-kappa{name_number(kappa)}", out, plot_path, no_plot
    )
    ds = manifold_dataset(family, (a, b), osc_eps=osc_eps)
    check = identity_check(make_system(system_name, eps=0.1), np.linspace(a, b, 101))
    ds.attrs["identity_max_abs_diff"] = check["max_abs_diff"]
    save_dataset(ds, out)
    if plot_path is not None:
        use_agg()
        from ..analysis import plot_branches, save_figure

        save_figure(plot_branches(ds), plot_path)
    branches = json.loads(ds.attrs["branches"])
    folds = json.loads(ds.attrs["folds"])
    osc = None
    if "osc_y_min" in ds.attrs:
        osc = {k: ds.attrs[f"osc_{k}"] for k in ("eps", "status", "y_min", "y_max", "y_window",
                                                  "y_window_kind", "period")}  # fmt: skip
        if "osc_period_note" in ds.attrs:  # the period is NaN: null in the JSON, and why
            osc["period_note"] = ds.attrs["osc_period_note"]
    if as_json:
        click.echo(json_text({
            "system": system_name, "kappa": kappa, "y_range": [a, b], "branches": branches,
            "folds": folds, "gap": ds.attrs["gap"], "gap_kind": ds.attrs["gap_kind"],
            "identity_max_abs_diff": check["max_abs_diff"], "oscillation": osc,
            "out": str(out), "plot": None if plot_path is None else str(plot_path),
        }))  # fmt: skip
        return
    click.echo(f"{system_name}, kappa = {kappa:g}, y in {range_text(a, b)}")
    click.echo(
        f"identity check (kappa = 0): max |x_newton(y) - p_st(y)| = "
        f"{_num(check['max_abs_diff'], '.2e')} over {plural(check['n_y'], 'value')} of y"
    )
    for br in branches:
        click.echo(
            f"branch {br['index']}: y in {_branch_range(br['y_min'], br['y_max'])}, "
            f"mean c.x in [{_num(br['mean_min'], '.3f')}, {_num(br['mean_max'], '.3f')}], "
            f"{_stability_text(br)}"
        )
    for f in folds:
        click.echo(f"fold at y = {_num(f['y'], '.6f')}, mean c.x = {_num(f['mean'], '.4f')}")
    over = ("sup over the curve" if ds.attrs["gap_kind"] == "sup"
            else f"max over the {ds.sizes['point']} sampled points")  # fmt: skip
    click.echo(
        f"gap = {over} of max_i |phi_i(y) - p_st,i(Q(x_ref, y))| = {_num(ds.attrs['gap'], '.4f')}"
    )
    if osc is not None:
        period = (f"period not determined: {osc['period_note']}" if "period_note" in osc
                  else f"period {_num(osc['period'], '.3f')}")  # fmt: skip
        a, b = osc["y_window"]
        over = (f"over its last cycle (t in [{_num(a, '.3f')}, {_num(b, '.3f')}])"
                if osc["y_window_kind"] == "last cycle"
                else f"over t in [{_num(a, 'g')}, {_num(b, 'g')}], not a full cycle")  # fmt: skip
        click.echo(
            f"relaxation oscillation (g = 1/2 - c.x, eps = {osc['eps']:g}): y in "
            f"[{_num(osc['y_min'], '.4f')}, {_num(osc['y_max'], '.4f')}] {over}, {period}"
        )
    click.echo(f"dataset     {out}")
    if plot_path is not None:
        click.echo(f"plot        {plot_path}")



def _stability_text(br: dict) -> str:
    """A branch's stability (`nonlinear._branch_stability`): the sign of the largest Re lambda
    where float64 resolves it, and where it does not, say so instead of printing a sign."""
    sup = br["max_real_eigenvalue"]
    if br["stable"] is None:
        text = (
            f"stability unresolved in float64 at {br['unresolved_points']} points (Re lambda "
            f"within round-off {br['max_unresolved_error']:.2g} of 0)"
        )
        return text + ("" if sup is None else f", max Re lambda {_num(sup, '.3g')} at the others")
    kind = "stable" if br["stable"] else "repelling"
    if br["unresolved_points"]:
        kind += f", unresolved at {br['unresolved_points']} points"
    at_fold = ", at its fold" if br["max_at_fold"] else ""
    return f"{kind} (max Re lambda {_num(sup, '.3g')}{at_fold})"


def _load_text(r: dict) -> str:
    """The first call's cost before the timed solve, where it took a noticeable time: numba
    loads the compiled march's kernels at their first call in a process (seconds, against
    milliseconds for the solve); the torch march has none to load, only torch's first use."""
    load = r.get("load_wall_time_s")
    if load is None or load < 0.01:
        return ""
    what = "loading compiled kernels" if r.get("march") == "compiled" else "warming up torch"
    return f" (+ {load:.3f} s {what} first)"


def _branch_range(a: float, b: float) -> str:
    """A branch's ends: 4 decimals, or 6 significant digits beyond 1e6 (michaelis-menten's domain
    reaches 9e306, 307 digits in fixed point); more digits where those print the ends alike."""
    if max(abs(a), abs(b)) < 1e6 and _num(a, ".4f") != _num(b, ".4f"):
        return f"[{_num(a, '.4f')}, {_num(b, '.4f')}]"
    return range_text(a, b, ".6g")


@click.command()
@click.option("--markdown", is_flag=True, help="Print a Markdown table.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def mapping(markdown, as_json):
    """How the ODE maps onto the attention network, row by row: the ODE object, its network
    counterpart, whether the correspondence is exact or an analogy, and the gap.

    \b
    Examples:
      fastslow-sim mapping
      fastslow-sim mapping --markdown > mapping.md
    """
    from ..bridge.mapping import MAPPING, render_mapping

    if markdown and as_json:
        raise InputError("--markdown and --json ask for two formats; expected one of them.")
    if as_json:
        click.echo(json.dumps(MAPPING, indent=1))
    else:
        click.echo(render_mapping("markdown" if markdown else "text"))



COMMANDS = [integrate, convergence, manifold, mapping]
