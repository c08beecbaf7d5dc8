"""phi_theta against p_st: how close the trained network's picture of the slow manifold is to
the master-equation corpus's `p_st(y_b)`.

For every block `b >= 1` of every aligned validation window, the target is `p_st(y_b)`, the
stationary distribution of the generator that governs block `b` (from the corpus's exact
`y_b`). Readouts:
- `model head`: the network's own next-token distribution averaged over the block's second
  half (positions `P/2 .. P-1`), where the corpus's fast chain has mixed: this is the network's
  `phi_theta(y)`, and it exists for every arm, dense ones included;
- `slow-state probe`: softmax regression, fitted on training windows with `p_st` targets, from
  the last layer's gated slow state `tanh(alpha) z_{b-1}` (what block `b`'s tokens read);
  slow-path arms whose last gate is open (not frozen-gate: an exactly zero gate passes
  nothing, and the probe would be one constant distribution). The features are standardised,
  so the probe reads what `z_{b-1}` encodes whatever the gate's size, not how much the network
  uses it;
- `slow-state probe, untrained network`: its control, the same probe on the slow state
  `z_{b-1}` of the network as initialised (the run's seed, before any step; its gate is 0, so
  ungated): what a linear readout of random features of the past blocks already gives, so
  that the trained probe's distance is judged against it, not against the baselines alone;
- `probe on the past blocks' histograms`: the same probe on the token histograms of every
  earlier block of the window, up to 31 (by lag, with a mask where the window has none), no network at
  all: a linear readout of what the slow path is given (its pooled inputs are linear in these
  histograms). In the birth-death corpus `log p_st(y)` is linear in `y` and `y_b` in the past
  blocks' mean states, so this control is strong: a slow state that reads out worse than it
  holds less, linearly, than the raw histograms of the past.
Baselines, on the same blocks: uniform; the training split's token frequencies; the previous
block's histogram (anti-correlated with `p_st(y_b)` under the default negative feedback); the
slow law replayed from `y = 1/2` over the previous 3 blocks' histograms (a short look-back
that a fast path could learn); the exact Bayes filter's posterior mean of `p_st(y_b)` from the tokens before
block `b`; the Bayes filter's own next-token distribution read out like the head (what a head
that minimises log loss shows, the chain not having mixed completely: a reference, not a lower
bound on TV, since a head could come closer to `p_st` by leaning less on the previous tokens,
down to the filter's posterior mean of `p_st`); and `y` known (TV 0).
Distance: total variation `1/2 sum_i |a_i - b_i|`, mean over blocks with the standard error
across windows (blocks of one window are correlated; None for a single window).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .bridge import BridgeConfig, FastSlowLM
from .corpora import load_corpus
from .errors import InputError
from .io import check_writable, save_json
from .me_corpus import parse_me_spec
from .wording import plural

__all__ = ["load_run", "check_run", "phi_vs_pst", "save_result", "READOUTS"]

READOUTS = ("model head", "slow-state probe", "slow-state probe, untrained network",
            "probe on the past blocks' histograms", "Bayes filter, head readout", "Bayes filter p_st",
            "slow law over the last 3 blocks", "previous block's histogram", "corpus frequencies",
            "uniform", "y known")  # fmt: skip


def load_run(run_dir):
    """`(model, train_config dict)` from `run_dir/ckpt.pt`, on the CPU in eval mode."""
    model, tcfg, _ = _load(run_dir)
    return model, tcfg


def _load(run_dir):
    """`load_run`'s model and configuration, and the run's progress as the checkpoint holds
    it: `{"steps", "steps_planned", "finished", "tokens", "tokens_planned"}` (`tokens`: those
    trained, which an interrupted run has fewer of than planned; `tokens_planned`: the planned
    steps' tokens, whole steps, so at most the run's requested tokens)."""
    path = Path(run_dir) / "ckpt.pt"
    if not path.is_file():
        raise InputError(
            f"no checkpoint at {str(path)!r}; expected a folder written by train-network."
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = FastSlowLM(BridgeConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        tcfg = ckpt["train_config"]
        per_step = int(tcfg["batch_size"]) * int(tcfg["block_size"]) * int(ckpt.get("world_size", 1))
        steps, planned = int(ckpt["step"]), max(1, int(tcfg["tokens"]) // per_step)
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001
        raise InputError(
            f"the checkpoint {str(path)!r} is corrupt or unreadable ({type(err).__name__})."
        ) from None
    progress = {"steps": steps, "steps_planned": planned, "finished": steps >= planned,
                "tokens": steps * per_step, "tokens_planned": planned * per_step}  # fmt: skip
    return model.eval(), tcfg, progress


def initial_network(config: BridgeConfig, seed: int) -> FastSlowLM:
    """The network of a run with `config` and `seed` as `train` initialises it, before any
    step (in eval mode), without touching the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))  # as `train` seeds it, just before building the model
        return FastSlowLM(config).eval()


