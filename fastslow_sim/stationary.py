"""Stationary distributions of master-equation generators and their derivatives.

`p_st(Q)` solves `Q^T p = 0`, `1^T p = 1`, `p >= 0` (DESIGN 3.1). It is unique when the chain
has exactly one closed class; we require irreducibility unless `allow_transient=True`.

Methods (a string registry, as in torchdiffeq):
- `"gth"` (default): Grassmann-Taksar-Heyman elimination. It reads only off-diagonal rates and
  performs no subtractions, so every entry has a small *relative* error however ill-conditioned
  the chain (O'Cinneide 1993). Rows are scaled into jump probabilities, so nothing overflows;
  a chain whose numbers may leave the normal range on the way (rates 1e+-300) is screened in
  O(n^2) and redone, its back-substitution with each entry's power of two kept apart, its
  elimination in long double (exponents to 1e-4932).
- `"lu"`: one linear solve of `Q^T` with its last row replaced by ones. Fine for
  well-conditioned chains, loses relative accuracy on nearly decomposable ones.
- `"svd"`: the right singular vector of `Q^T` for its smallest singular value (what
  `scipy.linalg.null_space` computes). Same caveat as `"lu"`.

All methods take the generator to be defined by its off-diagonal rates: with `check=True` (the
default) `Q` must still have rows summing to zero, an unset diagonal is refused; with
`check=False` the diagonal is ignored (GTH never reads it; `"lu"` and `"svd"` rebuild it as minus
the off-diagonal row sums). They work on batches `(..., n, n)`, accept numpy arrays or torch
tensors and return the same kind. Torch tensors that require grad get gradients from the identity
`dp = -Z dA p` with `A = Q^T`, `Z = (A - p 1^T)^{-1}`, not by back-propagating the elimination.

GTH on a large numpy batch runs as a compiled kernel (`stationary_kernel`: bit for bit the
vectorised elimination below 512 states, in panels with BLAS, to rounding, from there); a
neighbour chain given by its rates takes O(n) (`chain_stationary`).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.sparse.csgraph import connected_components

from .errors import InputError, ReducibleGeneratorError
from .generators import validate_generator
from .validation import first_non_finite, reads_as_float

__all__ = [
    "stationary_distribution",
    "chain_stationary",
    "stationary_derivative",
    "fundamental_matrix",
    "closed_classes",
    "STATIONARY_METHODS",
]

STATIONARY_METHODS = ("gth", "lu", "svd")


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
    chain censored to `{0..k}`) or some `p_k` is zero or not finite: the signature of a reducible
    chain, or of rates beyond the floating-point range, which the caller tells apart with a graph
    search. With `check`, `invalid` says whether any matrix fails `validate_generator`'s tests
    (run on each cache-hot chunk, so that validation costs no extra pass over memory); the caller
    then asks the validator for the sentence that names the entry.

    One algorithm for both inputs, written against the array namespace of `q` (numpy arrays stay
    numpy, torch is never imported for them): the batch is moved to the last axis so that each
    rank-one update is one contiguous, vectorised sweep.
    """
    torch_in = _is_torch(q)
    if torch_in:
        import torch

        t = q
        finfo = torch.finfo(t.dtype)
    else:
        t = np.ascontiguousarray(q)
        finfo = np.finfo(t.dtype)
    n = t.shape[-1]
    batch = t.shape[:-2]
    flat = t.reshape(-1, n * n)
    count = flat.shape[0]
    tol = max(1e-10, 100 * float(finfo.eps))
    kernel = None if torch_in or t.dtype != np.float64 else _gth_kernel(count * n**3 / 3)
    if kernel is not None:  # the elimination below, compiled (bit for bit below 512 states)
        p, bad, risky, invalid = kernel(flat.reshape(count, n, n), tol, check)
        _redo_extended(flat, p, bad, risky)
        return p.reshape(batch + (n,)), bad.reshape(batch), invalid
    if torch_in:
        p_out = torch.empty((count, n), dtype=t.dtype, device=t.device)
        bad_out = torch.empty(count, dtype=torch.bool, device=t.device)
    else:
        p_out = np.empty((count, n), dtype=t.dtype)
        bad_out = np.empty(count, dtype=bool)
    risky_out = bad_out.clone() if torch_in else bad_out.copy()
    invalid = False
    # Chunks keep each transposed block and its rank-one updates in cache.
    on_cpu = not torch_in or t.device.type == "cpu"
    chunk = _GTH_CHUNK if on_cpu else max(count, 1)
    buf = None
    if torch_in:
        buf = torch.empty((n * n, min(chunk, count)), dtype=t.dtype, device=t.device)
    for c in range(0, count, chunk):
        b = min(chunk, count - c)
        rows = flat[c : c + b]
        if buf is None and b == 1:  # numpy sums a contiguous (k, 1) column pairwise; with two
            rows = np.concatenate([rows, rows])  # columns it sums in order, as the kernel does
        a = _batch_last_copy(rows, buf, n)  # (n, n, b), a private copy
        diag = np.arange(n)
        if check:
            rowsum = a.sum(1)  # (n, b)
            scale = abs(a[diag, diag]) + 1.0  # (n, b)
            invalid = invalid or bool(
                (abs(rowsum) > tol * scale).any() or not _isfinite(rowsum).all()
            )
        a[diag, diag] = 0.0  # GTH never reads the diagonal
        if check:
            invalid = invalid or bool((a < 0).any())
        with np.errstate(all="ignore"):  # zero pivots (flagged) divide by zero
            p_c, bad_c, risky_c = _gth_batch_last(a)
        p_out[c : c + b], bad_out[c : c + b] = p_c[:b], bad_c[:b]
        risky_out[c : c + b] = risky_c[:b]
    _redo_extended(flat, p_out, bad_out, risky_out)
    return p_out.reshape(batch + (n,)), bad_out.reshape(batch), invalid


