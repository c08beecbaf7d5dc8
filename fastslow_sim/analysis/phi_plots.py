"""phi_theta against p_st, from the results `fastslow-sim phi-vs-pst` saves (phi_vs_pst.json)
and `scripts/phi_vs_pst_sweep.py` collects; nothing here trains or evaluates a model.

Both functions draw into the two Axes they are given (`ax=`, or make a Figure) and return the Figure; saving
is the caller's choice, and no backend is set here, so they work in a notebook.
"""

from __future__ import annotations

import numpy as np

from .plots import figure_axes

ARM_STYLE = {"coupled": ("C1", "--"), "dense-matched": ("C4", "-."), "dense": ("C0", ":"),
             "frozen-slow": ("C3", (0, (3, 1, 1, 1))), "frozen-gate": ("C2", (0, (1, 1)))}  # fmt: skip


def plot_phi_vs_pst(results: dict, ax=None):
    """`phi_theta(y)` against `p_st(y)` as curves per state, binned by `y` (quantile bins).

    `results`: `{label: phi_vs_pst result}`. Left: the model's head readout of each run (and the
    Bayes filter read out the same way, the best a head can do); right: the slow-state probes.
    Solid: `p_st,i(y)` (what `y` known gives); each state `i` has its colour.
    """
    import matplotlib.pyplot as plt

    fig, axes = figure_axes(ax, 2, ncols=2, figsize=(12, 4.6), sharey=True)
    first = next(iter(results.values()))
    y = np.array(first["binned"]["y"])
    truth = np.array(first["binned"]["y known"])  # (bins, n)
    n = truth.shape[1]
    colors = plt.cm.viridis(np.linspace(0.0, 0.95, n))
    panels = (("model head", "head readout (late in the block)"),
              ("slow-state probe", "probe of the gated slow state"))  # fmt: skip
    for ax, (key, title) in zip(axes, panels):
        for i in range(n):
            ax.plot(
                y,
                truth[:, i],
                color=colors[i],
                lw=2.0,
                label=f"state {i}" if key == "model head" else None,
            )
        if key == "model head":
            filt = np.array(first["binned"]["Bayes filter, head readout"])
            for i in range(n):
                ax.plot(y, filt[:, i], color=colors[i], lw=0.8, ls=(0, (1, 2)))
            ax.plot([], [], color="k", lw=0.8, ls=(0, (1, 2)), label="Bayes filter, same readout")
        for label, r in results.items():
            if key not in r["binned"]:
                continue
            color, ls = ARM_STYLE.get(r["arm"], ("k", "--"))
            est = np.array(r["binned"][key])
            for i in range(n):
                ax.plot(y, est[:, i], color=colors[i], lw=1.1, ls=ls)
            tv = r["tv"][key]
            ax.plot([], [], color="k", lw=1.1, ls=ls,
                    label=f"{label} (TV {tv['mean']:.3f} ± {tv['se']:.3f})")  # fmt: skip
        ax.set_xlabel("slow variable y of the predicted block (bin means)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, ncol=2, loc="upper center")
    axes[0].set_ylabel(r"probability of state $i$; solid: $p_{st,i}(y)$")
    fig.suptitle(r"$\phi_\theta(y)$ against $p_{st}(y)$ on the me corpus (validation blocks)",
                 fontsize=11)  # fmt: skip
    return fig


def plot_tv_sweep(rows: list, ax=None):
    """Mean TV to `p_st` (± s.e.) against training tokens and against `P`, per arm and readout,
    with the attainable floors of each readout (the Bayes filter read out the same way)."""
    fig, axes = figure_axes(ax, 2, ncols=2, figsize=(11, 4.2))
    for ax, sweep, xkey, xlabel in ((axes[0], "tokens", "tokens", "training tokens"),
                                    (axes[1], "P", "P", "block length P (eps = 1/P)")):  # fmt: skip
        sel = [r for r in rows if r["sweep"] == sweep]
        for arm in sorted({r["arm"] for r in sel}):
            rs = sorted((r for r in sel if r["arm"] == arm), key=lambda r: r[xkey])
            color, _ = ARM_STYLE.get(arm, ("k", "-"))
            x = [r[xkey] for r in rs]
            for key, marker in (("model head", "o-"), ("slow-state probe", "s--")):
                if all(key in r["tv"] for r in rs):
                    ax.errorbar(x, [r["tv"][key]["mean"] for r in rs],
                                yerr=[r["tv"][key]["se"] for r in rs], fmt=marker, color=color,
                                ms=4, capsize=2, label=f"{arm}: {key}")  # fmt: skip
        if sel:
            rs = sorted({r[xkey]: r for r in sel}.values(), key=lambda r: r[xkey])
            x = [r[xkey] for r in rs]
            ax.plot(x, [r["tv"]["Bayes filter, head readout"]["mean"] for r in rs], "k:",
                    label="Bayes filter, head readout")  # fmt: skip
            ax.plot(x, [r["tv"]["Bayes filter p_st"]["mean"] for r in rs], "k-.",
                    label="Bayes filter p_st (probe's floor)")  # fmt: skip
            ax.plot(x, [r["tv"]["corpus frequencies"]["mean"] for r in rs], color="0.6",
                    label="corpus frequencies")  # fmt: skip
        ax.set_xscale("log", base=2 if sweep == "P" else 10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(r"mean TV distance to $p_{st}(y_b)$")
        ax.legend(fontsize=7)
    fig.suptitle("how close phi_theta gets to p_st", fontsize=11)
    return fig
