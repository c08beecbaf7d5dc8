"""Plots that work in a notebook (issue 14, item 6): each plot function draws into the Axes it
is given and returns their Figure, labels axes from `long_name` and `units`, and importing the
analysis layer picks no matplotlib backend. Checked on the drawn lines' data and the labels."""

import json
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")  # this test process only; the package itself must not do this
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import xarray as xr  # noqa: E402

from fastslow_sim import io as fs_io  # noqa: E402
from fastslow_sim.analysis import (  # noqa: E402
    axis_label,
    plot_ablation,
    plot_branches,
    plot_convergence,
    plot_equilibrium_manifold,
    plot_gates,
    plot_multirate,
    plot_phi_vs_pst,
    plot_trajectory,
    plot_tv_sweep,
    plot_val_loss,
    plot_wall_clock,
    save_figure,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _trajectory(rng, n=3, T=7):
    t = np.linspace(0.0, 2.0, T)
    x = rng.dirichlet(np.ones(n), size=T)
    p = rng.dirichlet(np.ones(n), size=T)
    return xr.Dataset(
        {
            "x": (("time", "state"), x, {"long_name": "fast variable", "units": "1"}),
            "y": (("time", "slow"), rng.random((T, 1)), {"long_name": "slow variable"}),
            "p_st": (("time", "state"), p),
        },
        coords={"time": ("time", t, {"long_name": "slow time t", "units": "s"})},
        attrs={"system": "test", "eps": 0.125, "method": "radau", "status": "success"},
    )


@pytest.mark.parametrize(
    "choose, expect",
    [
        # nothing chosen: the import leaves the choice unresolved (matplotlib's own default)
        ("", "repr(dict.__getitem__(matplotlib.rcParams, 'backend')) == before"),
        # a backend chosen before the import stays chosen
        ("matplotlib.use('svg')", "matplotlib.get_backend() == 'svg'"),
    ],
    ids=["unchosen", "chosen"],
)
def test_importing_analysis_keeps_the_backend(choose, expect):
    code = (
        f"import matplotlib\n{choose}\n"
        "before = repr(dict.__getitem__(matplotlib.rcParams, 'backend'))\n"
        "import fastslow_sim.analysis, fastslow_sim.analysis.training_plots\n"
        f"assert {expect}, dict.__getitem__(matplotlib.rcParams, 'backend')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_trajectory_draws_into_given_axes(rng):
    ds = _trajectory(rng)
    fig, (ax_x, ax_y) = plt.subplots(2, 1)
    before = plt.get_fignums()
    assert plot_trajectory(ds, ax=(ax_x, ax_y)) is fig
    assert plt.get_fignums() == before  # no figure of its own
    t = ds["time"].values
    solid = [ln for ln in ax_x.lines if ln.get_linestyle() == "-" and len(ln.get_xdata())]
    dashed = [ln for ln in ax_x.lines if ln.get_linestyle() == "--" and len(ln.get_xdata())]
    for i in range(ds.sizes["state"]):
        np.testing.assert_array_equal(solid[i].get_xdata(), t)
        np.testing.assert_array_equal(solid[i].get_ydata(), ds["x"].values[:, i])
        np.testing.assert_array_equal(dashed[i].get_ydata(), ds["p_st"].values[:, i])
    np.testing.assert_array_equal(ax_y.lines[0].get_ydata(), ds["y"].values[:, 0])
    # long_name [units]; dimensionless units ("1") left out
    assert ax_y.get_xlabel() == "slow time t [s]"
    assert ax_x.get_ylabel() == "fast variable"
    assert ax_y.get_ylabel() == "slow variable"


def test_trajectory_without_axes_makes_a_figure(rng):
    before = set(plt.get_fignums())
    fig = plot_trajectory(_trajectory(rng))
    assert set(plt.get_fignums()) - before == {fig.number}
    assert len(fig.axes) == 2


def test_wrong_number_of_axes_is_one_clear_error(rng):
    _, ax = plt.subplots()
    with pytest.raises(ValueError, match="2 panel"):
        plot_trajectory(_trajectory(rng), ax=ax)


def test_convergence_lines_and_labels(rng):
    eps = np.array([0.02, 0.01, 0.005])
    errs = {
        k: c * eps**p for k, c, p in (("err_h0", 0.3, 1), ("err_h1", 2.0, 2), ("err_y", 1.0, 1))
    }
    ds = xr.Dataset(
        {k: ("eps", v, {"units": "m"}) for k, v in errs.items()},
        coords={"eps": eps},
        attrs={"slopes": json.dumps({"err_h0": 1.0, "err_h1": 2.0, "err_y": 1.0})},
    )
    fig, ax = plt.subplots()
    assert plot_convergence(ds, ax=ax) is fig
    # every eps run is a labelled tick, and no other (minor ticks off)
    np.testing.assert_array_equal(ax.get_xticks(), np.sort(eps))
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{e:g}" for e in np.sort(eps)]
    assert len(ax.get_xticks(minor=True)) == 0
    # one data line and one fitted line per error, in order
    assert len(ax.lines) == 6
    for j, key in enumerate(errs):
        np.testing.assert_array_equal(ax.lines[2 * j].get_xdata(), eps)
        np.testing.assert_array_equal(ax.lines[2 * j].get_ydata(), errs[key])
        np.testing.assert_allclose(ax.lines[2 * j + 1].get_ydata(), errs[key], rtol=1e-10)
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == r"$\varepsilon = 1/P$"  # eps has no long_name: the default
    assert ax.get_ylabel() == "error after the initial layer [m]"


def test_convergence_slope_not_determined_is_labelled_n_d():
    """A slope `convergence` left undetermined (null in `slopes`) was formatted with :.2f (a
    TypeError on None); now its label says n/d and it gets no fitted line."""
    eps = np.array([4e-5, 2e-5, 1e-5])
    errs = {"err_h0": 1e-3 * eps, "err_h1": np.array([1.9e-13, 9.8e-14, 7.6e-14]), "err_y": eps}
    ds = xr.Dataset(
        {k: ("eps", v) for k, v in errs.items()},
        coords={"eps": eps},
        attrs={"slopes": json.dumps({"err_h0": 1.0, "err_h1": None, "err_y": 1.0})},
    )
    fig, ax = plt.subplots()
    plot_convergence(ds, ax=ax)
    labels = [line.get_label() for line in ax.lines if not line.get_label().startswith("_")]
    assert labels[1].endswith("slope n/d (errors at the solver's floor)")
    assert labels[0].endswith("slope 1.00") and labels[2].endswith("slope 1.00")
    assert len(ax.lines) == 5  # three data lines, fitted lines for the two determined slopes
    plt.close(fig)


def _convergence(errs, slopes):
    eps = np.array([0.02, 0.01, 0.005])
    return xr.Dataset({k: ("eps", np.broadcast_to(v, eps.shape)) for k, v in errs.items()},
                      coords={"eps": eps}, attrs={"slopes": json.dumps(slopes)})  # fmt: skip


def test_convergence_of_errors_all_nan_prints_no_slope():
    """Every error NaN (every run failed): the slopes in attrs were still printed, and a fitted
    line computed, as if measured; now each label and a note on the axes say there is none."""
    keys = ("err_h0", "err_h1", "err_y")
    ds = _convergence({k: np.nan for k in keys}, {"err_h0": 1.0, "err_h1": 2.0, "err_y": 1.0})
    fig, ax = plt.subplots()
    plot_convergence(ds, ax=ax)
    labels = [line.get_label() for line in ax.lines]
    assert len(labels) == 3 and all(lab.endswith(": no finite error to fit") for lab in labels)
    assert not any(ch.isdigit() for lab in labels for ch in lab.split(":")[-1])
    (note,) = ax.texts
    assert note.get_text() == "no finite error to fit (every error is NaN or inf)"


def test_convergence_with_some_nan_errors_prints_no_slope_for_those():
    """`convergence` fits a slope over every eps, so a slope stored beside a NaN error (a
    hand-edited file) is no slope of the errors drawn: n/d, counting them, and no fitted line;
    the finite errors keep their slope and line, and no note is drawn."""
    eps = np.array([0.02, 0.01, 0.005])
    ds = _convergence({"err_h0": np.array([np.nan, 0.01, 0.005]), "err_h1": eps**2,
                       "err_y": eps}, {"err_h0": 1.0, "err_h1": 2.0, "err_y": float("nan")})  # fmt: skip
    fig, ax = plt.subplots()
    plot_convergence(ds, ax=ax)
    labels = [line.get_label() for line in ax.lines if not line.get_label().startswith("_")]
    assert labels[0].endswith(": slope n/d (1 of 3 errors not finite)")
    assert labels[1].endswith(": slope 2.00")
    assert labels[2].endswith(": slope n/d (errors at the solver's floor)")  # NaN as null
    assert len(ax.lines) == 4 and not ax.texts  # one fitted line, err_h1's
    np.testing.assert_allclose(ax.lines[2].get_ydata(), eps**2, rtol=1e-10)


def test_equilibrium_manifold_one_panel_per_state(rng):
    runs = [_trajectory(rng).assign_attrs(eps=e) for e in (0.1, 0.01)]
    y_grid = np.linspace(0.0, 1.0, 5)
    curve = xr.Dataset(
        {
            "h0": (("y_grid", "state"), rng.random((5, 3))),
            "h1": (("y_grid", "state"), rng.random((5, 3))),
        },
        coords={"y_grid": y_grid},
    )
    fig, axes = plt.subplots(1, 2)
    assert plot_equilibrium_manifold(runs, curve, states=[2, 0], ax=axes) is fig
    for ax, i in zip(axes, [2, 0]):
        h0 = ax.lines[0]
        np.testing.assert_array_equal(h0.get_xdata(), y_grid)
        np.testing.assert_array_equal(h0.get_ydata(), curve["h0"].values[:, i])
        # each run's trajectory in the (y, x_i) plane, then h0 + eps h1 dashed
        np.testing.assert_array_equal(ax.lines[1].get_xdata(), runs[0]["y"].values[:, 0])
        np.testing.assert_array_equal(ax.lines[1].get_ydata(), runs[0]["x"].values[:, i])
        np.testing.assert_allclose(
            ax.lines[2].get_ydata(), curve["h0"].values[:, i] + 0.1 * curve["h1"].values[:, i]
        )
        assert ax.get_xlabel() == "slow variable" and ax.get_ylabel() == f"$x_{{{i}}}$"


def _batched_trajectory(rng, B=4, n=3, T=7, eps_batch=None):
    """A dataset shaped as `integrate` writes a batch: `(batch, time, state)`, B != T."""
    t = np.linspace(0.0, 2.0, T)
    data = {
        "x": (("batch", "time", "state"), rng.dirichlet(np.ones(n), size=(B, T))),
        "y": (("batch", "time", "slow"), rng.random((B, T, 1))),
        "p_st": (("batch", "time", "state"), rng.dirichlet(np.ones(n), size=(B, T))),
    }
    if eps_batch is not None:
        data["eps_batch"] = ("batch", np.asarray(eps_batch, dtype=float))
    return xr.Dataset(data, coords={"time": t},
                      attrs={"system": "test", "eps": 0.125, "method": "radau",
                             "status": "success"})  # fmt: skip


def test_trajectory_of_a_batch_draws_every_trajectory_over_time(rng):
    """A batched dataset `(batch, time, state)` was read as `(time, state)`: x_0(t) was the
    trajectories' states at t = 0 (B == T) or matplotlib failed (B != T). Each trajectory is
    drawn against time, one legend entry per state, and the title counts them."""
    ds = _batched_trajectory(rng)
    fig, (ax_x, ax_y) = plt.subplots(2, 1)
    plot_trajectory(ds, ax=(ax_x, ax_y))
    t = ds["time"].values
    solid = [ln for ln in ax_x.lines if ln.get_linestyle() == "-" and len(ln.get_xdata())]
    dashed = [ln for ln in ax_x.lines if ln.get_linestyle() == "--" and len(ln.get_xdata())]
    assert len(solid) == len(dashed) == 4 * 3
    for i in range(3):
        for b in range(4):
            np.testing.assert_array_equal(solid[4 * i + b].get_xdata(), t)
            np.testing.assert_array_equal(solid[4 * i + b].get_ydata(), ds["x"].values[b, :, i])
            np.testing.assert_array_equal(dashed[4 * i + b].get_ydata(), ds["p_st"].values[b, :, i])
    for b in range(4):
        np.testing.assert_array_equal(ax_y.lines[b].get_ydata(), ds["y"].values[b, :, 0])
    assert [text.get_text() for text in ax_x.get_legend().get_texts()][:3] == [
        "$x_{0}$", "$x_{1}$", "$x_{2}$"]  # fmt: skip
    assert "4 trajectories" in ax_x.get_title()


def test_trajectory_of_a_batch_with_eps_per_trajectory_names_the_range(rng):
    fig = plot_trajectory(_batched_trajectory(rng, B=2, eps_batch=[0.01, 0.5]))
    assert "eps = 0.01 to 0.5" in fig.axes[0].get_title()


def test_equilibrium_manifold_of_a_batch_draws_each_trajectory(rng):
    """A batched run was drawn as `y(t=0)` of each trajectory against `x` at t = 0 (or failed
    in matplotlib); each trajectory is drawn in its eps's colour, labelled once per eps."""
    ds = _batched_trajectory(rng, B=3, eps_batch=[0.1, 0.1, 0.01])
    curve = xr.Dataset(
        {"h0": (("y_grid", "state"), rng.random((5, 3))),
         "h1": (("y_grid", "state"), rng.random((5, 3)))},
        coords={"y_grid": np.linspace(0.0, 1.0, 5)},
    )  # fmt: skip
    _, ax = plt.subplots()
    plot_equilibrium_manifold([ds], curve, states=[1], ax=[ax])
    drawn = [ln for ln in ax.lines if len(ln.get_xdata()) == ds.sizes["time"]]
    assert len(drawn) == 3
    for ln, b in zip(drawn, (0, 1, 2)):
        np.testing.assert_array_equal(ln.get_xdata(), ds["y"].values[b, :, 0])
        np.testing.assert_array_equal(ln.get_ydata(), ds["x"].values[b, :, 1])
    assert [ln.get_label() for ln in drawn] == [
        r"$\varepsilon$ = 0.1", "_nolegend_", r"$\varepsilon$ = 0.01"]  # fmt: skip
    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--" and len(ln.get_xdata())]
    y1 = curve["h0"].values[:, 1]
    np.testing.assert_allclose(dashed[0].get_ydata(), y1 + 0.1 * curve["h1"].values[:, 1])
    np.testing.assert_allclose(dashed[1].get_ydata(), y1 + 0.01 * curve["h1"].values[:, 1])


def _branches(with_oscillation):
    y = np.linspace(-1.0, 1.0, 6)
    data = {
        "curve_y": ("point", y, {"long_name": "slow variable y"}),
        "curve_mean": ("point", y**2, {"long_name": "mean state c.x", "units": "state"}),
        "curve_stability": ("point", np.where(y < 0, -1.0, 1.0)),
        "branch_id": ("point", (y >= 0).astype(int)),
        "linear_mean": ("point", 0.5 * y),
    }
    attrs = {"kappa": 3.0, "gap": 0.25, "folds": json.dumps([{"y": 0.0, "mean": 0.0}])}
    if with_oscillation:
        ts = np.linspace(0.0, 1.0, 4)
        data["osc_y"] = ("osc_time", np.sin(ts), {"long_name": "y(t) of the full system"})
        data["osc_mean"] = ("osc_time", np.cos(ts))
        attrs["osc_eps"] = 0.01
    return xr.Dataset(data, attrs=attrs)


def test_branches_split_by_stability_and_labelled():
    ds = _branches(with_oscillation=False)
    fig, ax = plt.subplots()
    assert plot_branches(ds, ax=ax) is fig
    stable, repelling = ax.lines[0], ax.lines[1]
    sel = ds["branch_id"].values == 0
    np.testing.assert_array_equal(stable.get_xdata(), ds["curve_y"].values[sel])
    assert stable.get_linestyle() == "-" and repelling.get_linestyle() == "--"
    np.testing.assert_array_equal(repelling.get_ydata(), ds["curve_mean"].values[~sel])
    assert ax.get_xlabel() == "slow variable y"
    assert ax.get_ylabel() == "mean state c.x [state]"
    # the folds are in the legend (unexplained black dots before), drawn above other marks
    folds = [ln for ln in ax.lines if ln.get_label() == "fold"]
    assert [(ln.get_xdata()[0], ln.get_ydata()[0]) for ln in folds] == [
        (f["y"], f["mean"]) for f in json.loads(ds.attrs["folds"])]
    assert "fold" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(ln.get_zorder() > 3 for ln in folds)


def test_branches_of_unresolved_stability_have_their_own_colour_and_label():
    """Where float64 does not resolve the sign of Re lambda (`curve_stability_error >=
    |curve_stability|`), the plot coloured the branch stable or repelling by the raw sign all
    the same (a branch of +1e-17 +- 1e-14 came out dashed red). Now a branch with no resolved
    point is drawn in its own colour and label, each unresolved point is marked in it, and a
    branch takes the stability the dataset's `branches` give (as the CLI prints it)."""
    y = np.linspace(-1.0, 1.0, 9)
    bid = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])
    stab = np.array([-1.0, -0.5, -0.1, 1e-17, 3e-17, -2e-17, 1e-17, 0.5, 1.0])
    err = np.array([1e-15, 1e-15, 1e-15, 1e-14, 1e-14, 1e-14, 1e-14, 1e-15, 1e-15])
    branches = [{"index": 0, "stable": True}, {"index": 1, "stable": None},
                {"index": 2, "stable": False}]  # fmt: skip
    ds = xr.Dataset(
        {
            "curve_y": ("point", y),
            "curve_mean": ("point", y**2),
            "curve_stability": ("point", stab),
            "curve_stability_error": ("point", err),
            "branch_id": ("point", bid),
            "linear_mean": ("point", 0.5 * y),
        },
        attrs={"kappa": 3.0, "gap": 0.25, "folds": "[]", "branches": json.dumps(branches)},
    )
    fig, ax = plt.subplots()
    plot_branches(ds, ax=ax)
    drawn = [ln for ln in ax.lines if ln.get_label() and not ln.get_label().startswith("_")]

    def branch_line(b):  # the line drawn through exactly branch b's points
        (line,) = [ln for ln in drawn if np.array_equal(ln.get_xdata(), y[bid == b])]
        return line

    stable, unresolved, repelling = (branch_line(b) for b in (0, 1, 2))
    assert stable.get_label() == "stable branch" and stable.get_linestyle() == "-"
    assert repelling.get_label() == "repelling branch" and repelling.get_linestyle() == "--"
    assert "unresolved" in unresolved.get_label()
    colours = {ln.get_color() for ln in (stable, unresolved, repelling)}
    assert len(colours) == 3  # the unresolved colour is neither stable's nor repelling's
    (marks,) = [ln for ln in drawn if ln.get_linestyle() == "None"]
    np.testing.assert_array_equal(marks.get_xdata(), y[err >= np.abs(stab)])
    assert "unresolved" in marks.get_label() and marks.get_color() == unresolved.get_color()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert marks.get_label() in legend and unresolved.get_label() in legend


