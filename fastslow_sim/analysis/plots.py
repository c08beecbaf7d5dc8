"""Figures made from saved datasets, for notebooks and for the CLI alike.

Every plot function draws into the Axes it is given (`ax=`; a sequence of Axes for the figures
of several panels) or, without one, into a new figure, and returns the Figure. Nothing here
picks a matplotlib backend or writes a file: `save_figure(fig, path)` does that for a caller
that wants a file (the CLI, which selects the Agg backend first). Axis labels come from the
data's `long_name` and `units` attributes where it has them.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from .._version import __version__
from ..wording import plural
from .palette import WIDTH, eps_color, state_colors


def check_figure_format(path, what: str = "figure path") -> None:
    """`InputError` unless matplotlib can write `path`'s format (its suffix; PNG without one)
    here: a known format, and for .pgf the TeX system that typesets it installed."""
    from matplotlib.backend_bases import FigureCanvasBase

    from fastslow_sim.errors import InputError

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if fmt not in formats:
        raise InputError(
            f"the {what} {str(path)!r} asks for format {fmt!r}, which matplotlib cannot "
            f"write; expected a suffix among {', '.join(formats)}."
        )
    if fmt == "pgf":  # matplotlib typesets a .pgf figure's text with TeX: refused before the run
        import shutil

        tex = matplotlib.rcParams["pgf.texsystem"]
        if shutil.which(tex) is None:
            raise InputError(
                f"the {what} {str(path)!r} asks for format 'pgf', which matplotlib "
                f"writes with {tex} (rcParams['pgf.texsystem']), and {tex} is not installed "
                f"here; expected another suffix (.pdf, .svg, .png) or a TeX installation."
            )


def script_figure(path):
    """For a script that ends by saving one figure at `path`: checks now, before the script's
    work, that `path` may be written (a file of the user's there is never replaced) and returns
    `save(fig)`, which writes it with `save_figure`. Either ends the script with one sentence on
    stderr, not a traceback, where the file cannot be written: exit status 2 for a path refused
    (as the CLI refuses bad input), 1 for a write the system failed."""
    import sys

    from fastslow_sim.errors import InputError
    from fastslow_sim.io import check_file_name, check_writable

    def refuse(err: Exception):
        print(f"Error: {err}", file=sys.stderr)
        sys.exit(2 if isinstance(err, InputError) else 1)

    try:
        check_file_name(path, "figure")  # Path() drops the slash: a PNG named after it
        check_figure_format(path)
        check_writable(path, "figure")
    except InputError as err:
        refuse(err)

    def save(fig) -> Path:
        try:  # checked again at the write: a file made meanwhile
            return save_figure(fig, path)
        except (InputError, OSError) as err:
            refuse(err)

    return save


EXAMPLES_RESULTS = Path("fastslow-results") / "examples"  # in the CLI's default, git-ignored


def script_arguments(doc: str, name: str, argv=None):
    """For an example script run from the command line: its arguments, `--help` (usage, with the
    script's docstring `doc` as description; exits 0 having done nothing) and `--out PATH`, the
    figure's path, by default `fastslow-results/examples/NAME.png` (its folders made; the CLI's
    default outputs go to the git-ignored `fastslow-results/` too), and not the current folder,
    which is the repository's root when run as the docstrings show. Returns `(path, save)`, with
    `save` from `script_figure(path)`: a file of the user's at `path` is refused now, before
    the script's work, with one sentence on stderr and exit status 2 (usage errors too)."""
    import argparse
    import sys

    from fastslow_sim.errors import InputError
    from fastslow_sim.validation import folder

    parser = argparse.ArgumentParser(
        prog=f"python scripts/examples/{name}.py", description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--out", metavar="PATH", default=None,
                        help=f"the figure's file; the format from its suffix (PNG, PDF, SVG, ...) "
                             f"[default: {EXAMPLES_RESULTS / (name + '.png')}]")  # fmt: skip
    args = parser.parse_args(argv)
    path = args.out
    if path is None:
        try:
            folder(EXAMPLES_RESULTS, "default output folder").mkdir(parents=True, exist_ok=True)
        except (InputError, OSError) as err:
            print(f"Error: {err}", file=sys.stderr)
            sys.exit(2 if isinstance(err, InputError) else 1)
        path = EXAMPLES_RESULTS / f"{name}.png"
    return path, script_figure(path)


def save_figure(fig, path, *, dpi: int = 130, close: bool = True) -> Path:
    """Write `fig` to `path` (format from the suffix, PNG without one), atomically: the file is
    either complete on disk or absent. A PNG, PDF, SVG, PS, TIFF or WebP file names
    fastslow-sim in its Software or Creator metadata, the mark that lets a later run
    replace it (`fastslow_sim.io`: a file without it is never replaced). Closes the figure unless `close=False`."""
    import matplotlib

    from fastslow_sim.io import MARK, atomic_path, check_file_name

    check_file_name(path, "figure")  # before Path() drops the separator
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    me = f"{MARK} {__version__} (Matplotlib v{matplotlib.__version__})"
    # no creation date in a PDF or an SVG: the same figure gives the same bytes (clean diffs in
    # figures/); PS and EPS take no date key (matplotlib's PS backend reads only Creator), so
    # `_reproducible_ps` takes their date line out after the write
    meta = {"png": {"Software": me}, "pdf": {"Creator": me, "CreationDate": None},
            "svg": {"Creator": me, "Date": None}, "svgz": {"Creator": me, "Date": None},
            "eps": {"Creator": me}, "ps": {"Creator": me}}.get(fmt)  # fmt: skip
    pil = None  # TIFF and WebP, written through Pillow, carry the mark in its options
    if fmt in ("tif", "tiff"):
        pil = {"tiffinfo": {305: me}}  # Software
    elif fmt == "webp":
        from PIL import Image

        exif = Image.Exif()
        exif[305] = me
        pil = {"exif": exif.tobytes()}
    kw = {"metadata": meta} if pil is None else {"pil_kwargs": pil}
    try:
        # an SVG's ids (clip paths, glyphs) are hashed with a random salt unless one is set
        salt = matplotlib.rcParams["svg.hashsalt"] or MARK
        with atomic_path(path, "figure") as tmp, matplotlib.rc_context({"svg.hashsalt": salt}):
            try:
                if fmt == "svgz":  # gzip's header holds the time and the temporary file's name
                    import gzip
                    import io

                    svg = io.BytesIO()
                    fig.savefig(svg, format="svg", dpi=dpi, bbox_inches="tight", **kw)
                    tmp.write_bytes(gzip.compress(svg.getvalue(), mtime=0))
                else:
                    fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", **kw)
                    if fmt in ("eps", "ps"):
                        _reproducible_ps(tmp, path.name)
            except Exception as err:  # noqa: BLE001 - matplotlib's LatexError has no public base
                # a TeX engine that exits at once may also close its pipe before matplotlib
                # has written to it: the same failure, one sentence either way
                died = fmt == "pgf" and isinstance(err, BrokenPipeError)
                if type(err).__name__ != "LatexError" and not died:
                    raise
                tex = matplotlib.rcParams["pgf.texsystem"]
                first = "it exited before reading its input" if died else \
                    (str(err).strip().splitlines() or ["no message"])[0][:160]
                raise OSError(0, f"{tex} failed to typeset the figure's text ({first})",
                              str(path)) from None  # fmt: skip
    finally:
        if close:
            plt.close(fig)
    return path


def _reproducible_ps(tmp: Path, name: str) -> None:
    """A PS or EPS file written at `tmp` without its `%%CreationDate` comment (the time of the
    write, which matplotlib sets whatever the metadata say) and with `name` as its `%%Title`
    (matplotlib's is the file it wrote, the temporary one, whose name is random): the same
    figure gives the same bytes. Only the header's comments, before `%%EndComments`, change."""
    import re

    data = tmp.read_bytes()
    end = data.find(b"%%EndComments")
    if end < 0:
        return
    head = re.sub(rb"^%%CreationDate:[^\n]*\n", b"", data[:end], flags=re.M)
    # one comment line: a control character (a newline in the name) would end it and leave
    # the rest of the name as PostScript to run
    title = "".join(c if c.isprintable() else "?" for c in name).encode("ascii", "replace")
    # matplotlib's title, the temporary name, runs to the next comment where it held a newline
    head = re.sub(rb"^%%Title:[^\n]*\n(?:(?!%%)[^\n]*\n)*", lambda _: b"%%Title: " + title + b"\n",
                  head, flags=re.M)  # fmt: skip
    tmp.write_bytes(head + data[end:])


def axis_label(da, default: str) -> str:
    """`long_name [units]` from a DataArray's attributes; `default` stands in for a missing
    long_name, and dimensionless units (`"1"`, `""`) are left out."""
    return da.attrs.get("long_name", default) + _units(da)


def _units(da) -> str:
    """`" [units]"` of a DataArray, or `""` when it has none or is dimensionless."""
    units = str(da.attrs.get("units", "")).strip()
    return "" if units in ("", "1") else f" [{units}]"


def refuse_empty(value, name: str, nothing: str, expected: str) -> None:
    """`InputError` "NAME is VALUE, NOTHING; expected EXPECTED." where `value` is empty: a
    figure of no data, refused before one is made."""
    from fastslow_sim.errors import InputError

    if not len(value):
        raise InputError(f"{name} is {value!r}, {nothing}; expected {expected}.")


def figure_axes(ax, n: int, **subplots_kw):
    """`(figure, [n Axes])`: those given in `ax` (one Axes, or a sequence or array of them), or
    the panels of a new figure made by `plt.subplots(**subplots_kw)`."""
    if ax is None:
        fig, axes = plt.subplots(squeeze=False, **subplots_kw)
        axes = list(axes.flat)
    else:
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        fig = axes[0].get_figure()
    if len(axes) != n:
        raise ValueError(f"this figure has {n} panel(s); got {len(axes)} Axes.")
    return fig, axes


def _trajectories(ds, name: str, last: str):
    """`ds[name]` as `(trajectories, time, last)`: a batched dataset from `integrate` holds
    `(batch, time, last)`, a single run `(time, last)` (one trajectory); any other dimensions
    but `time` and `last` count as batch dimensions, flattened in order."""
    da = ds[name]
    lead = [d for d in da.dims if d not in ("time", last)]
    return da.transpose(*lead, "time", last).values.reshape(-1, ds.sizes["time"], ds.sizes[last])


def _trajectory_eps(ds, count: int) -> np.ndarray:
    """The eps of each of a dataset's `count` trajectories: its `eps_batch` variable (one eps per
    trajectory, as `integrate(..., eps=[...])` writes it), else its `eps` attribute for all."""
    if "eps_batch" in ds:
        return np.broadcast_to(np.asarray(ds["eps_batch"].values, dtype=float).ravel(), (count,))
    return np.full(count, float(ds.attrs.get("eps", np.nan)))  # NaN: none recorded


def _eps_text(eps) -> str:
    """`eps = 0.1`, or `eps = 0.01 to 0.5` for trajectories of several eps; a NaN eps (none
    recorded) is counted, not shown as a value: `eps not recorded`."""
    eps = np.asarray(eps, dtype=float)
    known = eps[np.isfinite(eps)]
    if not len(known):
        return "eps not recorded"
    lo, hi = float(np.min(known)), float(np.max(known))
    text = f"eps = {lo:g}" if lo == hi else f"eps = {lo:g} to {hi:g}"
    return text if len(known) == len(eps) else f"{text} ({len(eps) - len(known)} not recorded)"


def plot_trajectory(ds, *, ax=None):
    """Two panels: `x_i(t)` (solid) with `p_st,i(y(t))` overlaid (dashed), and `y(t)`.

    A batched dataset (dimension `batch`) draws every trajectory, in the colour of its state (of
    its slow component in the `y` panel), with one legend entry per state; the title counts the
    trajectories. `ds.isel(batch=k)` plots one trajectory alone, titled with its own status
    (the `status` variable of a batch) as one of the batch's `batch_size` trajectories.
    The x axis spans the whole time coordinate; a point that no segment of its curve reaches
    (its neighbours NaN: a run that failed saves NaN after its last state) is marked, and a
    single trajectory that stopped early has a dotted line at its last saved time, labelled
    "solver stopped (status) after t = ...".
    `ax`: two Axes `(for x, for y)`, or None for a new figure. Returns the Figure.
    """
    t = ds["time"].values
    fig, (ax_x, ax_y) = figure_axes(ax, 2, nrows=2, ncols=1, figsize=(0.8 * WIDTH, 6.0), sharex=True,
                                    gridspec_kw={"height_ratios": [2, 1]})  # fmt: skip
    n = ds.sizes["state"]
    colors = state_colors(n)
    x = _trajectories(ds, "x", "state")
    p = _trajectories(ds, "p_st", "state") if "p_st" in ds else None
    y = _trajectories(ds, "y", "slow")
    B = len(x)
    lw, alpha = (1.4, 1.0) if B == 1 else (1.0, 0.7)
    for i in range(n):
        for b in range(B):
            ax_x.plot(t, x[b, :, i], color=colors[i], lw=lw, alpha=alpha, ms=4,
                      **_isolated(x[b, :, i]),
                      label=f"$x_{{{i}}}$" if b == 0 else "_nolegend_")  # fmt: skip
            if p is not None:
                ax_x.plot(t, p[b, :, i], color=colors[i], lw=1.0, ls="--", alpha=alpha,
                          ms=4, mfc="none", **_isolated(p[b, :, i]))  # fmt: skip
    if p is not None:
        ax_x.plot([], [], color="k", ls="--", lw=1.0, label=r"$p_{st}(y(t))$")
    ax_x.set_ylabel(axis_label(ds["x"], "probability"))
    # a batch's own status is its `status` variable, one per trajectory; its attribute says
    # how many of the whole batch failed, which is not this trajectory's (`ds.isel(batch=k)`)
    own = ds["status"] if "status" in ds.data_vars else None
    if own is not None and own.ndim == 0:
        status = str(own.values)
        index = f"trajectory {int(ds['batch'])}" if "batch" in ds.coords else "one trajectory"
        count = f", {index} of {int(ds.attrs['batch_size']):,}" if "batch_size" in ds.attrs \
            else ""  # fmt: skip
    else:
        status = str(ds.attrs.get("status", ""))
        count = "" if "batch" not in ds.dims and B == 1 else f", {B:,} trajectories"
    ax_x.set_title(
        f"{ds.attrs.get('system', '')}: {_eps_text(_trajectory_eps(ds, B))}, method "
        f"{ds.attrs.get('method', '')}, status {status}{count}"
    )
    ax_x.legend(ncol=3, fontsize=8, loc="center right")
    for k in range(ds.sizes["slow"]):
        for b in range(B):
            ax_y.plot(t, y[b, :, k], lw=1.5 if B == 1 else 1.0, alpha=alpha, color=f"C{k % 10}",
                      ms=4, **_isolated(y[b, :, k]),
                      label=f"$y_{{{k}}}$" if b == 0 else "_nolegend_")  # fmt: skip
    if len(t) > 1 and t[-1] > t[0]:  # the run's span, also where its states are NaN (both
        for a in (ax_x, ax_y):  # panels: a caller's two Axes need not share x)
            a.set_xlim(t[0], t[-1])
    finite = np.isfinite(x[0]).all(axis=1) & np.isfinite(y[0]).all(axis=1)
    if B == 1 and status != "success" and len(t) and not finite[-1]:
        last = np.flatnonzero(finite)
        stop = f"after t = {t[last[-1]]:g}" if len(last) else "before its first saved state"
        for a in (ax_x, ax_y):
            a.axvline(t[last[-1]] if len(last) else t[0], color="C3", lw=1.0, ls=":")
        why = f" ({status})" if status else ""
        ax_y.text(0.99, 0.95, f"solver stopped{why} {stop}", transform=ax_y.transAxes,
                  ha="right", va="top", fontsize=8, color="C3")  # fmt: skip
    ax_y.set_xlabel(axis_label(ds["time"], "slow time t"))
    ax_y.set_ylabel(axis_label(ds["y"], "slow variable y"))
    ax_y.legend(fontsize=8)
    return fig


def _isolated(v) -> dict:
    """`plot` keywords that mark the finite points of `v` that no segment of its line reaches
    (both neighbours NaN or absent): a run that failed has NaN after its last saved state, and
    a single point draws nothing without a marker. Empty where there are none."""
    ok = np.isfinite(v)
    before = np.concatenate([[False], ok[:-1]])
    after = np.concatenate([ok[1:], [False]])
    alone = np.flatnonzero(ok & ~before & ~after)
    return {"marker": "o", "markevery": alone.tolist()} if len(alone) else {}


def plot_convergence(ds, *, ax=None):
    """Log-log errors after the initial layer against `eps`, with fitted slopes (expected 1, 2, 1;
    "n/d" and no fitted line where `convergence` left a slope undetermined, null in `slopes`, or
    an error is not finite; "no finite error to fit" where none is).

    `ax`: an Axes, or None for a new figure. Returns the Figure.
    """
    eps = ds["eps"].values
    slopes = json.loads(ds.attrs["slopes"])
    labels = {
        "err_h0": r"$\max|x - h_0(y)|$",
        "err_h1": r"$\max|x - h_0(y) - \varepsilon h_1(y)|$",
        "err_y": r"$\max|y - y_{\rm reduced}|$",
    }
    fig, (ax,) = figure_axes(ax, 1, figsize=(0.75 * WIDTH, 5.0))
    for key, marker in zip(labels, "osd"):
        err, slope = np.asarray(ds[key].values, dtype=float), slopes[key]
        bad, fit = int(np.sum(~np.isfinite(err))), False
        if bad == len(err):  # every run failed: nothing drawn, so no slope either
            shown = "no finite error to fit"
        elif bad:  # `convergence` fits over every eps: a slope with a NaN error is none of its
            shown = f"slope n/d ({bad} of {len(err)} errors not finite)"
        elif slope is None or not np.isfinite(slope):
            shown = "slope n/d (errors at the solver's floor)"
        else:
            shown, fit = f"slope {slope:.2f}", True
        ax.loglog(eps, err, marker=marker, lw=1.4, label=f"{labels[key]}: {shown}")
        if fit:
            coef = np.polyfit(np.log(eps), np.log(err), 1)
            ax.loglog(eps, np.exp(np.polyval(coef, np.log(eps))), color="gray", lw=0.7, ls=":")
    if not any(np.isfinite(ds[key].values).any() for key in labels):
        ax.text(0.5, 0.5, "no finite error to fit (every error is NaN or inf)", ha="center",
                va="center", color="C3", transform=ax.transAxes)  # fmt: skip
    ticks = np.unique(eps[np.isfinite(eps) & (eps > 0)])
    if 0 < len(ticks) <= 8:  # every eps run, labelled (a decade's default ticks can miss them all)
        ax.set_xticks(ticks, [f"{e:g}" for e in ticks])
        ax.set_xticks([], minor=True)
    ax.set_xlabel(axis_label(ds["eps"], r"$\varepsilon = 1/P$"))
    ax.set_ylabel("error after the initial layer" + _units(ds["err_h0"]))
    ax.set_title(f"{ds.attrs.get('system', '')}: convergence in eps (expected slopes 1, 2, 1)")
    ax.legend(loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def plot_equilibrium_manifold(runs, curve, states=None, *, ax=None):
    """Trajectories for several `eps` in the `(y, x_i)` plane with `h0(y)` and `h0 + eps h1`.

    `runs`: datasets from `integrate` (one per `eps`; a batched one draws each of its trajectories,
    in the colour of its eps, `eps_batch` where it has one); `curve`: dataset with `y_grid`,
    `h0(y_grid, state)` and `h1(y_grid, state)`; one panel per state in `states` (default all).
    `ax`: one Axes per state, or None for a new figure. Returns the Figure.
    """
    n = curve.sizes["state"]
    states = list(range(n)) if states is None else list(states)
    fig, axes = figure_axes(ax, len(states), nrows=1, ncols=len(states),
                            figsize=(WIDTH * min(1.0, len(states) / 3), 3.8))  # fmt: skip
    y_grid = curve["y_grid"].values
    # each run's trajectories (every one of a batched run), grouped by eps in the order met:
    # [(eps, [(y_0(t), x(t, state), solver status), ...]), ...]
    groups = []
    for ds in runs:
        x, y = _trajectories(ds, "x", "state"), _trajectories(ds, "y", "slow")
        eps_run, status = _trajectory_eps(ds, len(x)), _statuses(ds, len(x))
        for e in dict.fromkeys(eps_run.tolist()):
            groups.append((e, [(y[b, :, 0], x[b], status[b])
                               for b in np.flatnonzero(eps_run == e)]))  # fmt: skip
    for ax, i in zip(axes, states):
        ax.plot(y_grid, curve["h0"].values[:, i], color="k", lw=2.0, label=r"$h_0(y) = p_{st}(y)$")
        for eps, trajectories in groups:
            col = eps_color(eps)
            for j, (y_b, x_b, _) in enumerate(trajectories):
                ax.plot(y_b, x_b[:, i], color=col, lw=1.1,
                        label=rf"$\varepsilon$ = {eps:g}" if j == 0 else "_nolegend_")  # fmt: skip
            ax.plot(y_grid, curve["h0"].values[:, i] + eps * curve["h1"].values[:, i],
                    color=col, lw=0.9, ls="--")  # fmt: skip
        ax.set_xlabel(axis_label(runs[0]["y"], "slow variable y") if runs else "slow variable y")
        ax.set_ylabel(f"$x_{{{i}}}$" + _units(curve["h0"]))
        ax.set_title(f"state {i}")
    axes[0].plot([], [], color="gray", ls="--", label=r"$h_0 + \varepsilon h_1$")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False,
               bbox_to_anchor=(0.5, -0.06))  # fmt: skip
    fig.suptitle(_manifold_title(groups, curve), fontsize=9.5)
    fig.tight_layout()
    return fig


def _statuses(ds, count: int) -> list:
    """The solver status of each of a dataset's `count` trajectories: its `status` variable
    (one per trajectory of a batch), else its `status` attribute for all."""
    if "status" in ds.data_vars:
        return [str(v) for v in np.ravel(ds["status"].values)]
    return [str(ds.attrs.get("status", ""))] * count


def _manifold_title(groups, curve) -> str:
    """What the trajectories show of the critical manifold: per eps, the largest distance
    `max_i |x_i - h0_i(y)|` at the last saved time over its successful trajectories (none where
    `y` ends outside the curve's grid), and how many trajectories failed."""
    order = np.argsort(curve["y_grid"].values)
    y_grid, h0 = curve["y_grid"].values[order], curve["h0"].values[order]

    def end_distance(y_b, x_b):  # NaN where not measured
        if not y_grid[0] <= y_b[-1] <= y_grid[-1]:
            return np.nan
        on = [np.interp(y_b[-1], y_grid, h0[:, i]) for i in range(h0.shape[1])]
        return float(np.max(np.abs(x_b[-1] - on)))

    measured = []
    for eps, trajectories in groups:
        ends = [end_distance(y_b, x_b) for y_b, x_b, status in trajectories if status == "success"]
        ends = [d for d in ends if np.isfinite(d)]
        if ends:
            measured.append(f"{max(ends):.2g} (eps {eps:g})")
    text = "trajectories and the critical manifold $h_0$: " + (
        r"at the last saved time $\max_i |x_i - h_{0,i}(y)|$ = " + ", ".join(measured)
        if measured else "distance to $h_0$ not measured")  # fmt: skip
    statuses = [status for _, trajectories in groups for *_, status in trajectories]
    failed = [s for s in statuses if s != "success"]
    if failed:
        text += (f"; {len(failed)} of {plural(len(statuses), 'trajectory')} failed "
                 f"({', '.join(dict.fromkeys(failed))}), not measured")  # fmt: skip
    return text


# a branch's style by its stability (`nonlinear._branch_stability`'s `stable`: True, False, or
# None where float64 resolves the sign of Re lambda at none of its points)
BRANCH_STYLES = {
    True: dict(color="C0", ls="-", label="stable branch"),
    False: dict(color="C3", ls="--", label="repelling branch"),
    None: dict(color="C4", ls="-.", label="branch of unresolved stability"),
}
UNRESOLVED_LABEL = r"sign of Re $\lambda$ unresolved in float64"


def plot_branches(ds, *, ax=None):
    """Critical manifold of a non-linear generator in the `(y, c.x)` plane: stable branches
    solid, repelling dashed, a branch whose stability float64 does not resolve dash-dotted in
    its own colour, and each point where the sign of the largest Re lambda is unresolved
    (`curve_stability_error >= |curve_stability|`) marked in that colour; folds marked, the
    linear identity in gray, and the relaxation oscillation of the full system (if present) in
    a second panel.

    A branch's stability is the dataset's (`branches`, as the CLI prints it) or, in a dataset
    without it, that of its points (repelling if one is resolved positive, stable if some are
    resolved and none positive). `ax`: one Axes per panel (two when the dataset holds the
    oscillation), or None for a new figure. Returns the Figure.
    """
    has_osc = "osc_y" in ds
    fig, axes = figure_axes(ax, 2 if has_osc else 1, nrows=1, ncols=2 if has_osc else 1,
                            figsize=(WIDTH if has_osc else 0.7 * WIDTH, 4.3))  # fmt: skip
    ax = axes[0]
    y, mean, stab, bid = (
        ds[k].values for k in ("curve_y", "curve_mean", "curve_stability", "branch_id")
    )
    err = ds["curve_stability_error"].values if "curve_stability_error" in ds else 0.0 * stab
    resolved = err < np.abs(stab)
    verdicts = {b["index"]: b["stable"] for b in json.loads(ds.attrs.get("branches", "[]"))}
    for b in np.unique(bid):
        sel = bid == b
        if int(b) in verdicts:
            stable = verdicts[int(b)]
        elif np.any(resolved[sel] & (stab[sel] > 0)):
            stable = False
        else:
            stable = True if np.any(resolved[sel]) else None
        ax.plot(y[sel], mean[sel], lw=2, **BRANCH_STYLES[stable])
    if not np.all(resolved):
        ax.plot(y[~resolved], mean[~resolved], ls="none", marker="x", ms=6, mew=1.5,
                color=BRANCH_STYLES[None]["color"], label=UNRESOLVED_LABEL, zorder=3)  # fmt: skip
    ax.plot(ds["curve_y"].values, ds["linear_mean"].values, color="gray", lw=1, ls=":",
            label=r"linear identity $p_{st}(Q(x_{ref}, y))$")  # fmt: skip
    for f in json.loads(ds.attrs["folds"]):  # above the unresolved marks: a fold often is one
        ax.plot(f["y"], f["mean"], "o", mfc="none", mec="k", mew=1.5, ms=8, zorder=4,
                label="fold")  # fmt: skip
    if has_osc:
        ax.plot(ds["osc_y"].values, ds["osc_mean"].values, color="C2", lw=0.8, alpha=0.8,
                label=f"full system, eps = {ds.attrs['osc_eps']:g}")  # fmt: skip
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="center right")
    ax.set_xlabel(axis_label(ds["curve_y"], "slow variable y"))
    ax.set_ylabel(axis_label(ds["curve_mean"], r"mean state $c \cdot x$"))
    ax.set_title(f"kappa = {ds.attrs['kappa']:g}: gap to the identity {ds.attrs['gap']:.3f}")
    if has_osc:
        ax2 = axes[1]
        ax2.plot(ds["osc_time"].values, ds["osc_y"].values, color="C2")
        for f in json.loads(ds.attrs["folds"]):
            ax2.axhline(f["y"], color="k", lw=0.7, ls=":")
        ax2.set_xlabel(axis_label(ds["osc_time"], "slow time t"))
        ax2.set_ylabel(axis_label(ds["osc_y"], "y"))
        ax2.set_title("relaxation oscillation (dotted: folds)")
    return fig