def _redo_extended(flat, p, bad, risky):
    """Redo, in place, in numpy's long double (exponents to 1e-4932 and 1e+4932: x86's 80-bit
    format, 128-bit on aarch64) the chains whose elimination may have lost a transition below
    the normal range (`risky`) or overflowed (a non-finite `p`): `flat (count, n*n)`, `p (count,
    n)`, flags `(count,)`. There the screen is replaced by the exact test
    (`_censor_batch_last(exact=True)`); a chain that fails it, or any chain where long double is plain
    float64, gets NaN, which the caller refuses in one sentence (or finds reducible)."""
    redo = np.flatnonzero(_numpy(risky | ~_isfinite(p).all(-1)))
    if not redo.size:
        return
    n = p.shape[-1]
    rows = _numpy(flat[_index_like(flat, redo)]).astype(np.float64)
    # a chain reducible by its graph has a zero pivot in any precision: the caller's graph
    # search refuses it or solves it on its closed class, without this O(n^3) redo
    strong = np.array([connected_components((r.reshape(n, n) > 0), directed=True,
                                            connection="strong")[0] == 1 for r in rows])  # fmt: skip
    if not strong.all():
        _put(bad, redo[~strong], np.ones(int((~strong).sum()), dtype=bool))
        redo, rows = redo[strong], rows[strong]
        if not redo.size:
            return
    rows = rows if redo.size > 1 else np.concatenate([rows, rows])  # summed in order
    wide = np.full((redo.size, n), np.nan)
    if np.finfo(np.longdouble).minexp < -16000:  # exponents to 2^-16382
        a = np.array(rows.T, dtype=np.longdouble, order="C").reshape(n, n, -1)
        a[np.arange(n), np.arange(n)] = 0.0
        with np.errstate(all="ignore"):
            p_w, _, lost_w = _gth_batch_last(a, exact=True)
        keep = ~lost_w[: redo.size]
        wide[keep] = p_w[: redo.size][keep]
    _put(p, redo, wide)
    _put(bad, redo, ~np.isfinite(wide).all(-1) | ~(wide > 0).all(-1))


def _index_like(x, idx):
    """A numpy index array as an index for `x` (a torch tensor on its device), else itself."""
    if _is_torch(x) and isinstance(idx, np.ndarray):
        import torch

        return torch.as_tensor(idx, device=x.device)
    return idx


def _put(x, index, values):
    """`x[index] = values` for numpy `values`, with `x` numpy or torch (cast to its dtype)."""
    if not _is_torch(x):
        x[index] = values
        return
    if isinstance(index, tuple):
        index = tuple(_index_like(x, i) for i in index)
    x[_index_like(x, index)] = x.new_tensor(values)


_GTH_CHUNK = 8192
KERNEL_MIN_FLOPS = 1e7  # about 50 ms of the vectorised elimination; loading the kernel: 0.8 s
_KERNEL = {}  # "gth": the compiled kernel, or None where numba does not import


def _gth_kernel(flops: float):
    """The compiled GTH (`stationary_kernel.gth`) for a numpy batch of `flops` operations: once
    it is loaded, or for a batch of at least `KERNEL_MIN_FLOPS` (a small call is not worth the
    once-per-process load); `None` otherwise, and where numba does not import (one warning)."""
    if "gth" not in _KERNEL:
        if flops < KERNEL_MIN_FLOPS:
            return None
        try:
            from .stationary_kernel import gth
        except Exception as e:  # numba missing or built for another numpy; no cache folder
            warnings.warn(
                f"fastslow-sim: the compiled GTH is unavailable ({type(e).__name__}: {e}); "
                f"stationary distributions use the vectorised elimination (the same numbers "
                f"to rounding, 3-40 times slower, and up to 160 times at 1,024 states).",
                RuntimeWarning,
                stacklevel=3,
            )
            gth = None
        _KERNEL["gth"] = gth
    return _KERNEL["gth"]


