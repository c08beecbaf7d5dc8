"""Non-linear generators `Q(x, y)`: where the paper's identity `phi(y) = p_st(y)` breaks.

When the rates depend on the fast state itself (mean-field rates), the critical manifold solves
`F(x, y) = Q(x, y)^T x = 0` on the simplex. It is in general not the stationary distribution of
any fixed generator, and it can fold: several branches over one `y`, the middle one repelling,
and relaxation oscillations when the slow law pushes `y` past the folds (DESIGN 3.2).

- `NonlinearBirthDeath`: up rate `exp(beta (y - y_mid) + kappa c.x)`, down rate `down`,
  `c_i = i/(n-1)`; `kappa = 0` is the linear `BirthDeath` family.
- `LinearFamily`: any linear generator seen as a (trivially) non-linear one.
- `NonlinearMasterEquationSystem`: `eps dx/dt = Q(x, y)^T x`, `dy/dt = g(x, y)`.
- `critical_branches`: every branch of `F = 0` over a range of `y`, by pseudo-arclength
  continuation, with fold points (refined by bisection on the tangent's `y` component) and the
  stability of each branch (eigenvalues of `D_x F` on the simplex's tangent space).
- `identity_gap`: `max |phi(y) - p_st(Q(x_ref, y))|` with `x_ref` uniform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .generators import BirthDeath, Generator, domain_text, rate_domain, readout_vector
from .stationary import stationary_distribution
from .systems import FastSlowSystem, LinearSlowLaw, merged_params
from .wording import plural

__all__ = [
    "NonlinearBirthDeath",
    "LinearFamily",
    "NonlinearMasterEquationSystem",
    "critical_branches",
    "identity_gap",
    "identity_gap_kind",
    "relaxation_oscillation",
    "family_for",
    "manifold_dataset",
]


@dataclass
class NonlinearBirthDeath:
    """Birth-death chain with up rate `u(x, y) = up * exp(beta (y - y_mid) + kappa c.x)`."""

    n: int = 8
    up: float = 1.0
    down: float = 1.0
    beta: float = 4.0
    y_mid: float = 0.5
    kappa: float = 0.0
    name: str = field(default="birth-death", init=False, repr=False)
    domain_reason = "its rates are positive and finite"

    def __post_init__(self):
        if not math.isfinite(self.kappa):
            raise InputError(f"kappa must be a finite number; got kappa={self.kappa}.")
        self._linear = BirthDeath(
            n=self.n, up=self.up, down=self.down, beta=self.beta, y_mid=self.y_mid
        )

    @property
    def n_states(self):
        return int(self.n)

    @property
    def c(self):
        return readout_vector(self.n_states)

    def domain(self):
        """The `y` on which the up rate `up exp(beta (y - y_mid) + kappa c.x)` is a positive
        normal float for every `c.x` in [0, 1] (below, it underflows: state 0 absorbs), and
        `n (|beta| + |kappa| + 1)` times it is finite (above, the Jacobian overflows):
        `generators.rate_domain` of the rates `up e^{min(0, kappa)}` and `up e^{max(0, kappa)}`
        at slope `beta`, and of the factor `exp(...)` that `up` multiplies, in range too."""
        k = np.array([min(0.0, self.kappa), max(0.0, self.kappa)])
        room = self.n_states * (abs(self.beta) + abs(self.kappa) + 1.0)
        ends = rate_domain(np.append(math.log(self.up) + k, k), self.beta, [room, room, 1, 1],
                           self.y_mid, positive=True)  # fmt: skip
        if ends is None:
            raise InputError(
                f"kappa={self.kappa:g} leaves no y where the birth-death rates and their "
                f"Jacobian are positive and finite; expected |kappa| well below 1400 (the span "
                f"of float64's exponents)."
            )
        return ends

    def _graph(self, s):
        """The manifold at `s = log(u/down)`: `x_i ~ e^(s i)`, its mean `m = c.x`, `Var(c.x)`
        and `y(s) = y_mid + (s - log(up/down) - kappa m) / beta` (arrays over `s`)."""
        i = np.arange(self.n_states)
        logw = np.outer(s, i)
        x = np.exp(logw - logw.max(axis=1, keepdims=True))
        x /= x.sum(axis=1, keepdims=True)
        m = x @ self.c
        var = x @ self.c**2 - m**2
        y = self.y_mid + (s - math.log(self.up / self.down) - self.kappa * m) / self.beta
        return x, m, var, y

    def fold_points(self) -> list:
        """The folds `[(x, y)]`, exactly: `dy/ds = 0`, i.e. `kappa m'(s) = 1` with
        `m'(s) = (n-1) Var(c.x)`, by brentq, the low-mean one (`s < 0`) first.

        `Var(i) = (n^2/4) p''(n s/2) - p''(s/2)/4` with `p(z) = log(sinh(z)/z)` is even in `s`
        and falls strictly in `|s|` (`z^3 p'''(z)` falls in `z > 0`, as `3 sinh(w) <
        w cosh(w) + 2w` for `w > 0`, term by term in `w`), from `(n^2-1)/12` at `s = 0`. So
        there are two folds, at `+-s*`, when `kappa (n+1)/12 > 1` and none otherwise (the onset
        of folding is `kappa = 12/(n+1)`); `s*` is bracketed between `s = 0`, or the last
        `2^k/(n-1)` where the condition holds, and the first where it fails, and solved at
        `-s*` (the side where `Var` is not the difference of two numbers near 1). Near the onset
        the two folds are `2 s*` apart, however close: no grid to step over them; far from it,
        `Var(i) ~ e^(-|s|)` puts `s*` near `log(kappa/(n-1))` (below 8 in the domain). O(n)
        memory (the grid of 120,001 values of `s` in [-60, 60] took 5.4 s and 1.2 GB at
        n = 400)."""
        s = self._fold_s()
        if s is None:
            return []
        x, _, _, y = self._graph(np.array([-s, s]))
        return [(x[0], float(y[0])), (x[1], float(y[1]))]

    def _fold_s(self):
        """`s* > 0`, the folds being at `s = +-s*` (`fold_points`), or None without folds."""
        from scipy.optimize import brentq

        n = self.n_states
        if self.kappa <= 0 or n < 2:
            return None

        def f(v):  # at -v: near a point mass on state 0, Var = c^2.x - m^2 cancels nothing
            return self.kappa * (n - 1) * self._graph(np.array([-v]))[2][0] - 1.0

        if not f(0.0) > 0:
            return None
        a, b = 0.0, 1.0 / (n - 1)  # Var(i) falls on the scale 1/n first
        while f(b) >= 0:  # Var(i) -> 0: f -> -1
            a, b = b, 2.0 * b
        return brentq(f, a, b, xtol=1e-15)

    def graph_solutions(self, y) -> list:
        """`[(s, interior)]`: every `s` with `y(s) = y`, one per monotone piece of the graph
        `y(s)` (split at the folds `+-s*`) that reaches `y`, in increasing `s` (mean), by
        brentq; `interior` is False for a root on a piece's end (`y` is that fold's).
        `y(s) ~ (s - log(up/down))/beta` runs off to infinity at both ends, so every `y` has a
        root on the first piece or the last."""
        from scipy.optimize import brentq

        if not self.beta:
            raise InputError("NonlinearBirthDeath needs beta != 0.")
        y = float(y)
        if not math.isfinite(y):
            raise InputError(f"y must be a finite number; got y={y}.")

        def g(s):
            return float(self._graph(np.array([s]))[3][0]) - y

        s_f = self._fold_s()
        ends = [-math.inf, math.inf] if s_f is None else [-math.inf, -s_f, s_f, math.inf]
        out = []
        for a, b in zip(ends[:-1], ends[1:]):
            if math.isinf(a) and math.isinf(b):
                a, b = -1.0, 1.0
                while g(a) * g(b) > 0 and b < 1e300:
                    a, b = 2.0 * a, 2.0 * b
            elif math.isinf(a) or math.isinf(b):  # an outer piece: y(s) -> -+inf sign(beta)
                e = b if math.isinf(a) else a
                far = -1.0 if math.isinf(a) else 1.0
                if g(e) == 0 or np.sign(g(e)) == far * np.sign(self.beta):
                    continue  # g(e) and g(far end) have one sign: y is not on this piece
                step = 1.0
                while np.sign(g(e + far * step)) != far * np.sign(self.beta) and step < 1e300:
                    step *= 2.0
                a, b = sorted((e, e + far * step))
            elif g(a) * g(b) > 0:
                continue
            ga, gb = g(a), g(b)
            if ga == 0 or gb == 0:
                out.append((a if ga == 0 else b, s_f is None))
            else:
                out.append((brentq(g, a, b, xtol=1e-15, rtol=4 * np.finfo(float).eps), True))
        return out

    def y_scale(self):
        """`1/|beta|`: the graph's `y` moves by about that per unit of `s` (and its folds lie
        `~ kappa/|beta|` apart), so the continuation steps in units of it where it exceeds 1."""
        return 1.0 / abs(self.beta) if self.beta else math.inf

    def graph_x(self, x, y):
        """The graph's `x` at `s = log(u(x, y)/down)` for rows `x (k, n)` at `y (k,)`: one step
        of the fixed point `x = p_st(Q(x, y))`, positive by construction. From `x` within `e`
        of the manifold it moves `x` by about `kappa |c.e| |dx/ds|`: round-off for the
        continuation's points, whose tiniest entries Newton resolves only in absolute terms
        (-3e-53 where the graph has 1e-60, kappa 30; -4e-17 at 40 states)."""
        return self._graph(self.graph_s(x, y))[0]

    def graph_s(self, x, y):
        """The graph's parameter `s = log(u(x, y)/down)` of rows `x (k, n)` at `y (k,)`; it rises
        with the mean along the curve (over every branch)."""
        return (math.log(self.up / self.down) + self.beta * (np.asarray(y) - self.y_mid)
                + self.kappa * (x @ self.c))  # fmt: skip

    def graph_point(self, s):
        """`(x, y)` of the graph at the parameter `s` (a float)."""
        x, _, _, y = self._graph(np.array([float(s)]))
        return x[0], float(y[0])

    def fold_region(self):
        """An interval of `y` holding every fold of the manifold (`fold_points`), or None (no
        folds, as for `kappa <= 0`)."""
        return _region_of(self.fold_points())

    def _u(self, x, y):
        return self.up * np.exp(self.beta * (y[..., 0] - self.y_mid) + self.kappa * (x @ self.c))

    def rates(self, x, y):
        """`Q(x, y)`: the linear chain's structure with the mean-field up rate."""
        # the linear family at the slow value whose up rate equals u(x, y)
        u = self._u(x, y)
        y_eff = self.y_mid + np.log(u / self.up) / self.beta if self.beta else None
        if y_eff is None:  # beta = 0: build directly
            raise InputError("NonlinearBirthDeath needs beta != 0.")
        return self._linear.rates(y_eff[..., None])

    def field_jacobians(self, x, y):
        """`D_x F` `(..., n, n)` and `D_y F` `(..., n, 1)` of `F = Q(x, y)^T x`."""
        Q = self.rates(x, y)
        u = self._u(x, y)
        n = self.n_states
        v = np.zeros_like(x)  # (dQ/du)^T x
        v[..., 1:] += x[..., :-1]
        v[..., :-1] -= x[..., :-1]
        Fx = np.swapaxes(Q, -1, -2) + (self.kappa * u)[..., None, None] * v[..., :, None] * self.c
        Fy = (self.beta * u)[..., None, None] * v[..., :, None]
        assert Fx.shape[-1] == n
        return Fx, Fy

    def params(self):
        return {"generator": "nonlinear-birth-death", "n": self.n, "up": self.up,
                "down": self.down, "beta": self.beta, "y_mid": self.y_mid, "kappa": self.kappa}  # fmt: skip


