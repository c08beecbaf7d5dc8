"""Dense output of the Rosenbrock march: the solution at output times inside accepted steps.

`y(t0 + s h) = (1-s) y0 + s (y1 + (1-s) (D_0.k + s D_1.k))` with the tableau's continuous
extension `D` (Hairer's, of order 3 for RODAS4); exact at `s = 1`.
"""

from __future__ import annotations

import torch

__all__ = ["dense_outputs"]


def dense_outputs(tab, rows, ks, y0, y1, t0, h, t1, t_eval, k_next, idx, out_rows, recorded):
    """Write the solution at every output time in `(t0, t1]` of the accepted steps `rows`,
    `y(t0 + s h) = (1-s) y0 + s (y1 + (1-s) (D_0.k + s D_1.k))`, and advance `k_next`; exact at
    `s = 1` (a step that landed on the output time). All the (step, output time) pairs at once:
    a step longer than the spacing of the output times covers several. `recorded`
    (differentiable runs) keeps the values with their graphs. `y0`, `y1` are batch last,
    `(n, b)`; `ks` the stages, `(s, n, b)` (a tensor, or a list of `(n, b)`)."""
    n = y1.shape[0]
    kk = k_next[rows]  # the first output time in each step (due: t_eval[kk] <= t1)
    k_end = torch.searchsorted(t_eval, t1[rows], right=True)  # past the last one
    k_next[rows] = k_end
    counts = k_end - kk
    if bool((counts == 1).all()):  # the usual case: one output time per step
        sel, k = rows, kk
    else:  # pair each step with each of its output times
        sel = rows.repeat_interleave(counts)
        first = (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
        k = kk.repeat_interleave(counts) + torch.arange(sel.numel(), device=sel.device) - first
    s = ((t_eval[k] - t0[sel]) / h[sel])[:, None].detach()
    y_end = y1[:, sel].T  # batch first from here
    if bool((s == 1).all()):  # every step landed on its output time: the step's end
        val = y_end
    else:  # D (2, s) times the stages of these steps, one product
        Ks = (ks if torch.is_tensor(ks) else torch.stack(ks))[:, :, sel]
        D = torch.tensor(tab.D, dtype=Ks.dtype, device=Ks.device)
        d0, d1 = (D @ Ks.reshape(tab.stages, -1)).reshape(2, n, -1).transpose(1, 2).unbind(0)
        val = (1 - s) * y0[:, sel].T + s * (y_end + (1 - s) * (d0 + s * d1))
    g = idx[sel]
    out_rows[k, g] = val.detach()
    if recorded is not None:
        for b, kb, i in zip(g.tolist(), k.tolist(), range(len(sel))):
            recorded[b][kb] = val[i]
