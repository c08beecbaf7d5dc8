"""Stationary distributions of master-equation generators and their derivatives.

`p_st(Q)` solves `Q^T p = 0`, `1^T p = 1`, `p >= 0` (DESIGN 3.1). It is unique when the chain
has exactly one closed class; we require irreducibility unless `allow_transient=True`.

Methods (a string registry, as in torchdiffeq):
- `"gth"` (default): Grassmann-Taksar-Heyman elimination. It reads only off-diagonal rates and
  performs no subtractions, so every entry has a small *relative* error however ill-conditioned
  the chain (O'Cinneide 1993).
- `"lu"`: one linear solve of `Q^T` with its last row replaced by ones. Fine for
  well-conditioned chains, loses relative accuracy on nearly decomposable ones.
- `"svd"`: the right singular vector of `Q^T` for its smallest singular value (what
  `scipy.linalg.null_space` computes). Same caveat as `"lu"`.

All methods take the generator to be defined by its off-diagonal rates (the diagonal is rebuilt
as minus the row sums), work on batches `(..., n, n)`, accept numpy arrays or torch tensors and
return the same kind. Torch tensors that require grad get gradients from the identity
`dp = -Z dA p` with `A = Q^T`, `Z = (A - p 1^T)^{-1}`, not by back-propagating the elimination.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.csgraph import connected_components

from .errors import InputError, ReducibleGeneratorError
from .generators import validate_generator

__all__ = [
    "stationary_distribution",
    "stationary_derivative",
    "fundamental_matrix",
    "closed_classes",
    "METHODS",
]

METHODS = ("gth", "lu", "svd")


def _is_torch(a) -> bool:
    return type(a).__module__.startswith("torch")


def _rebuild_diagonal(q):
    """Copy of `q` with `q_ii = -sum_{j != i} q_ij` (numpy or torch, out of place)."""
    n = q.shape[-1]
    if _is_torch(q):
        import torch

        eye = torch.eye(n, dtype=torch.bool, device=q.device)
        off = q.masked_fill(eye, 0.0)
        return off - torch.diag_embed(off.sum(-1))
    off = np.array(q, dtype=q.dtype, copy=True)
    idx = np.arange(n)
    off[..., idx, idx] = 0.0
    off[..., idx, idx] = -off.sum(axis=-1)
    return off


def _gth(q, check: bool = False):
    """GTH elimination on a batch `(..., n, n)` (numpy or torch); returns `(p, bad, invalid)`.

    `bad[...]` flags chains where some pivot (the rate out of state `k` into `{0..k-1}` in the
    chain censored to `{0..k}`) or some `p_k` is zero: the signature of a reducible chain (or of
    underflow, which the caller tells apart with a graph search). With `check`, `invalid` says
    whether any matrix fails `validate_generator`'s tests (run on each cache-hot chunk, so that
    validation costs no extra pass over memory); the caller then asks the validator for the
    sentence that names the entry.

    One implementation serves both inputs: numpy arrays are viewed as CPU tensors. The batch is
    moved to the last axis so that each rank-one update is one contiguous, vectorised sweep.
    """
    import torch

    torch_in = _is_torch(q)
    t = q if torch_in else torch.from_numpy(np.ascontiguousarray(q))
    n = t.shape[-1]
    batch = t.shape[:-2]
    flat = t.reshape(-1, n * n)
    p_out = torch.empty((flat.shape[0], n), dtype=t.dtype, device=t.device)
    bad_out = torch.empty(flat.shape[0], dtype=torch.bool, device=t.device)
    invalid = torch.zeros((), dtype=torch.bool, device=t.device)
    tol = max(1e-10, 100 * torch.finfo(t.dtype).eps)
    # Chunks keep each transposed block and its rank-one updates in cache.
    chunk = _GTH_CHUNK if t.device.type == "cpu" else max(flat.shape[0], 1)
    buf = torch.empty((n * n, min(chunk, flat.shape[0])), dtype=t.dtype, device=t.device)
    for c in range(0, flat.shape[0], chunk):
        # (n, n, b): a private copy with the batch last, so every update is a contiguous sweep;
        # transposed in blocks of 256 rows, which stay in cache (twice as fast as one copy)
        b = min(chunk, flat.shape[0] - c)
        for r in range(0, b, 256):
            e = min(r + 256, b)
            buf[:, r:e].copy_(flat[c + r : c + e].t())
        a = buf[:, :b].view(n, n, b) if b == buf.shape[1] else buf[:, :b].contiguous().view(n, n, b)
        if check:
            rowsum = a.sum(1)  # (n, b)
            scale = a.diagonal(dim1=0, dim2=1).t().abs() + 1.0  # (n, b)
            invalid |= (rowsum.abs() > tol * scale).any() | ~torch.isfinite(rowsum).all()
        a.diagonal(dim1=0, dim2=1).zero_()  # GTH never reads the diagonal
        if check:
            invalid |= (a < 0).any()
        p_out[c : c + chunk], bad_out[c : c + chunk] = _gth_batch_last(a)
    p, bad = p_out.reshape(batch + (n,)), bad_out.reshape(batch)
    if torch_in:
        return p, bad, bool(invalid)
    return p.numpy(), bad.numpy(), bool(invalid)


_GTH_CHUNK = 8192


def _gth_batch_last(a):
    """GTH in place on `a` of shape `(n, n, b)` with a zero diagonal; returns `p (b, n)`, flags."""
    import torch

    n, b = a.shape[0], a.shape[-1]
    pivots = a.new_empty((max(n - 1, 1), b))
    for k in range(n - 1, 0, -1):
        s = torch.sum(a[k, :k], 0, out=pivots[k - 1])  # (b,) rate of k into the lower states
        a[:k, k].div_(s)  # a zero pivot gives inf/nan here; such chains are flagged below
        # censor state k: i -> k -> j becomes i -> j, with no subtraction anywhere
        a[:k, :k].addcmul_(a[:k, k, None], a[k, None, :k])
    # back-substitution p_k = sum_{i<k} p_i a_ik, pushed forward row by row (no temporaries)
    p = a.new_zeros((n, b))
    p[0] = 1.0
    for i in range(n - 1):
        p[i + 1 :].addcmul_(a[i, i + 1 :], p[i])
    bad = (p > 0).logical_not_().any(0)  # also catches NaN
    if n > 1:
        bad |= (pivots > 0).logical_not_().any(0)
    return (p / p.sum(0)).t(), bad


def _lu(q):
    n = q.shape[-1]
    a = q.transpose(-1, -2) if _is_torch(q) else np.swapaxes(q, -1, -2)
    a = a.clone() if _is_torch(q) else a.copy()
    a[..., n - 1, :] = 1.0
    if _is_torch(q):
        import torch

        b = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
        b[..., n - 1] = 1.0
        return torch.linalg.solve(a, b)
    b = np.zeros(q.shape[:-1])
    b[..., n - 1] = 1.0
    return np.linalg.solve(a, b[..., None])[..., 0]


def _svd(q):
    if _is_torch(q):
        import torch

        v = torch.linalg.svd(q.transpose(-1, -2))[2][..., -1, :]
    else:
        v = np.linalg.svd(np.swapaxes(q, -1, -2))[2][..., -1, :]
    return v / v.sum(-1)[..., None]


def closed_classes(Q) -> tuple[list[list[int]], list[int]]:
    """Closed communicating classes and transient states of one generator `(n, n)`."""
    q = np.asarray(Q)
    adj = (q > 0) & ~np.eye(q.shape[-1], dtype=bool)
    ncomp, labels = connected_components(adj, directed=True, connection="strong")
    closed, transient = [], []
    for c in range(ncomp):
        members = np.flatnonzero(labels == c)
        leaves = adj[np.ix_(members, np.flatnonzero(labels != c))].any()
        if leaves:
            transient.extend(int(i) for i in members)
        else:
            closed.append([int(i) for i in members])
    return closed, sorted(transient)


def _check_flagged(q_np: np.ndarray, flagged: np.ndarray, allow_transient: bool) -> list:
    """Raise for the first flagged batch element that has no unique answer.

    Returns `(index, closed_class)` for each flagged element that does have one (a single
    closed class, plus transient states when `allow_transient`), to be solved on its class.
    """
    batch_shape = q_np.shape[:-2]
    unichains = []
    for flat in np.flatnonzero(flagged.reshape(-1)):
        index = np.unravel_index(flat, batch_shape) if batch_shape else ()
        closed, transient = closed_classes(q_np[index])
        if len(closed) == 1 and (not transient or allow_transient):
            if transient:
                unichains.append((index, closed[0]))
            continue
        where = f" (batch index {tuple(int(i) for i in index)})" if batch_shape else ""
        if len(closed) > 1:
            msg = (
                f"the generator{where} is reducible with {len(closed)} closed classes "
                f"{closed}, so its stationary distribution is not unique; expected an "
                f"irreducible generator."
            )
        else:
            msg = (
                f"the generator{where} is reducible: states {transient} are transient and "
                f"{closed[0]} is the only closed class; expected an irreducible generator "
                f"(pass allow_transient=True to accept zero mass on transient states)."
            )
        raise ReducibleGeneratorError(msg, closed, transient)
    return unichains


def _solve_on_closed_class(p, q_np, unichains):
    """Set `p[index]` to the stationary distribution of its closed class, zero elsewhere."""
    for index, members in unichains:
        sub = q_np[index][np.ix_(members, members)]
        row = np.zeros(q_np.shape[-1])
        row[members] = _gth(sub)[0]
        p[index] = row if not _is_torch(p) else p.new_tensor(row)
    return p


def _reachability_flags(q_np: np.ndarray) -> np.ndarray:
    """Batch mask of chains that are not strongly connected (boolean closure by squaring)."""
    n = q_np.shape[-1]
    r = ((q_np > 0) | np.eye(n, dtype=bool)).astype(np.float32)
    for _ in range(int(np.ceil(np.log2(max(n, 2))))):
        r = np.minimum(r @ r, 1.0)
    return ~np.all(r > 0, axis=(-1, -2))


def _solve(q, method: str, allow_transient: bool, check: bool = False):
    """Forward computation without autograd; returns `p` of the same kind as `q`."""
    q_np = None
    if method == "gth":
        p, bad, invalid = _gth(q, check)
        if invalid:
            validate_generator(q)  # raises with the sentence that names the bad entry
        bad = bad.cpu().numpy() if _is_torch(bad) else bad
        flags = np.asarray(bad)
    else:
        if check:
            validate_generator(q)
        q_np = q.detach().cpu().numpy() if _is_torch(q) else q
        flags = _reachability_flags(q_np)
        unichains = _check_flagged(q_np, flags, allow_transient) if np.any(flags) else []
        p = _lu(q) if method == "lu" else _svd(q)
        return _solve_on_closed_class(p, q_np, unichains)
    if np.any(flags):
        q_np = q.detach().cpu().numpy() if _is_torch(q) else q
        p = _solve_on_closed_class(p, q_np, _check_flagged(q_np, flags, allow_transient))
    return p


def _torch_function():
    import torch

    class _Stationary(torch.autograd.Function):
        """`p = p_st(Q)` with the backward pass of DESIGN 3.1."""

        @staticmethod
        def forward(ctx, q, method, allow_transient, check):
            p = _solve(q.detach(), method, allow_transient, check)
            ctx.save_for_backward(q, p)
            return p

        @staticmethod
        def backward(ctx, grad_p):
            q, p = ctx.saved_tensors
            n = q.shape[-1]
            ones = torch.ones_like(p)
            # w = Z^T g with Z^T = (Q - 1 p^T)^{-1}
            m = q - ones[..., :, None] * p[..., None, :]
            w = torch.linalg.solve(m, grad_p)
            # dL/dQ_ij = -p_i w_j for a free matrix; the generator is a function of its
            # off-diagonal rates (Q_ii = -row sum), so project: dL/do_ij = -p_i (w_j - w_i).
            g = -p[..., :, None] * (w[..., None, :] - w[..., :, None])
            g = g.masked_fill(torch.eye(n, dtype=torch.bool, device=q.device), 0.0)
            return g, None, None, None

    return _Stationary


_STATIONARY_FN = None


def stationary_distribution(Q, method: str = "gth", *, allow_transient: bool = False, check=True):
    """Stationary distribution `p` with `Q^T p = 0`, `sum(p) = 1`, batched over `Q[..., n, n]`.

    Parameters
    ----------
    Q : array or tensor `(..., n, n)`, `Q[i, j]` the rate `i -> j`, rows summing to zero.
    method : `"gth"` (default), `"lu"` or `"svd"`; see the module docstring.
    allow_transient : accept a chain with one closed class plus transient states.
    check : validate `Q` first (finite, non-negative rates, zero row sums).

    Returns `p` of shape `(..., n)`: float64 numpy for array input, a tensor of the input's
    floating dtype (float64 for integer input) for torch input, differentiable in `Q`.
    Raises `ReducibleGeneratorError` naming the closed classes when `p` is not unique.
    """
    if method not in METHODS:
        raise InputError(f"unknown stationary method {method!r}; expected one of {list(METHODS)}.")
    if _is_torch(Q):
        import torch

        q = Q if Q.is_floating_point() else Q.to(torch.float64)
    else:
        q = np.asarray(Q, dtype=np.float64)
    if q.ndim < 2 or q.shape[-1] != q.shape[-2] or q.shape[-1] < 1:
        validate_generator(q)  # raises: not a batch of square matrices
    if method != "gth":  # GTH never reads the diagonal; the others get it rebuilt
        if check:  # check the caller's matrix, not the rebuilt one
            validate_generator(q)
            check = False
        q = _rebuild_diagonal(q)
    if _is_torch(q) and q.requires_grad:
        global _STATIONARY_FN
        if _STATIONARY_FN is None:
            _STATIONARY_FN = _torch_function()
        return _STATIONARY_FN.apply(q, method, allow_transient, check)
    return _solve(q, method, allow_transient, check)


def fundamental_matrix(Q, p=None) -> np.ndarray:
    """`Z = (Q^T - p 1^T)^{-1}`, batched; non-singular for an irreducible `Q` (DESIGN 3.1)."""
    q = np.asarray(Q, dtype=np.float64)
    if p is None:
        p = stationary_distribution(q)
    m = np.swapaxes(q, -1, -2) - p[..., :, None]
    return np.linalg.inv(m)


def stationary_derivative(Q, dQ, p=None) -> np.ndarray:
    """`dp/dy = -Z (dQ/dy)^T p` for `dQ` of shape `(..., m, n, n)`; returns `(..., n, m)`.

    This is the derivative of `p_st(Q(y))` along the slow variables, computed by one batched
    linear solve with `Q^T - p 1^T` (no differentiation of the elimination).
    """
    q = np.asarray(Q, dtype=np.float64)
    dq = np.asarray(dQ, dtype=np.float64)
    if p is None:
        p = stationary_distribution(q)
    m = np.swapaxes(q, -1, -2) - p[..., :, None]  # (..., n, n)
    rhs = np.einsum("...kji,...j->...ki", dq, p)  # (dQ_k^T p)_i, shape (..., m, n)
    dp = np.linalg.solve(m[..., None, :, :], -rhs[..., None])[..., 0]  # (..., m, n)
    return np.swapaxes(dp, -1, -2)