def _isfinite(x):
    if _is_torch(x):
        import torch

        return torch.isfinite(x)
    return np.isfinite(x)


def _batch_last_copy(rows, buf, n):
    """`rows (b, n*n)` as a private contiguous `(n, n, b)` array (the batch last)."""
    b = rows.shape[0]
    if buf is None:  # numpy
        return np.array(rows.T, order="C", copy=True).reshape(n, n, b)
    # torch: transposed in blocks of 256 rows, which stay in cache (twice as fast as one copy)
    for r in range(0, b, 256):
        e = min(r + 256, b)
        buf[:, r:e].copy_(rows[r:e].t())
    return buf[:, :b].view(n, n, b) if b == buf.shape[1] else buf[:, :b].contiguous().view(n, n, b)


def _add_product(dst, x, y):
    """`dst += x * y` in place (torch without a temporary)."""
    if _is_torch(dst):
        dst.addcmul_(x, y)
    else:
        dst += x * y


def _gth_batch_last(a, exact: bool = False):
    """GTH in place on `a` of shape `(n, n, b)` with a zero diagonal; returns `p (b, n)` and the
    flags `bad` (see `_gth`) and `risky` (see `_censor_batch_last`, and its `exact`).

    Written once for numpy and torch (operators, `sum`, `abs`, slicing). The back-substitution
    `p_k = sum_{i<k} p_i a_ik` keeps `p_0..p_{k-1}` normalised to sum 1 as it goes, so no
    partial sum can overflow however far the mass sits from state 0 (fixing `p_0 = 1` overflows
    once `p_k / p_0 > 1e308`); each step divides by a number >= 1, so an entry only shrinks and a
    final entry in the normal range kept its relative accuracy all the way. An inflow
    `p_i a_ik` or a final entry below that range may have lost bits that later entries were
    built from (rates 1e+-300 can put `p_2 / p_0 = 1e-351` on the way to `p_6 / p_0 = 1e67`), so
    such chains are redone with `_wide_back_substitution`, from the same censored matrix.
    """
    bad, risky, low_rate = _censor_batch_last(a, exact)
    tiny = _finfo(a).tiny
    p = a[0] * 0.0  # (n, b); every row is written below
    p[0] = 1.0
    for k in range(1, a.shape[0]):
        pk = (p[:k] * a[:k, k]).sum(0) / a[k, k]  # p_0..p_{k-1} sum to 1: no overflow
        p[k] = pk
        p[: k + 1] /= 1.0 + pk
    # an entry below the normal range (or NaN), or maybe an inflow p_i a_ik: p_i only shrinks,
    # so p_i a_ik >= min(p) times the smallest positive rate
    lost = ~(p >= tiny).all(0) | (_amin(p) * low_rate < tiny)
    redo = np.flatnonzero(_numpy(lost & ~bad))  # pivots fine, some entry out of the normal range
    if redo.size:
        cols = redo if redo.size > 1 else np.repeat(redo, 2)  # two columns: summed in order
        sub = _numpy(a[:, :, _index_like(a, cols)])
        wide, zero = _wide_back_substitution(sub if sub.dtype != np.float32 else sub.astype(float))
        _put(p, (slice(None), redo), wide[:, : redo.size])
        _put(lost, redo, zero[: redo.size])
    if a.shape[0] > 1 and bool(risky.any()) and gradual_underflow(a):  # probe only if needed
        diag = np.arange(1, a.shape[0])
        risky = risky & ~_underflow_is_harmless(p[1:] * a[diag, diag], tiny)
    return p.T, bad | lost, risky


_HALF = 0.5  # a global, so that `tiny * _HALF` below is computed when called, not folded


def gradual_underflow(like=None) -> bool:
    """Whether this thread's arithmetic keeps subnormal numbers, which `_underflow_is_harmless`
    assumes: flush-to-zero or denormals-are-zero (`torch.set_flush_denormal(True)`, a library
    built with -ffast-math) make a lost term as large as `tiny`, not `tiny eps / 2`. Probed in
    Python floats, and for a torch tensor `like` also in its dtype on its device."""
    tiny = float(np.finfo(np.float64).tiny)
    sub = tiny * _HALF
    if not (sub > 0.0 and sub + sub == tiny):  # FTZ: sub is 0; DAZ: sub reads as 0
        return False
    if _is_torch(like):
        import torch

        t = torch.full((), torch.finfo(like.dtype).tiny, dtype=like.dtype, device=like.device)
        half = t * _HALF
        return bool((half > 0) & (half + half == t))
    return True


