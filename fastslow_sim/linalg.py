"""Batched linear solves `(s I - J)^{-1} r` for the Rosenbrock stages: dense and arrow-tridiagonal.

A Rosenbrock step factors `s I - J` once (`s = 1/(h gamma)`, one value per trajectory) and solves
with it once per stage. Two forms of `J`:

- a dense tensor `(B, N, N)`: batched LU with partial pivoting (`torch.linalg.lu_factor_ex`);
- `ArrowTridiagonal`: `J = [[T, u], [v^T, d]]` with `T` tridiagonal `(n x n)` and one bordering
  row and column, the Jacobian of a master-equation system whose fast chain only jumps between
  neighbours (two-state, birth-death, Michaelis-Menten) with one slow variable.

Why the second form: on the CPU a batched LAPACK LU treats each small matrix on its own (about
1 us per 17 x 17 solve), and a Rosenbrock step needs six solves. The arrow form is solved with
whole-batch vector operations: Gaussian elimination along the chain (the Thomas algorithm) on
one `(B,)` row per state, from both ends at once (two rows per operation, `n` multiply-adds per
solve in `n/2` operations), and the Schur complement of the border,
`sigma = (s - d) - v^T (s I - T)^{-1} u`. The number of tensor operations per solve does not
depend on the batch size. Without autograd it runs in place on buffers the caller may keep
(`workspace`); with autograd, or under torch.compile, an out-of-place one-sided version runs.

Stability without pivoting: for a master-equation system `s I - T` is `s I - Q(y)^T/eps`, column
diagonally dominant (column `j`: diagonal `s + |q_jj|/eps`, off-diagonal sum `|q_jj|/eps`);
Gaussian elimination keeps column dominance, so every multiplier has modulus at most 1 (growth
factor at most 2, Wilkinson 1961); `sigma` vanishes only where `s I - J` is singular. (Parallel
cyclic reduction, with fewer, larger operations, was tried and dropped: its componentwise
backward error reached 7e-8 on such matrices with rates of 1e8, against 1e-14 for elimination.)
Eliminating from both ends is elimination in the pivot order `0, n-1, 1, n-2, ...`, a symmetric
permutation, which keeps column dominance and so the same bound. The compiled CPU kernels
(`cpu_kernels`, the default on the CPU) eliminate from one end: in a compiled loop both cost the
same.

The border: `s I - T` is nearly singular when `s` is small against the rates (its columns sum
to `s`), along the slow mode. A master-equation Jacobian's border column `u = d(Q^T x)/dy / eps`
sums to zero (the chain conserves probability), so `w = (s I - T)^{-1} u` carries no `1/s`
growth and `sigma` no cancellation: backward errors of at most 6e-16 in a sweep of 23,000 such
systems (rates up to 1e8, shifts 1e-2 to 1e4; `tests/test_linalg.py`). With an arbitrary border
column the Schur complement is not backward stable: up to 9e-12 at rates 1e8, shift 1e-2.

The mass: backward stable is not mass-keeping. At stiff, lopsided rates (the birth-death chain
at eps 1e-12, up rates 1e34 times the down rates) the elimination down the chain gave stages
whose chain sums were off `sum_i r_i / s` by 1e-3 of their scale `sum |k_i| + sum |r_i| / s`
on the slow manifold, by all of it at random states, and rodas4 from y0 =
150 ended 1.6e-5 off the simplex, reported as success. A master equation's Jacobian carries its
chain's state (`ArrowTridiagonal.chain_state`, set only by `ArrowTridiagonal.master_equation`,
which derives `diag` and `u` from the rates so that the columns of `[T, u]` sum to zero, as this
solve takes them to without reading them; `MasterEquationSystem.torch_functions` builds it so):
it is then solved in the partial sums of the chain's unknowns around the heaviest state, the
compiled march's solve (`cpu_kernels.chain_solve`, and `_chain_factor` / `_chain_solve` in
torch operations, out of place, for CUDA, autograd and torch.compile), which keeps the chain's
sum to the round-off of the entries (6.4e-10 off at most in that run).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .errors import InputError
from .generators import chain_divergence

__all__ = [
    "ArrowTridiagonal",
    "LinearSolver",
    "LINEAR_SOLVERS",
    "linear_solver",
    "shifted_solver",
    "keep_one",
    "compiled_kernels",
]


@dataclass
class ArrowTridiagonal:
    """`J = [[T, u], [v^T, d]]` for a batch of `B` matrices, stored chain-major (batch last, so
    that each chain row is one contiguous `(B,)` vector): `T` tridiagonal with `sub (n, B)`
    (`sub[i] = T[i, i-1]`, `sub[0] = 0`), `diag (n, B)`, `sup (n, B)` (`sup[i] = T[i, i+1]`,
    `sup[-1] = 0`); `u (n, B)` the last column, `v (n, B)` the last row, `d (B,)` the corner.

    `chain_state (n, B)`, set only by `master_equation` (the constructor refuses it), says that
    `J` is a master equation's Jacobian taken at the chain's state `x = chain_state`: the
    columns of `[T, u]` sum to zero (`diag_i = -(sub_{i+1} + sup_{i-1})`, `sum_i u_i = 0`),
    which the solve then takes as given and does not read. `shifted_solver` then solves in the
    partial sums of the chain's unknowns around the heaviest state of `x`
    (`cpu_kernels.chain_solve`, the compiled march's solve), which keeps the mass: the chain's
    unknowns sum to the right-hand side's chain sum over `s` to the round-off of the entries,
    whatever the rates. Without it (any other arrow matrix) the elimination down the chain."""

    sub: torch.Tensor
    diag: torch.Tensor
    sup: torch.Tensor
    u: torch.Tensor
    v: torch.Tensor
    d: torch.Tensor
    chain_state: torch.Tensor | None = None

    def __post_init__(self):
        if self.chain_state is not None:  # the mass-keeping solve would not read diag nor sum u
            raise InputError(
                "an ArrowTridiagonal with chain_state is a master equation's Jacobian, whose "
                "columns of [T, u] sum to zero (diag_i = -(sub_{i+1} + sup_{i-1}), sum_i u_i = "
                "0); build it with ArrowTridiagonal.master_equation(up, down, du, v, d, "
                "chain_state), which derives diag and u from the rates, or leave chain_state "
                "out (any other arrow matrix, one with a decay term on its diagonal for instance)."
            )

    @classmethod
    def master_equation(cls, up, down, du, v, d, chain_state) -> ArrowTridiagonal:
        """`J` of `dx/dt = Q(y)^T x / eps` on a neighbour chain at `x = chain_state (n, B)`:
        `up`, `down` `(n-1, B)` the rates `i -> i+1`, `i+1 -> i` over `eps`; `du (n-1, B)` the
        `y`-derivative of the net flux `up_i x_i - down_i x_{i+1}` over `eps`. Then `sub = [0,
        up]`, `sup = [down, 0]`, `diag_i = -(up_i + down_{i-1})`, `u_i = du_{i-1} - du_i`: the
        columns of `[T, u]` sum to zero by construction."""
        n = chain_state.shape[0]
        if not (up.shape[0] == down.shape[0] == du.shape[0] == n - 1 == v.shape[0] - 1):
            raise InputError(
                f"master_equation takes up, down, du with n-1 rows and v with n, for a chain "
                f"state of n = {n}; got {up.shape[0]}, {down.shape[0]}, {du.shape[0]} and "
                f"{v.shape[0]}."
            )
        sub, sup = F.pad(up, (0, 0, 1, 0)), F.pad(down, (0, 0, 0, 1))
        diag = -(F.pad(up, (0, 0, 0, 1)) + F.pad(down, (0, 0, 1, 0)))  # minus the exit rates
        J = cls(sub, diag, sup, chain_divergence(du, batch_last=True), v, d)
        J.chain_state = chain_state
        return J

    def dense(self) -> torch.Tensor:
        """The full `(B, n+1, n+1)` matrix (for tests and small problems)."""
        T = (
            torch.diag_embed(self.diag.T)
            + torch.diag_embed(self.sub.T[:, 1:], -1)
            + torch.diag_embed(self.sup.T[:, :-1], 1)
        )
        top = torch.cat([T, self.u.T[:, :, None]], dim=2)
        bottom = torch.cat([self.v.T, self.d[:, None]], dim=1)[:, None, :]
        return torch.cat([top, bottom], dim=1)

    def shifted_solver(self, s: torch.Tensor, first: torch.Tensor | None = None, workspace=None,
                       kernels=None):  # fmt: skip
        """`solve(r (n+1, B), out=None) -> (s I - J)^{-1} r` for `s (B,)`: the tridiagonal block
        by elimination down the chain (Thomas), or with `chain_state` in the partial sums of
        the chain's unknowns (which keeps the mass; in torch operations out of place, without
        `workspace`), the border by its Schur complement. With
        `first`, also returns the solution for that right-hand side, found in the same sweep as
        the border's. `workspace` (a dict owned by the caller) keeps the buffers and their views
        from one factorisation to the next of the same shape; a factorisation made with it is
        valid until the next one made with it. `kernels`: the compiled `cpu_kernels` module
        (CPU tensors, no autograd), or `None` for torch operations."""
        n = self.diag.shape[0]
        # in place, on rows made once per factorisation, unless autograd records the operations
        # or torch.compile traces them (it fuses the out-of-place form itself)
        inplace = not torch.compiler.is_compiling() and (
            not torch.is_grad_enabled()
            or not any(
                t is not None and t.requires_grad
                for t in (self.sub, self.diag, self.sup, self.u, self.v, self.d, s, first)
            )
        )
        chain = self.chain_state is not None and n > 1
        if inplace and kernels is not None:
            return _CompiledArrowSolver(kernels, self, s, first, workspace, chain).result()
        if chain:  # keeps the mass; out of place, for torch ops with or without autograd
            fac = _chain_factor(self, s)

            def solve_chain(r, out=None):
                x = _chain_solve(fac, r)
                return x if out is None else out.copy_(x)

            return solve_chain if first is None else (solve_chain, solve_chain(first))
        if inplace:
            return _ArrowSolver(self, s, first, workspace).result()
        fac = _thomas_factor(self.sub, s - self.diag, self.sup)
        if first is None:
            w = _thomas_solve(fac, self.u)  # (s I - T)^{-1} u
        else:  # one sweep for two right-hand sides
            both = _thomas_solve(fac, torch.stack([self.u, first[:n]], dim=1))
            w, a_first = both[:, 0], both[:, 1]
        inv_sigma = 1.0 / (s - self.d - (self.v * w).sum(0))  # 1 / Schur complement

        def finish(a, r_last):  # a = (s I - T)^{-1} r[:n]
            last = (r_last + (self.v * a).sum(0)) * inv_sigma  # (B,)
            return torch.cat([torch.addcmul(a, w, last), last[None]])

        def solve(r, out=None):
            x = finish(_thomas_solve(fac, r[:n]), r[n])
            return x if out is None else out.copy_(x)

        return solve if first is None else (solve, finish(a_first, first[n]))


def keep_one(workspace: dict, key: tuple, make):
    """`workspace[key]`, made by `make()` when absent. Entries of the same kind (`key[0]`) under
    another key are dropped first: a solve's batch only shrinks, so older shapes are not needed
    again."""
    entry = workspace.get(key)
    if entry is None:
        for old in [other for other in workspace if other[0] == key[0]]:
            del workspace[old]
        entry = workspace[key] = make()
    return entry


_KERNELS = {}  # "module": the imported cpu_kernels, or None where numba does not import


def compiled_kernels():
    """The compiled `cpu_kernels` module (numba), or `None` where it does not import (with one
    warning)."""
    if "module" not in _KERNELS:
        try:
            from . import cpu_kernels
        except Exception as e:  # numba missing or built for another numpy; no cache folder
            warnings.warn(
                f"fastslow-sim: the compiled CPU kernels are unavailable ({type(e).__name__}: "
                f"{e}); the solver runs the same arithmetic as torch operations, more slowly.",
                RuntimeWarning,
                stacklevel=2,
            )
            cpu_kernels = None
        _KERNELS["module"] = cpu_kernels
    return _KERNELS["module"]


@dataclass(frozen=True)
class LinearSolver:
    """How a Rosenbrock march solves `(s I - J) k = r`: `structure` is the form of `J` it takes
    (`"dense"`, or `"arrow"` for `ArrowTridiagonal`), and `compiled` whether it runs as the
    numba kernels of `cpu_kernels` (CPU, no autograd), which then also form the step's stage
    states and error norm. A compiled factorisation has `stage` beside `solve`."""

    name: str
    structure: str
    compiled: bool = False
    description: str = ""

    @property
    def kernels(self):
        return compiled_kernels() if self.compiled else None

    def factor(self, J, s, first=None, workspace=None):
        """`solve` (or `(solve, solve(first))`) for `(s I - J)^{-1}`; see `shifted_solver`."""
        if self.structure == "dense" and isinstance(J, ArrowTridiagonal):
            J = J.dense()
        return shifted_solver(J, s, first, workspace, self.kernels)


LINEAR_SOLVERS = {
    "dense": LinearSolver("dense", "dense", False, "batched LAPACK LU with partial pivoting"),
    "arrow-torch": LinearSolver("arrow-torch", "arrow", False, "arrow elimination, torch ops"),
    "arrow-numba": LinearSolver("arrow-numba", "arrow", True, "arrow elimination, numba kernels"),
}


def linear_solver(spec, structure: str, device, grad: bool) -> LinearSolver:
    """The `LinearSolver` for `spec` (a name of `LINEAR_SOLVERS`, `"auto"`, or a `LinearSolver`)
    on a Jacobian of `structure` on `device`; `grad` when autograd records the march. `auto`:
    arrow with the numba kernels on the CPU without autograd where numba imports, arrow in torch
    otherwise; dense LU for a dense Jacobian."""
    if isinstance(spec, LinearSolver):
        chosen = spec
    elif spec == "auto":
        if structure != "arrow":
            return LINEAR_SOLVERS["dense"]
        fast = torch.device(device).type == "cpu" and not grad and compiled_kernels() is not None
        return LINEAR_SOLVERS["arrow-numba" if fast else "arrow-torch"]
    elif spec in LINEAR_SOLVERS:
        chosen = LINEAR_SOLVERS[spec]
    else:
        raise InputError(
            f"unknown linear solver {spec!r}; expected 'auto' or one of {list(LINEAR_SOLVERS)}."
        )
    if chosen.structure == "arrow" and structure != "arrow":
        raise InputError(
            f"the linear solver {chosen.name!r} needs an arrow-tridiagonal Jacobian (a neighbour "
            f"chain); this system's is {structure}. Use 'dense' or 'auto'."
        )
    if chosen.compiled:
        if torch.device(device).type != "cpu" or grad:
            raise InputError(
                f"the linear solver {chosen.name!r} runs on the CPU without autograd; use "
                f"'arrow-torch' on {device} or for differentiable runs."
            )
        if compiled_kernels() is None:
            raise InputError(f"the linear solver {chosen.name!r} needs numba, which does not import.")
    return chosen


def numpy_view(t):
    """The numpy view of a CPU tensor (no copy)."""
    return (t.detach() if t.requires_grad else t).numpy()


class _CompiledArrowSolver:
    """`(s I - J)^{-1}` for an `ArrowTridiagonal` `J` on the CPU by `cpu_kernels`: one call
    to factor, one per solve, on buffers kept in the caller's `workspace`. `solve.stage` solves
    for a Rosenbrock stage's right-hand side `f + inv_h sum_j c_j K_j` without forming it."""

    def __init__(self, kernels, J, s, first, workspace=None, chain=False):
        n, B = J.diag.shape
        dtype = J.diag.dtype

        def buffers():  # inv, p/den, q/den, w (n, B); 1/sigma (B,), as numpy arrays; for a
            # chain, the pivots (B,) and scratch (2, B)
            out = [torch.empty(shape, dtype=dtype).numpy() for shape in [(n, B)] * 4 + [(B,)]]
            if chain:
                out += [np.zeros(B, dtype=np.int64), np.zeros((2, B), dtype=out[0].dtype)]
            return out

        key = ("arrow", "compiled", n, B, dtype, chain)
        self.factors = buffers() if workspace is None else keep_one(workspace, key, buffers)
        self.kernels, self.v, self.first, self.chain = kernels, numpy_view(J.v), first, chain
        if chain:  # the rates up_i = J[i+1, i], down_i = J[i, i+1]
            rates = numpy_view(J.sub)[1:], numpy_view(J.sup)[:-1]
            kernels.chain_arrow_factor(numpy_view(J.chain_state), *rates,
                                       *(numpy_view(t) for t in (J.u, J.v, J.d, s)),
                                       self.factors[5], *self.factors[:5],
                                       self.factors[6])  # fmt: skip
            return
        kernels.arrow_factor(*(numpy_view(t) for t in (J.sub, J.diag, J.sup, J.u)), self.v,
                             *(numpy_view(t) for t in (J.d, s)), *self.factors)  # fmt: skip

    def solve(self, r, out=None):
        if out is None:
            out = torch.empty_like(r)
        inv, pm, g, w, inv_sigma = self.factors[:5]
        if self.chain:
            if out.data_ptr() != r.data_ptr():
                out.copy_(r)
            self.kernels.chain_arrow_solve(inv, pm, g, w, self.v, inv_sigma, self.factors[5],
                                           self.factors[6], out.numpy())  # fmt: skip
            return out
        self.kernels.arrow_solve(inv, pm, g, w, self.v, inv_sigma, numpy_view(r), out.numpy())
        return out

    def stage(self, f, K, c, inv_h, out):
        """`out <- (s I - J)^{-1} (f + inv_h sum_j c_j K_j)`: `f`, `out` tensors `(n+1, B)`; `K`
        `(i, n+1, B)`, `c (i,)` and `inv_h (B,)` numpy arrays."""
        inv, pm, g, w, inv_sigma = self.factors[:5]
        if self.chain:
            self.kernels.chain_arrow_solve_stage(inv, pm, g, w, self.v, inv_sigma,
                                                 self.factors[5], self.factors[6],
                                                 numpy_view(f), K, c, inv_h,
                                                 out.numpy())  # fmt: skip
            return out
        self.kernels.arrow_solve_stage(inv, pm, g, w, self.v, inv_sigma, numpy_view(f), K, c, inv_h,
                                       out.numpy())  # fmt: skip
        return out

    __call__ = solve

    def result(self):  # the solver itself is the `solve` function, with `.stage`
        if self.first is None:
            return self
        return self, self.solve(self.first)


