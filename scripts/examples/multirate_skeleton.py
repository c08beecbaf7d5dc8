"""The multirate map: the network's skeleton.

Tokens t = 0, 1, ..., blocks of P tokens. The fast variable moves every token by the exact
propagator of the fast chain with y frozen over the block, x_{t+1} = expm(tau Q(y_k)^T) x_t;
the slow variable moves once per block from the block mean of x (causal block-mean pooling),
y_{k+1} = y_k + H g(mean_k x, y_k). With eps = 1/P the fast chain moves by tau = H per token and
y by H per block. The network has the same skeleton: its fast path (attention over tokens)
updates every token, its slow path (attention over pooled blocks) once per P tokens, and the
pooled state reaches the tokens only after its block has ended. The map converges to the ODE
at first order in H: halving H halves the error.

    python scripts/examples/multirate_skeleton.py   # figure in fastslow-results/examples/
    python scripts/examples/multirate_skeleton.py --out fig.pdf   # elsewhere; or --help
"""

from __future__ import annotations

import numpy as np

import fastslow_sim as fs
from fastslow_sim.multirate import multirate_map

P = 8  # tokens per block, eps = 1/P


def main(ax=None, P: int = P, H: float = 0.1, n_blocks: int = 12) -> dict:
    """Left: the fast state x_7 per token (a step per token) and the block means that the slow
    update reads, against the ODE. Right: y per block against the ODE's y(t), for H and H/2.
    Returns `{"figure", "errors": {H: max |y_k - y(kH)|}, "order", "slow_updates", "tokens"}`."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(1, 2, figsize=(9.5, 3.8))
    ax_x, ax_y = np.ravel(ax)
    fig = ax_x.get_figure()
    system = fs.make_system("birth-death", P=P)
    t_end = n_blocks * H
    ref = fs.integrate(system, (0.0, t_end), method="radau", rtol=1e-11, atol=1e-13, n_eval=601)
    run = multirate_map(system, H, n_blocks, tokens=True)
    state = system.n_fast - 1
    ax_x.step(run["t_tokens"], run["x_tokens"][:, state], where="post", color="C0", lw=1,
              label=f"map: x per token ({P} tokens per block)")  # fmt: skip
    ax_x.hlines(run["block_mean"][:, state], run["t_blocks"][:-1], run["t_blocks"][1:], color="C1",
                lw=2.5, label="block mean (what the slow update reads)")  # fmt: skip
    ax_x.plot(ref["time"].values, ref["x"].values[:, state], color="k", lw=1, ls="--", label="ODE")
    for tb in run["t_blocks"]:
        ax_x.axvline(tb, color="0.85", lw=0.6, zorder=0)
    ax_x.set_xlabel("slow time t (grey: block boundaries)")
    ax_x.set_ylabel(f"$x_{state}$ (fast)")
    ax_x.set_title(f"fast: every token (eps = 1/P = 1/{P}, H = {H:g})")
    ax_x.legend(fontsize=7.5, loc="lower right")
    errors = {}
    for h, color in ((H, "C0"), (H / 2, "C2")):
        r = multirate_map(system, h, int(round(t_end / h)))
        y_ref = fs.integrate(system, (0.0, t_end), method="radau", rtol=1e-11, atol=1e-13,
                             t_eval=r["t_blocks"])["y"].values[:, 0]  # fmt: skip
        errors[h] = float(np.max(np.abs(r["y_blocks"][:, 0] - y_ref)))
        ax_y.plot(r["t_blocks"], r["y_blocks"][:, 0], "o-", ms=3, color=color, lw=1,
                  label=f"map, H = {h:g}: max error {errors[h]:.1e}")  # fmt: skip
    ax_y.plot(ref["time"].values, ref["y"].values[:, 0], color="k", lw=1, ls="--", label="ODE")
    ax_y.set_xlabel("slow time t")
    ax_y.set_ylabel("y (slow: once per block)")
    ax_y.set_title("slow: once per P tokens; first order in H")
    ax_y.legend(fontsize=7.5)
    fig.tight_layout()
    order = float(np.log2(errors[H] / errors[H / 2]))
    return {"figure": fig, "errors": errors, "order": order, "slow_updates": len(run["y_blocks"]) - 1,
            "tokens": len(run["x_tokens"]) - 1, "mass_error": float(np.max(np.abs(run["x_tokens"].sum(1) - 1)))}  # fmt: skip


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")  # before pyplot, which fastslow_sim.analysis imports
    from fastslow_sim.analysis.plots import script_arguments

    # --help; --out PATH, by default in fastslow-results/examples/ (a file of the user's there
    # is refused before the work)
    png, save = script_arguments(__doc__, "multirate_skeleton")
    out = main()
    print(f"{out['tokens']} tokens, {out['slow_updates']} slow updates (one per {P} tokens)")
    for h, e in out["errors"].items():
        print(f"H = {h:<6g} max |y_k - y(kH)| = {e:.3e}")
    print(f"order in H: {out['order']:.3f} (theory 1); max |1^T x - 1| = {out['mass_error']:.1e}")
    save(out["figure"])
    print(f"saved {png}")