def _underflow_is_harmless(flows, tiny):
    """Whether the underflow that the screen (`risky`) allows for cannot have cost `p` more than
    rounding does: `2 tiny n^2 (1/2 + max_k f_k) <= min_k f_k`, from the flows `f_k = p_k s_k`
    (k >= 1; `(n - 1, b)`, p summing to 1) out of each eliminated state into the lower ones.

    Why: an underflowing product or probability is off by at most half the subnormal spacing,
    `tiny eps / 2`, in absolute terms (sums of subnormals are exact). Such errors move through the
    elimination like probability mass: weighted by `p`, the error mass of the rows is conserved
    (row k's mass reaches row i with weight `a_ik / s_k`, and `sum_i p_i a_ik = p_k s_k`). The
    `n^2 / 2` products per row and the at most `n` probabilities per pivot row, weighted by `p`
    and `p_k s_k`, bound it by `tiny eps n^2 (1/2 + max f) / 2`; twice that against the unit
    roundoff times the smallest flow bounds the relative error of every `s_k` and `p_k` by about
    `n eps`, GTH's own rounding bound. A long cycle passes (its far-away fill-in underflows, but
    carries no flow that matters); rates 1e+-300 in one chain do not. NaN: not harmless."""
    n = flows.shape[0] + 1
    return (2.0 * tiny) * (n * n) * (0.5 + _amax(flows)) <= _amin(flows)


def _censor_batch_last(a, exact: bool = False):
    """Eliminate states n-1, ..., 1 of `a (n, n, b)` (zero diagonal) in place. Afterwards
    `a[i, k]` (i < k) is the rate i -> k of the chain censored to {0..k}, `a[k, k]` the pivot
    `s_k` (the rate of k into the lower states) and `a[k, j]` (j < k) the probability that k's
    next jump below goes to j. Scaling the row, not the column, keeps every number within the
    range of the rates: a probability is at most 1, so neither `a_kj / s_k` nor the update
    `a_ij += a_ik a_kj / s_k` can overflow, and the ratio `a_ik / s_k`, which can (rates 1e+-200),
    is never formed. A probability, or a product of one with a rate, can still fall below the
    normal range (rates 1e+-300 in one row), losing a transition that may matter.

    Returns `(bad, risky, low_rate)`: the flags of a zero or non-finite pivot and of chains
    where some probability `a_kj / s_k` or product `a_ik a_kj / s_k` may have left the normal
    range, screened from the smallest positive ones in O(n^2) (division by `s_k` is monotone,
    so the smallest probability is the smallest rate over `s_k`; the screen never misses one),
    and the smallest positive censored rate `a_ik` (i < k), for the back-substitution's screen.
    `stationary_kernel._censor` computes the same, flags included. (`_gth_batch_last` then
    clears `risky` where the underflow is certified harmless, `_underflow_is_harmless`.)

    `exact` (numpy, for the few chains the screen flags, redone in long double): the product
    test is exact instead, O(n^3) more work: a product below the normal range that was added to
    a rate not much larger (`< tiny / eps`, so the loss may matter); products onto the diagonal
    are self-loops, never read."""
    finfo = _finfo(a)
    tiny = finfo.tiny
    bad = a[0, 0] != 0.0  # (b,) all False: the diagonal was zeroed
    risky = bad
    low_rate = a[0, 0] + float("inf")  # (b,)
    for k in range(a.shape[0] - 1, 0, -1):
        row = a[k, :k]  # (k, b) rates of k into the lower states
        s = row.sum(0)  # (b,) their sum, the pivot
        bad = bad | ~(s > 0)  # a zero pivot: reducible (or underflow); also catches NaN
        low_prob = _min_positive(row) / s
        row /= s  # a zero pivot gives inf/nan here; such chains are flagged
        a[k, k] = s
        rate = _min_positive(a[:k, k])
        low_rate = _minimum(low_rate, rate)
        risky = risky | (low_prob < tiny)  # a probability below the normal range
        # censor state k: i -> k -> j becomes i -> j, with no subtraction anywhere
        if not exact:
            risky = risky | (rate * low_prob < tiny)  # maybe a product below it
            _add_product(a[:k, :k], a[:k, k, None], a[k, None, :k])
            continue
        col = a[:k, k, None]
        product = col * row[None]  # (k, k, b)
        under = (product < tiny) & (col > 0) & (row[None] > 0) & (a[:k, :k] < tiny / finfo.eps)
        under[np.arange(k), np.arange(k)] = False
        risky = risky | under.any((0, 1))
        a[:k, :k] += product
    return bad, risky, low_rate


def _min_positive(x):
    """The smallest positive entry along the first axis (inf where there is none); one pass
    where every entry is positive (a dense generator)."""
    low = _amin(x)
    if bool((low > 0).all()):
        return low
    if _is_torch(x):
        import torch

        return torch.where(x > 0, x, torch.inf).amin(0)
    return np.where(x > 0, x, np.inf).min(0)


def _amin(x):
    return x.amin(0) if _is_torch(x) else x.min(0)


def _amax(x):
    return x.amax(0) if _is_torch(x) else x.max(0)


def _minimum(x, y):
    if _is_torch(x):
        import torch

        return torch.minimum(x, y)
    return np.minimum(x, y)


def _finfo(a):
    if _is_torch(a):
        import torch

        return torch.finfo(a.dtype)
    return np.finfo(a.dtype)