def test_branches_with_oscillation_need_two_axes():
    ds = _branches(with_oscillation=True)
    fig, axes = plt.subplots(1, 2)
    assert plot_branches(ds, ax=axes) is fig
    np.testing.assert_array_equal(axes[1].lines[0].get_ydata(), ds["osc_y"].values)
    assert axes[1].get_xlabel() == "slow time t"  # osc_time has no attributes
    assert axes[1].get_ylabel() == "y(t) of the full system"
    with pytest.raises(ValueError, match="2 panel"):
        plot_branches(ds, ax=axes[0])


def test_axis_label():
    da = xr.DataArray([1.0], dims="t")
    assert axis_label(da, "fallback") == "fallback"
    assert axis_label(da.assign_attrs(units="s"), "fallback") == "fallback [s]"
    assert axis_label(da.assign_attrs(long_name="time", units="1"), "f") == "time"
    assert axis_label(da.assign_attrs(long_name="time", units="ms"), "f") == "time [ms]"


def test_save_figure_writes_and_closes(tmp_path, rng):
    fig = plot_trajectory(_trajectory(rng))
    path = save_figure(fig, tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.number not in plt.get_fignums()
    kept = plot_trajectory(_trajectory(rng))
    save_figure(kept, tmp_path / "t.svg", close=False)
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")
    assert kept.number in plt.get_fignums()


def _ablation_folder(tmp_path, listed, stale, evals):
    """A reproduce folder whose ablation.nc lists `listed` `{arm: seeds}`; `stale` runs lie
    beside them (an earlier ablation's); every run evaluated at `evals` steps."""
    from fastslow_sim.io import save_dataset

    arms = list(listed)
    seeds = max(listed.values())
    save_dataset(xr.Dataset({"val_loss": (("arm", "seed"), np.ones((len(arms), seeds)))},
                            coords={"arm": arms, "seed": np.arange(seeds)}),
                 tmp_path / "ablation.nc")  # fmt: skip
    runs = [(a, s) for a, n in listed.items() for s in range(n)] + stale
    for arm, seed in runs:
        (tmp_path / f"{arm}-seed{seed}").mkdir()
        steps = np.arange(1, 5)
        save_dataset(xr.Dataset({"gate": (("step", "layer"), np.full((4, 2), 0.1)),
                                 "val_loss": ("eval_step", np.full(len(evals), 1.5))},
                                coords={"step": steps, "eval_step": evals}),
                     tmp_path / f"{arm}-seed{seed}" / "train.nc")  # fmt: skip
    return tmp_path


@pytest.mark.parametrize("plot", [plot_val_loss, plot_gates])
def test_training_curves_show_exactly_the_runs_of_the_ablation(tmp_path, plot):
    # reproduce --seeds 3, then --seeds 1 into the same folder: the validation loss said
    # "3 seeds" beside an ablation of 1; a coupled-only ablation drew an older dense run
    folder = _ablation_folder(tmp_path, {"coupled": 1},
                              [("coupled", 1), ("coupled", 2), ("dense", 0)], np.array([4]))
    fig = plot({"me": folder})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["coupled (1 seed)"] + (["final, on every validation window"]
                                             if plot is plot_val_loss else [])  # fmt: skip


def test_the_final_loss_on_every_window_is_drawn_beside_the_sampled_curve(tmp_path):
    """The curve is the loss on 8 sampled batches (1.5 here); the table's final loss is on every
    aligned window (ablation.nc, 1.0 here, mean over seeds): the figure had shown only the
    former under the label "validation loss", below the Bayes floor where the table is above."""
    folder = _ablation_folder(tmp_path, {"coupled": 2}, [], np.array([2, 4]))
    ablation = fs_io.load_dataset(folder / "ablation.nc")
    ablation["val_loss"].values[:] = [[1.0, 1.2]]
    (folder / "ablation.nc").unlink()
    fs_io.save_dataset(ablation, folder / "ablation.nc")
    ax = plot_val_loss({"me": folder}).axes[0]
    (diamond,) = [ln for ln in ax.get_lines() if ln.get_marker() == "D" and len(ln.get_xdata())]
    assert diamond.get_xdata().tolist() == [4] and diamond.get_ydata().tolist() == [pytest.approx(1.1)]
    (curve,) = [ln for ln in ax.get_lines() if ln.get_label() == "coupled (2 seeds)"]
    assert curve.get_ydata().tolist() == [1.5, 1.5]
    assert ax.get_ylabel() == "validation loss on sampled batches (nats/token)"


def test_a_validation_curve_of_one_evaluation_is_drawn_as_a_marker(tmp_path):
    # a run evaluated once drew a line of one point: nothing visible
    fig = plot_val_loss({"me": _ablation_folder(tmp_path, {"coupled": 2}, [], np.array([4]))})
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "coupled (2 seeds)"]
    assert line.get_marker() == "o" and len(line.get_xdata()) == 1