def _pairs(t, m):
    """Views of rows `(k, n-1-k)` of `t (n, ...)` as `(2, ...)` tensors, `k < m`."""
    s0, n = t.stride(0), t.shape[0]
    rest, rest_strides = t.shape[1:], t.stride()[1:]
    off = t.storage_offset()
    return [
        t.as_strided((2, *rest), ((n - 1 - 2 * k) * s0, *rest_strides), off + k * s0)
        for k in range(m)
    ]


class _Workspace:
    """The buffers of `_ArrowSolver` for one shape, with the views its sweeps use (making views
    costs about as much as the arithmetic on a `(B,)` row, so they are made once)."""

    def __init__(self, n, B, k, like):
        m = n // 2
        kw = {"dtype": like.dtype, "device": like.device}
        self.b, self.fw_num, self.bw_num, self.inv, self.bw, self.fw, self.work = (
            torch.empty((n, B), **kw) for _ in range(7)
        )
        self.border = torch.empty((n, k, B), **kw) if k > 1 else torch.empty((n, B), **kw)
        self.Bb, self.Fn, self.Bn, self.Ip, self.BW, self.FW, self.work_pairs = (
            _pairs(t, m)
            for t in (self.b, self.fw_num, self.bw_num, self.inv, self.bw, self.fw, self.work)
        )
        self.border_pairs = _pairs(self.border, m)
        wide = k > 1
        self.FW3 = _pairs(self.fw[:, None], m) if wide else self.FW
        self.BW3 = _pairs(self.bw[:, None], m) if wide else self.BW
        self.inv3 = self.inv[:, None] if wide else self.inv
        middle = [i for i in (m - 1, m, m + 1) if 0 <= i < n]  # rows the middle step reads
        self.work_rows = {i: self.work[i] for i in middle}
        self.border_rows = {i: self.border[i] for i in middle}
        self.bw_rows = {i: self.bw[i] for i in middle}
        self.fw_rows = {i: self.fw[i] for i in middle}