@torch.no_grad()
def _readouts(model, windows, P, gated=True):
    """Head distributions `(W, T, V)` and last-layer slow states `(W, nb, C)` (times the gate
    `tanh(alpha)` where `gated`) or None."""
    heads, slows = [], []
    for i in range(0, len(windows), 32):
        idx = torch.from_numpy(windows[i : i + 32, :-1])
        logits, _ = model(idx)
        heads.append(torch.softmax(logits.double(), -1).numpy())
        if model.slow is not None:
            z = model.slow_states()[-1]  # (B, nb, C)
            slows.append((model.slow[-1].gate() * z if gated else z).double().numpy())
    return np.concatenate(heads), (np.concatenate(slows) if slows else None)


def _fit_probe(X, Y, steps=200, l2=1e-4):
    """Softmax regression `X -> Y` (soft targets), by L-BFGS; returns a predict function."""
    Xt = torch.tensor(X, dtype=torch.float64)
    mu, sd = Xt.mean(0), Xt.std(0) + 1e-8  # scale-free: a tiny gate still carries its signal
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


PAST_LAGS_MAX = 31  # the probe control's look-back, in blocks: every earlier one at T/P = 32


def past_block_histograms(windows, P: int, V: int, lags: int = PAST_LAGS_MAX) -> np.ndarray:
    """Features `(W, nb-1, L(V+1))` of blocks `b = 1..nb-1` of windows `(W, >= nb P)`, `L =
    min(lags, nb-1)`: for each lag `j = 1..L`, the token histogram of block `b - j` and a 1, or
    zeros where the window starts after it (`nb = T // P` blocks of `T = windows.shape[1] - 1`
    tokens); block `b` itself and later ones never enter. (Capped: at P = 1 every earlier
    block would be W x 65,000 x 9 numbers.)"""
    W = len(windows)
    nb = (windows.shape[1] - 1) // P
    L = min(lags, nb - 1)
    hist = (windows[:, : nb * P].reshape(W, nb, P)[..., None] == np.arange(V)).mean(axis=2)
    X = np.zeros((W, nb - 1, L, V + 1))  # (window, block b - 1, lag - 1, histogram + mask)
    for b in range(1, nb):
        lag = np.arange(min(b, L))  # lag - 1: blocks b-1 down to max(0, b - L)
        X[:, b - 1, lag, :V] = hist[:, b - 1 - lag]
        X[:, b - 1, lag, V] = 1.0
    return X.reshape(W, nb - 1, -1)


def _tv(a, b):
    return 0.5 * np.abs(a - b).sum(-1)


def _windows(corpus, split, T, limit):
    """Windows of `split` and the global index of each window's first block."""
    win, starts = corpus.windows(split, T, limit)
    return win, starts // corpus.block_len