@pytest.mark.parametrize("plot", [plot_val_loss, plot_gates])
def test_a_listed_run_that_is_gone_is_left_out_not_an_error(tmp_path, plot):
    # the review of the fix above: a listed run whose train.nc was removed stopped
    # training-figures ("no dataset at ...") where the glob had drawn what was there
    folder = _ablation_folder(tmp_path, {"coupled": 2, "frozen-slow": 1}, [], np.array([4]))
    (folder / "coupled-seed1" / "train.nc").unlink()
    (folder / "frozen-slow-seed0" / "train.nc").unlink()
    labels = [t.get_text() for t in plot({"me": folder}).axes[0].get_legend().get_texts()]
    assert labels[0] == "coupled (1 seed)" and len(labels) == (2 if plot is plot_val_loss else 1)


@pytest.mark.parametrize("plot", [plot_val_loss, plot_gates])
def test_seeds_of_different_lengths_are_each_drawn_on_their_own_steps(tmp_path, plot):
    """One seed's run stopped after 2 of 4 steps (train.nc re-saved as `isel(step=slice(0, 2))`):
    `np.array` of the seeds' curves raised "setting an array element with a sequence ... an
    inhomogeneous shape" (training-figures exit 1), and seed 0's steps stood for every seed's.
    Each seed is drawn on its own steps, the mean over the steps both logged."""
    folder = _ablation_folder(tmp_path, {"coupled": 2}, [], np.array([1, 2, 3, 4]))
    path = folder / "coupled-seed1" / "train.nc"
    short = fs_io.load_dataset(path).isel(step=slice(0, 2), eval_step=slice(0, 2))
    short["gate"].values[:] = 0.3
    short["val_loss"].values[:] = 2.5
    path.unlink()
    fs_io.save_dataset(short, path)
    ax = plot({"me": folder}).axes[0]
    runs = {ln.get_label(): ln for ln in ax.get_lines() if "run" in ln.get_label()}
    if plot is plot_val_loss:
        assert runs["_coupled run 0"].get_xdata().tolist() == [1, 2, 3, 4]
        assert runs["_coupled run 0"].get_ydata().tolist() == [1.5] * 4
        assert runs["_coupled run 1"].get_xdata().tolist() == [1, 2]
        assert runs["_coupled run 1"].get_ydata().tolist() == [2.5, 2.5]
    else:
        for layer in (0, 1):
            assert runs[f"_coupled run 0, layer {layer}"].get_xdata().tolist() == [1, 2, 3, 4]
            assert runs[f"_coupled run 1, layer {layer}"].get_xdata().tolist() == [1, 2]
            assert runs[f"_coupled run 1, layer {layer}"].get_ydata().tolist() == [0.3, 0.3]
    (mean,) = [ln for ln in ax.get_lines() if ln.get_label() == "coupled (2 seeds)"]
    assert mean.get_xdata().tolist() == [1, 2]  # the steps both seeds logged
    assert mean.get_ydata().tolist() == pytest.approx([2.0, 2.0] if plot is plot_val_loss
                                                      else [0.2, 0.2])  # fmt: skip


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg", "svgz", "eps", "ps"])
def test_the_same_figure_saved_twice_gives_the_same_bytes(tmp_path, rng, fmt):
    """PNG and PDF were reproducible; an SVG held the time in <dc:date> and random ids, an
    SVGZ also gzip's time and the temporary file's name, a PS or EPS file %%CreationDate and
    a %%Title naming the temporary file. Still marked as fastslow-sim's (replaceable)."""
    ds = _trajectory(rng)
    path = tmp_path / f"t.{fmt}"
    save_figure(plot_trajectory(ds), path)
    first = path.read_bytes()
    save_figure(plot_trajectory(ds), path)  # replaces its own file
    assert path.read_bytes() == first
    assert fs_io.written_by_us(path)
    if fmt in ("eps", "ps"):
        head = first[: first.index(b"%%EndComments")]
        assert b"%%CreationDate" not in head and b"%%Title: t." + fmt.encode() + b"\n" in head
    if fmt == "svg":
        assert b"<dc:date>" not in first