class _ArrowSolver:
    """`(s I - J)^{-1}` for an `ArrowTridiagonal` `J`, in place, eliminating from both ends of the
    chain at once: rows `k` (from the top) and `n-1-k` (from the bottom) are one `(2, B)` view, so
    a sweep takes `n/2` vector operations instead of `n`. This is Gaussian elimination without
    pivoting in the order `0, n-1, 1, n-2, ...`, a symmetric permutation of `s I - T`, which keeps
    its column diagonal dominance and so the stability argument of the module docstring (for
    odd `n` the middle row is eliminated last; for even `n` the middle pair is a 2 x 2 system).

    Top rows `i < m`: `den_i = b_i - p_i g_{i-1}`, `g_i = q_i / den_i`, forward multiplier
    `p_i / den_i`; bottom rows, mirrored: `den_j = b_j - q_j h_{j+1}`, `h_j = p_j / den_j`,
    forward multiplier `q_j / den_j`. The border by its Schur complement, as in the functional
    path."""

    def __init__(self, J, s, first, workspace=None):
        p, q = J.sub, J.sup
        n, B = J.diag.shape
        m = n // 2
        k = 1 if first is None else 2
        if workspace is None:
            ws = _Workspace(n, B, k, J.diag)
        else:
            key = ("arrow", n, B, k, J.diag.dtype, J.diag.device)
            ws = keep_one(workspace, key, lambda: _Workspace(n, B, k, J.diag))
        self.J, self.n, self.m, self.ws = J, n, m, ws
        b = torch.sub(s, J.diag, out=ws.b)
        torch.cat([p[:m], q[m:]], out=ws.fw_num)  # forward numerators: p on top, q at the bottom
        torch.cat([q[:m], p[m:]], out=ws.bw_num)  # backward numerators: q on top, p at the bottom
        Ip, BW, Fn, Bn, Bb = ws.Ip, ws.BW, ws.Fn, ws.Bn, ws.Bb
        for i in range(m):
            if i == 0:
                torch.reciprocal(Bb[0], out=Ip[0])
            else:
                torch.addcmul(Bb[i], Fn[i], BW[i - 1], value=-1, out=Ip[i]).reciprocal_()
            torch.mul(Bn[i], Ip[i], out=BW[i])
        inv, bw = ws.inv, ws.bw
        if n % 2:  # the middle row, coupled to both ends
            den = b[m] if m == 0 else b[m] - p[m] * bw[m - 1] - q[m] * bw[m + 1]
            torch.reciprocal(den, out=inv[m])
            self.fw_mid = p[m] * inv[m]  # and fw[m] = q_m / den_m
        elif m:  # the middle pair: x_m = (y_m + h_m y_{m-1}) / (1 - g_{m-1} h_m)
            self.inv_mid = (bw[m - 1] * bw[m]).neg_().add_(1.0).reciprocal_()
        torch.mul(ws.fw_num, inv, out=ws.fw)
        # the border: w = (s I - T)^{-1} u, sigma = s - d - v.w, in one sweep with `first`
        if first is None:
            w = self._tridiagonal(torch.mul(J.u, inv, out=ws.border), ws.border_pairs,
                                  ws.border_rows, wide=False)  # fmt: skip
        else:
            both = torch.stack([J.u, first[:n]], dim=1, out=ws.border).mul_(ws.inv3)
            both = self._tridiagonal(both, ws.border_pairs, ws.border_rows, wide=True)
            w, self.a_first = both[:, 0], both[:, 1]
        self.w, self.first = w, first
        self.inv_sigma = (torch.linalg.vecdot(J.v, w, dim=0).add_(J.d).neg_().add_(s)).reciprocal_()

    def _tridiagonal(self, y, pairs, rows, wide):
        """`y <- (s I - T)^{-1} r` in place from `y = r / den` (`(n, B)`, or `(n, k, B)` if
        `wide`), given the pair views and middle rows of `y`."""
        ws, n, m = self.ws, self.n, self.m
        FW, BW = (ws.FW3, ws.BW3) if wide else (ws.FW, ws.BW)
        for i in range(1, m):
            pairs[i].addcmul_(FW[i], pairs[i - 1])
        # single rows `(B,)` broadcast against `(B,)` and `(k, B)` alike
        if n % 2:
            mid = rows[m]
            if m:
                mid.addcmul_(self.fw_mid, rows[m - 1])
                mid.addcmul_(ws.fw_rows[m], rows[m + 1])
                pairs[m - 1].addcmul_(BW[m - 1], mid)
        elif m:
            lo, hi = rows[m - 1], rows[m]
            hi.addcmul_(ws.bw_rows[m], lo).mul_(self.inv_mid)
            lo.addcmul_(ws.bw_rows[m - 1], hi)
        for i in range(m - 2, -1, -1):
            pairs[i].addcmul_(BW[i], pairs[i + 1])
        return y

    def finish(self, a, r_last, out=None):
        """`[a - w x_n, x_n]` with `x_n = (r_n + v.a) / sigma`, for `a = (s I - T)^{-1} r[:n]`."""
        n = self.n
        if out is None:
            out = torch.empty((n + 1, *a.shape[1:]), dtype=a.dtype, device=a.device)
        last = out[n]
        torch.mul(torch.linalg.vecdot(self.J.v, a, dim=0).add_(r_last), self.inv_sigma, out=last)
        torch.addcmul(a, self.w, last, out=out[:n])
        return out

    def solve(self, r, out=None):
        ws = self.ws
        torch.mul(r[: self.n], ws.inv, out=ws.work)
        a = self._tridiagonal(ws.work, ws.work_pairs, ws.work_rows, wide=False)
        return self.finish(a, r[self.n], out)

    def result(self):
        if self.first is None:
            return self.solve
        return self.solve, self.finish(self.a_first, self.first[self.n])


