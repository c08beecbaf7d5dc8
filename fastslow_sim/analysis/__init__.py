"""Plotting and analysis of saved fastslow-sim results.

It reads datasets (never trains or integrates, DESIGN 5) and draws figures: each plot function
takes optional Axes (`ax=`) and returns the Figure, so it works in a notebook; it picks no
matplotlib backend. `save_figure(fig, path)` writes a figure to a file, as the CLI does.
`palette` holds the colours shared by every figure (one per arm, one per eps) and the text sizes.
"""

from . import palette
from .phi_plots import plot_phi_vs_pst, plot_tv_sweep
from .plots import (
    axis_label,
    plot_branches,
    plot_convergence,
    plot_equilibrium_manifold,
    plot_multirate,
    plot_trajectory,
    save_figure,
)
from .training_plots import plot_ablation, plot_cost, plot_gates, plot_val_loss, plot_wall_clock

__all__ = [
    "palette",
    "save_figure",
    "plot_ablation",
    "plot_cost",
    "plot_multirate",
    "axis_label",
    "plot_gates",
    "plot_phi_vs_pst",
    "plot_tv_sweep",
    "plot_val_loss",
    "plot_wall_clock",
    "plot_branches",
    "plot_convergence",
    "plot_equilibrium_manifold",
    "plot_trajectory",
]
