"""phi_theta against p_st: what the trained slow path knows about the master-equation corpus.

For every validation block `j` of the `me` corpus, the last layer's slow state `z_j` is what the
tokens of block `j+1` read (the completed-blocks rule). We turn it into a distribution over the
`V` states two ways and compare with `p_st(y_{j+1})`, the stationary distribution of the
generator that governs block `j+1`:
- through the model's own head: `softmax(lm_head(ln_f(z_j)))`;
- through a linear probe: softmax regression from `z_j` to block `j+1`'s token histogram,
  fitted on training blocks.
Baselines: uniform; the corpus's overall token frequencies; the predicted block's own empirical
histogram (a sample of `P` tokens: its distance is the sampling-noise level, not a predictor).
The distance is the total variation `1/2 sum_i |a_i - b_i|`, averaged over blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .bridge import BridgeConfig, FastSlowLM
from .corpora import load_corpus
from .errors import InputError

__all__ = ["load_run", "phi_vs_pst"]


def load_run(run_dir):
    """`(model, train_config dict)` from `run_dir/ckpt.pt`, on the CPU in eval mode."""
    path = Path(run_dir) / "ckpt.pt"
    if not path.is_file():
        raise InputError(
            f"no checkpoint at {str(path)!r}; expected a folder written by train-network."
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        model = FastSlowLM(BridgeConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001
        raise InputError(
            f"the checkpoint {str(path)!r} is corrupt or unreadable ({type(err).__name__})."
        ) from None
    return model.eval(), ckpt["train_config"]


def _windows(tokens, first_block, end_block, P, T, max_windows):
    """Non-overlapping windows of `T` tokens of the global stream, starting at block boundaries
    from block `first_block` and ending before block `end_block`: `(tokens, first block)`."""
    blocks_per = T // P
    out = []
    for b in range(first_block, end_block - blocks_per + 1, blocks_per):
        out.append((np.asarray(tokens[b * P : b * P + T], dtype=np.int64), b))
        if len(out) >= max_windows:
            break
    return out


@torch.no_grad()
def _slow_readout(model, windows, P):
    """Last-layer slow states and head distributions for block j (read by block j+1)."""
    feats, head, gidx = [], [], []
    for toks, first in windows:
        idx = torch.from_numpy(toks)[None]
        model(idx)
        z = model.slow_states()[-1][0]  # (nb, C)
        nb = z.shape[0] - 1  # the last block has no successor inside the window
        z = z[:nb]
        feats.append(z.numpy())
        head.append(torch.softmax(model.lm_head(model.transformer.ln_f(z)), -1).numpy())
        gidx.append(first + np.arange(nb))
    return np.concatenate(feats), np.concatenate(head), np.concatenate(gidx)


def _fit_probe(X, Y, steps=300, l2=1e-4):
    """Softmax regression `X -> Y` (soft targets), by L-BFGS; returns a predict function."""
    Xt = torch.tensor(X, dtype=torch.float64)
    mu, sd = Xt.mean(0), Xt.std(0) + 1e-8
    Xs = (Xt - mu) / sd
    Yt = torch.tensor(Y, dtype=torch.float64)
    W = torch.zeros(X.shape[1], Y.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(Y.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -(Yt * torch.log_softmax(Xs @ W + b, -1)).sum(-1).mean() + l2 * (W**2).sum()
        loss.backward()
        return loss

    opt.step(closure)

    def predict(Z):
        Zs = (torch.tensor(Z, dtype=torch.float64) - mu) / sd
        return torch.softmax(Zs @ W + b, -1).detach().numpy()

    return predict


def _tv(a, b):
    return 0.5 * np.abs(a - b).sum(-1)


def phi_vs_pst(run_dir, max_windows: int = 400) -> dict:
    """Mean total-variation distance from `p_st(y)` of the head and probe readouts and baselines."""
    model, tcfg = load_run(run_dir)
    if tcfg.get("corpus") != "me":
        raise InputError(
            f"run {str(run_dir)!r} was trained on {tcfg.get('corpus')!r}; phi-vs-pst needs the 'me' corpus."
        )
    if model.slow is None:
        raise InputError(f"run {str(run_dir)!r} is a dense model: it has no slow path to read.")
    P, T = model.config.P, model.config.block_size
    corpus = load_corpus("me", P=tcfg["P"])
    if corpus.stats["P"] != P:
        raise InputError(f"the model's P={P} differs from the corpus's P={corpus.stats['P']}.")
    ys, pst = corpus.blocks["y"], corpus.blocks["p_st"]
    tokens = np.concatenate([np.asarray(corpus.train), np.asarray(corpus.val)])
    V = corpus.vocab_size

    def hist(block):
        return np.bincount(tokens[block * P : (block + 1) * P], minlength=V) / P

    n_blocks = len(tokens) // P
    first_val = -(-len(corpus.train) // P)  # first block that lies wholly in the validation split
    # training windows end one block early: the probe's target is the following block
    train_w = _windows(tokens, 0, len(corpus.train) // P - 1, P, T, max_windows)
    val_w = _windows(tokens, first_val, n_blocks - 1, P, T, max_windows)
    Xtr, _, gtr = _slow_readout(model, train_w, P)
    Xva, head, gva = _slow_readout(model, val_w, P)
    probe = _fit_probe(Xtr, np.stack([hist(g + 1) for g in gtr]))(Xva)
    target = pst[gva + 1]  # p_st of the generator that governs the predicted block
    freqs = np.bincount(np.asarray(corpus.train), minlength=V) / len(corpus.train)
    own = np.stack([hist(g + 1) for g in gva])
    rows = {
        "model head": _tv(head, target),
        "linear probe": _tv(probe, target),
        "uniform": _tv(np.full(V, 1.0 / V), target),
        "corpus frequencies": _tv(freqs, target),
        "block's own histogram": _tv(own, target),
    }
    result = {
        "run": str(run_dir),
        "variant": tcfg["variant"],
        "blocks": int(len(gva)),
        "mean_tv": {k: float(v.mean()) for k, v in rows.items()},
        "y": ys[gva + 1].tolist(),
        "p_st_mean_state": (target @ np.arange(V) / (V - 1)).tolist(),
        "head_mean_state": (head @ np.arange(V) / (V - 1)).tolist(),
        "probe_mean_state": (probe @ np.arange(V) / (V - 1)).tolist(),
    }
    out = Path(run_dir) / "phi_vs_pst.json"
    tmp = out.with_name(".phi_vs_pst.json.part")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)
    return result
