"""phi_theta against p_st, from the results `fastslow-sim phi-vs-pst` saves (phi_vs_pst.json)
and `scripts/phi_vs_pst_sweep.py` collects; nothing here trains or evaluates a model.

Both functions draw into the two Axes they are given (`ax=`, or make a Figure) and return the Figure; saving
is the caller's choice, and no backend is set here, so they work in a notebook.
"""

from __future__ import annotations

import numpy as np

from .palette import ARM_LINESTYLES, WIDTH, arm_color
from .plots import figure_axes, refuse_empty

ARM_STYLE = {arm: (arm_color(arm), ls) for arm, ls in ARM_LINESTYLES.items()}  # old name


def plot_phi_vs_pst(results: dict, ax=None):
    """`phi_theta(y)` against `p_st(y)`, one panel per state `i`: curves of the probability of
    state `i` against `y`, binned by `y` (quantile bins of the validation blocks).

    `results`: `{label: phi_vs_pst result}` (one run per arm). Black: `p_st,i(y)` (what `y`
    known gives); grey dotted: the Bayes filter read out like the head (what a log-loss-optimal
    head shows; not a lower bound on TV); solid, in the arm's colour: the model's head readout; dashed: the probe of the gated
    slow state (slow-path arms whose gate is not pinned at zero). `ax`: one Axes per state, or
    None for a new figure. Returns the Figure.
    """
    refuse_empty(results, "results", "no run to draw",
                 "{label: phi_vs_pst result} with at least one run")
    first = next(iter(results.values()))
    y = np.array(first["binned"]["y"])
    truth = np.array(first["binned"]["y known"])  # (bins, n)
    n = truth.shape[1]
    ncols = min(4, n)
    nrows = -(-n // ncols)
    fig, axes = figure_axes(ax, n, nrows=nrows, ncols=ncols, figsize=(WIDTH, 2.35 * nrows + 0.9),
                            sharex=True)  # fmt: skip
    filt = np.array(first["binned"]["Bayes filter, head readout"])
    for i, ax in enumerate(axes):
        ax.plot(y, truth[:, i], color="k", lw=2.2, label=r"$p_{st}(y)$ (y known)")
        ax.plot(y, filt[:, i], color="0.45", lw=1.2, ls=":", label="Bayes filter, head readout")
        for label, r in results.items():
            color = arm_color(r["arm"])
            tv = r["tv"]["model head"]
            ax.plot(y, np.array(r["binned"]["model head"])[:, i], color=color, lw=1.2,
                    label=f"{label}: head (TV {tv['mean']:.3f})")  # fmt: skip
            if "slow-state probe" in r["binned"] and r["arm"] != "frozen-gate":
                tv = r["tv"]["slow-state probe"]
                ax.plot(y, np.array(r["binned"]["slow-state probe"])[:, i], color=color, lw=1.0,
                        ls="--", label=f"{label}: slow-state probe (TV {tv['mean']:.3f})")  # fmt: skip
        ax.set_title(f"state {i}", fontsize=9.5)
        if i % ncols == 0:
            ax.set_ylabel("probability")
        if i >= n - ncols:
            ax.set_xlabel("slow variable y")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle(r"$\phi_\theta(y)$ against $p_{st}(y)$ on the me corpus (validation blocks, "
                 r"binned by $y$; TV: mean distance to $p_{st}(y_b)$)")  # fmt: skip
    fig.tight_layout(rect=(0, 0.12 if len(labels) > 6 else 0.08, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=8)
    return fig


def _count(n) -> str:
    """125000 -> "125k", 2000000 -> "2M", 8 -> "8"."""
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:g}"


def plot_tv_sweep(rows: list, ax=None):
    """Mean TV to `p_st` (± s.e.) against training tokens and against `P`, per arm and readout,
    with the exact Bayes filter read out the same way as each readout (references, not lower
    bounds on TV). One legend below, for every series of either panel."""
    # the figure would be two empty panels under a title about them
    refuse_empty(rows, "rows", "no sweep point to draw", "at least one row of a phi-vs-pst sweep")
    fig, axes = figure_axes(ax, 2, ncols=2, figsize=(WIDTH, 4.2))
    for ax, sweep, xkey, xlabel in ((axes[0], "tokens", "tokens", "training tokens"),
                                    (axes[1], "P", "P", "block length P (eps = 1/P)")):  # fmt: skip
        sel = [r for r in rows if r["sweep"] == sweep]
        for arm in sorted({r["arm"] for r in sel}):
            rs = sorted((r for r in sel if r["arm"] == arm), key=lambda r: r[xkey])
            color = arm_color(arm)
            x = [r[xkey] for r in rs]
            for key, marker in (("model head", "o-"), ("slow-state probe", "s--")):
                if all(key in r["tv"] for r in rs):
                    ax.errorbar(x, [r["tv"][key]["mean"] for r in rs],
                                yerr=[np.nan if r["tv"][key]["se"] is None else r["tv"][key]["se"]
                                      for r in rs], fmt=marker, color=color,  # None: one window
                                ms=4, capsize=2, label=f"{arm}: {key}")  # fmt: skip
        if sel:
            rs = sorted({r[xkey]: r for r in sel}.values(), key=lambda r: r[xkey])
            x = [r[xkey] for r in rs]
            ax.plot(x, [r["tv"]["Bayes filter, head readout"]["mean"] for r in rs], "k:",
                    label="Bayes filter, head readout")  # fmt: skip
            ax.plot(x, [r["tv"]["Bayes filter p_st"]["mean"] for r in rs], "k-.",
                    label="Bayes filter p_st")  # fmt: skip
            ax.plot(x, [r["tv"]["corpus frequencies"]["mean"] for r in rs], color="0.6",
                    label="corpus frequencies")  # fmt: skip
        ax.set_xscale("log", base=2 if sweep == "P" else 10)
        if sel:
            ticks = sorted({r[xkey] for r in sel})
            ax.set_xticks(ticks, [_count(t) for t in ticks])
            ax.minorticks_off()
        else:  # rows of the other sweep only: say why this panel is empty
            ax.text(0.5, 0.5, f"no {sweep} sweep in these rows", ha="center", va="center",
                    color="0.4", transform=ax.transAxes)  # fmt: skip
        ax.set_xlabel(xlabel)
        ax.set_ylabel(r"mean TV distance to $p_{st}(y_b)$")
    # both panels' series, once each: rows of one sweep draw in one panel only
    drawn = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            drawn.setdefault(label, handle)
    handles, labels = list(drawn.values()), list(drawn)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(r"how close $\phi_\theta$ gets to $p_{st}$: against training tokens and against P")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=8)
    return fig