def _region_of(fold_points):
    """The interval of `y` between the outermost of `[(x, y)]` folds, padded by 1e-6; None if none."""
    ys = [y for _, y in fold_points]
    if not ys:
        return None
    pad = 1e-6 * (1.0 + max(abs(v) for v in ys))
    return (min(ys) - pad, max(ys) + pad)


class LinearFamily:
    """A linear generator `Q(y)` seen as `Q(x, y)` that ignores `x` (`kappa = 0`)."""

    def __init__(self, generator: Generator):
        self.generator = generator
        self.name = generator.name
        self.domain_reason = generator.domain_reason
        self.kappa = 0.0

    @property
    def n_states(self):
        return self.generator.n_states

    def domain(self):
        return self.generator.domain()

    def fold_region(self):
        """None: the manifold of a linear family is `p_st(y)`, one point per `y`, no folds."""
        return None

    # every eigenvalue of a generator's transpose has Re <= 0 (Gershgorin's discs of its
    # columns: centre q_jj = -sum_{i != j} q_ji, radius the same sum): `_fast_stability` never
    # reports one beyond it as resolved
    max_real_bound = 0.0

    def graph_x(self, x, y):
        """The manifold's `x` at the rows `y (k,)`: `p_st(Q(y))` by GTH (`x` unused), every
        entry to relative accuracy. The continuation's points resolve the tiniest entries
        only in absolute terms: the cycle at y = 95 had entries of -5e-20, and its mean c.x,
        -2e-20, printed as -0.000."""
        y = np.asarray(y, dtype=float).reshape(-1, 1)
        return stationary_distribution(self.generator.rates(y), allow_transient=True)

    def rates(self, x, y):
        return self.generator.rates(y)

    def field_jacobians(self, x, y):
        Fx = np.swapaxes(self.generator.rates(y), -1, -2)
        Fy = np.einsum("...kji,...j->...ik", self.generator.rates_dy(y), x)
        return Fx, Fy

    def params(self):
        return {**self.generator.params(), "kappa": 0.0}


class NonlinearMasterEquationSystem(FastSlowSystem):
    """`eps dx/dt = Q(x, y)^T x`, `dy/dt = g(x, y)`; mass is conserved, `p_st` is not the manifold."""

    def __init__(self, family, slow_law, eps, *, x0=None, y0=None):
        self.family = family
        self.slow_law = slow_law
        super().__init__(
            f=lambda x, y: np.einsum("...ji,...j->...i", family.rates(x, y), x),
            g=slow_law,
            n_fast=family.n_states,
            n_slow=1,
            eps=eps,
            f_x=lambda x, y: family.field_jacobians(x, y)[0],
            f_y=lambda x, y: family.field_jacobians(x, y)[1],
            g_x=slow_law.dx,
            g_y=slow_law.dy,
            name=f"nonlinear-{family.name}",
            parameters=merged_params(family.params(), slow_law.params()),
            x0=x0,
            y0=y0,
            conserves_mass=True,
        )


def _residual(family, x, y):
    """`G(x, y)`: the first `n-1` equations of `F = 0` and the normalisation `1^T x = 1`."""
    F = np.einsum("ji,j->i", family.rates(x, y), x)
    F[-1] = x.sum() - 1.0
    return F


def _jacobian(family, x, y):
    """`DG = [D_x G, D_y G]`, shape `(n, n+1)`."""
    Fx, Fy = family.field_jacobians(x, y)
    J = np.concatenate([Fx, Fy], axis=-1)
    J[-1, :] = 0.0
    J[-1, :-1] = 1.0
    return J


def _weights(size, scale):
    """`(1, ..., 1, scale)`: the continuation's metric measures `(x, y / scale)`."""
    w = np.ones(size)
    w[-1] = scale
    return w


def _norm(v, scale=1.0):
    """`|(v_x, v_y / scale)|`: a length in the continuation's metric, without overflow
    (`math.hypot`: steps in a `y` beyond 1e154, michaelis-menten's, square beyond float64)."""
    return math.hypot(*(v / _weights(v.size, scale)))


def _solve(J, b):
    """`J^-1 b`, or None where `J` is singular to LAPACK or the solution is not finite."""
    try:
        x = np.linalg.solve(J, b)
    except np.linalg.LinAlgError:
        return None
    return x if np.all(np.isfinite(x)) else None


