"""Stationary distribution of a birth-death chain, and why GTH.

A chain on states 0..n-1 jumps up at rate r and down at rate 1, so p_st,i = r^i (1 - r)/(1 - r^n)
(detailed balance: p_i r = p_{i+1}). With n = 40 and r = 0.1 the entries run from 1 down to
1e-39; with r = 10 the mass sits at the far end, state 39, and p_0 is 1e-39. The textbook
solvers of Q^T p = 0 lose the small entries to round-off: the SVD null space and the eigenvector
of the eigenvalue closest to 0 at both ratios (relative errors from 1e6 to 1e22), the
row-replaced LU solve at r = 0.1, where the small entries come last in its elimination (at
r = 10 it happens to be exact). GTH elimination (Grassmann-Taksar-Heyman) performs no
subtractions and gives every entry to a relative error of a few units of round-off, whatever the
ratio (O'Cinneide 1993): about 1e-15 here, against a reference computed in exact arithmetic.

    python scripts/examples/gth_birth_death.py      # prints the table, saves a PNG
    python scripts/examples/gth_birth_death.py --out gth.pdf   # the figure elsewhere

The PNG goes to fastslow-results/examples/gth_birth_death.png unless --out says otherwise.
"""

from __future__ import annotations

import numpy as np

import fastslow_sim as fs

N_STATES = 40


def birth_death(n: int, r: float) -> np.ndarray:
    """Generator with up rate r and down rate 1 (rows sum to zero)."""
    Q = np.zeros((n, n))
    i = np.arange(n - 1)
    Q[i, i + 1] = r
    Q[i + 1, i] = 1.0
    np.fill_diagonal(Q, -Q.sum(axis=1))
    return Q


def closed_form(n: int, r: float) -> np.ndarray:
    """p_i = r^i / sum_j r^j in exact rational arithmetic (r is the float the generator holds),
    each entry then rounded once: a reference with no error of its own. (`exp(i log r)` is not:
    the rounding of `log r`, times i = 39, is a relative error of about 1e-14, ten times GTH's.)"""
    from fractions import Fraction

    powers = [Fraction(r) ** i for i in range(n)]
    total = sum(powers)
    return np.array([float(q / total) for q in powers])


def eigenvector(Q: np.ndarray) -> np.ndarray:
    """The textbook route: the eigenvector of Q^T for the eigenvalue closest to 0."""
    w, V = np.linalg.eig(Q.T)
    v = np.real(V[:, np.argmin(np.abs(w))])
    return v / v.sum()


def main(ax=None, n: int = N_STATES, ratios=(0.1, 10.0)) -> dict:
    """Relative error per state of each solver against the closed form, one panel per ratio;
    returns `{"figure", "errors": {r: {method: max relative error}}}`."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(1, len(ratios), figsize=(9.5, 3.8), sharey=True)
    axes = np.ravel(ax)
    fig = axes[0].get_figure()
    errors = {}
    for a, r in zip(axes, ratios):
        Q, p = birth_death(n, r), closed_form(n, r)
        solvers = {"GTH": fs.stationary_distribution(Q, method="gth"),
                   "LU (row replaced)": fs.stationary_distribution(Q, method="lu"),
                   "SVD null space": fs.stationary_distribution(Q, method="svd"),
                   "eigenvector": eigenvector(Q)}  # fmt: skip
        errors[r] = {}
        for (name, q), marker, z in zip(solvers.items(), "osd^", (4, 3, 2, 1)):
            rel = np.abs(q - p) / p
            errors[r][name] = float(rel.max())
            # GTH on top: where another solver is as exact, its curve would hide GTH's
            a.semilogy(np.arange(n), np.maximum(rel, 1e-17), marker=marker, ms=3, lw=1, zorder=z,
                       label=f"{name}: max {rel.max():.1e}")  # fmt: skip
        a.axhline(1.0, color="k", lw=0.7, ls=":")
        a.set_title(f"r = {r:g}: p_st from {p.max():.0e} to {p.min():.0e}")
        a.set_xlabel("state i")
        a.legend(fontsize=7.5, loc="center left")
    axes[0].set_ylabel(r"relative error $|q_i - p_i| / p_i$")
    fig.tight_layout()
    return {"figure": fig, "errors": errors}


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")  # before pyplot, which fastslow_sim.analysis imports
    from fastslow_sim.analysis.plots import script_arguments

    # --help; --out PATH, by default in fastslow-results/examples/ (a file of the user's there
    # is refused before the work)
    png, save = script_arguments(__doc__, "gth_birth_death")
    out = main()
    print(f"birth-death chain, {N_STATES} states: largest relative error against the closed form")
    print(f"| r | {' | '.join(next(iter(out['errors'].values())))} |")
    for r, row in out["errors"].items():
        print(f"| {r:g} | " + " | ".join(f"{e:.1e}" for e in row.values()) + " |")
    save(out["figure"])
    print(f"saved {png}")