def test_a_failed_trajectory_spans_its_run_marks_lone_points_and_says_where_it_stopped(rng):
    """`integrate --eps 0.001 --method rk45 --max-steps 50 --plot`: every state after t = 0 is
    NaN. The figure was blank (one point of a line draws nothing) on an x axis of -0.04..0.04;
    it spans the run's [0, 2] here, marks the lone points and names where the solver stopped."""
    ds = _trajectory(rng, T=9)
    for k in ("x", "y", "p_st"):
        ds[k].values[3:] = np.nan  # saved states at t = 0, 0.25, 0.5, then none
    ds["x"].values[1] = np.nan  # x at t = 0 alone: no segment reaches it
    ds.attrs["status"] = "max_steps"
    fig = plot_trajectory(ds)
    ax_x, ax_y = fig.axes
    assert ax_x.get_xlim() == (0.0, 2.0) and ax_y.get_xlim() == (0.0, 2.0)
    x0 = [ln for ln in ax_x.lines if ln.get_label() == "$x_{0}$"][0]
    assert x0.get_marker() == "o" and x0.get_markevery() == [0, 2]  # t = 0 alone, t = 0.5 too
    y0 = [ln for ln in ax_y.lines if ln.get_label() == "$y_{0}$"][0]
    assert y0.get_marker() in ("None", "", None) or not y0.get_markevery()  # a segment 0..0.5
    assert [t.get_text() for t in ax_y.texts] == ["solver stopped (max_steps) after t = 0.5"]
    stops = [ln for ln in ax_x.lines + ax_y.lines if ln.get_linestyle() == ":"]
    assert [ln.get_xdata()[0] for ln in stops] == [0.5, 0.5]
    # into a caller's two Axes that do not share x: the lower panel spans the run too
    f, axs = plt.subplots(2, 1)
    plot_trajectory(ds, ax=axs)
    assert [a.get_xlim() for a in axs] == [(0.0, 2.0), (0.0, 2.0)]