def _tangent(J, previous=None, scale=1.0):
    """Null vector of `J (n, n+1)`, of unit `_norm`, oriented along `previous`.

    With `previous`, from the bordered system `[J; previous^T W] t = e_last` (`W` the metric's
    weights; `_solve`), the corrector's own matrix: accurate wherever Newton converges. An SVD
    of `J` gives the null vector only to round-off of `J`'s largest entry: rates of e^76 swamped
    the others, the cycle at y = 151.8 got a tangent of y part 0.17 for 1, and its continuation
    stalled there. The SVD where the system is singular, or without `previous`."""
    w = _weights(J.shape[1], scale)
    t = None
    if previous is not None:
        t = _solve(np.vstack([J, previous / w**2]), np.append(np.zeros(len(J)), 1.0))
    if t is None or not _norm(t, scale) > 0:
        t = np.linalg.svd(J * w)[2][-1] * w
    t = t / _norm(t, scale)
    if previous is not None and (t / w) @ (previous / w) < 0:
        t = -t
    return t


def _correct(family, u_pred, t, tol=1e-13, max_iter=12, scale=1.0):
    """Newton on `[G(u); <t, u - u_pred>] = 0`, the product that of `_norm`, to steps below
    `tol` in its metric; returns `(u, converged)`."""
    n = u_pred.size - 1
    u = u_pred.copy()
    w = _weights(n + 1, scale)
    normal = t / w**2
    for _ in range(max_iter):
        with np.errstate(all="ignore"):  # a diverging iterate overflows: caught just below
            G = _residual(family, u[:n], u[n:])
            H = np.append(G, normal @ (u - u_pred))
            J = np.vstack([_jacobian(family, u[:n], u[n:]), normal])
        if not (np.all(np.isfinite(H)) and np.all(np.isfinite(J))):
            return u, False  # Newton left the region where the rates are finite
        du = _solve(J, -H)
        if du is None:
            return u, False
        u = u + du
        if np.max(np.abs(du / w)) < tol and np.all(u[:n] > -1e-12):
            return u, True
    return u, False


def _fast_stability(family, x, y):
    """`(value, error)`: the largest real part of the eigenvalues of `D_x F` on the tangent
    space `{1^T v = 0}`, and an estimate of its round-off.

    `1^T F = 0` for every `x`, so `1^T D_x F = 0` and `D_x F` maps the tangent space to itself;
    in the coordinates that drop state `k` (`v_k = -sum_{j != k} v_j`) it is
    `B_ij = A_ij - A_ik` (`i, j != k`, `A = D_x F`), exact on the tangent space: no rotation
    mixes rates of 1e21 into a relaxation rate of 0.2, as an orthonormal basis did (the cycle at
    y = 100 printed +9e5 for -0.2). `k` is the state of largest mass. `B` is scaled exactly
    (powers of 2: by its largest entry, and a diagonal similarity, `_balance`) before its
    eigenvectors are computed (a birth-death chain of ratio 1e174 is a Jordan block to
    LAPACK otherwise). Each eigenvalue is refined by one step `w^H r / w^H v` on its residual
    `r = B v - lambda v` (left and right vectors `w`, `v`), and its error estimated as that
    step plus the residual's round-off, `2 n u |w|^T (M |v| + |lambda| |v|) / |w^H v|`, with
    `M_ij = |A_ij| + |A_ik|` the size of the terms of `B_ij`. `error` covers every
    eigenvalue: the largest real part lies in `value +- error`; where `error >= |value|`,
    float64 does not resolve its sign (at a fold, where it is 0: some 1e-17 within 1e-14).
    The cycle at y = 1000 (rates e^(+-500)) comes out -0.2 +- 9e-16 (mpmath: -0.2)."""
    Fx, _ = family.field_jacobians(x, y)
    n = x.size
    k = int(np.argmax(x))
    idx = np.delete(np.arange(n), k)
    A, a_k = Fx[np.ix_(idx, idx)], Fx[idx, k][:, None]
    B, M = A - a_k, np.abs(A) + np.abs(a_k)
    top = float(np.max(M))
    if not (math.isfinite(top) and top > 0):
        return (0.0, 0.0) if top == 0 else (math.nan, math.inf)
    big = 2.0 ** math.frexp(top)[1]
    B, M = B / big, M / big
    e = _balance(B)
    # unscaled and balanced: the estimate is tighter for one or the other (the cycle at y = 100
    # unscaled, 4e-10; a birth-death chain of ratio 1e174 balanced, 6e-15 relative)
    best = min((_refined_max_real(B * s, M * s) for s in
                (1.0, np.exp2(e[None, :] - e[:, None]))), key=lambda v: v[1])  # fmt: skip
    value, error = best[0] * big, best[1] * big
    bound = getattr(family, "max_real_bound", None)
    if bound is not None and value - error > bound:
        # the estimate is first order: past round-off of the largest rates (the random
        # family at y = 300, rates 1e-255 to 1e158) it claimed +2.7e101 +- 3e100 for a
        # generator, whose eigenvalues are known to lie at or left of `bound`
        error = value - bound
    return value, error


def _refined_max_real(B, M):
    """`(value, error)` of `_fast_stability` for the scaled matrix `B` with term sizes `M`."""
    from scipy.linalg import eig

    n = len(B) + 1
    with np.errstate(all="ignore"):
        lam, W, V = eig(B, left=True, right=True)
        wv = np.einsum("ij,ij->j", W.conj(), V)
        step = np.einsum("ij,ij->j", W.conj(), B @ V - V * lam) / wv
        size = np.einsum("ij,ij->j", np.abs(W), M @ np.abs(V) + np.abs(V) * np.abs(lam))
        err = np.abs(step) + 2 * (n - 1) * np.finfo(float).eps * size / np.abs(wv)
        re = (lam + step).real
    if not (np.all(np.isfinite(re)) and np.all(np.isfinite(err))):
        return float(np.max(lam.real)), math.inf
    value = float(np.max(re))
    return value, float(max(np.max(re + err) - value, value - np.max(re - err)))


def _balance(B, sweeps=60):
    """Exponents `e` (integers in [-500, 500]) such that `B_ij 2^(e_j - e_i)` has rows and
    columns of comparable size (Osborne's balancing, all rows at once): an exact similarity,
    which changes no eigenvalue. LAPACK's own balancing left a birth-death chain of ratio 1e174
    as it was, a Jordan block to its eigenvectors."""
    absB = np.abs(B)
    np.fill_diagonal(absB, 0.0)
    e = np.zeros(len(B))
    with np.errstate(all="ignore"):
        for _ in range(sweeps):
            S = absB * np.exp2(e[None, :] - e[:, None])
            r, c = S.sum(axis=1), S.sum(axis=0)
            f = np.where((r > 0) & (c > 0), np.round(0.5 * np.log2(r / c)), 0.0)
            f = np.where(np.isfinite(f), f, 0.0)
            new = np.clip(np.round(e + 0.5 * f), -500, 500)
            if np.array_equal(new, e):
                break
            e = new
    return e


def _start(family, y, n):
    """A point of the critical manifold at `y`. On a family with an exact graph
    (`graph_solutions`: `NonlinearBirthDeath`) its point of lowest mean at `y` off the folds, or
    on a fold where `y` is one (positive by construction; Newton missed a range starting on the
    upper fold near the onset of folding). Otherwise Newton from near `e_0` (mostly on the low
    branch), or, where that fails (no low branch at `y`: a range above the folds), the stable
    point that the fast flow `dx/dt = F(x, y)` relaxes to from there (pseudo-transient
    continuation)."""
    if hasattr(family, "graph_solutions"):
        roots = family.graph_solutions(float(y[0]))
        s = next((r for r, interior in roots if interior), roots[0][0])
        return family._graph(np.array([s]))[0][0]
    x0 = np.eye(n)[0] * 0.5 + 0.5 / n
    x, ok = _newton_on_simplex(family, x0, y)
    if ok:
        return x
    x, ok = _newton_on_simplex(family, _relax(family, x0, y), y)
    if not ok:
        raise RuntimeError(
            f"no point of the critical manifold was found at y={float(y[0]):.6g} (Newton from "
            f"the low state and from the relaxed fast flow both failed)"
        )
    return x


