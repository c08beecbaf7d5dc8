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


def block_rows(t0, t1, H, t_eval) -> np.ndarray:
    """The rows (blocks) of the map's states over `[t0, t1]` at the times of `t_eval`, or
    `InputError` unless each is a block end `t0 + k H` (within 1e-9 of a block): the map has no
    state between block ends, so a t_eval elsewhere is refused rather than answered at other
    times."""
    n = whole_blocks(t0, t1, H)
    t_eval = np.asarray(t_eval, dtype=np.float64)
    k = (t_eval - t0) / H
    rows = np.rint(k).astype(np.int64)
    off = np.abs(k - rows) > 1e-9 * np.maximum(np.abs(k), 1.0)
    if np.any(off) or np.any(rows < 0) or np.any(rows > n):
        bad = float(t_eval[np.argmax(off | (rows < 0) | (rows > n))])
        raise InputError(
            f"t_eval holds t = {bad:g}, which is not the end of a block of the multirate map "
            f"(blocks of H = {H:g} from t = {t0:g}); expected times t0 + k H, or no t_eval (the "
            f"map saves every block end)."
        )
    return rows


def solve_multirate(system, z0, t_eval, rtol, atol, eps=None, H=DEFAULT_H):
    """The map per trajectory; one whose slow step leaves the generator's domain gets status
    `left_domain`, its states NaN from that block end on (`multirate.MapLeftDomainError`)."""
    from ..multirate import MapLeftDomainError, multirate_map

    t0, t1 = float(t_eval[0]), float(t_eval[-1])
    n_blocks = whole_blocks(t0, t1, H)
    n = system.n_fast
    B = z0.shape[0]
    z = np.full((n_blocks + 1, B, z0.shape[1]), np.nan)
    P, status, message, nfev = [], [], [], []
    for b in range(B):
        one = system if eps is None else system.with_eps(float(eps[b]))
        try:
            run = multirate_map(one, H, n_blocks, None, z0[b, :n], z0[b, n:], tokens=False)
        except MapLeftDomainError as stop:  # the rows before it kept, the rest NaN
            done = len(stop.y_blocks)
            z[:done, b] = np.concatenate([stop.x_blocks, stop.y_blocks], axis=1)
            P.append(stop.P)
            status.append("left_domain")
            message.append(f"multirate stopped: left_domain at t = {t0 + done * H:.6g} "
                           f"({stop.reason}; a smaller H keeps y inside)")  # fmt: skip
            nfev.append(stop.block + 1)
            continue
        z[:, b] = np.concatenate([run["x_blocks"], run["y_blocks"]], axis=1)
        P.append(run["P"])
        status.append("success")
        # each trajectory's own P (one eps per trajectory): its message, and the dataset's
        # `tokens_per_block` only where they all share it (else the variable P_batch says each)
        message.append(f"{plural(n_blocks, 'block')} of slow time H={H:g}, "
                       f"{plural(run['P'], 'token')} each")  # fmt: skip
        nfev.append(n_blocks)
    stats = {"nfev": np.array(nfev), "njev": np.zeros(B, int), "nlu": np.zeros(B, int)}
    attrs = {"H": H}
    if len(set(P)) == 1:
        attrs["tokens_per_block"] = P[0]
    return Solution(z, status, message, stats, t=t0 + H * np.arange(n_blocks + 1),
                    attrs=attrs)  # fmt: skip


register(Method(
    "multirate", "multirate", True,
    "multirate map of DESIGN 3.3: exact fast propagation per token, one slow step per block H",
    solve_multirate, options=("H",), atol_min=ATOL_ANY,
    atol_why="the map takes no tolerance (its fast propagation is exact per token)",
))  # fmt: skip