def _thomas_factor(p, b, q):
    """Elimination down the chain for `b_i x_i - p_i x_{i-1} - q_i x_{i+1} = r_i` (rows of
    `(n, B)`): `den_i = b_i - p_i g_{i-1}`, `g_i = q_i / den_i` (so that `x_i = y_i + g_i x_{i+1}`;
    the `g` the back substitution uses is the one the pivots were made with, which keeps the
    elimination backward stable). Returns `1/den (n, B)` and the rows `p_i / den_i` and `g_i`.
    Out of place, for autograd; `_ArrowSolver` is the in-place version."""
    P, Bs, Q = p.unbind(0), b.unbind(0), q.unbind(0)
    inv = [1.0 / Bs[0]]
    G = [Q[0] * inv[0]]
    for i in range(1, b.shape[0]):
        inv.append(1.0 / torch.addcmul(Bs[i], P[i], G[i - 1], value=-1))
        G.append(Q[i] * inv[i])
    inv = torch.stack(inv)
    return inv, (p * inv).unbind(0), G


def _thomas_solve(fac, r):
    """`r (n, B)` or `(n, k, B)`: forward `y_i = r_i / den_i + (p_i / den_i) y_{i-1}`, back
    `x_i = y_i + g_i x_{i+1}`, on `(B,)` rows."""
    inv, ps, g = fac
    return _sweeps(r * (inv if r.ndim == 2 else inv[:, None]), ps, g)