def _newton_step(family, x, y):
    """Newton's step `dx` on `G(x, y) = 0` in `x` at fixed `y`, or None where it is not finite."""
    n = x.size
    with np.errstate(all="ignore"):
        G = _residual(family, x, y)
        J = _jacobian(family, x, y)[:, :n]
        if not (np.all(np.isfinite(G)) and np.all(np.isfinite(J))):
            return None
        try:
            dx = np.linalg.solve(J, -G)
        except np.linalg.LinAlgError:
            return None
    return dx if np.all(np.isfinite(dx)) else None


def _newton_on_simplex(family, x, y, max_iter=200):
    """Newton on `G(x, y) = 0` with `x` kept on the simplex (an entry that a step would make
    negative is divided by 10 instead, so tiny probabilities converge in relative terms, not
    clipped to 0); returns `(x, on the manifold)`."""
    for _ in range(max_iter):
        dx = _newton_step(family, x, y)
        if dx is None:
            return x, False
        new = x + dx
        new = np.where(new < 0, 0.1 * x, new)
        new /= new.sum()
        done = np.all(np.abs(new - x) <= 1e-13 * new + 1e-300)
        x = new
        if done:
            break
    return x, _on_manifold(family, x, y)


def _on_manifold(family, x, y, tol=1e-10) -> bool:
    """Whether Newton's next step from `x` moves no entry by more than `tol` (an absolute accuracy
    of the probabilities, as the continuation's corrector asks; a residual test would depend on
    rates that may be far from 1) and stays on the simplex."""
    dx = _newton_step(family, x, y)
    return dx is not None and bool(np.max(np.abs(dx)) <= tol and np.min(x + dx) >= -tol)


def _relax(family, x, y, steps=2000):
    """Pseudo-transient continuation: linearly implicit Euler steps `(I - dt D_x F) dx = dt F`
    of the fast flow with `dt` grown as the residual falls (switched evolution relaxation), from
    `dt = 1 / (the largest rate)`, a step that would leave the simplex shortened;
    `1^T D_x F = 0` keeps `1^T x = 1`. It follows the flow to a stable equilibrium, and ends as
    Newton's method once `dt` is large."""
    n = x.size
    Q = family.rates(x, y)
    dt = 1.0 / max(float(np.max(np.abs(Q))), 1e-300)
    with np.errstate(all="ignore"):
        F = np.einsum("ji,j->i", Q, x)
        for _ in range(steps):
            Fx = family.field_jacobians(x, y)[0]
            try:
                dx = np.linalg.solve(np.eye(n) - dt * Fx, dt * F)
            except np.linalg.LinAlgError:  # dt hit an eigenvalue 1/dt of D_x F exactly
                dx = np.full(n, np.nan)
            if not np.all(np.isfinite(dx)) or np.min(x + dx) < -1e-12:
                dt *= 0.25  # a step that leaves the simplex is too long, not clipped onto it
                continue
            x_new = np.clip(x + dx, 0.0, None)
            x_new /= x_new.sum()
            F_new = np.einsum("ji,j->i", family.rates(x_new, y), x_new)
            scale = np.max(np.abs(F)) or 1.0  # norms of rescaled vectors: no overflow
            r, r_new = np.linalg.norm(F / scale), np.linalg.norm(F_new / scale)
            if not np.isfinite(r_new):
                dt *= 0.1
                continue
            x, F = x_new, F_new
            if r_new == 0.0 or _on_manifold(family, x, y):
                break
            dt *= min(max(r / r_new, 0.5), 10.0)
    return x


def check_y_range(family, y_range) -> tuple[float, float]:
    """`(A, B)` as floats, or `InputError` unless `A < B` are finite and inside the domain."""
    y_lo, y_hi = (float(v) for v in y_range)
    if not (math.isfinite(y_lo) and math.isfinite(y_hi)) or y_hi <= y_lo:
        raise InputError(f"the y range must be two finite numbers A < B; got {list(y_range)}.")
    lo, hi = family.domain()
    if y_lo < lo or y_hi > hi:
        raise InputError(f"the y range [{y_lo:.15g}, {y_hi:.15g}] leaves {domain_text(family)}.")
    return y_lo, y_hi