def check_run(run_dir):
    """`(model, train_config, progress, corpus)` of the run in `run_dir` once it passes every
    check phi-vs-pst makes before any work (a checkpoint of an me-corpus run whose context
    holds at least two blocks and whose validation split two windows, a result path that may be
    written); else `InputError`."""
    model, tcfg, progress = _load(run_dir)
    check_writable(Path(run_dir) / "phi_vs_pst.json", "phi-vs-pst result")  # before the work
    bad = [name for name, w in model.named_parameters() if not bool(torch.isfinite(w).all())]
    if bad:  # a diverged run's checkpoint: every readout would be NaN, reported as a result
        raise InputError(
            f"run {str(run_dir)!r}: the checkpoint's weights are not finite ({bad[0]}"
            f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}), so the run diverged; "
            f"expected a network with finite weights."
        )
    corpus_spec = str(tcfg.get("corpus"))
    if not (corpus_spec == "me" or corpus_spec.startswith("me:")):
        raise InputError(
            f"run {str(run_dir)!r} was trained on {corpus_spec!r}; phi-vs-pst needs an 'me' corpus."
        )
    P, T = model.config.P, tcfg["block_size"]
    try:
        block = parse_me_spec(corpus_spec, P=tcfg["P"], context=T).P
    except InputError as err:  # a spec this version refuses
        raise InputError(f"run {str(run_dir)!r}: {err}") from None
    if block != P:  # `me:block=N`: the readouts are per corpus block, the slow state per P
        raise InputError(f"run {str(run_dir)!r}: the model's P={P} differs from its corpus's "
                         f"block length {block} ({corpus_spec}); phi-vs-pst reads the slow state "
                         f"once per corpus block, so it expects a run whose P is the corpus's "
                         f"block length.")  # fmt: skip
    if model.config.pool_offset:  # the slow states would be read against the wrong blocks
        raise InputError(f"run {str(run_dir)!r}: its pooling grid starts at token "
                         f"{model.config.pool_offset} (--pool-offset), off the corpus's blocks; "
                         f"phi-vs-pst reads the slow state once per corpus block, so it expects "
                         f"a run with --pool-offset 0.")  # fmt: skip
    if T % P:
        raise InputError(f"run {str(run_dir)!r}: the context {T} is not a multiple of P={P}.")
    if T // P < 2:
        raise InputError(
            f"run {str(run_dir)!r}: the context {T} holds fewer than two blocks of P={P}."
        )
    try:
        corpus = load_corpus(corpus_spec, P=tcfg["P"], context=T)
    except InputError as err:  # a corpus this version refuses (too small for two windows)
        raise InputError(f"run {str(run_dir)!r}: {err}") from None
    n_val = len(corpus.window_starts("val", T))
    if n_val < 2:  # the standard errors are across windows
        raise InputError(f"run {str(run_dir)!r}: its corpus {corpus_spec!r} has "
                         f"{plural(n_val, 'validation window')} of {T + 1} tokens; expected at "
                         f"least two, for a standard error across windows.")  # fmt: skip
    return model, tcfg, progress, corpus