def _wide_back_substitution(a):
    """`p (n, b)` and flags from censored `a (n, n, b)` (numpy): each `p_k = sum_{i<k} p_i
    a_ik / s_k` kept as a mantissa in [0.5, 1) and a power of two apart (`frexp`), so no entry
    under- or overflows on the way however far apart they are; entries below 2^-1074 of the
    largest are 0 at the end. Flags chains with an entry whose inflow is exactly zero (a
    transient state) or not finite; `stationary_kernel._wide` is the same, operation for
    operation."""
    n, _, b = a.shape
    mant = np.zeros((n, b), dtype=a.dtype)
    expo = np.full((n, b), _NO_EXPONENT, dtype=np.int64)
    mant[0], expo[0] = 0.5, 1  # p_0 = 1
    for k in range(1, n):
        t = mant[:k] * a[:k, k]  # (k, b): a mantissa times a censored rate: finite
        mt, et = np.frexp(t)
        tot = np.where(t > 0, expo[:k] + et, _NO_EXPONENT)
        top = tot.max(0)  # (b,) the largest term's exponent
        shift = np.maximum(tot - top, -2000).astype(np.int32)
        ms, es = np.frexp(a[k, k])  # the pivot s_k
        mant[k], de = np.frexp(np.ldexp(mt, shift).sum(0) / ms)
        expo[k] = np.where(mant[k] > 0, top + de - es, _NO_EXPONENT)
    zero = ~(mant > 0).all(0)
    rel = np.maximum(expo - expo.max(0), -2000).astype(np.int32)
    p = np.ldexp(mant, rel)  # the largest entry in [0.5, 1)
    return p / p.sum(0), zero


_NO_EXPONENT = np.iinfo(np.int64).min // 4  # the exponent of a zero entry


def _numpy(x):
    return x.detach().cpu().numpy() if _is_torch(x) else x


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
        raise _reducible(closed, transient, index if batch_shape else None)
    return unichains


_SHOWN = 8  # states (and classes) a sentence lists before it says how many more


def _states(states) -> str:
    """`[0, 1, 2]`, or for a long list its first few and the count: `[0, 1, ..., 7, ...] (512
    states)` (the full lists stay on the error's `closed_classes` and `transient`)."""
    if len(states) <= _SHOWN:
        return str(list(states))
    return f"[{', '.join(str(i) for i in states[:_SHOWN])}, ...] ({len(states)} states)"


def _reducible(closed, transient, index=None) -> ReducibleGeneratorError:
    """The error for a chain without a unique answer: several closed classes, or (without
    `allow_transient`) one with transient states; `index` the batch index, if any."""
    where = f" (batch index {tuple(int(i) for i in index)})" if index is not None else ""
    if len(closed) > 1:
        shown = ", ".join(_states(c) for c in closed[:_SHOWN])
        more = f", and {len(closed) - _SHOWN} more" if len(closed) > _SHOWN else ""
        msg = (
            f"the generator{where} is reducible with {len(closed)} closed classes "
            f"[{shown}{more}], so its stationary distribution is not unique; expected an "
            f"irreducible generator."
        )
    else:
        msg = (
            f"the generator{where} is reducible: states {_states(transient)} are transient and "
            f"{_states(closed[0])} is the only closed class; expected an irreducible generator "
            f"(pass allow_transient=True to accept zero mass on transient states)."
        )
    return ReducibleGeneratorError(msg, closed, transient)


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
        _check_finite(p, q_np, flags)
    return p


def _check_finite(p, q_np, flags):
    """Raise `InputError` (one sentence) if an irreducible chain's `p` is not finite: a rate
    is not a number (`check=False`), or a sum or product of rates left even long double's
    range in the elimination (`_redo_extended`)."""
    finite = _isfinite(p).all(-1)
    finite = finite.cpu().numpy() if _is_torch(finite) else np.asarray(finite)
    if finite.all():
        return
    batch_shape = q_np.shape[:-2]
    flat = int(np.flatnonzero(~finite.reshape(-1))[0])
    index = np.unravel_index(flat, batch_shape) if batch_shape else ()
    off = q_np[index][~np.eye(q_np.shape[-1], dtype=bool)]
    pos = off[off > 0]
    where = f" (batch index {tuple(int(i) for i in index)})" if batch_shape else ""
    raise InputError(
        f"the stationary distribution of the generator{where} cannot be computed in "
        f"floating-point arithmetic: its positive rates span {pos.min():.3g} to "
        f"{pos.max():.3g}, and a sum or product of them in the elimination left even long "
        f"double's range, or a rate is not a number; expected finite rates spanning less."
    )


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