def critical_branches(family, y_range, h=0.02, h_max=0.05, max_points=20000) -> dict:
    """All branches of `Q(x, y)^T x = 0` for `y` in `y_range`, by pseudo-arclength continuation.

    Starts at `y_range[0]` and follows the curve through folds both ways. Where the family can
    fold, the curve is followed beyond the range until it has left for good: heading away from
    the range past the family's `fold_region()` (or, for a family without one, with `x` no
    longer changing), or at the domain's edge; so the branches that lie in the range only
    between folds outside it are found too. A fold-free family's curve (`fold_region()` None:
    linear families, `kappa <= 0`) is a graph over `y` and ends where it leaves the range.
    Returns the points inside the range (x, y, stability, `branch_id`; with a point on each end
    of the range the curve crosses and on each fold in it), the `folds` in the range (refined
    by bisection on the tangent's `y` component) and `branches` (segments between folds, each
    stable or not). Assumes the solution set is one curve (true for `NonlinearBirthDeath`,
    whose manifold is the graph `y(m)` of its mean `m = c.x`). Steps `h`, `h_max` are
    arclengths in `(x, y / scale)`, `scale = max(1, family.y_scale())` (`1/|beta|` for the
    birth-death family, whose folds lie `~ kappa/|beta|` apart: at beta 0.002 steps of 0.05 in
    `y` ran into `max_points`); inside the range, steps in `y` stay at most those of scale 1.
    """
    y_lo, y_hi = check_y_range(family, y_range)
    n = family.n_states
    x = _start(family, np.array([y_lo]), n)
    u = np.append(x, y_lo)
    e_y = np.append(np.zeros(n), 1.0)
    # steps and distances in (x, y / scale): h and h_max in units of the curve's y scale
    scale = max(1.0, family.y_scale()) if hasattr(family, "y_scale") else 1.0
    t = _tangent(_jacobian(family, x, u[n:]), e_y, scale)
    if hasattr(family, "fold_points"):  # solved once: the region is derived from them
        points = family.fold_points()
        region, known = _region_of(points), [np.append(x, y) for x, y in points]
    else:
        region = family.fold_region() if hasattr(family, "fold_region") else "unknown"
        known = []
    trace = dict(y_range=(y_lo, y_hi), region=region, h=h, h_max=h_max, max_points=max_points,
                 known_folds=known, scale=scale)  # fmt: skip
    ahead = _trace(family, u, t, **trace)
    behind = _trace(family, u, -t, **trace) if region is not None else [(u, -t)]
    # one curve in one orientation: the backward part reversed, its tangents turned round
    P = np.array([p for p, _ in behind[:0:-1]] + [p for p, _ in ahead])
    T = np.array([-q for _, q in behind[:0:-1]] + [q for _, q in ahead])
    c = readout_vector(n)
    if region is not None and P[-1, :n] @ c < P[0, :n] @ c:  # from low mean to high
        P, T = P[::-1], -T[::-1]

    turns = np.flatnonzero(np.sign(T[1:, n]) != np.sign(T[:-1, n]))
    # the folds that may lie in the range are refined; the others only split the curve
    near = (np.maximum(P[turns, n], P[turns + 1, n]) >= y_lo - h_max * scale) & (
        np.minimum(P[turns, n], P[turns + 1, n]) <= y_hi + h_max * scale
    )
    folds = [_refine_fold(family, P[i], T[i], P[i + 1], n, scale=scale) if close else None
             for i, close in zip(turns, near)]  # fmt: skip
    if hasattr(family, "graph_x"):  # on the exact graph, as every point (_with_folds_and_...)
        for f in folds:
            if f is not None:
                f["x"] = family.graph_x(np.array([f["x"]]), np.array([f["y"]]))[0].tolist()
                f["mean"] = float(np.array(f["x"]) @ readout_vector(n))
    P, T, segment = _with_folds_and_range_ends(family, P, T, turns, folds, y_lo, y_hi, scale)
    # points and folds this near the range count as in it; a quarter of a narrower range at
    # most: at 1e-12 every branch across the range [0.1, 0.1 + 1e-13] spanned no more than
    # that, was taken for a fold touching the range (below), and none was found
    tol = min(1e-12 * (1.0 + max(abs(y_lo), abs(y_hi))), 0.25 * (y_hi - y_lo))
    inside = (P[:, n] >= y_lo - tol) & (P[:, n] <= y_hi + tol)
    in_range = [f is not None and y_lo - tol <= f["y"] <= y_hi + tol for f in folds]
    stab, stab_err = np.full(len(P), np.nan), np.full(len(P), np.nan)
    for i in np.flatnonzero(inside):
        stab[i], stab_err[i] = _fast_stability(family, P[i, :n], P[i, n:])
    branches, branch_of = [], {}
    for k in range(len(turns) + 1):
        sel = np.flatnonzero((segment == k) & inside)
        if sel.size == 0:
            continue
        # a branch runs to the folds that bound it (folds[k - 1] and folds[k]); at a fold one
        # eigenvalue is 0, so the points within 1e-9 of one in y do not decide its stability
        bounds = [folds[j] for j in (k - 1, k) if 0 <= j < len(folds) and folds[j] is not None]
        ends = [folds[j] for j in (k - 1, k) if 0 <= j < len(folds) and in_range[j]]
        interior = [i for i in sel if all(abs(P[i, n] - f["y"]) > 1e-9 * (1 + abs(f["y"]))
                                          for f in bounds)]  # fmt: skip
        off_fold = [i for i in sel if not any(np.array_equal(P[i, :n], f["x"]) for f in bounds)]
        judged = np.array(interior or off_fold or list(sel))
        ys = np.concatenate([P[sel, n], [f["y"] for f in ends]])
        means = np.concatenate([P[sel, :n] @ c, [f["mean"] for f in ends]])
        # a segment that meets the range only at a fold is that fold, not a branch; one that
        # spans no y between two folds in the range is a branch, just past the onset of folding
        # (the folds 2e-12 apart in y at kappa = 1.3333334, its means 0.4999 to 0.5001)
        if len(turns) and ys.max() - ys.min() <= tol and len(ends) < 2:
            continue
        branch_of[k] = len(branches)
        branches.append({
            "index": len(branches),
            "y_min": float(ys.min()),
            "y_max": float(ys.max()),
            "mean_min": float(means.min()),
            "mean_max": float(means.max()),
            **_branch_stability(stab[judged], stab_err[judged], at_fold=bool(ends)),
            "n_points": int(sel.size),
        })  # fmt: skip
        if hasattr(family, "graph_point") and branches[-1]["max_real_eigenvalue"] is not None \
                and not branches[-1]["max_at_fold"]:  # fmt: skip
            branches[-1]["max_real_eigenvalue"] = _branch_sup(
                family, P[judged], stab[judged], stab_err[judged], y_lo, y_hi
            )
    if not branches:  # the curve passes through its start at y_lo: no branch is a failure
        raise RuntimeError(f"the continuation found no branch of the critical manifold in the y "
                           f"range [{y_lo!r}, {y_hi!r}], though the curve starts in it; "
                           f"no gap or stability can be given.")  # fmt: skip
    inside &= np.isin(segment, list(branch_of))
    return {"x": P[inside, :n], "y": P[inside, n], "stability": stab[inside],
            "stability_error": stab_err[inside],
            "branch_id": np.array([branch_of[k] for k in segment[inside]], dtype=int),
            "folds": [f for f, keep in zip(folds, in_range) if keep], "branches": branches}  # fmt: skip


def _branch_sup(family, P, value, error, y_lo, y_hi) -> float:
    """The largest resolved Re lambda over a branch's points `P` (rows `(x, y)`, in the curve's
    order; `value +- error` there, `_fast_stability`) of a family with an exact graph,
    polished between them (`_sup_along_graph`): the repelling branch's sampled maximum was
    0.19721 at steps of 0.05, 0.19743 at 0.002."""
    n = P.shape[1] - 1

    def f(v):  # an unresolved value counts as none (a finite stand-in for the optimiser)
        x, y = family.graph_point(v)
        value, err = _fast_stability(family, x, np.array([y]))
        return (value if err < abs(value) else -1e308), y

    resolved = error < np.abs(value)
    values = np.where(resolved, value, -math.inf)
    return _sup_along_graph(family, family.graph_s(P[:, :n], P[:, n]), values, f, y_lo, y_hi)


def _branch_stability(value, error, at_fold) -> dict:
    """A branch's stability from the largest real parts `value +- error` (`_fast_stability`)
    at its points off its folds: `stable` False where one is resolved positive, else True where
    some are resolved (all negative), None where float64 resolves none; `unresolved_points`
    counts those within round-off of 0 (near the onset of folding, 1e-17 within 1e-10 of a
    fold). `max_real_eigenvalue` is the supremum over the branch: the largest resolved value,
    or 0 where the branch ends on a fold in the range (`max_at_fold`; there `D_x F` is
    singular on the tangent space, so one eigenvalue is 0: the sampled maximum of a stable
    branch only approached it, -0.0633 at steps of 0.05, -0.0064 at 0.002); None if nothing
    is resolved."""
    resolved = error < np.abs(value)
    top = [float(value[resolved].max())] if resolved.any() else []
    sup = max(top + [0.0]) if at_fold else (top[0] if top else None)
    if np.any(resolved & (value > 0)):
        stable = False
    else:
        stable = True if resolved.any() else None
    return {
        "stable": stable,
        "max_real_eigenvalue": sup,
        "max_at_fold": bool(at_fold and not (top and top[0] >= 0)),
        "unresolved_points": int(np.count_nonzero(~resolved)),
        "max_unresolved_error": float(error[~resolved].max()) if (~resolved).any() else None,
    }


def _trace(family, u, t, y_range, region, h, h_max, max_points, known_folds=(), scale=1.0) -> list:
    """`[(u, t), ...]` along the curve from `u` in the direction `t` until it has left `y_range`
    for good: at once for a fold-free family (`region` None); heading away from the range past
    the fold region `region = (lo, hi)`; heading away with the tangent's `x` part below 1e-10
    for a family whose region is "unknown"; or at the domain's edge. Near the `known_folds`
    (points of the curve), steps shrink to a quarter of their distance apart, so that a close
    pair (near the onset of folding) is not stepped over."""
    y_lo, y_hi = y_range
    sep = min((_norm(a - b, scale) for a in known_folds for b in known_folds
               if a is not b), default=math.inf)  # fmt: skip
    d_lo, d_hi = family.domain()
    n = u.size - 1
    out = [(u, t)]
    while True:
        if y_lo <= u[n] <= y_hi:  # in the range, steps in y as at scale 1: h_max, or up to
            # 1/2000 of the range (a no-op at scale 1; on a curve of large y scale, a range of
            # 2.5 in 2 points otherwise)
            h = min(h, max(h_max, (y_hi - y_lo) / 2000) / scale)
        if sep < math.inf:  # approach a close pair of folds in steps of half the way there
            d = min(_norm(u - f, scale) for f in known_folds)
            h = min(h, max(sep / 4, 0.5 * (d - sep), 1e-9))  # the first step too (a start
            # between the pair near the onset jumped over both to the other branch)
        pred = u + h * t
        ok = d_lo <= pred[n] <= d_hi  # beyond the domain's edge the rates are not finite
        if ok:
            u_new, ok = _correct(family, pred, t, scale=scale)
            # a corrector that moves further than the step has jumped to another part of the curve
            ok = ok and _norm(u_new - pred, scale) <= h
        if not ok:
            h *= 0.5
            ulp = float(np.spacing(abs(u[n])))  # steps below 1000 of them hardly move y
            if h < max(1e-10, 1e3 * ulp):
                if not d_lo <= u[n] + max(1e-6, 1e6 * ulp) * t[n] <= d_hi:
                    break  # at the domain's edge
                raise RuntimeError(f"continuation stalled near y={u[n]:.6g}")
            continue
        t = _tangent(_jacobian(family, u_new[:n], u_new[n:]), t, scale)
        u = u_new
        out.append((u, t))
        if t[n] > 0 and u[n] > y_hi or t[n] < 0 and u[n] < y_lo:  # outside, heading away
            if region is None:
                break
            if region == "unknown":
                if np.max(np.abs(t[:n])) < 1e-10:
                    break
            elif (u[n] > region[1]) if t[n] > 0 else (u[n] < region[0]):
                break  # no fold ahead: the curve never turns back
        if len(out) >= max_points:
            raise RuntimeError(
                f"the continuation took {plural(max_points, 'step')} without leaving y in "
                f"[{y_lo:g}, {y_hi:g}] for good (now at y={u[n]:.6g})"
            )
        # h_max near folds; elsewhere steps of up to 1/2000 of the range (a wide range of a
        # smooth branch in as many points as a narrow one)
        if isinstance(region, tuple):
            width = region[1] - region[0]
            pad = width + h_max * scale
            near_folds = region[0] - pad <= u[n] <= region[1] + pad
        else:
            near_folds = region == "unknown"
        h = min(h * 1.3, h_max if near_folds else max(h_max, (y_hi - y_lo) / scale / 2000))
    return out


