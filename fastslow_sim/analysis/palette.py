"""One palette for every figure: a colour per ablation arm, a colour per `eps` (and per `P`,
since `eps = 1/P`), a colour map for the states of the fast chain, and the text sizes that keep
a figure readable at the README's width. Nothing here touches matplotlib's global state on
import; `style()` is a context manager that a caller enters while drawing.
"""

from __future__ import annotations

import math

import numpy as np

# the five arms of the ablation (training.ARMS), one colour each in every figure
ARM_COLORS = {
    "dense": "#3b6fb6",  # blue
    "dense-matched": "#8a5fbf",  # purple
    "coupled": "#e07b1f",  # orange
    "frozen-gate": "#3a9a4a",  # green
    "frozen-slow": "#c23b3b",  # red
}
# a line style per arm where colour alone must not carry the arm (dense panels, print)
ARM_LINESTYLES = {
    "dense": ":",
    "dense-matched": "-.",
    "coupled": "-",
    "frozen-gate": (0, (1, 1)),
    "frozen-slow": "--",
}

# one colour per eps, a function of eps alone, so eps = 0.01 has the same colour in every figure:
# the network's block lengths P = 4, 8, 16 (eps = 1/P) have their own colours, away from the
# arms'; any other eps (the ODE figures, 0.1 down to 1e-6) sits on viridis, piecewise linear in
# log10(eps) through EPS_ANCHORS, which spreads 0.1, 0.03, 0.01 and 1e-3..1e-6 apart.
P_COLORS = {4: "#d1259f", 8: "#6f4ae0", 16: "#1aa6c9"}
EPS_CMAP = "viridis"
EPS_ANCHORS = ((-1.0, 0.0), (-1.5, 0.25), (-2.0, 0.45), (-3.0, 0.6), (-4.0, 0.72), (-5.0, 0.83),
               (-6.0, 0.92))  # fmt: skip
STATE_CMAP = "viridis"  # states of the fast chain (never on the same Axes as lines per eps)

# text sizes for figures shown at about 800 px (the README's width): 9-10 in wide at 150 dpi
RC = {
    "font.size": 10.5,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10.5,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "figure.titlesize": 11.5,
    "axes.grid": False,
    "savefig.dpi": 150,
}
WIDTH = 9.5  # inches of a full-width figure


def arm_color(arm: str) -> str:
    """The arm's colour (grey for a name outside the ablation)."""
    return ARM_COLORS.get(arm, "0.4")


def arm_linestyle(arm: str):
    return ARM_LINESTYLES.get(arm, "-")


def eps_color(eps: float):
    """The colour of `eps` (see the rule above `P_COLORS`)."""
    from matplotlib import colormaps

    eps = float(eps)
    P = 1.0 / eps
    if abs(P - round(P)) < 1e-9 * P and int(round(P)) in P_COLORS:
        return P_COLORS[int(round(P))]
    logs, slots = zip(*EPS_ANCHORS)
    pos = float(np.interp(math.log10(eps), logs[::-1], slots[::-1]))
    return colormaps[EPS_CMAP](pos)


def P_color(P: int):
    """The colour of `P`: that of `eps = 1/P`."""
    return eps_color(1.0 / P)


def state_colors(n: int):
    """`n` colours for the states `0..n-1` of the fast chain."""
    from matplotlib import colormaps

    return colormaps[STATE_CMAP](np.linspace(0.0, 0.92, n))


def style():
    """`with style(): ...` draws with the gallery's text sizes (matplotlib's `rc_context`)."""
    import matplotlib.pyplot as plt

    return plt.rc_context(RC)
