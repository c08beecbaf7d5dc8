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