def phi_vs_pst(run_dir, max_windows: int = 2000, probe_windows: int = 400, bins: int = 12,
               write: bool = True, checked: tuple | None = None) -> dict:
    """Mean TV distance to `p_st(y_b)` of every readout and baseline (module docstring), with
    standard errors, and the readouts binned by `y` for the figure (bins with no block left
    out); written to
    `run_dir/phi_vs_pst.json` (`write=False`: not written; `save_result` writes it). The
    tokens are those the checkpoint's steps trained, `finished` says whether it holds every
    planned step. `checked`: what `check_run(run_dir)` returned, where the caller checked the
    run already (the checkpoint and corpus are then not loaded again)."""
    from .me_corpus import MECorpusConfig, _start_prior, bayes_filter
    from .stationary import stationary_distribution

    model, tcfg, progress, corpus = check_run(run_dir) if checked is None else checked
    corpus_spec = str(tcfg.get("corpus"))
    P, T = model.config.P, tcfg["block_size"]
    mcfg = MECorpusConfig(**corpus.stats["config"])
    V, nb = corpus.vocab_size, T // P
    ys, pst_all = corpus.blocks["y"], corpus.blocks["p_st"]

    win, first_block = _windows(corpus, "val", T, max_windows)  # (W, T+1), (W,)
    W = len(win)
    blocks = first_block[:, None] + np.arange(1, nb)  # (W, nb-1): blocks b = 1..nb-1
    target = pst_all[blocks]  # (W, nb-1, V)
    late = np.arange(P // 2, P)  # positions of a block where the chain has mixed

    def head_readout(next_dist):  # (W, T, V), row t-1 predicts token t -> (W, nb-1, V)
        pos = np.arange(1, nb)[:, None] * P + late[None, :]  # predicted tokens
        return next_dist[:, pos - 1].mean(axis=2)

    heads, slow = _readouts(model, win, P)
    filt = bayes_filter(win, mcfg, _start_prior(corpus, mcfg), predictive=True)
    hist = (win[:, :-1].reshape(W, -1, P)[:, : nb - 1, :, None] == np.arange(V)).mean(axis=2)
    train = np.asarray(corpus.train, dtype=np.int64)
    freqs = np.bincount(train, minlength=V) / len(train)
    # the cheap causal baseline: the slow law replayed from y = 1/2 over the last 3 blocks
    means = hist @ mcfg.readout()  # (W, nb-1): mean state of blocks 0..nb-2
    replay = np.empty((W, nb - 1))
    for b in range(1, nb):
        y = np.full(W, 0.5)
        for k in range(max(0, b - 3), b):
            y = mcfg.slow_update(y, means[:, k])
        replay[:, b - 1] = y
    replayed = stationary_distribution(mcfg.generator().rates(replay.reshape(-1))).reshape(
        target.shape
    )
    readouts = {
        "slow law over the last 3 blocks": replayed,
        "model head": head_readout(heads),
        "Bayes filter, head readout": head_readout(filt["next"]),
        "Bayes filter p_st": filt["pst"][:, 1:nb],
        "previous block's histogram": hist,
        "corpus frequencies": np.broadcast_to(freqs, target.shape),
        "uniform": np.full(target.shape, 1.0 / V),
        "y known": target,
    }
    twin, tfirst = _windows(corpus, "train", T, probe_windows)
    ttarget = pst_all[tfirst[:, None] + np.arange(1, nb)].reshape(-1, V)
    features = min(PAST_LAGS_MAX, nb - 1) * (V + 1)
    past = _fit_probe(past_block_histograms(twin, P, V).reshape(-1, features), ttarget)
    readouts["probe on the past blocks' histograms"] = past(
        past_block_histograms(win, P, V).reshape(-1, features)
    ).reshape(target.shape)
    if slow is not None:

        def probe(net, val_states, gated):  # fitted on training windows, read on validation
            _, states = _readouts(net, twin, P, gated)
            predict = _fit_probe(states[:, : nb - 1].reshape(-1, states.shape[-1]), ttarget)
            return predict(val_states[:, : nb - 1].reshape(-1, val_states.shape[-1])).reshape(
                target.shape
            )

        if bool((model.slow[-1].gate() != 0).any()):
            readouts["slow-state probe"] = probe(model, slow, gated=True)
        untrained = initial_network(model.config, tcfg["seed"])
        readouts["slow-state probe, untrained network"] = probe(
            untrained, _readouts(untrained, win, P, gated=False)[1], gated=False
        )
    tv = {}
    for name in READOUTS:
        if name in readouts:
            per_window = _tv(readouts[name], target).mean(axis=1)  # (W,)
            tv[name] = {"mean": float(per_window.mean()),  # se None: one window, none to give
                        "se": float(per_window.std(ddof=1) / np.sqrt(W)) if W > 1 else None}  # fmt: skip
    y_blocks = ys[blocks].reshape(-1)
    edges = np.quantile(y_blocks, np.linspace(0, 1, bins + 1))
    which = np.clip(np.searchsorted(edges, y_blocks, side="right") - 1, 0, bins - 1)
    filled = [k for k in range(bins) if (which == k).any()]  # a bin with no block is left out
    binned = {"y": [float(y_blocks[which == k].mean()) for k in filled]}
    for name in ("y known", "model head", "slow-state probe", "slow-state probe, untrained network",
                 "Bayes filter, head readout"):
        if name in readouts:
            flat = readouts[name].reshape(-1, V)
            binned[name] = [flat[which == k].mean(axis=0).tolist() for k in filled]
    result = {
        "run": str(run_dir),
        "arm": tcfg.get("arm") or tcfg["variant"],
        "variant": tcfg["variant"],
        "corpus": corpus_spec,
        **progress,  # the tokens the checkpoint's steps trained, not the planned ones
        "P": P,
        "seed": tcfg["seed"],
        "windows": int(W),
        "blocks": int(W * (nb - 1)),
        "readout_positions": late.tolist(),
        "tv": tv,
        "binned": binned,
    }
    if write:
        save_result(run_dir, result)
    return result


def save_result(run_dir, result: dict) -> Path:
    """Write `phi_vs_pst`'s `result` to `run_dir/phi_vs_pst.json`."""
    return save_json(result, Path(run_dir) / "phi_vs_pst.json", "phi-vs-pst result", indent=None)