def test_a_newline_in_an_eps_name_stays_in_its_title_comment(tmp_path):
    """The title comment took the name up to a newline and left the rest (and the temporary
    name matplotlib had written there) as PostScript lines to run."""
    name = tmp_path / "x\nshowpage quit\n.eps"
    heads = []
    for _ in range(2):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1])
        data = save_figure(fig, name).read_bytes()
        heads.append(data)
    assert heads[0] == heads[1]
    head = heads[0][: heads[0].find(b"%%EndComments")].decode()
    assert "%%Title: x?showpage quit?.eps\n" in head
    assert all(line.startswith(("%!", "%%")) for line in head.splitlines())


def test_a_successful_trajectory_has_no_stop_note_and_no_markers(rng):
    fig = plot_trajectory(_trajectory(rng))
    assert len(fig.axes[1].texts) == 0 and fig.axes[0].get_xlim() == (0.0, 2.0)
    assert all(ln.get_marker() in ("None", None) for ln in fig.axes[0].lines)


def test_one_trajectory_of_a_batch_is_titled_as_such_with_its_own_status(rng):
    """`integrate --batch 4 --plot` drew trajectory 0 alone under the batch's status ("status
    4 of 4 trajectories failed"), nothing saying it was 1 of 4."""
    ds = _batched_trajectory(rng)
    ds["status"] = ("batch", ["success", "max_steps", "success", "max_steps"])
    ds.attrs.update(status="2 of 4 trajectories failed", batch_size=4)
    indexed = ds.assign_coords(batch=np.arange(4))
    title = plot_trajectory(indexed.isel(batch=1)).axes[0].get_title()
    assert title == "test: eps = 0.125, method radau, status max_steps, trajectory 1 of 4"
    title = plot_trajectory(ds.isel(batch=0)).axes[0].get_title()  # no batch coordinate
    assert title == "test: eps = 0.125, method radau, status success, one trajectory of 4"
    title = plot_trajectory(ds).axes[0].get_title()  # the whole batch: its summary
    assert title == ("test: eps = 0.125, method radau, status 2 of 4 trajectories failed, "
                     "4 trajectories")