def require_square(q) -> None:
    """`InputError` (from `validate_generator`'s own wording) unless `q` is a batch of square
    matrices `(..., n, n)` with `n >= 1`."""
    if q.ndim < 2 or q.shape[-1] != q.shape[-2] or q.shape[-1] < 1:
        validate_generator(q)  # raises: not a batch of square matrices


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
    if method not in STATIONARY_METHODS:
        raise InputError(
            f"unknown stationary method {method!r}; expected one of {list(STATIONARY_METHODS)}."
        )
    if _is_torch(Q):
        import torch

        if Q.is_complex():  # .to(float64) would drop the imaginary part
            raise InputError(f"Q must hold real numbers; got dtype {Q.dtype}.")
        q = Q if Q.is_floating_point() else Q.to(torch.float64)
    else:
        q_in = _real_array(Q, "Q")
        q = np.asarray(q_in, dtype=np.float64)
        if check and q_in.dtype.kind == "f" and q_in.dtype.itemsize < q.dtype.itemsize:
            # validated at its own dtype's tolerance: float32 rows summing to zero within
            # float32's round-off do not sum to zero within float64's (GTH never reads the
            # diagonal; the other methods get it rebuilt in float64)
            validate_generator(q_in)
            check = False
    require_square(q)
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


def chain_stationary(up, down, *, allow_transient: bool = False) -> np.ndarray:
    """`p_st` of a neighbour chain in O(n): `p_{i+1} / p_i = up_i / down_i`, for the rates
    `up_i` (`i -> i+1`) and `down_i` (`i+1 -> i`), finite and non-negative, of shape
    `(..., n-1)`; returns `(..., n)`. A zero rate splits the chain into classes (runs of links
    with both rates positive); as in `stationary_distribution`, one closed class plus transient
    states needs `allow_transient` (the mass then sits on the closed class), and several closed
    classes raise `ReducibleGeneratorError`.

    This is GTH on a tridiagonal generator (censoring the last state touches only its neighbour's
    diagonal, which GTH never reads), without the O(n^3) of the dense elimination: products of
    positive numbers, no subtraction. Each ratio and running product is kept as a mantissa in
    [0.5, 1) and a separate power of two (`frexp`), so nothing overflows however far the mass sits
    from state 0; entry `k` has a relative error of at most about `(n + k) u`, except entries
    below the smallest float times the largest, which are 0 (as the dense elimination gives).
    """
    up, down = np.asarray(up, dtype=np.float64), np.asarray(down, dtype=np.float64)
    try:
        up, down = np.broadcast_arrays(up, down)
    except ValueError:
        raise InputError(
            f"up and down rates must broadcast to one shape (..., n-1); got shapes {up.shape} "
            f"and {down.shape}."
        ) from None
    if up.ndim < 1:
        raise InputError(f"chain rates must have shape (..., n-1); got shape {up.shape}.")
    for name, r in (("up", up), ("down", down)):
        bad = ~(np.isfinite(r) & (r >= 0))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InputError(
                f"a neighbour chain's stationary distribution in O(n) needs finite, non-negative "
                f"up and down rates; got {name}{list(at)} = {r[at]:g}."
            )
    batch, links = up.shape[:-1], up.shape[-1]
    if links == 0:  # one state, no links: all the mass on it (as stationary_distribution)
        return np.ones(batch + (1,))
    up, down = up.reshape(-1, links), down.reshape(-1, links)
    split = ~np.all((up > 0) & (down > 0), axis=-1)  # chains that a zero rate splits
    p = np.zeros((up.shape[0], links + 1))
    if not split.all():
        p[~split] = _positive_chain(up[~split], down[~split])
    for i in np.flatnonzero(split):
        index = np.unravel_index(i, batch) if batch else None
        p[i] = _split_chain(up[i], down[i], allow_transient, index)
    return p.reshape(batch + (links + 1,))


def _split_chain(up, down, allow_transient, index):
    """One chain `(n-1,)` with a zero rate: its classes are the runs of links with both rates
    positive; a class is closed unless a rate leads out of it at either end."""
    n = up.size + 1
    cuts = np.flatnonzero(~((up > 0) & (down > 0)))  # link i cuts between i and i+1
    starts = np.concatenate([[0], cuts + 1])
    ends = np.concatenate([cuts, [n - 1]])  # class [l, r]
    closed = [(lo, hi) for lo, hi in zip(starts, ends)
              if not ((lo > 0 and down[lo - 1] > 0) or (hi < n - 1 and up[hi] > 0))]  # fmt: skip
    members = [list(range(lo, hi + 1)) for lo, hi in closed]
    transient = sorted(set(range(n)).difference(*members))
    if len(closed) > 1 or (transient and not allow_transient):
        raise _reducible(members, transient, index)
    lo, hi = closed[0]
    p = np.zeros(n)
    p[lo : hi + 1] = _positive_chain(up[lo:hi], down[lo:hi])
    return p


