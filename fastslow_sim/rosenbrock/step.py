"""One Rosenbrock step of any tableau on a batch stored batch last, `y (n, b)`.

One factorisation of `I/(h gamma) - J` (by the march's `LinearSolver`) and one solve per stage.
Each stage sum `y + sum_j A_ij k_j` (and `sum_j C_ij k_j`) is a single matrix product; without
autograd the stages are written into one `(s, n, b)` buffer reused from step to step, with it
they stay separate tensors that autograd records. With a compiled linear solver the stage states
and the stage solves run as numba kernels, one pass each.
"""

from __future__ import annotations

import numpy as np
import torch

from ..linalg import keep_one
from .tableau import RosenbrockTableau

__all__ = ["rosenbrock_step"]


def rosenbrock_step(tab: RosenbrockTableau):
    """`step(field, y, h, 1/h, idx, solver, workspace) -> (y_new, error vector, stages)`."""
    from_previous, stiffly_accurate = tab.from_previous, tab.stiffly_accurate
    s_stages = tab.stages
    rows = {}  # (dtype, device) -> the rows of A and C as (1, i) tensors

    def coefficient_rows(like):
        key = (like.dtype, like.device)
        if key not in rows:
            kw = {"dtype": like.dtype, "device": like.device}
            rows[key] = (
                [torch.tensor([a], **kw) if a else None for a in tab.A],
                [torch.tensor([c], **kw) if c else None for c in tab.C],
            )
        return rows[key]

    # the rows as numpy arrays for the compiled kernels (`cpu_kernels.combine`, `.stage`)
    A_np = [np.array(a, dtype=np.float64) for a in tab.A]
    C_np = [np.array(c, dtype=np.float64) for c in tab.C]

    def step(field, ya, hh, inv_h, sel, solver, workspace=None):  # ya (n, b), hh (b,)
        s = (hh * tab.gamma).reciprocal_()
        fac, k0 = solver.factor(field.jac(ya, sel), s, first=field.fun(ya, sel),
                                workspace=workspace)  # fmt: skip
        A, C = coefficient_rows(ya)
        n, b = ya.shape
        buffered = not (k0.requires_grad or ya.requires_grad)  # in place unless autograd records
        kernels = solver.kernels if buffered else None
        if buffered:

            def stage_buffer():  # K (s, n, b), its rows k_j, and k_0..k_{i-1} flat as (i, n b);
                # for the kernels, numpy views of K and of the stage states Y (s, n, b)
                K = torch.empty((s_stages, n, b), dtype=ya.dtype, device=ya.device)
                Kf = K.view(s_stages, n * b)
                Y = torch.empty_like(K) if kernels is not None else None
                numpy = (K.numpy(), Y.numpy()) if kernels is not None else (None, None)
                return K, K.unbind(0), [Kf[:i] for i in range(s_stages + 1)], Y, numpy

            # reused from step to step: the caller is done with the stages before the next step
            K, ks, leading, Y, (K_np, Y_np) = (stage_buffer() if workspace is None
                              else keep_one(workspace, ("stages", n, b), stage_buffer))  # fmt: skip
            ks[0].copy_(k0)
        else:
            ks = [k0]

        def first(i):  # k_0 .. k_{i-1} as (i, n b)
            return leading[i] if buffered else torch.stack(ks[:i]).view(i, n * b)

        yf, yi = ya.reshape(1, n * b), ya
        if kernels is not None:
            ya_np, inv_h_np = ya.numpy(), inv_h.numpy().reshape(-1)
        for i in range(1, s_stages):
            if from_previous[i]:
                yi = yi + ks[i - 1]
            elif kernels is not None:  # y + sum_j A_ij k_j in one pass
                kernels.combine(ya_np, K_np[:i], A_np[i], Y_np[i])
                yi = Y[i]
            else:  # mm then add: faster than addmm for one row on the CPU
                yi = torch.mm(A[i], first(i)).add_(yf).view(n, b)
            if kernels is not None:  # (s I - J)^{-1} (f + sum_j C_ij k_j / h), one pass
                fac.stage(field.fun(yi, sel), K_np[:i], C_np[i], inv_h_np, out=ks[i])
                continue
            rhs = torch.addcmul(field.fun(yi, sel), torch.mm(C[i], first(i)).view(n, b), inv_h)
            if buffered:
                fac(rhs, out=ks[i])
            else:
                ks.append(fac(rhs))
        if stiffly_accurate:
            y_new = yi + ks[-1]
        else:
            y_new = torch.addmm(yf, ya.new_tensor([tab.M]), first(s_stages)).view(n, b)
        if tab.plain_error:
            err = ks[-1]
        else:
            err = torch.mm(ya.new_tensor([tab.E]), first(s_stages)).view(n, b)
        return y_new, err, (K if buffered else ks)

    return step
