"""Plotting and analysis of saved fastslow-sim results, installed as `fastslow_sim.analysis`.

It reads datasets (never trains or integrates, DESIGN 5) and writes figures.
"""

from .plots import plot_branches, plot_convergence, plot_equilibrium_manifold, plot_trajectory
from .training_plots import plot_gates, plot_phi_vs_pst, plot_val_loss, plot_wall_clock

__all__ = [
    "plot_gates",
    "plot_phi_vs_pst",
    "plot_val_loss",
    "plot_wall_clock",
    "plot_branches",
    "plot_convergence",
    "plot_equilibrium_manifold",
    "plot_trajectory",
]
