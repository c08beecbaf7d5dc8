"""The multirate map of DESIGN 3.3 (`fastslow_sim.multirate`) as the `multirate` method: blocks of
slow time `H`, `P = 1/eps` tokens each (the system's), the state saved at block ends."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..wording import plural
from . import ATOL_ANY, Method, Solution, register

DEFAULT_H = 0.01  # slow time per block when `H` is not given


MAX_BLOCKS = 999_999  # one saved state per block: integrate saves at most 1,000,000 points


def check_block_count(t_end, H=None) -> float:
    """The blocks of slow time `H` (default `DEFAULT_H`) in `[0, t_end]`, or `InputError` when
    there are more than `MAX_BLOCKS`, each a saved state (`integrate --method multirate`)."""
    blocks = t_end / (DEFAULT_H if H is None else H)
    if not blocks <= MAX_BLOCKS:
        raise InputError(
            f"--t-end / --H is {blocks:.3g} blocks of the multirate map, each a saved time "
            f"point; expected at most {MAX_BLOCKS:,} blocks (a larger --H or a shorter "
            f"--t-end)."
        )
    return blocks


def whole_blocks(t0, t1, H) -> int:
    """The number of blocks of slow time `H` in `[t0, t1]`, or `InputError` unless it is whole."""
    from ..validation import positive

    H = positive("H", H)
    blocks = (t1 - t0) / H
    n = int(round(blocks))
    if n < 1 or abs(blocks - n) > 1e-9 * max(blocks, 1.0):
        raise InputError(
            f"the span {t1 - t0:g} is not a whole number of blocks of H = {H:g} ({blocks:.6g} "
            f"blocks); expected a span that is a multiple of H, such as {max(n, 1) * H:g}."
        )
    return n


def solve_multirate(system, z0, t_eval, rtol, atol, eps=None, H=DEFAULT_H):
    from ..multirate import multirate_map

    t0, t1 = float(t_eval[0]), float(t_eval[-1])
    n_blocks = whole_blocks(t0, t1, H)
    n = system.n_fast
    z = np.empty((n_blocks + 1, z0.shape[0], z0.shape[1]))
    P = []
    for b in range(z0.shape[0]):
        one = system if eps is None else system.with_eps(float(eps[b]))
        run = multirate_map(one, H, n_blocks, None, z0[b, :n], z0[b, n:], tokens=False)
        z[:, b] = np.concatenate([run["x_blocks"], run["y_blocks"]], axis=1)
        P.append(run["P"])
    B = z0.shape[0]
    message = f"{plural(n_blocks, 'block')} of slow time H={H:g}, {plural(P[0], 'token')} each"
    stats = {"nfev": np.full(B, n_blocks), "njev": np.zeros(B, int), "nlu": np.zeros(B, int)}
    return Solution(z, ["success"] * B, [message] * B, stats, t=t0 + H * np.arange(n_blocks + 1),
                    attrs={"H": H, "tokens_per_block": P[0]})  # fmt: skip


register(Method(
    "multirate", "multirate", True,
    "multirate map of DESIGN 3.3: exact fast propagation per token, one slow step per block H",
    solve_multirate, options=("H",), atol_min=ATOL_ANY,
    atol_why="the map takes no tolerance (its fast propagation is exact per token)",
))  # fmt: skip