def _with_folds_and_range_ends(family, P, T, turns, folds, y_lo, y_hi, scale=1.0):
    """`(P, T, segment)`: the curve with each refined fold put in as a point (the last of the
    segment before it) and a point exactly on each end of the range wherever the curve crosses
    one, found along the arc between two points (so on the same branch), not by Newton at fixed
    `y` (which near a fold may land on the other branch). On a family with an exact graph
    (`graph_x`) every point is then put on it: no negative probabilities."""
    n = P.shape[1] - 1
    seg = np.zeros(len(P), dtype=int)
    for k, i in enumerate(turns):
        seg[i + 1 :] = k + 1
    rows = []  # (u, t, segment, is a fold)
    fold_after = {int(i): f for i, f in zip(turns, folds) if f is not None}
    for i in range(len(P)):
        rows.append((P[i], T[i], seg[i], False))
        if i in fold_after:
            f = fold_after[i]
            u_f = np.append(f["x"], f["y"])
            t_f = _tangent(_jacobian(family, u_f[:n], u_f[n:]), T[i], scale)
            rows.append((u_f, t_f, seg[i], True))
    out = [rows[0]]
    for a, b in zip(rows[:-1], rows[1:]):
        k = b[2] if a[3] else a[2]  # an arc from a fold belongs to the segment after it
        ends = []
        for edge in (y_lo, y_hi):
            if np.sign(a[0][n] - edge) * np.sign(b[0][n] - edge) < 0:
                # from either end: near a fold, only the arc's parametrisation from the fold
                # meets the curve once
                end = _on_arc(family, a[0], a[1], b[0], edge, scale=scale)
                if end is None:
                    end = _on_arc(family, b[0], -b[1], a[0], edge, scale=scale)
                if end is not None:
                    ends.append((_norm(end - a[0], scale), end))
        for _, end in sorted(ends, key=lambda e: e[0]):
            out.append((end, _tangent(_jacobian(family, end[:n], end[n:]), a[1], scale), k, False))
        out.append(b)
    # a curve that stops inside the range (at the domain's edge) ends on the range's end
    for first in (False, True):
        u, t = (out[0][0], -out[0][1]) if first else (out[-1][0], out[-1][1])
        edge = y_hi if t[n] > 0 else y_lo
        if y_lo < u[n] < y_hi:
            end, ok = _at_y(family, u[:n], edge, scale)
            if ok and np.max(np.abs(end[:n] - u[:n])) <= 1e-6:
                row = (end, _tangent(_jacobian(family, end[:n], end[n:]), t, scale),
                       out[0][2] if first
                       else out[-1][2], False)  # fmt: skip
                out = [row] + out if first else out + [row]
    P = np.array([r[0] for r in out])
    if hasattr(family, "graph_x"):  # the folds are already on the graph: kept as they are
        moved = ~np.array([r[3] for r in out])
        P[moved, :n] = family.graph_x(P[moved, :n], P[moved, n])
    return P, np.array([r[1] for r in out]), np.array([r[2] for r in out])


def _on_arc(family, u_a, t_a, u_b, edge, iters=80, scale=1.0):
    """The point at `y = edge` on the arc from `u_a` (tangent `t_a`) to `u_b`: bisection on the
    arclength `s` of the corrected predictor `u_a + s t_a`, polished at exactly `y = edge`."""
    n = u_a.size - 1
    s_lo, s_hi = 0.0, _norm(u_b - u_a, scale)
    side = np.sign(u_a[n] - edge)
    u = u_a
    for _ in range(iters):
        s = 0.5 * (s_lo + s_hi)
        u_s, ok = _correct(family, u_a + s * t_a, t_a, scale=scale)
        if not ok:
            return None
        u = u_s
        if np.sign(u[n] - edge) == side:
            s_lo = s
        else:
            s_hi = s
        if s_hi - s_lo < 1e-14:
            break
    end, ok = _at_y(family, u[:n], edge, scale)
    if ok and np.max(np.abs(end[:n] - u[:n])) <= 1e-8:
        return end
    # within a hair of a fold Newton at fixed y is ill-conditioned: the arc's point will do
    return np.append(u[:n], edge) if abs(u[n] - edge) <= 1e-12 * (1.0 + abs(edge)) else None


def _at_y(family, x, y, scale=1.0):
    """`(u, converged)`: the corrector from `(x, y)` at fixed `y`, its `y` exactly `y` (Newton
    keeps it up to round-off of its solve: 8e-17 above the range's end put a point outside)."""
    n = x.size
    u, ok = _correct(family, np.append(x, y), np.append(np.zeros(n), 1.0), scale=scale)
    u[n] = y
    return u, ok


def _refine_fold(family, u_a, t_a, u_b, n, iters=60, scale=1.0):
    """Bisect the arc between `u_a` and `u_b` for the point where the tangent's `y` part is zero."""
    s_lo, s_hi = 0.0, _norm(u_b - u_a, scale)
    sign_a = np.sign(t_a[n])
    u_mid = u_a
    for _ in range(iters):
        s = 0.5 * (s_lo + s_hi)
        u_mid, ok = _correct(family, u_a + s * t_a, t_a, scale=scale)
        if not ok:  # the predictor strayed too far from the curve: look nearer u_a
            s_hi = s
            continue
        t_mid = _tangent(_jacobian(family, u_mid[:n], u_mid[n:]), t_a, scale)
        if np.sign(t_mid[n]) == sign_a:
            s_lo = s
        else:
            s_hi = s
        if s_hi - s_lo < 1e-13:
            break
    x = u_mid[:n]
    return {"y": float(u_mid[n]), "mean": float(x @ readout_vector(n)), "x": x.tolist()}


def _linear_reference(family, curve):
    """`p_st(Q(x_ref, y))` at the curve's points, `x_ref` uniform; as `h0`, transient states
    get no mass (where a rate is 0: michaelis-menten at y = 0, where nothing binds)."""
    x_ref = np.full((len(curve["y"]), family.n_states), 1.0 / family.n_states)
    return stationary_distribution(family.rates(x_ref, curve["y"][:, None]), allow_transient=True)