def _sweeps(y, ps, g):
    """The two sweeps of an elimination from the top: `y_i += ps_i y_{i-1}` down, then
    `y_i += g_i y_{i+1}` up, on the rows of `y` (out of place)."""
    rows = list(y.unbind(0))
    n = len(rows)
    for i in range(1, n):
        rows[i] = torch.addcmul(rows[i], ps[i], rows[i - 1])
    for i in range(n - 2, -1, -1):
        rows[i] = torch.addcmul(rows[i], g[i], rows[i + 1])
    return torch.stack(rows)


def _chain_factor(J, s):
    """The out-of-place torch form of `cpu_kernels.chain_arrow_factor` (for autograd,
    torch.compile and CUDA): `s I - J` for a master equation's `J` (`J.chain_state` given) in
    the partial sums of the chain's unknowns around the heaviest state `p` of the chain's state;
    the arithmetic of `chain_factor`, `chain_border` and `chain_sigma` but for the order of
    the sums (`.sum(0)` here, left to right there): the two agree to about 1e-15 on well-posed
    chains, and can differ widely where the system is ill conditioned (rates 1e200-1e280)."""
    up, dr = J.sub[1:], J.sup[:-1]  # (n-1, B): up_i = J[i+1, i], down_i = J[i, i+1]
    n = J.diag.shape[0]
    m = n - 1
    piv = torch.argmax(J.chain_state, dim=0)  # the first of the largest
    rows = torch.arange(n, device=piv.device)[:, None]
    below = rows[:m] < piv  # (n-1, B)
    rho = torch.ones_like(s)  # e_{j-1} / den_{j-1}
    inv, pm, g = [], [], []
    for i in range(m):  # den_j = e_j + down_j, e_j = s + up_j e_{j-1} / den_{j-1}
        e = torch.addcmul(s, up[i], rho)
        inv.append(1.0 / (e + dr[i]))
        pm.append(up[i] * inv[i])
        g.append(dr[i] * inv[i])
        rho = e * inv[i]
    inv = torch.stack(inv)
    # the terms in T, + down_{p-1} T in row p-1 and - up_p T in row p, divided by their pivots
    # (rate * T could overflow where the answer is finite): g_{p-1} T and -pm_p T
    at = rows[:m] == piv
    t_coef = torch.where(rows[:m] == piv - 1, torch.stack(g), 0.0) - torch.where(at, torch.stack(pm),
                                                                                0.0)  # fmt: skip
    heavy = (rows == piv).to(s.dtype)  # (n, B): 1 at the heaviest state
    fac = (inv, pm, g, below)
    # the border column u (summing to zero) in partial sums from the nearer end, T = 0
    w = _chain_partial_sums(fac, torch.where(below, torch.cumsum(J.u[:m], 0), -_tail_sums(J.u)))
    v = J.v
    dv = v[:-1] - v[1:]
    inv_sigma = 1.0 / (s - J.d - (dv * w).sum(0))
    at_p = torch.stack([piv, piv + 1])  # rows p, p+1 of the padded partial sums
    return fac + (1.0 / s, at_p, t_coef, heavy, w, v.gather(0, piv[None])[0], dv, inv_sigma)


