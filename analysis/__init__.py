"""Plotting and analysis of saved fastslow-sim results, installed as `fastslow_sim.analysis`.

It reads datasets (never trains or integrates, DESIGN 5) and writes figures.
"""

from .plots import plot_branches, plot_convergence, plot_equilibrium_manifold, plot_trajectory

__all__ = [
    "plot_branches",
    "plot_convergence",
    "plot_equilibrium_manifold",
    "plot_trajectory",
]