def identity_gap(family, curve) -> float:
    """`sup |phi(y) - p_st(Q(x_ref, y))|` over the curve (max over the states), `x_ref` uniform:
    zero when linear. On a family with an exact graph (`graph_s`, `graph_point`) the sampled
    maximum only brackets it (0.6187 for 0.61995 at kappa 3): each sampled local maximum within
    the largest jump between neighbouring points of the top is polished by a bounded scalar
    optimiser over the graph's parameter `s` between its neighbours, on the arcs that lie in the
    range. Otherwise it is the maximum over the sampled points (`identity_gap_kind`)."""
    if not len(curve["y"]):  # no point is no gap: 0.0 here read as the linear identity
        raise RuntimeError("the critical manifold's curve holds no point, so it has no gap to "
                           "the linear identity; expected the branches of a y range.")
    d = np.max(np.abs(curve["x"] - _linear_reference(family, curve)), axis=1)
    if identity_gap_kind(family) != "sup":
        return float(d.max())
    s = family.graph_s(curve["x"], curve["y"])
    y_lo, y_hi = float(curve["y"].min()), float(curve["y"].max())
    x_ref = np.full((1, family.n_states), 1.0 / family.n_states)

    def gap_at(v):
        x, y = family.graph_point(v)
        p = stationary_distribution(family.rates(x_ref, np.array([[y]])), allow_transient=True)
        return float(np.max(np.abs(x - p[0]))), y

    return _sup_along_graph(family, s, d, gap_at, y_lo, y_hi)


WIDE_PEAKS_POLISHED = 8  # _sup_along_graph: peaks polished under the wide rule, at most


def _sup_along_graph(family, s, values, f, y_lo, y_hi) -> float:
    """The supremum of a function along the exact graph from its samples `values` at the
    graph's parameters `s` (in the curve's order): each sampled local maximum within its own
    larger jump to a neighbour of the top is polished by a bounded scalar optimiser over `s`
    towards each neighbour, on arcs in `[y_lo, y_hi]`; `f(s) -> (value, y)`.

    The jump is the peak's own (a peak locally quadratic between the samples rises above the
    sampled one by at most a quarter of it), or the largest finite one anywhere where both of
    its are not finite; the `WIDE_PEAKS_POLISHED` highest local maxima within the largest jump
    anywhere are polished too (a narrow peak can hide between low samples). With the largest
    anywhere for every peak, a wide range let in every round-off wiggle: Re lambda of the
    linear chain spans -1e54 to -0.15 over y in [-32, 32.5], and 299 of its local maxima were
    polished (15,000 eigenvalue solves, 100 s; 1 at [-4, 4.5])."""
    from scipy.optimize import minimize_scalar

    best = float(np.max(values))
    if len(values) < 2:
        return best
    last = len(values) - 1
    with np.errstate(invalid="ignore"):  # -inf - -inf: unresolved neighbours, not finite
        jumps = np.abs(np.diff(values))
    finite = np.isfinite(jumps)
    margin = float(np.max(jumps[finite], initial=0.0))
    v = values

    def own_jump(i):
        near = [jumps[j] for j in (i - 1, i) if 0 <= j < last and finite[j]]
        return max(near) if near else margin

    local = [i for i in range(len(v)) if v[i] >= v[max(i - 1, 0)] and v[i] >= v[min(i + 1, last)]]
    peaks = {i for i in local if v[i] >= best - own_jump(i)}
    # and the highest few within the largest jump anywhere (the rule before the own jump), so
    # that a narrow peak whose samples sit low on its flanks is still polished, at a bounded cost
    wide = sorted((i for i in local if v[i] >= best - margin), key=lambda i: -v[i])
    peaks.update(wide[:WIDE_PEAKS_POLISHED])
    for i in sorted(peaks):
        for j in (i - 1, i + 1):
            if not 0 <= j <= last or s[j] == s[i]:
                continue
            a, b = sorted((s[i], s[j]))
            if not y_lo <= f(0.5 * (a + b))[1] <= y_hi:
                continue  # an arc outside the range between two of its ends' points
            res = minimize_scalar(lambda v: -f(v)[0], bounds=(a, b), method="bounded",
                                  options={"xatol": 1e-12 * max(1.0, abs(a), abs(b))})  # fmt: skip
            value, y = f(res.x)
            if y_lo <= y <= y_hi:
                best = max(best, value)
    return best


def identity_gap_kind(family) -> str:
    """`"sup"` where `identity_gap` is the supremum over the curve (a family with an exact graph),
    "sampled max" where it is the maximum over the continuation's points."""
    return "sup" if hasattr(family, "graph_point") else "sampled max"


# the smallest eps of the relaxation oscillation that the CLI and the sweeps accept. At 1e-10
# (the floor before) `manifold` at kappa 3 broke its own mass budget: 1^T x drifted by 2.4e-7,
# over its budget 1.1e-7 (201,741 evaluations of f), and it took 46 s of CPU (121 s on a busy
# 2-core machine). At 1e-9 it stays within the budget in 25 s of CPU (1e-8: 22 s, 1e-6: 19 s,
# the default 0.01: 8 s; the same machine). Earlier, unloaded: 7 s at 1e-10, 3 s at 1e-9, then
# about tenfold per decade below (60 s at 1e-11). Nearer the onset of folding it grows sooner:
# at 1e-10, 26 s at kappa 2 and over a minute at kappa 1.5 (helper-22), not refused
OSC_EPS_MIN = 1e-9


def relaxation_oscillation(kappa=3.0, eps=0.01, t_end=20.0, n_eval=4001, family=None):
    """The full system with slow law `g = 1/2 - c.x`, which pushes `y` across both folds.

    Returns the trajectory dataset; with folds, `y` oscillates between the fold values and `x`
    jumps between the outer branches.
    """
    system = _oscillation_system(family or NonlinearBirthDeath(kappa=kappa), eps)
    return _oscillation_run(system, (0.0, t_end), n_eval=n_eval)


# |dy/dt| = |1/2 - c.x| <= 1/2 on the simplex (c in [0, 1]): y moves at most this fast
OSC_SPEED_MAX = 0.5


def _oscillation_system(family, eps):
    """The system of `relaxation_oscillation`: `g = 1/2 - c.x`, from all mass on state 0, y = 0."""
    n = family.n_states
    c = readout_vector(n)
    system = NonlinearMasterEquationSystem(
        family, LinearSlowLaw(-c, a=0.0, b=0.5), eps, x0=np.eye(n)[0], y0=np.array([0.0])
    )
    system.parameters["slow_law_note"] = "g = 1/2 - c.x"
    return system


def _oscillation_run(system, t_span, x0=None, y0=None, warn=True, drifts=None, **kw):
    """`integrate` as the oscillation runs: integrate's automatic choice (LSODA here), the
    same oscillation as Radau to 6 digits at eps 0.01 and 0.001 in a fifth of the time, and at
    eps 1e-9 in 3 s where Radau took > 5 min. `warn`: integrate's; the run's
    `MassDriftWarning` sentence, if any, is appended to the list `drifts` (when given)."""
    from .integrators import integrate

    run = integrate(system, t_span, x0, y0, method="auto", rtol=1e-8, atol=1e-10, warn=warn, **kw)
    if drifts is not None and "mass_drift_warning" in run.attrs:
        drifts.append(run.attrs["mass_drift_warning"])
    return run


def _turning_point(system, t, x, y, i, sign, tol=1e-9, points=101, **run_kw):
    """`(t*, y*)`: the extremum of `y` (`sign` +1 a maximum, -1 a minimum) next to the saved
    point `i`, a local extremum of the saved `y`. The saved points can miss it by up to
    `OSC_SPEED_MAX` times their spacing (a maximum at the fold 0.227106 was saved as 0.2270 at
    eps 1e-6: y turns in the jump, a time of order eps). So the run is repeated from the saved
    state before it over `[t[i-1], t[i+1]]` on `points` times, and again around the largest of
    those, until the spacing `h` bounds the miss, `OSC_SPEED_MAX h / 2`, by `tol`."""
    a, b = t[i - 1], t[i + 1]
    xa, ya = x[i - 1], y[i - 1]
    best = (t[i], y[i])
    while True:
        grid = np.linspace(a, b, points)
        xa = np.clip(xa, 0.0, None)  # the saved state is a probability vector to the solver's
        xa = xa / xa.sum()  # atol (1e-10); integrate takes one to 1e-12
        run = _oscillation_run(system, (a, b), xa, np.array([ya]), t_eval=grid, **run_kw)
        if run.attrs["status"] != "success":
            return best  # the saved point: the run that saved it succeeded
        yv = run["y"].values[:, 0]
        j = int(np.argmax(sign * yv))
        if sign * yv[j] >= sign * best[1]:
            best = (float(grid[j]), float(yv[j]))
        if OSC_SPEED_MAX * (grid[1] - grid[0]) / 2 <= tol or j in (0, points - 1):
            return best
        a, b = grid[j - 1], grid[j + 1]
        xa, ya = run["x"].values[j - 1], yv[j - 1]