TV_REFS = ("Bayes filter, head readout", "Bayes filter p_st", "corpus frequencies")


def _tv_row(sweep, x, arm):
    return {"sweep": sweep, sweep: x, "arm": arm, "run": f"{arm}-{x}",
            "tv": {k: {"mean": 0.1, "se": 0.01} for k in (*TV_REFS, "model head")}}  # fmt: skip


@pytest.mark.parametrize("rows", [
    [_tv_row("P", P, "coupled") for P in (4, 8)],
    [_tv_row("tokens", 1000, "dense"), _tv_row("P", 4, "coupled")],
], ids=["P only", "an arm in the P sweep only"])  # fmt: skip
def test_tv_sweep_legend_names_every_series_of_either_panel(rows):
    """The legend was read from the tokens panel alone: rows of the P sweep only drew no legend
    entry at all, and an arm swept in P only was unlabelled; now every drawn series is named once."""
    fig = plot_tv_sweep(rows)
    (legend,) = fig.legends
    named = [t.get_text() for t in legend.get_texts()]
    arms = {f"{r['arm']}: model head" for r in rows}
    assert sorted(named) == sorted({*TV_REFS, *arms})
    for ax in fig.axes:  # every labelled artist of each panel is in it
        assert set(ax.get_legend_handles_labels()[1]) <= set(named)


@pytest.mark.parametrize("plot, empty, name", [(plot_phi_vs_pst, {}, "results"),
                                               (plot_tv_sweep, [], "rows")])  # fmt: skip
def test_phi_plots_of_no_result_refuse_in_one_sentence(plot, empty, name):
    """plot_phi_vs_pst({}) raised a bare StopIteration, and plot_tv_sweep([]) drew two empty
    panels under its title; both now refuse, naming the empty argument."""
    import re

    from fastslow_sim.errors import InputError

    said = rf"^{name} is {re.escape(repr(empty))}, no .*; expected .*\.$"
    with pytest.raises(InputError, match=said):
        plot(empty)
    assert not plt.get_fignums()  # refused before a figure was made