def plot_multirate(ds, *, ax=None):
    """The multirate map against the ODE: its error at a fixed block length `H` against `eps`
    (left) and against `H` for several `eps` (right), with the fitted order in `H`.

    `ds`: `err_y(eps, H)` and `err_x(eps, H)` (max over block ends of `|y_map - y_ode|`, and of
    `|x_map - x_ode|_inf` after the first block) and `attrs["H_fixed"]`. `ax`: two Axes, or None
    for a new figure. Returns the Figure.
    """
    eps = ds["eps"].values
    H = ds["H"].values
    H_fixed = float(ds.attrs["H_fixed"])
    j = int(np.argmin(np.abs(H - H_fixed)))
    fig, (ax_e, ax_h) = figure_axes(ax, 2, nrows=1, ncols=2, figsize=(WIDTH, 4.0))
    for key, marker, label in (("err_y", "o", r"slow $\max_k |y_k - y(kH)|$"),
                               ("err_x", "s", r"fast $\max_{k \geq 1} |x_k - x(kH)|_\infty$")):  # fmt: skip
        ax_e.loglog(eps, ds[key].values[:, j], marker=marker, color="0.25",
                    ls="-" if key == "err_y" else "--", label=label)  # fmt: skip
    for i, e in enumerate(eps):
        ax_e.plot(e, ds["err_y"].values[i, j], "o", color=eps_color(e), ms=7, zorder=3)
    ax_e.set_xlabel(axis_label(ds["eps"], r"$\varepsilon = 1/P$"))
    ax_e.set_ylabel("error against the ODE at block ends" + _units(ds["err_y"]))
    # what the data show at the largest and the smallest eps, and at the H drawn (the nearest
    # to H_fixed), not a claim that the error does not grow, whatever a dataset holds
    big, small = int(np.argmax(eps)), int(np.argmin(eps))
    e_big, e_small = (float(ds["err_y"].values[k, j]) for k in (big, small))
    ax_e.set_title(f"H = {H[j]:g}: slow error {e_big:.2g} (eps {eps[big]:g}) to {e_small:.2g} "
                   f"(eps {eps[small]:g})")  # fmt: skip
    ax_e.invert_xaxis()
    ax_e.legend(loc="upper right")
    # null in strict JSON, NaN where log(err) was not finite: not determined
    orders = [np.nan if o is None else float(o) for o in json.loads(ds.attrs["orders"])]
    for i, e in enumerate(eps):
        order = f"{orders[i]:.2f}" if np.isfinite(orders[i]) else "n/d"
        ax_h.loglog(H, ds["err_y"].values[i], marker="o", ms=4, color=eps_color(e),
                    label=rf"$\varepsilon$ = {e:g} (order {order})")  # fmt: skip
    # anchored on a finite error: the last eps listed that has one, at its last finite H
    finite = np.argwhere(np.isfinite(ds["err_y"].values))  # row-major: the last is that one
    if len(finite):
        i, k = finite[-1]
        ax_h.loglog(H, ds["err_y"].values[i, k] * H / H[k], color="0.5", ls=":", lw=1,
                    label="slope 1")  # fmt: skip
    # the H of the data as the ticks: log minor labels (2x10^-2, 3x10^-2, ...) ran into each
    # other over this one-decade axis
    ax_h.set_xticks(H, [f"{h:g}" for h in H])
    ax_h.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_h.set_xlabel(axis_label(ds["H"], "slow time per block H"))
    ax_h.set_ylabel(r"slow error $\max_k |y_k - y(kH)|$" + _units(ds["err_y"]))
    fitted = sorted({f"{o:.2f}" for o in orders if np.isfinite(o)}, key=float)
    span = " to ".join(dict.fromkeys(fitted[:1] + fitted[-1:])) or "not determined"
    ax_h.set_title(f"fitted order in H: {span}")
    ax_h.legend(loc="lower right", fontsize=7.5)
    for a in (ax_e, ax_h):
        a.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