def oscillation_summary(system, osc, t_end, **run_kw):
    """The range of `y` of the oscillation run `osc` (`relaxation_oscillation`) over its last
    full cycle (between the last two maxima of `y` in the second half of the run) or, without
    one, over the second half, named so; each turning point of `y` located to 1e-9
    (`_turning_point`), not taken from the saved points. A dict of the `osc_*` attributes of
    `manifold_dataset`, less `osc_eps`. `run_kw`: `_oscillation_run`'s `warn` and `drifts`."""
    t = osc["time"].values
    x = osc["x"].values
    yv = osc["y"].values[:, 0]
    up = np.flatnonzero(np.diff(np.sign(np.diff(yv))) < 0) + 1  # local maxima of y
    up = up[t[up] >= 0.5 * t_end]
    period = float(np.median(np.diff(t[up]))) if up.size >= 2 else float("nan")
    # y's range over the last full cycle (between the last two maxima); without one, over
    # the second half of the run, and named so (kappa 30: [-6.36, -2.79] on the upper
    # branch's way down was printed as the oscillation's range, which is [-6.36, -0.11])
    cycle = up.size >= 2
    sel = np.flatnonzero((t >= t[up[-2]]) & (t <= t[up[-1]]) if cycle else t >= 0.5 * t_end)
    ends = []
    for sign in (-1, 1):
        k = sel[np.argmax(sign * yv[sel])]
        if cycle and sign > 0:  # both ends of the cycle are maxima
            turns = [_turning_point(system, t, x, yv, j, 1, **run_kw) for j in (up[-2], up[-1])]
            window = (turns[0][0], turns[1][0])
            ends.append(max(v for _, v in turns))
        elif sel[0] < k < sel[-1]:  # a turning point inside the window
            ends.append(_turning_point(system, t, x, yv, k, sign, **run_kw)[1])
        else:  # on the window's end: y there as saved
            ends.append(float(yv[k]))
    out = {
        "status": osc.attrs["status"],
        "y_min": ends[0],
        "y_max": ends[1],
        "y_window": [float(v) for v in (window if cycle else (0.5 * t_end, t_end))],
        "y_window_kind": "last cycle" if cycle else "second half, not a full cycle",
        "period": period,
    }
    if not math.isfinite(period):
        out["period_note"] = (
            f"fewer than two maxima of y in the second half of the run "
            f"(t in [{0.5 * t_end:g}, {t_end:g}])"
        )
    return out


def family_for(system_name: str, kappa: float):
    """The non-linear family of a named system: `birth-death` has one for every `kappa`; the
    other systems are linear (`kappa` must be 0)."""
    from .systems import SYSTEMS, make_system

    if not math.isfinite(kappa):
        raise InputError(f"kappa must be a finite number; got kappa={kappa}.")
    if system_name not in SYSTEMS:
        raise InputError(f"unknown system {system_name!r}; expected one of {sorted(SYSTEMS)}.")
    if system_name == "birth-death":
        return NonlinearBirthDeath(kappa=kappa)
    if kappa != 0:
        raise InputError(
            f"system {system_name!r} has no non-linear family; expected kappa = 0 (only "
            f"'birth-death' takes kappa != 0)."
        )
    return LinearFamily(make_system(system_name, eps=1.0).generator)


MANIFOLD_KAPPA = 3.0  # birth-death's default: the manifold folds (onset at kappa = 4/3)
MANIFOLD_Y_RANGE = (-1.0, 1.5)  # holds both folds at kappa = 3


def default_kappa(system_name: str) -> float:
    """The kappa of `fastslow-sim manifold` and `sweep manifold` where none is given: 3 for
    birth-death (it folds), 0 for the others (linear: the only value they take)."""
    return MANIFOLD_KAPPA if system_name == "birth-death" else 0.0


def default_y_range(family) -> tuple[float, float]:
    """The y range of `fastslow-sim manifold` and `sweep manifold` where none is given:
    `MANIFOLD_Y_RANGE` cut to the family's domain (michaelis-menten: y >= 0)."""
    lo, hi = family.domain()
    return max(MANIFOLD_Y_RANGE[0], lo), min(MANIFOLD_Y_RANGE[1], hi)


def manifold_dataset(family, y_range, osc_eps: float | None = 0.01, osc_t_end: float = 20.0,
                     warn: bool = True):  # fmt: skip
    """Branches, folds and gap of the critical manifold as a dataset; with folds and `osc_eps`,
    also the relaxation oscillation of the full system with `g = 1/2 - c.x`.
    `attrs["mass_drift_warning"]` (present only where one warned): the `MassDriftWarning` of
    the oscillation's runs; `warn=False` issues none (`integrate`'s `warn`)."""
    import json
    import time

    import xarray as xr

    from ._version import __version__

    start = time.perf_counter()
    curve = critical_branches(family, y_range)
    gap = identity_gap(family, curve)
    n = family.n_states
    c = readout_vector(n)
    p_lin = _linear_reference(family, curve)
    data = {
        "curve_x": (("point", "state"), curve["x"], {"long_name": "critical manifold point x"}),
        "curve_y": ("point", curve["y"], {"long_name": "slow variable y"}),
        "curve_mean": ("point", curve["x"] @ c, {"long_name": "mean state c.x"}),
        "curve_stability": ("point", curve["stability"],
                            {"long_name": "largest Re eigenvalue of D_x F on the simplex"}),
        "curve_stability_error": ("point", curve["stability_error"],
                                  {"long_name": "round-off estimate of curve_stability"}),
        "branch_id": ("point", curve["branch_id"], {"long_name": "segment between folds"}),
        "linear_mean": ("point", p_lin @ c, {"long_name": "c.p_st(Q(x_ref, y)), x_ref uniform"}),
    }  # fmt: skip
    attrs = {
        "title": f"critical manifold of the {family.name} family, kappa = {family.kappa:g}",
        "kappa": float(family.kappa),
        "y_range": list(map(float, y_range)),
        "gap": gap,
        "gap_kind": identity_gap_kind(family),
        "folds": json.dumps([{k: f[k] for k in ("y", "mean")} for f in curve["folds"]]),
        "branches": json.dumps(curve["branches"]),
        "family_params": json.dumps(family.params(), default=float),
        "fastslow_sim_version": __version__,
    }
    if osc_eps is not None and curve["folds"]:
        system = _oscillation_system(family, osc_eps)
        drifts = []
        osc = _oscillation_run(system, (0.0, osc_t_end), n_eval=4001, warn=warn, drifts=drifts)
        yv = osc["y"].values[:, 0]
        data["osc_y"] = ("osc_time", yv, {"long_name": "y(t) of the full system"})
        data["osc_mean"] = ("osc_time", osc["x"].values @ c, {"long_name": "c.x(t)"})
        summary = oscillation_summary(system, osc, osc_t_end, warn=warn, drifts=drifts)
        attrs["osc_eps"] = float(osc_eps)
        attrs.update({f"osc_{k}": v for k, v in summary.items()})
        if drifts:
            n_warned = len(drifts)
            attrs["mass_drift_warning"] = (drifts[0] if n_warned == 1 else f"{n_warned} runs of the "
                                           f"oscillation warned; the first: {drifts[0]}")  # fmt: skip
        coords = {"osc_time": osc["time"].values}
    else:
        coords = {}
    attrs["wall_time_s"] = time.perf_counter() - start
    return xr.Dataset(data, coords={"point": np.arange(len(curve["y"])), "state": np.arange(n), **coords},
                      attrs=attrs)  # fmt: skip
