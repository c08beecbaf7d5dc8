"""The discrete multirate map that the network instantiates (DESIGN 3.3).

Tokens `t = 0, 1, ...`, blocks of `P` tokens, block `k` spanning slow time `[kH, (k+1)H)`:

    x_{t+1} = expm(tau Q(y_k)^T) x_t,     tau = H / (P eps)       (every token, exact)
    y_{k+1} = y_k + H g(mean_k x, y_k)                              (once per block)

where `mean_k x` is the mean of the `P` token states of block `k` (causal block-mean pooling).
The fast propagation is exact with `y` frozen over the block, so the map's error at fixed `H`
does not grow as `eps -> 0`, and its cost per unit slow time (`P/H` tokens, one matrix
exponential per block) does not depend on `eps`. As `H -> 0` it converges to the ODE at first
order in `H` (the slow update is an Euler step with a block-averaged fast state).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import expm

from .errors import InputError

__all__ = ["multirate_map"]


def multirate_map(system, H: float, n_blocks: int, P: int = 8, x0=None, y0=None) -> dict:
    """Run the map for `n_blocks` blocks; returns per-token fast states and per-block slow states.

    Returns `{"x_tokens": (n_blocks*P + 1, n), "y_blocks": (n_blocks + 1, m),
    "t_blocks": (n_blocks + 1,), "t_tokens": (n_blocks*P + 1,), "block_mean": (n_blocks, n)}`.
    """
    if not hasattr(system, "generator"):
        raise InputError(f"the multirate map needs a master-equation system; got {system.name!r}.")
    if not (np.isfinite(H) and H > 0):
        raise InputError(f"H (slow time per block) must be a positive finite number; got {H}.")
    if int(n_blocks) != n_blocks or n_blocks < 1:
        raise InputError(f"n_blocks must be a positive integer; got {n_blocks}.")
    if int(P) != P or P < 1:
        raise InputError(f"P (tokens per block) must be a positive integer; got {P}.")
    n, m = system.n_fast, system.n_slow
    x = np.asarray(system.x0 if x0 is None else x0, dtype=np.float64).reshape(n)
    y = np.asarray(system.y0 if y0 is None else y0, dtype=np.float64).reshape(m)
    tau = H / (P * system.eps)
    x_tokens = np.empty((n_blocks * P + 1, n))
    y_blocks = np.empty((n_blocks + 1, m))
    means = np.empty((n_blocks, n))
    x_tokens[0], y_blocks[0] = x, y
    for k in range(n_blocks):
        E = expm(tau * system.generator.rates(y).T)  # exact one-token propagator, y frozen
        block = np.empty((P, n))
        for j in range(P):
            x = E @ x
            block[j] = x
        x_tokens[k * P + 1 : (k + 1) * P + 1] = block
        means[k] = block.mean(axis=0)
        y = y + H * system.g(means[k][None], y[None])[0]
        y_blocks[k + 1] = y
    return {
        "x_tokens": x_tokens,
        "y_blocks": y_blocks,
        "t_blocks": H * np.arange(n_blocks + 1),
        "t_tokens": H / P * np.arange(n_blocks * P + 1),
        "block_mean": means,
    }