def _tail_sums(r):
    """`r_{j+1} + .. + r_{n-1}` for `j < n-1`."""
    return torch.flip(torch.cumsum(torch.flip(r[1:], (0,)), 0), (0,))


def _chain_partial_sums(fac, c, extra=None):
    """`V`, the partial sums of `(s I - T)^{-1} r` (`j < n-1`), from their right-hand sides `c`
    (`extra` added to them divided by their pivots): elimination from the top, then back."""
    inv, pm, g = fac[:3]
    c = c * inv
    return _sweeps(c if extra is None else c + extra, pm, g)


def _chain_solve(fac, r):
    """`(s I - J)^{-1} r` for `r (n+1, B)` from `_chain_factor`, keeping the mass (the torch
    form of `cpu_kernels.chain_solve`)."""
    inv, pm, g, below, inv_s, at_p, t_coef, heavy, w, v_p, dv, inv_sigma = fac
    m = inv.shape[0]  # n - 1
    x = r[: m + 1]
    # the partial sums from the nearer end: R_j = r_0 + .. + r_j below the heaviest state p,
    # -R'_{j+1} = -(r_{j+1} + .. + r_{n-1}) from it on
    c = torch.where(below, torch.cumsum(x[:m], 0), -_tail_sums(x))
    # T = (r_p + R_{p-1} + R'_{p+1}) / s: the right-hand side's chain sum over s
    near = F.pad(c, (0, 0, 1, 1)).gather(0, at_p)  # R_{p-1}, -R'_{p+1} (0 past the ends)
    T = (x.gather(0, at_p[:1])[0] + near[0] - near[1]) * inv_s
    V = _chain_partial_sums(fac, c, t_coef * T)
    # k_n = (r_n + sum_j (v_j - v_{j+1}) V_j + v_p T) / sigma
    last = (r[m + 1] + v_p * T + (dv * V).sum(0)) * inv_sigma
    V = torch.addcmul(V, w, last)
    # k_i = V_i - V_{i-1} + T [i = p]  (V_{-1} = V_{n-1} = 0)
    k = torch.addcmul(torch.diff(F.pad(V, (0, 0, 1, 1)), dim=0), heavy, T)
    return torch.cat([k, last[None]])


def shifted_solver(J, s: torch.Tensor, first: torch.Tensor | None = None, workspace=None,
                   kernels=None):  # fmt: skip
    """`r (N, B) -> (s I - J)^{-1} r` (batch last) for a dense `J (B, N, N)` or an
    `ArrowTridiagonal`; `s (B,)`. With `first (N, B)`, returns `(solve, solve(first))`.
    `workspace`, `kernels`: see `ArrowTridiagonal.shifted_solver`."""
    if isinstance(J, ArrowTridiagonal):
        return J.shifted_solver(s, first, workspace, kernels)
    G = torch.diag_embed(s[:, None].expand(-1, J.shape[-1])) - J
    LU, piv, _ = torch.linalg.lu_factor_ex(G)

    def solve(r, out=None):
        x = torch.linalg.lu_solve(LU, piv, r.T[..., None])[..., 0].T
        return x if out is None else out.copy_(x)

    return solve if first is None else (solve, solve(first))
