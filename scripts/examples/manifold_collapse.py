"""A fast-slow system collapsing onto its slow manifold.

The default system of fastslow-sim: an 8-state birth-death chain whose up rate depends on a slow
variable y, eps dx/dt = Q(y)^T x, dy/dt = c.x - y. Started at x0 = e_0, far from equilibrium,
the fast variable crosses an initial layer of duration about eps log(1/eps) / gap and then
stays within O(eps) of the critical manifold h0(y) = p_st(Q(y)), the chain's stationary
distribution at the current y (the paper's theorem for a linear generator). More precisely,
x = h0(y) + eps h1(y) + O(eps^2): after the layer, |x - h0(y)| / (eps |h1(y)|) tends to 1.

    python scripts/examples/manifold_collapse.py   # figure in fastslow-results/examples/
    python scripts/examples/manifold_collapse.py --out fig.pdf   # elsewhere; or --help
"""

from __future__ import annotations

import numpy as np

import fastslow_sim as fs
from fastslow_sim.manifold import h0, h1, initial_layer_duration

EPS = (0.1, 0.03, 0.01)


def main(ax=None, eps_values=EPS) -> dict:
    """Left: the distance |x - h0(y)|_1 against the fast time t / eps, where the collapse
    decays at the same rate (the spectral gap) for every eps; the layer itself, log(1/eps) /
    gap in fast time, lengthens slowly as eps shrinks (dotted: 6 layers, where the right panel
    starts). Right: after that, |x - h0(y)|_inf against eps |h1(y)|_inf.
    Returns `{"figure", "ratio": {eps: max|x - h0| / max eps|h1|}}`."""
    import matplotlib.pyplot as plt

    from fastslow_sim.analysis.palette import eps_color

    if ax is None:
        fig, ax = plt.subplots(1, 2, figsize=(9.5, 3.8))
    ax_l, ax_r = np.ravel(ax)
    fig = ax_l.get_figure()
    ratio, cut_fast = {}, []
    for eps in eps_values:
        system = fs.make_system("birth-death", eps=eps)
        ds = fs.integrate(system, (0.0, 2.0), method="radau", rtol=1e-10, atol=1e-12, n_eval=2001)
        t, x, y = ds["time"].values, ds["x"].values, ds["y"].values[:, 0]
        dist = np.abs(x - h0(system, y)).sum(axis=1)
        color = eps_color(eps)
        ax_l.semilogy(t[1:] / eps, dist[1:], color=color, label=rf"$\varepsilon$ = {eps:g}")
        cut = 6 * initial_layer_duration(system)
        after = t >= cut
        ax_l.axvline(cut / eps, color=color, lw=0.8, ls=":")
        cut_fast.append(cut / eps)
        dev = np.abs(x[after] - h0(system, y[after])).max(axis=1)
        pred = eps * np.abs(h1(system, y[after])).max(axis=1)
        ax_r.plot(t[after], dev, color=color, lw=1.5, label=rf"$|x - h_0(y)|$, $\varepsilon$ = {eps:g}")
        ax_r.plot(t[after], pred, color=color, lw=1, ls="--")
        ratio[eps] = float(dev.max() / pred.max())
    ax_l.set_xlim(0, 1.1 * max(cut_fast))
    ax_l.set_xlabel(r"fast time $t / \varepsilon$")
    ax_l.set_ylabel(r"$|x - h_0(y)|_1$")
    ax_l.set_title("the initial layer: collapse onto the manifold")
    ax_l.plot([], [], color="k", ls=":", lw=0.8, label="6 initial layers")
    ax_l.legend()
    ax_r.plot([], [], color="k", ls="--", lw=1, label=r"$\varepsilon |h_1(y)|$ (theory)")
    ax_r.set_yscale("log")
    ax_r.set_xlabel("slow time t")
    ax_r.set_ylabel(r"$\max_i |x_i - h_{0,i}(y)|$")
    ax_r.set_title("after the layer: O(eps) from the manifold")
    ax_r.legend(fontsize=7.5)
    fig.tight_layout()
    return {"figure": fig, "ratio": ratio}


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")  # before pyplot, which fastslow_sim.analysis imports
    from fastslow_sim.analysis.plots import script_arguments

    # --help; --out PATH, by default in fastslow-results/examples/ (a file of the user's there
    # is refused before the work)
    png, save = script_arguments(__doc__, "manifold_collapse")
    out = main()
    for eps, r in out["ratio"].items():
        print(f"eps = {eps:<5g} max|x - h0(y)| / max eps|h1(y)| after the layer = {r:.4f} (theory -> 1)")
    save(out["figure"])
    print(f"saved {png}")