def _positive_chain(up, down):
    """`chain_stationary` for rates that are all positive."""
    mu, eu = np.frexp(up)
    md, ed = np.frexp(down)
    ratio = mu / md  # in (0.5, 2); up_i / down_i = ratio_i 2^(eu_i - ed_i)
    shift = (eu - ed).astype(np.int64)
    links = up.shape[-1]
    mant = np.empty(up.shape[:-1] + (links + 1,))
    expo = np.empty(mant.shape, dtype=np.int64)
    mant[..., 0], expo[..., 0] = 0.5, 1  # p_0 = 1 before normalisation
    for c in range(0, links, _CHAIN_BLOCK):  # a block of products stays within 2^(+-block)
        e = min(c + _CHAIN_BLOCK, links)
        w = mant[..., c : c + 1] * np.cumprod(ratio[..., c:e], axis=-1)
        mant[..., c + 1 : e + 1], de = np.frexp(w)
        expo[..., c + 1 : e + 1] = expo[..., c : c + 1] + np.cumsum(shift[..., c:e], -1) + de
    rel = np.maximum(expo - expo.max(-1, keepdims=True), -2000).astype(np.int32)
    p = np.ldexp(mant, rel)  # the largest entry in [0.5, 1); entries below 2^-1074 are 0
    return p / p.sum(-1, keepdims=True)


_CHAIN_BLOCK = 512


def _real_array(x, name: str) -> np.ndarray:
    """`x` (an array, a list, a tensor) as a numpy array of real numbers, at its own dtype when
    that is numeric (so that callers can read its precision), else as float64; `InputError` (one
    sentence) for complex numbers, whose imaginary part numpy's cast would drop with only a
    warning, and for entries that are no numbers (an object array holding text)."""
    a = x.detach().cpu().numpy() if _is_torch(x) else np.asarray(x)
    if a.dtype.kind == "c":
        raise InputError(f"{name} must hold real numbers; got dtype {a.dtype}.")
    if a.dtype.kind in "biuf":
        return a
    try:
        return np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        bad = next((v for v in a.flat if not reads_as_float(v)), None)
        raise InputError(
            f"{name} must hold real numbers; got {bad!r} in an array of dtype {a.dtype}."
        ) from None


def _stationary_vector(p, q: np.ndarray, q_in) -> np.ndarray:
    """The caller's stationary vector `p` of the float64 generators `q (..., n, n)` (`q_in`:
    the caller's array, at its own dtype) as float64 `(..., n)`, or `InputError` (one sentence)
    unless `q` passes `validate_generator`'s finite and row-sum screens (its off-diagonal signs
    are not searched) and `p` has `n` entries on its last axis and batch axes that broadcast
    against `q`'s (each pair checked: one `p` for a stack of equal generators, or one generator
    for a stack of its `p`s, as before the check), is finite, and is a
    stationary distribution of `q` to rounding: `|Q^T p - p * (Q 1)| <= tol max|Q|` entrywise
    (the balance of the flows in and out of each state, so that a diagonal off by the row
    sums that `validate_generator` allows does not count: the generator is defined by its
    off-diagonal rates, as in `stationary_distribution`), `|1^T p - 1| <= tol`, `p >= -tol`;
    `max|Q|` is read off the diagonal (a valid row's largest entry). A `p` computed in float32
    must be passed at float32 (its tolerance is its dtype's): upcast, it is held to float64's.

    Why `tol = max(1e-10, 100 n u)` (`u` the unit round-off of the coarser of `Q`'s and `p`'s
    dtypes) against `max|Q|`: a `p` within `eta` of the exact one in the 1-norm has residuals
    at most `(eta + 4 n u) max|Q|` (each entry `sum_j |Q_ji| |dp_j|`, plus the rounding of the
    two sums of `n` terms) and `|1^T p - 1| <= eta + n u`. GTH's `p` has each entry to a small
    relative error (`eta` a few `n u`) however stiff the chain, and a backward-stable `"lu"` or
    `"svd"` solve, or a closed form, is within `O(n u)` normwise too, so the test refuses no
    correct `p` (the floor is `validate_generator`'s row-sum tolerance); a `p` of another `y`,
    a uniform one or one that does not sum to 1 misses by orders of magnitude more. Scaled to
    the largest rate, a chain whose rates span 1e-300 to 1e300 passes as well. Cost: O(n^2)
    per generator, vectorised, beside the O(n^3) solve that follows (products with `ones` and
    `p`, not numpy's slower reductions over a short last axis)."""
    n = q.shape[-1]
    rowsum = q @ np.ones(n)
    diag = np.abs(np.diagonal(q, axis1=-2, axis2=-1))
    q_dtype = q_in.dtype
    atol = max(1e-10, 100 * float(np.finfo(q_dtype).eps)) if q_dtype.kind == "f" else 1e-10
    if not (np.abs(rowsum) <= atol * (1.0 + diag)).all():  # a NaN or inf entry's row too
        validate_generator(q_in)  # raises with the sentence that names the entry
    p_in = _real_array(p, "p")
    try:  # batch axes broadcast against Q's (each p is then checked against its own Q below)
        ok = p_in.ndim >= 1 and p_in.shape[-1] == n and \
            np.broadcast_shapes(p_in.shape[:-1], q.shape[:-2]) is not None  # fmt: skip
    except ValueError:
        ok = False
    if not ok:
        raise InputError(
            f"p must have shape (..., {n}), one entry per state, with batch axes that broadcast "
            f"against Q's {tuple(q.shape[:-2])}; got {tuple(p_in.shape)}."
        )
    p_out = np.asarray(p_in, dtype=np.float64)
    first_non_finite(p_out, "p")
    u = max((float(np.finfo(d).eps) for d in (q_dtype, p_in.dtype) if d.kind == "f"),
            default=float(np.finfo(np.float64).eps))  # fmt: skip
    tol = max(1e-10, 100 * n * u)
    residual = (p_out[..., None, :] @ q)[..., 0, :] - p_out * rowsum
    worst = np.abs(residual).max(-1)
    scale = np.broadcast_to(diag.max(-1), worst.shape)  # max|Q|
    total = np.broadcast_to(p_out.sum(-1), worst.shape)
    smallest = np.broadcast_to(p_out.min(-1), worst.shape)
    bad = (worst > tol * scale) | (np.abs(total - 1.0) > tol) | (smallest < -tol)
    if np.any(bad):
        index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        where = f" (batch index {index})" if index else ""
        rel = worst[index] / scale[index] if scale[index] > 0 else 0.0
        raise InputError(
            f"p must be a stationary distribution of Q{where}, with Q^T p = 0 (to {tol:.2g} "
            f"times Q's largest rate), sum 1 and no negative entry (each to {tol:.2g}); got "
            f"|Q^T p| up to {rel:.3g} times Q's largest rate, sum {total[index]:.17g} and "
            f"smallest entry {smallest[index]:.3g}."
        )
    return p_out


