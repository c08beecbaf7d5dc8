"""Figures made from saved datasets (matplotlib, Agg back-end, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fastslow_sim.io import atomic_path  # noqa: E402


def _save(fig, path) -> Path:
    """Save atomically: a figure is either complete on disk or absent."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=130, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def plot_trajectory(ds, path) -> Path:
    """Two panels: `x_i(t)` (solid) with `p_st,i(y(t))` overlaid (dashed), and `y(t)`."""
    t = ds["time"].values
    fig, (ax_x, ax_y) = plt.subplots(
        2, 1, figsize=(7.5, 6.0), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    n = ds.sizes["state"]
    colors = plt.cm.viridis(np.linspace(0.0, 0.95, n))
    for i in range(n):
        ax_x.plot(t, ds["x"].values[:, i], color=colors[i], lw=1.4, label=f"$x_{{{i}}}$")
        if "p_st" in ds:
            ax_x.plot(t, ds["p_st"].values[:, i], color=colors[i], lw=1.0, ls="--")
    if "p_st" in ds:
        ax_x.plot([], [], color="k", ls="--", lw=1.0, label=r"$p_{st}(y(t))$")
    ax_x.set_ylabel("probability")
    eps = ds.attrs.get("eps")
    ax_x.set_title(
        f"{ds.attrs.get('system', '')}: eps = {eps:g}, method {ds.attrs.get('method', '')}, "
        f"status {ds.attrs.get('status', '')}"
    )
    ax_x.legend(ncol=min(n + 1, 5), fontsize=8, loc="upper right")
    for k in range(ds.sizes["slow"]):
        ax_y.plot(t, ds["y"].values[:, k], lw=1.5, label=f"$y_{{{k}}}$")
    ax_y.set_xlabel("slow time t")
    ax_y.set_ylabel("slow variable y")
    ax_y.legend(fontsize=8)
    return _save(fig, path)


def plot_convergence(ds, path) -> Path:
    """Log-log errors after the initial layer against `eps`, with fitted slopes (expected 1, 2, 1)."""
    import json

    eps = ds["eps"].values
    slopes = json.loads(ds.attrs["slopes"])
    labels = {
        "err_h0": r"$\max|x - h_0(y)|$",
        "err_h1": r"$\max|x - h_0(y) - \varepsilon h_1(y)|$",
        "err_y": r"$\max|y - y_{\rm reduced}|$",
    }
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for key, marker in zip(labels, "osd"):
        err = ds[key].values
        ax.loglog(eps, err, marker=marker, lw=1.4, label=f"{labels[key]}: slope {slopes[key]:.2f}")
        fit = np.polyfit(np.log(eps), np.log(err), 1)
        ax.loglog(eps, np.exp(np.polyval(fit, np.log(eps))), color="gray", lw=0.7, ls=":")
    ax.set_xlabel(r"$\varepsilon = 1/P$")
    ax.set_ylabel("error after the initial layer")
    ax.set_title(f"{ds.attrs.get('system', '')}: convergence in eps (expected slopes 1, 2, 1)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_equilibrium_manifold(runs, curve, path, states=None) -> Path:
    """Trajectories for several `eps` in the `(y, x_i)` plane with `h0(y)` and `h0 + eps h1`.

    `runs`: datasets from `integrate` (one per `eps`); `curve`: dataset with `y_grid`,
    `h0(y_grid, state)` and `h1(y_grid, state)`.
    """
    n = curve.sizes["state"]
    states = list(range(n)) if states is None else list(states)
    fig, axes = plt.subplots(1, len(states), figsize=(4.2 * len(states), 4.2), squeeze=False)
    y_grid = curve["y_grid"].values
    colors = plt.cm.plasma(np.linspace(0.0, 0.8, len(runs)))
    for ax, i in zip(axes[0], states):
        ax.plot(y_grid, curve["h0"].values[:, i], color="k", lw=2.0, label=r"$h_0(y) = p_{st}(y)$")
        for ds, col in zip(runs, colors):
            eps = ds.attrs["eps"]
            ax.plot(ds["y"].values[:, 0], ds["x"].values[:, i], color=col, lw=1.1,
                    label=rf"$\varepsilon$ = {eps:g}")  # fmt: skip
            ax.plot(y_grid, curve["h0"].values[:, i] + eps * curve["h1"].values[:, i],
                    color=col, lw=0.9, ls="--")  # fmt: skip
        ax.set_xlabel("slow variable y")
        ax.set_ylabel(f"$x_{{{i}}}$")
        ax.set_title(f"state {i}")
    axes[0][0].plot([], [], color="gray", ls="--", label=r"$h_0 + \varepsilon h_1$")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        "trajectories leave x0 through the initial layer, then follow the critical manifold",
        fontsize=10,
    )
    return _save(fig, path)


def plot_branches(ds, path) -> Path:
    """Critical manifold of a non-linear generator in the `(y, c.x)` plane: stable branches
    solid, repelling dashed, folds marked, the linear identity in gray, and the relaxation
    oscillation of the full system (if present)."""
    import json

    has_osc = "osc_y" in ds
    fig, axes = plt.subplots(1, 2 if has_osc else 1, figsize=(11 if has_osc else 6.5, 4.6),
                             squeeze=False)  # fmt: skip
    ax = axes[0][0]
    y, mean, stab, bid = (
        ds[k].values for k in ("curve_y", "curve_mean", "curve_stability", "branch_id")
    )
    for b in np.unique(bid):
        sel = bid == b
        stable = bool(np.all(stab[sel] < 0))
        ax.plot(y[sel], mean[sel], color="C0" if stable else "C3", ls="-" if stable else "--", lw=2,
                label=("stable branch" if stable else "repelling branch"))  # fmt: skip
    ax.plot(ds["curve_y"].values, ds["linear_mean"].values, color="gray", lw=1, ls=":",
            label=r"linear identity $p_{st}(Q(x_{ref}, y))$")  # fmt: skip
    for f in json.loads(ds.attrs["folds"]):
        ax.plot(f["y"], f["mean"], "ko", ms=6)
    if has_osc:
        ax.plot(ds["osc_y"].values, ds["osc_mean"].values, color="C2", lw=0.8, alpha=0.8,
                label=f"full system, eps = {ds.attrs['osc_eps']:g}")  # fmt: skip
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8)
    ax.set_xlabel("slow variable y")
    ax.set_ylabel(r"mean state $c \cdot x$")
    ax.set_title(f"kappa = {ds.attrs['kappa']:g}: gap to the linear identity {ds.attrs['gap']:.3f}")
    if has_osc:
        ax2 = axes[0][1]
        ax2.plot(ds["osc_time"].values, ds["osc_y"].values, color="C2")
        for f in json.loads(ds.attrs["folds"]):
            ax2.axhline(f["y"], color="k", lw=0.7, ls=":")
        ax2.set_xlabel("slow time t")
        ax2.set_ylabel("y")
        ax2.set_title("relaxation oscillation, g = 1/2 - c.x (dotted: folds)")
    return _save(fig, path)
