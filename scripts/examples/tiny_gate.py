"""A tiny fast-slow network whose gate opens on the master-equation corpus.

The `me` corpus is a language whose tokens are the states of a fast Markov chain with generator
Q(y_k); the slow variable y_k changes once per block of P tokens, driven by the block's token
histogram, so it carries information that the last few tokens alone do not. The coupled network
adds to every layer a slow path (causal block-mean pooling, attention among the pooled blocks,
phi_theta, upsampling) through a gate tanh(alpha) with alpha = 0 at initialisation: at step 0
the network is exactly the dense one. The gate still receives the gradient
<dL/d out, slow(x)>, and on this corpus training opens it. A small budget (about 16k tokens,
a few seconds on a CPU) is enough to see the gate leave zero.

What the curve's height and shape say, and what they do not: AdamW moves a parameter by about
the learning rate per step whatever the size of its gradient, so a gate whose gradient keeps one
sign traces tanh(sum of lr_t), drawn dashed; its S shape is the warm-up and the cosine decay.
That the gate follows it says only that the gradient kept pointing the same way. How much the
coupling helps is in the losses (the run's validation loss against ignore-y and the Bayes
floor, printed), and here, after so few tokens, the network does not use y yet.

    python scripts/examples/tiny_gate.py   # figure in fastslow-results/examples/
    python scripts/examples/tiny_gate.py --out fig.pdf   # elsewhere; or --help
"""

from __future__ import annotations

import math
import tempfile

import numpy as np

from fastslow_sim.corpora import load_corpus
from fastslow_sim.training import TrainConfig, train

TINY = {"P": 8, "batch_size": 8, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
        "eval_interval": 8, "eval_batches": 2, "warmup_steps": 4, "progress": False}  # fmt: skip
CORPUS = "me:tokens=60000"


def main(ax=None, tokens: int = 16_384, seed: int = 0, out: str | None = None) -> dict:
    """Train the coupled variant for `tokens` tokens and draw |tanh(alpha)| per layer against
    the step, beside tanh(sum of lr). Returns `{"figure", "gates": (steps, layers), "lr_reach":
    (steps,), "val_loss", "uniform_loss", "bayes_floor_loss", "ignore_y_loss"}`."""
    import matplotlib.pyplot as plt

    from fastslow_sim.analysis.palette import arm_color
    from fastslow_sim.io import load_dataset

    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 4.0))
    fig = ax.get_figure()
    corpus = load_corpus(CORPUS, P=TINY["P"], context=TINY["block_size"])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(variant="coupled", corpus=CORPUS, tokens=tokens, seed=seed,
                          out=out or f"{tmp}/run", **TINY)  # fmt: skip
        summary = train(cfg, corpus)
        logs = load_dataset(f"{cfg.out}/train.nc")
        gates, lr = logs["gate"].values, logs["lr"].values  # (steps, layers), (steps,)
    steps = np.arange(len(gates) + 1)
    gates = np.vstack([np.zeros(gates.shape[1]), gates])  # step 0: alpha = 0
    reach = np.tanh(np.concatenate([[0.0], np.cumsum(lr)]))  # AdamW's steps of about lr_t
    for layer in range(gates.shape[1]):
        ax.plot(steps, gates[:, layer], color=arm_color("coupled"), lw=1.5,
                alpha=0.5 + 0.5 * layer / max(gates.shape[1] - 1, 1), label=f"layer {layer}")  # fmt: skip
    ax.plot(steps, reach, "k--", lw=1, label=r"$\tanh\sum_{s \leq t} \mathrm{lr}_s$ (steps of lr)")
    ax.set_xlabel("training step (8 x 64 tokens each)")
    ax.set_ylabel(r"gate $|\tanh\alpha|$")
    ax.set_title(f"coupled network on the me corpus: the gate opens ({summary['tokens']:,} tokens)")
    ax.legend()
    return {"figure": fig, "gates": gates, "lr_reach": reach, "val_loss": summary["val_loss"],
            "uniform_loss": math.log(corpus.vocab_size),
            **{k: corpus.stats[k] for k in ("bayes_floor_loss", "ignore_y_loss")}}  # fmt: skip


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")  # before pyplot, which fastslow_sim.analysis imports
    from fastslow_sim.analysis.plots import script_arguments

    # --help; --out PATH, by default in fastslow-results/examples/ (a file of the user's there
    # is refused before the work)
    png, save = script_arguments(__doc__, "tiny_gate")
    out = main()
    g = out["gates"]
    print(f"gate |tanh alpha| per layer: step 0 {g[0].tolist()}, last step {np.round(g[-1], 4).tolist()}")
    print(f"validation loss {out['val_loss']:.4f} nats/token; uniform ln V = {out['uniform_loss']:.4f}, "
          f"ignore-y {out['ignore_y_loss']:.4f}, Bayes floor {out['bayes_floor_loss']:.4f}")
    save(out["figure"])
    print(f"saved {png}")