def fundamental_matrix(Q, p=None) -> np.ndarray:
    """`Z = (Q^T - p 1^T)^{-1}`, batched (DESIGN 3.1); non-singular whenever 0 is a simple
    eigenvalue of `Q`: one closed class, with or without transient states. A given `p` must be
    `Q`'s stationary distribution, of shape `(..., n)` (checked in O(n^2), to rounding:
    `_stationary_vector`)."""
    q_in = _real_array(Q, "Q")
    q = np.asarray(q_in, dtype=np.float64)
    require_square(q)
    if p is None:  # validates Q at its own dtype's tolerance
        p = stationary_distribution(q_in, allow_transient=True)
    else:
        p = _stationary_vector(p, q, q_in)
    m = np.swapaxes(q, -1, -2) - p[..., :, None]
    return np.linalg.inv(m)


def stationary_derivative(Q, dQ, p=None) -> np.ndarray:
    """`dp/dy = -Z (dQ/dy)^T p` for `dQ` of shape `(..., m, n, n)`; returns `(..., n, m)`.

    This is the derivative of `p_st(Q(y))` along the slow variables, computed by one batched
    linear solve with `Q^T - p 1^T` (no differentiation of the elimination). It holds wherever
    `p_st` is unique, so transient states are allowed (Michaelis-Menten at `y = 0`: the mass
    on state 0 leaks to state 1 at the binding rate's slope); several closed classes raise.
    A given `p` must be `Q`'s stationary distribution, `(..., n)` with batch axes that
    broadcast against `Q`'s (checked in O(n^2), to rounding: `_stationary_vector`); `dQ` must
    be finite.
    """
    q_in = _real_array(Q, "Q")
    q = np.asarray(q_in, dtype=np.float64)
    require_square(q)
    n = q.shape[-1]
    dq = np.asarray(_real_array(dQ, "dQ"), dtype=np.float64)
    # at least Q's dimensions and an m axis; more leading ones broadcast (one Q, a batch of dQ)
    if dq.ndim < q.ndim + 1 or dq.shape[-2:] != (n, n):
        raise InputError(
            f"dQ must have shape (..., m, {n}, {n}) for Q of shape {q.shape} (the leading "
            f"dimensions of Q, then one {n} x {n} derivative per slow variable); got shape "
            f"{dq.shape}."
        )
    if p is not None:
        p = _stationary_vector(p, q, q_in)
    try:
        np.broadcast_shapes(q.shape[:-2], dq.shape[:-3])
    except ValueError:
        raise InputError(
            f"Q and dQ must share their leading dimensions; got shapes {q.shape} and "
            f"{dq.shape}."
        ) from None
    first_non_finite(dq, "dQ")
    if p is None:  # validates Q at its own dtype's tolerance
        p = stationary_distribution(q_in, allow_transient=True)
    m = np.swapaxes(q, -1, -2) - p[..., :, None]  # (..., n, n)
    rhs = np.einsum("...kji,...j->...ki", dq, p)  # (dQ_k^T p)_i, shape (..., m, n)
    dp = np.linalg.solve(m[..., None, :, :], -rhs[..., None])[..., 0]  # (..., m, n)
    return np.swapaxes(dp, -1, -2)