def test_multirate_titles_say_what_the_data_show_not_the_expected_result():
    """The titles said "the error does not grow as eps -> 0" and "first order in H at every
    eps" whatever the dataset held; now they give its errors at the H drawn and its fitted
    orders, and an order null in the JSON is n/d (was a TypeError)."""
    eps, H = np.array([0.1, 1e-3, 1e-6]), np.array([0.2, 0.1, 0.05])
    err = np.array([[1.0], [2.0], [4.0]]) * H  # grows 4x as eps -> 0
    ds = xr.Dataset({"err_y": (("eps", "H"), err), "err_x": (("eps", "H"), err)},
                    coords={"eps": eps, "H": H},
                    attrs={"H_fixed": 0.05, "orders": json.dumps([0.5, 1.0, None])})  # fmt: skip
    fig = plot_multirate(ds)
    left, right = (a.get_title() for a in fig.axes)
    assert left == "H = 0.05: slow error 0.05 (eps 0.1) to 0.2 (eps 1e-06)"
    assert right == "fitted order in H: 0.50 to 1.00"
    named = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert named[0].endswith("(order 0.50)") and named[2].endswith("(order n/d)")


@pytest.mark.parametrize("seeds", [1, 3])
def test_ablation_title_claims_an_interval_only_where_one_is_drawn(seeds):
    """With one seed the table's 95% intervals are NaN and no bar is drawn, yet the title said
    "mean and 95% t interval"; it says so only where every interval is finite."""
    loss = {"coupled": [3.0, 3.1, 3.05][:seeds], "dense": [3.02, 3.08, 3.1][:seeds]}
    # as training.paired_comparison writes it (NaN interval for one seed; not imported: torch)
    ci = [-0.07, 0.04] if seeds > 1 else [float("nan")] * 2
    table = {"margin": 0.01, "comparisons": [{"a": "coupled", "b": "dense", "mean_diff": -0.02,
                                              "ci95": ci}]}  # fmt: skip
    ds = xr.Dataset({"val_loss": (("arm", "seed"), np.array(list(loss.values())))},
                    coords={"arm": list(loss), "seed": np.arange(seeds)},
                    attrs={"table": json.dumps(table, default=float)})  # fmt: skip
    title = plot_ablation({"me": ds}).axes[0].get_title()
    interval = np.isfinite(table["comparisons"][0]["ci95"]).all()
    assert interval == (seeds > 1)
    assert title.endswith("mean and 95% t interval" if interval else
                          "mean only (no finite 95% t interval; it needs 2 seeds or more)")  # fmt: skip


def test_each_final_loss_is_drawn_at_the_step_where_its_runs_ended(tmp_path):
    """Seed 1 stopped after 2 of 4 evaluations: the final-loss diamond was one mean over both
    seeds at step 4, where seed 1 never was; each end step has its own diamond, mean over
    the seeds that ended there."""
    folder = _ablation_folder(tmp_path, {"coupled": 3}, [], np.array([1, 2, 3, 4]))
    ablation = fs_io.load_dataset(folder / "ablation.nc")
    ablation["val_loss"].values[:] = [[1.0, 1.3, 1.4]]
    (folder / "ablation.nc").unlink()
    fs_io.save_dataset(ablation, folder / "ablation.nc")
    path = folder / "coupled-seed1" / "train.nc"
    short = fs_io.load_dataset(path).isel(eval_step=slice(0, 2))
    path.unlink()
    fs_io.save_dataset(short, path)
    ax = plot_val_loss({"me": folder}).axes[0]
    diamonds = [ln for ln in ax.get_lines() if ln.get_marker() == "D" and len(ln.get_xdata())]
    assert sorted((ln.get_xdata()[0], ln.get_ydata()[0]) for ln in diamonds) == [
        (2, pytest.approx(1.3)), (4, pytest.approx(1.2))]  # seed 1; seeds 0 and 2  # fmt: skip


@pytest.mark.parametrize("plot, name, expected", [
    (plot_gates, "ablation_dirs", "{corpus: reproduce folder}"),
    (plot_val_loss, "ablation_dirs", "{corpus: reproduce folder}"),
    (plot_wall_clock, "ablation_dirs", "{corpus: reproduce folder}"),
    (plot_ablation, "ablations", "{corpus: ablation dataset}"),
])  # fmt: skip
def test_training_plots_of_no_corpus_refuse_in_one_sentence(plot, name, expected):
    """plot_gates({}) and the others raised matplotlib's "Number of columns must be a positive
    integer, not 0"; they refuse naming the empty argument, before a figure is made."""
    import re

    from fastslow_sim.errors import InputError

    said = rf"^{name} is \{{\}}, no corpus to draw; expected {re.escape(expected)} with at least one corpus\.$"
    with pytest.raises(InputError, match=said):
        plot({})
    assert not plt.get_fignums()


def test_equilibrium_manifold_title_says_what_the_runs_show(rng):
    """The title said the trajectories "follow the critical manifold" whatever they did, a
    failed run too; it gives the measured distance to h0 at the end, per eps, over the
    successful trajectories, and counts the failed ones."""
    curve = xr.Dataset({"h0": (("y_grid", "state"), np.tile([0.2, 0.3, 0.5], (5, 1))),
                        "h1": (("y_grid", "state"), np.zeros((5, 3)))},
                       coords={"y_grid": np.linspace(0.0, 1.0, 5)})  # fmt: skip
    runs = [_trajectory(rng).assign_attrs(eps=e) for e in (0.1, 0.01)]
    runs[0]["x"].values[-1] = [0.25, 0.3, 0.45]  # 0.05 from h0 at its end
    runs[1].attrs["status"] = "max_steps"
    title = plot_equilibrium_manifold(runs, curve)._suptitle.get_text()
    assert "follow" not in title
    assert title.endswith(r"$\max_i |x_i - h_{0,i}(y)|$ = 0.05 (eps 0.1); 1 of 2 trajectories "
                          "failed (max_steps), not measured")  # fmt: skip
    runs[0].attrs["status"] = "non_finite"
    title = plot_equilibrium_manifold(runs, curve)._suptitle.get_text()
    assert title.endswith("distance to $h_0$ not measured; 2 of 2 trajectories failed "
                          "(non_finite, max_steps), not measured")  # fmt: skip


