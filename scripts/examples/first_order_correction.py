"""The first-order correction h1 and the eps^2 error.

For eps dx/dt = Q(y)^T x, dy/dt = g(x, y), the slow manifold is x = h0(y) + eps h1(y) + O(eps^2)
with h0 = p_st(Q(y)) and h1 = Z (dh0/dy) g(h0, y), Z = (Q^T - h0 1^T)^{-1} (Fenichel; DESIGN
3.2). After the initial layer, |x - h0(y)| is O(eps) and |x - h0(y) - eps h1(y)| is O(eps^2),
and the reduced (QSS) system dy/dt = g(h0(y), y) follows y to O(eps). Halving eps halves the
first error and quarters the second: their log-log slopes are 1 and 2.

    python scripts/examples/first_order_correction.py   # figure in fastslow-results/examples/
    python scripts/examples/first_order_correction.py --out fig.pdf   # elsewhere; or --help
"""

from __future__ import annotations

import numpy as np

import fastslow_sim as fs
from fastslow_sim.manifold import convergence

EPS = (0.01, 0.005, 0.0025)


def main(ax=None, eps_values=EPS, t_end: float = 2.0) -> dict:
    """The largest errors after the initial layer against eps, log-log, with their fitted
    slopes; returns `{"figure", "slopes": {"err_h0", "err_h1", "err_y"}, "dataset"}`."""
    import json

    import matplotlib.pyplot as plt

    from fastslow_sim.analysis import plot_convergence

    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 4.6))
    system = fs.make_system("birth-death", eps=eps_values[0])
    ds = convergence(system, list(eps_values), t_end=t_end)
    fig = plot_convergence(ds, ax=ax)
    eps = np.asarray(eps_values)
    ax.loglog(eps, ds["err_h1"].values[-1] * (eps / eps[-1]) ** 2, color="k", lw=0.6, ls="--",
              label=r"$\propto \varepsilon^2$")  # fmt: skip
    ax.legend(fontsize=8)
    return {"figure": fig, "slopes": json.loads(ds.attrs["slopes"]), "dataset": ds}


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")  # before pyplot, which fastslow_sim.analysis imports
    from fastslow_sim.analysis.plots import script_arguments

    # --help; --out PATH, by default in fastslow-results/examples/ (a file of the user's there
    # is refused before the work)
    png, save = script_arguments(__doc__, "first_order_correction")
    out = main()
    ds = out["dataset"]
    print(f"{'eps':>8} {'|x-h0|':>11} {'|x-h0-eps h1|':>14} {'|y-y_red|':>11}")
    for i, e in enumerate(ds["eps"].values):
        print(f"{e:>8g} {ds['err_h0'].values[i]:>11.3e} {ds['err_h1'].values[i]:>14.3e} "
              f"{ds['err_y'].values[i]:>11.3e}")  # fmt: skip
    s = out["slopes"]
    print(f"{'slope':>8} {s['err_h0']:>11.3f} {s['err_h1']:>14.3f} {s['err_y']:>11.3f}  (theory 1, 2, 1)")
    save(out["figure"])
    print(f"saved {png}")