def test_wall_clock_bar_of_an_arm_with_a_failed_seed_is_the_mean_of_the_others(tmp_path):
    """One NaN seed (a failed run) made its arm's bar NaN, so nothing was drawn; the bar is the
    mean of the finite seeds, counted under the arm, and an arm with none says it failed."""
    wall = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [2.0, 2.0, 2.0]])
    arms = ["coupled", "dense", "frozen-slow"]
    fs_io.save_dataset(xr.Dataset({"wall_time_s": (("arm", "seed"), wall)},
                                  coords={"arm": arms, "seed": np.arange(3)},
                                  attrs={"tokens": 1024}), tmp_path / "ablation.nc")  # fmt: skip
    ax = plot_wall_clock({"me": tmp_path}).axes[0]
    assert [b.get_height() for b in ax.patches] == [2.0, 0.0, 2.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "coupled\n(2 of 3 seeds)", "dense\n(failed: no finite time)", "frozen-slow"]


def test_multirate_labels_carry_units_and_slope_one_is_anchored_on_a_finite_error():
    """The y labels ignored err_y's units (plot_convergence shows them), and the slope-1 line,
    anchored on the last eps's last-H error, vanished when that error was NaN."""
    eps, H = np.array([0.1, 1e-3]), np.array([0.2, 0.1])
    err = np.array([[0.4, 0.2], [0.8, np.nan]])
    ds = xr.Dataset({"err_y": (("eps", "H"), err, {"units": "m"}), "err_x": (("eps", "H"), err)},
                    coords={"eps": eps, "H": H},
                    attrs={"H_fixed": 0.1, "orders": json.dumps([1.0, None])})  # fmt: skip
    fig = plot_multirate(ds)
    assert [a.get_ylabel()[-4:] for a in fig.axes] == [" [m]", " [m]"]
    (ref,) = [ln for ln in fig.axes[1].get_lines() if ln.get_label() == "slope 1"]
    np.testing.assert_allclose(ref.get_ydata(), [0.8, 0.4])  # through (H 0.2, 0.8)


def test_multirate_fast_error_legend_leaves_out_the_first_block_as_the_data_do():
    """err_x is the max over block ends k >= 1 (gallery.multirate_error_dataset leaves out k = 0,
    the start t = 0); the legend said max_k, over every block end."""
    eps, H = np.array([0.1, 1e-3]), np.array([0.2, 0.1])
    err = np.array([[0.4, 0.2], [0.8, 0.4]])
    ds = xr.Dataset({"err_y": (("eps", "H"), err), "err_x": (("eps", "H"), err)},
                    coords={"eps": eps, "H": H},
                    attrs={"H_fixed": 0.1, "orders": json.dumps([1.0, 1.0])})  # fmt: skip
    labels = [ln.get_label() for ln in plot_multirate(ds).axes[0].get_lines()]
    assert r"fast $\max_{k \geq 1} |x_k - x(kH)|_\infty$" in labels
    assert r"slow $\max_k |y_k - y(kH)|$" in labels


def test_multirate_H_axis_is_labelled_at_the_data_s_H_only():
    """The log axis over one decade of H also labelled its minor ticks (2x10^-2, 3x10^-2, ...),
    which ran into each other; the ticks are now the H values of the data."""
    eps, H = np.array([0.1, 1e-3]), np.array([0.2, 0.1, 0.05, 0.025, 0.0125])
    err = np.outer([1.0, 0.5], H)
    ds = xr.Dataset({"err_y": (("eps", "H"), err), "err_x": (("eps", "H"), err)},
                    coords={"eps": eps, "H": H},
                    attrs={"H_fixed": 0.05, "orders": json.dumps([1.0, 1.0])})  # fmt: skip
    fig = plot_multirate(ds)
    fig.canvas.draw()
    ax = fig.axes[1]
    major = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    minor = [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    assert major == ["0.2", "0.1", "0.05", "0.025", "0.0125"] and minor == []


@pytest.mark.parametrize("sweep, empty", [("P", "tokens"), ("tokens", "P")])
def test_tv_sweep_panel_of_a_sweep_absent_from_the_rows_says_so(sweep, empty):
    """Rows of one sweep left the other panel empty without a word."""
    x = (4, 8) if sweep == "P" else (1000, 2000)
    fig = plot_tv_sweep([_tv_row(sweep, v, "coupled") for v in x])
    texts = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert texts == ([[f"no {empty} sweep in these rows"], []] if empty == "tokens" else
                     [[], [f"no {empty} sweep in these rows"]])  # fmt: skip


def test_trajectory_title_of_an_unrecorded_eps_says_so(rng):
    """A NaN eps was titled "eps = nan to nan"."""
    ds = _trajectory(rng).assign_attrs(eps=float("nan"))
    assert "eps not recorded, method radau" in plot_trajectory(ds).axes[0].get_title()
    batch = _batched_trajectory(rng, B=3, eps_batch=[0.1, np.nan, 0.5])
    assert "eps = 0.1 to 0.5 (1 not recorded)," in plot_trajectory(batch).axes[0].get_title()


def test_ablation_of_one_arm_claims_no_interval():
    """A one-arm ablation (reproduce --arms coupled) has no comparison; the title claimed
    "mean and 95% t interval" over an empty panel (all() of no intervals is True)."""
    ds = xr.Dataset({"val_loss": (("arm", "seed"), np.array([[3.0, 3.1]]))},
                    coords={"arm": ["coupled"], "seed": np.arange(2)},
                    attrs={"table": json.dumps({"margin": 0.01, "comparisons": []})})  # fmt: skip
    ax = plot_ablation({"me": ds}).axes[0]
    assert ax.get_title() == "me: paired by seed (2 seeds), no paired comparison (one arm)"
    assert [t.get_text() for t in ax.texts] == ["no paired comparison: arms coupled"]
