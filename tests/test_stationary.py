import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.generators import from_off_diagonal, readout_vector
from fastslow_sim.stationary import STATIONARY_METHODS, closed_classes
from fastslow_sim.systems import LinearSlowLaw, MasterEquationSystem

CLOSED = [fs.TwoState(beta=1.7), fs.BirthDeath(n=12, beta=3.0), fs.MichaelisMenten(N=6, k1=2.0)]


@pytest.mark.parametrize("gen", CLOSED, ids=lambda g: g.name)
@pytest.mark.parametrize("method", STATIONARY_METHODS)
def test_closed_form_stationary_distributions(gen, method):
    y = np.linspace(0.05, 2.0, 25)
    p = fs.stationary_distribution(gen.rates(y), method)
    np.testing.assert_allclose(p, gen.closed_form(y), rtol=1e-10, atol=1e-14)
    # Q^T p = 0 and normalised
    np.testing.assert_allclose(np.einsum("...ji,...j->...i", gen.rates(y), p), 0, atol=1e-12)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)


def test_methods_agree_on_random_chains():
    Q = fs.random_generators(500, 16, seed=0)
    p = {m: fs.stationary_distribution(Q, m) for m in STATIONARY_METHODS}
    np.testing.assert_allclose(p["lu"], p["gth"], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(p["svd"], p["gth"], rtol=1e-9, atol=1e-13)
    assert np.all(p["gth"] > 0)


def test_batch_dimensions_are_kept():
    Q = fs.random_generators(12, 5, seed=2).reshape(3, 4, 5, 5)
    p = fs.stationary_distribution(Q)
    assert p.shape == (3, 4, 5)
    np.testing.assert_allclose(p.reshape(12, 5), fs.stationary_distribution(Q.reshape(12, 5, 5)))


def test_gth_keeps_relative_accuracy_on_nearly_decomposable_chain():
    # DESIGN 3.1: 40 states, ratio 0.1, entries from 1 to 1e-39
    gen = fs.BirthDeath(n=40, up=0.1, down=1.0, beta=0.0)
    exact = gen.closed_form(0.0)
    assert exact[-1] / exact[0] < 1e-38
    rel = {
        m: np.max(np.abs(fs.stationary_distribution(gen.rates(0.0), m) - exact) / exact)
        for m in STATIONARY_METHODS
    }
    assert rel["gth"] <= 1e-12
    # the subtracting methods lose all relative accuracy in the tail (this is why GTH is default)
    assert rel["lu"] > 1.0 and rel["svd"] > 1.0


def test_input_is_not_modified():
    Q = fs.BirthDeath(n=6).rates(0.3)
    before = Q.copy()
    for m in STATIONARY_METHODS:
        fs.stationary_distribution(Q, m)
    np.testing.assert_array_equal(Q, before)


def test_reducible_chain_names_closed_classes():
    off = np.zeros((5, 5))
    off[0, 1] = off[1, 0] = 1.0  # closed class {0, 1}
    off[2, 3] = off[3, 2] = 2.0  # closed class {2, 3}
    off[4, 0] = 1.0  # 4 is transient
    Q = from_off_diagonal(off)
    for method in STATIONARY_METHODS:
        with pytest.raises(
            fs.ReducibleGeneratorError, match=r"closed classes \[\[0, 1\], \[2, 3\]\]"
        ) as info:
            fs.stationary_distribution(Q, method)
        assert info.value.closed_classes == [[0, 1], [2, 3]]
    assert closed_classes(Q) == ([[0, 1], [2, 3]], [4])


def test_unichain_with_transient_state_needs_opt_in():
    off = np.zeros((3, 3))
    off[0, 1] = off[1, 0] = 1.0
    off[2, 0] = 1.0
    Q = from_off_diagonal(off)
    with pytest.raises(fs.ReducibleGeneratorError, match="transient"):
        fs.stationary_distribution(Q)
    np.testing.assert_allclose(fs.stationary_distribution(Q, allow_transient=True), [0.5, 0.5, 0.0])


def test_batch_error_names_the_batch_index():
    Q = fs.random_generators(4, 3, seed=0)
    Q[2] = from_off_diagonal(np.array([[0, 1.0, 0], [1.0, 0, 0], [0, 0, 0]]))
    with pytest.raises(fs.ReducibleGeneratorError, match=r"batch index \(2,\)"):
        fs.stationary_distribution(Q)


def test_unknown_method():
    with pytest.raises(fs.InputError, match="expected one of"):
        fs.stationary_distribution(fs.TwoState().rates(0.0), "qr")


@pytest.mark.parametrize(
    "gen",
    [
        fs.TwoState(),
        fs.BirthDeath(),
        fs.Cycle(),
        fs.RandomIrreducible(seed=1),
        fs.MichaelisMenten(),
    ],
    ids=lambda g: g.name,
)
def test_dp_dy_identity_against_finite_differences(gen):
    y = np.array([[0.2], [0.6], [1.1]])
    dp = fs.stationary_derivative(gen.rates(y), gen.rates_dy(y))
    assert dp.shape == (3, gen.n_states, 1)
    h = 1e-5
    fd = (
        fs.stationary_distribution(gen.rates(y + h)) - fs.stationary_distribution(gen.rates(y - h))
    ) / (2 * h)
    # central differences: error O(h^2 p''') ~ 1e-10 relative to O(1) derivatives
    np.testing.assert_allclose(dp[..., 0], fd, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(dp.sum(-2), 0.0, atol=1e-12)  # probability stays normalised


def test_dp_dy_with_transient_states_is_the_closed_form_slope():
    # Michaelis-Menten at y = 0: state 0 is the only closed class, the rest transient; p_st is
    # binomial(N, f) with f = y / (y + K_M), so dp/dy at 0 is -N/K_M on state 0, +N/K_M on
    # state 1 and 0 elsewhere (d f^k/dy = 0 at f = 0 for k >= 2)
    system = fs.make_system("michaelis-menten", eps=0.1)
    gen = system.generator
    y = np.array([0.0])
    slope = gen.N / gen.K_M
    expected = np.zeros(gen.n_states)
    expected[:2] = -slope, slope
    np.testing.assert_allclose(system.critical_manifold_dy(y)[:, 0], expected, atol=1e-13)
    np.testing.assert_allclose(fs.stationary_derivative(gen.rates(y), gen.rates_dy(y))[:, 0],
                               expected, atol=1e-13)  # fmt: skip
    # the first-order correction is finite there and keeps the total mass
    from fastslow_sim import manifold

    corr = manifold.h1(system, y)
    assert np.all(np.isfinite(corr)) and abs(corr.sum()) < 1e-12
    # two closed classes: no unique p_st, so no derivative either
    q = np.zeros((3, 3))
    q[1, 0] = q[1, 2] = 1.0
    q[1, 1] = -2.0
    with pytest.raises(fs.ReducibleGeneratorError, match="closed class"):
        fs.stationary_derivative(q, np.zeros((1, 3, 3)))


Q32 = np.array([[-1.1, 0.1, 1.0], [0.3, -0.7, 0.4], [0.2, 0.7, -0.9]], dtype=np.float32)
TS_Q = fs.TwoState().rates(np.array([0.3]))  # (2, 2); its rates_dy is (1, 2, 2)


@pytest.mark.parametrize("method", STATIONARY_METHODS)
def test_float32_generator_is_validated_at_its_own_tolerance(method):
    """A float32 generator was cast to float64 before validation, so its rows' float32 round-off
    (-2.2e-8 here) failed float64's tolerance, although validate_generator and the torch path
    accept it. It is validated at max(1e-10, 100 eps(float32)) and solved in float64."""
    row_sums = Q32.sum(-1, dtype=np.float64)
    assert np.abs(row_sums).max() > 1e-10  # the round-off that float64's tolerance refused
    fs.validate_generator(Q32)
    p = fs.stationary_distribution(Q32, method)
    assert p.dtype == np.float64
    q64 = Q32.astype(np.float64)
    np.fill_diagonal(q64, 0.0)
    np.fill_diagonal(q64, -q64.sum(-1))  # the same rates, diagonal rebuilt in float64
    np.testing.assert_allclose(p, fs.stationary_distribution(q64, method), rtol=1e-13)
    np.testing.assert_allclose(p, fs.stationary_distribution(torch.tensor(Q32)).numpy(), rtol=1e-5)
    bad = Q32.copy()
    bad[0, 0] = -1.0  # a row sum of 0.1 is still refused
    with pytest.raises(fs.InputError, match="rows must sum to zero"):
        fs.stationary_distribution(bad, method)
    # the derivative solves for p the same way
    dQ = np.ones((1, 3, 3)) - 3 * np.eye(3)
    np.testing.assert_allclose(fs.stationary_derivative(Q32, dQ),
                               fs.stationary_derivative(q64, dQ), rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((TS_Q, np.zeros((2, 2))),
         r"dQ must have shape \(\.\.\., m, 2, 2\) for Q of shape \(2, 2\).*got shape \(2, 2\)"),
        ((TS_Q, np.zeros((1, 3, 3))), r"dQ must have shape .*got shape \(1, 3, 3\)"),
        ((np.zeros((3, 2, 2)), np.zeros((2, 1, 2, 2))), "must share their leading dimensions"),
        ((TS_Q, np.zeros((1, 2, 2)), [1.0, 0.0, 0.0]), r"p must have shape \(\.\.\., 2\)"),
        ((np.zeros(3), np.zeros((1, 3, 3))), "square"),
    ],
    ids=["dQ-without-m", "dQ-size", "batch", "p-size", "Q-not-square"],
)
def test_stationary_derivative_refuses_shapes_in_one_sentence(args, fragment):
    """dQ without its m axis (and the other mismatches) failed deep in einsum or solve."""
    with pytest.raises(fs.InputError, match=fragment) as err:
        fs.stationary_derivative(*args)
    assert len(str(err.value).splitlines()) == 1


def test_stationary_derivative_broadcasts_one_Q_over_a_batch_of_dQ():
    # the shape check of bc2101e had refused this (dQ with more leading dimensions than Q)
    Q = fs.random_generators(3, 4, seed=1)
    dQ = Q[:, None]  # (3, m = 1, 4, 4)
    batched = fs.stationary_derivative(Q[0], dQ)
    assert batched.shape == (3, 4, 1)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], fs.stationary_derivative(Q[0], dQ[i]))


@pytest.mark.parametrize("method", STATIONARY_METHODS)
def test_torch_autograd_matches_finite_differences(method):
    Q = torch.tensor(fs.random_generators(2, 5, seed=4), requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q: fs.stationary_distribution(q, method, check=False), (Q,)
    )


def test_torch_chain_rule_through_a_parametrised_generator():
    gen = fs.BirthDeath(n=6, beta=2.0)
    y = 0.37
    a = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    # Q(y) with up rate a*exp(beta (y - 1/2)), built in torch
    up = a * np.exp(gen.beta * (y - 0.5))
    off = torch.zeros(6, 6, dtype=torch.float64)
    idx = torch.arange(5)
    off = off.index_put((idx, idx + 1), up.expand(5)).index_put(
        (idx + 1, idx), torch.ones(5, dtype=torch.float64)
    )
    Q = off - torch.diag_embed(off.sum(-1))
    p = fs.stationary_distribution(Q)
    loss = (p * torch.arange(6.0, dtype=torch.float64)).sum()
    (grad,) = torch.autograd.grad(loss, a)

    def mean_state(av):
        g = fs.BirthDeath(n=6, up=av, beta=2.0)
        return float(fs.stationary_distribution(g.rates(y)) @ np.arange(6.0))

    h = 1e-6
    fd = (mean_state(0.8 + h) - mean_state(0.8 - h)) / (2 * h)
    assert abs(grad.item() - fd) <= 1e-7 * max(1.0, abs(fd))


def test_torch_input_returns_torch_of_same_dtype():
    Q = torch.tensor(fs.BirthDeath().rates([0.1, 0.9]))
    p = fs.stationary_distribution(Q)
    assert isinstance(p, torch.Tensor) and p.dtype == torch.float64
    np.testing.assert_allclose(p.numpy(), fs.BirthDeath().closed_form([0.1, 0.9]), rtol=1e-12)
    p32 = fs.stationary_distribution(Q.float())
    assert p32.dtype == torch.float32


@pytest.mark.parametrize("method", STATIONARY_METHODS)
def test_unichain_whose_first_state_is_transient(method):
    # 0 -> 1 <-> 2: state 0 is transient, and GTH meets a zero pivot on the way
    off = np.zeros((3, 3))
    off[0, 1] = 2.0
    off[1, 2] = 1.0
    off[2, 1] = 3.0
    p = fs.stationary_distribution(from_off_diagonal(off), method, allow_transient=True)
    np.testing.assert_allclose(p, [0.0, 0.75, 0.25], atol=1e-15)


@pytest.mark.parametrize("method", STATIONARY_METHODS)
def test_every_method_validates(method):
    bad = fs.BirthDeath(n=4).rates(0.2)
    bad[1, 2] = -0.5
    bad[1, 1] += 0.5 + 1.0  # keep the row sum at zero; only the sign is wrong
    with pytest.raises(fs.InputError, match=r"non-negative off-diagonal rates; entry \(1, 2\)"):
        fs.stationary_distribution(bad, method)
    with pytest.raises(fs.InputError, match="sum to zero"):
        fs.stationary_distribution(np.array([[-1.0, 1.0], [2.0, -1.0]]), method)
    with pytest.raises(fs.InputError, match="square"):
        fs.stationary_distribution(np.ones((2, 3)), method)


# --- issue 13: mass far from state 0 (no overflow in the back-substitution) ---------------------


def _exact_gth(off):
    """GTH in exact rational arithmetic (`Fraction`s of the float rates): the reference."""
    n = len(off)
    a = [
        [Fraction(float(off[i][j])) if i != j else Fraction(0) for j in range(n)] for i in range(n)
    ]
    for k in range(n - 1, 0, -1):
        s = sum(a[k][:k])
        for i in range(k):
            a[i][k] /= s
        for i in range(k):
            for j in range(k):
                a[i][j] += a[i][k] * a[k][j]
    p = [Fraction(1)] + [Fraction(0)] * (n - 1)
    for k in range(1, n):
        p[k] = sum(p[i] * a[i][k] for i in range(k))
    total = sum(p)
    return np.array([float(v / total) for v in p])  # correctly rounded (0 below the range)


def _assert_relative(p, exact, rtol=1e-12):
    """Relative error <= rtol on every entry in the normal range (with a margin), and entries
    that the float range cannot hold (exact < 1e-290) at most 1e-290 in absolute terms."""
    p = np.asarray(p)
    assert np.all(np.isfinite(p)) and np.all(p >= 0)
    assert abs(p.sum() - 1.0) <= 1e-14 * p.size
    normal = exact > 1e-290
    rel = np.abs(p[normal] - exact[normal]) / exact[normal]
    assert rel.max() <= rtol, rel.max()
    assert np.all(np.abs(p[~normal] - exact[~normal]) <= 1e-290)


def _birth_death_exact(r, n):
    """`p_i = r^i / sum_j r^j` in exact arithmetic for the float ratio `r`."""
    w = [Fraction(float(r)) ** i for i in range(n)]
    total = sum(w)
    return np.array([float(v / total) for v in w])


@pytest.mark.parametrize("y", [26.0, 27.5, 30.0])
def test_default_birth_death_far_from_state_0(y):
    # issue 13: gave [0, ..., 0, nan] (p_7 / p_0 = exp(4 (y - 1/2))^7 > 1e308)
    gen = fs.make_system("birth-death", eps=0.1).generator
    r = gen.up_rate(y)[()] / gen.down
    exact = _birth_death_exact(r, gen.n_states)
    assert exact[0] < 1e-300  # the mass really is beyond 1e308 from state 0
    _assert_relative(fs.stationary_distribution(gen.rates(y)), exact)
    _assert_relative(fs.stationary_distribution(torch.tensor(gen.rates(y))).numpy(), exact)


def test_260_state_chain_with_ratio_20():
    # issue 13: all NaN (20^259 ~ 1e337)
    gen = fs.BirthDeath(n=260, up=20.0, down=1.0, beta=0.0)
    exact = _birth_death_exact(20.0, 260)
    _assert_relative(fs.stationary_distribution(gen.rates(0.0)), exact)
    # batched, numpy and torch, with the chain's mirror image (the mass at state 0) beside it
    mirror = gen.rates(0.0)[::-1, ::-1]
    Q = np.stack([gen.rates(0.0), mirror])
    for p in (fs.stationary_distribution(Q), fs.stationary_distribution(torch.tensor(Q)).numpy()):
        _assert_relative(p[0], exact)
        _assert_relative(p[1], exact[::-1])


def test_three_state_chain_with_a_rate_1e_200():
    # issue 13: [0, 0, nan]; exact p = (1e-400, 1e-200, 1) / sum
    off = np.zeros((3, 3))
    off[0, 1] = off[1, 2] = 1.0
    off[1, 0] = off[2, 1] = 1e-200
    exact = _exact_gth(off)
    assert exact[1] == pytest.approx(1e-200, rel=1e-15) and exact[0] == 0.0
    _assert_relative(fs.stationary_distribution(from_off_diagonal(off)), exact)


@pytest.mark.parametrize("n", [3, 6, 11])
def test_non_reversible_cycle_with_far_mass(n):
    # a pure cycle 0 -> 1 -> ... -> n-1 -> 0 with rates r_i: flux balance p_i r_i = const, so
    # p_i = (1/r_i) / sum_j (1/r_j) exactly; rates from 1 down to 1e-300 put the mass at n-1
    r = 10.0 ** -np.linspace(0, 300, n)
    off = np.zeros((n, n))
    off[np.arange(n), (np.arange(n) + 1) % n] = r
    exact = np.array([float(v) for v in _exact_gth(off)])
    inv = [1 / Fraction(float(v)) for v in r]
    assert np.array_equal(exact, [float(v / sum(inv)) for v in inv])
    _assert_relative(fs.stationary_distribution(from_off_diagonal(off)), exact)
    # the same chain with its states permuted: the mass sits in the middle
    perm = np.random.default_rng(n).permutation(n)
    offp = off[np.ix_(perm, perm)]
    _assert_relative(fs.stationary_distribution(from_off_diagonal(offp)), exact[perm])
    _assert_relative(
        fs.stationary_distribution(torch.tensor(from_off_diagonal(offp))).numpy(), exact[perm]
    )


def test_gradient_with_the_mass_far_from_state_0():
    # p_i proportional to (a r)^i: d E[i] / d a = Var(i) / a (d log p_i / d log a = i - E[i])
    n, r = 260, 20.0
    a = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    idx = torch.arange(n - 1)
    off = torch.zeros(n, n, dtype=torch.float64)
    off = off.index_put((idx, idx + 1), (a * r).expand(n - 1)).index_put(
        (idx + 1, idx), torch.ones(n - 1, dtype=torch.float64)
    )
    Q = off - torch.diag_embed(off.sum(-1))
    states = torch.arange(n, dtype=torch.float64)
    p = fs.stationary_distribution(Q)
    (grad,) = torch.autograd.grad((p * states).sum(), a)
    exact = _birth_death_exact(r, n)
    mean = exact @ np.arange(n)
    var = exact @ (np.arange(n) - mean) ** 2
    assert grad.item() == pytest.approx(var, rel=1e-9)


def test_rates_spanning_the_float_range_give_the_exact_answer():
    # p_1 / p_0 = 1e300 / 1e-300 = 1e600 is no float, but p = (1e-600 ~ 0, 1/2, 1/2) is: the
    # elimination scales rows into probabilities (the ratio 1e300 / 1e-300 is never formed) and
    # the back-substitution keeps p_k's exponent apart once an entry leaves the normal range
    off = np.zeros((3, 3))
    off[0, 1], off[1, 0], off[1, 2], off[2, 1] = 1e300, 1e-300, 1.0, 1.0
    np.testing.assert_array_equal(fs.stationary_distribution(from_off_diagonal(off)), [0, 0.5, 0.5])


def test_sums_beyond_the_largest_float_are_redone_in_long_double():
    # rates 1.5e308 on two paths 0 -> 1: censoring state 2 adds them, beyond the largest float
    # (the validator refuses the row sum first, so this is the unchecked path); exact p is
    # (1, 3e308, 1.5e308) / 4.5e308
    q = np.zeros((3, 3))
    q[0, 1] = q[0, 2] = 1.5e308
    q[2, 1] = q[1, 0] = 1.0
    p = fs.stationary_distribution(q, check=False)
    np.testing.assert_allclose(p, [1e-308 / 4.5, 2 / 3, 1 / 3], rtol=1e-14)  # p_0 subnormal


def test_a_rate_that_is_not_a_number_is_refused_without_the_check():
    q = fs.random_generators(1, 4, seed=0)[0]
    q[1, 2] = np.nan
    with pytest.raises(fs.InputError, match="cannot be computed.*or a rate is not a number"):
        fs.stationary_distribution(q, check=False)


def test_a_transition_lost_even_in_long_double_is_refused_not_guessed():
    # a reviewer's construction (20 states, rates within 1e+-300): a path over a hill of
    # seventeen 1e+-300 links, so the effective rate 0 -> H is below 1e-4932 while H -> 0 is
    # not; the true p sits on state 19, and without the exact long-double test the answer put
    # it on state 0, with no error
    m1, m2 = 8, 9
    n = m1 + m2 + 3
    path = [0] + list(range(2, m1 + m2 + 2)) + [1]
    off = np.zeros((n, n))
    for i, (a, b) in enumerate(zip(path, path[1:])):
        off[a, b], off[b, a] = (1e-300, 1e300) if i <= m1 else (1e300, 1e-300)
    peak = path[m1 + 1]
    off[path[m1], peak] = off[path[m1 + 2], peak] = 1e-300 * 1e147
    off[1, path[-2]] = 1e-295
    off[1, n - 1], off[n - 1, 1] = 1e300, 1e-300
    with pytest.raises(fs.InputError, match="left even long double's range"):
        fs.stationary_distribution(from_off_diagonal(off))


def test_a_screened_chain_that_long_double_computes_is_not_refused():
    # the O(n^2) screen multiplies the smallest rate and probability of different pairs, so it
    # flags this 10-state chain (rates 1e+-300 only); the exact test in long double finds no
    # loss that matters, and p is the exact (1, 9, 1, ..., 1) / 18
    n = 10
    off = np.zeros((n, n))
    off[1, 0] = 1e300
    off[0, 1:] = 1e300
    for k in range(2, n):
        off[k, 1] = 1e300
        off[k - 1, k] = 1e-300
    off[n - 1, 0] = 1e-300
    expected = np.full(n, 1 / 18)
    expected[1] = 0.5
    np.testing.assert_allclose(fs.stationary_distribution(from_off_diagonal(off)), expected,
                               rtol=1e-13)  # fmt: skip
    np.testing.assert_allclose(_exact_stationary(off), expected, rtol=1e-15)


def _exact_stationary(off):
    """p_st of the generator with off-diagonal rates `off (n, n)` in exact rational arithmetic
    (the rates are binary fractions, so this is the true answer), as floats (0 below 1e-300)."""
    n = off.shape[0]
    a = [[Fraction(float(off[i, j])) if i != j else Fraction(0) for j in range(n)] for i in range(n)]
    for k in range(n - 1, 0, -1):
        s = sum(a[k][:k])
        for i in range(k):
            a[i][k] /= s
            for j in range(k):
                a[i][j] += a[i][k] * a[k][j]
    p = [Fraction(1)]
    for k in range(1, n):
        p.append(sum(p[i] * a[i][k] for i in range(k)))
    total = sum(p)
    return np.array([float(x / total) if x / total > Fraction(10) ** -300 else 0.0 for x in p])


@pytest.mark.parametrize("compiled", [False, True], ids=["vectorised", "compiled"])
def test_dense_generators_with_rates_1e300_apart_are_exact(compiled, monkeypatch):
    # rates 10^U(-300, 300), half of them zero: probabilities and products fall below the
    # normal range in the elimination; such chains are redone in long double. Against exact
    # rationals: every entry above 1e-300 to 1e-12 relative, the rest below 1e-290. At
    # 725df89, 400 such 6-state generators gave 27 wrong answers and 115 refusals.
    import fastslow_sim.stationary as st

    monkeypatch.setattr(st, "KERNEL_MIN_FLOPS", 0.0 if compiled else np.inf)
    monkeypatch.setattr(st, "_KERNEL", {} if compiled else {"gth": None})
    rng = np.random.default_rng(11)
    done = 0
    for _ in range(80):
        off = 10.0 ** rng.uniform(-300, 300, (6, 6)) * (rng.uniform(size=(6, 6)) < 0.6)
        np.fill_diagonal(off, 0.0)
        try:
            p = fs.stationary_distribution(from_off_diagonal(off))
        except fs.ReducibleGeneratorError:
            closed, transient = closed_classes(off)
            assert len(closed) > 1 or transient  # reducible from its zero pattern alone
            continue
        exact = _exact_stationary(off)
        big = exact > 0
        np.testing.assert_allclose(p[big], exact[big], rtol=1e-12)
        assert np.all(p[~big] < 1e-290)
        done += 1
    assert done > 60


def _extreme_chains(count, n, seed):
    """`count` neighbour chains of `n` states with rates 10^U(-300, 300), as dense generators,
    and their up and down rates."""
    rng = np.random.default_rng(seed)
    up, down = 10.0 ** rng.uniform(-300, 300, (2, count, n - 1))
    off = np.zeros((count, n, n))
    idx = np.arange(n - 1)
    off[:, idx, idx + 1], off[:, idx + 1, idx] = up, down
    return from_off_diagonal(off), up, down


@pytest.mark.parametrize("dense_only", [False, True, "torch"], ids=["small", "compiled", "torch"])
def test_entries_far_below_the_largest_keep_their_relative_accuracy(dense_only):
    # neighbour chains with rates 1e+-300 given as dense matrices: the ratios p_{k+1}/p_k span
    # far beyond the float range on the way (p_2 / p_0 = 1e-351 before p_6 / p_0 = 1e67), which
    # put the mass on the wrong state before the back-substitution kept exponents apart; the
    # O(n) chain formula (mantissas and exponents apart, tested against exact rationals) is
    # the reference, to 1e-12 on every entry above 1e-250
    q, up, down = _extreme_chains(300, 6, seed=0)
    if dense_only is True:  # the compiled kernel's elimination for the wide back-substitution
        from fastslow_sim.stationary import _gth_kernel

        assert _gth_kernel(1e9) is not None
    if dense_only == "torch":
        p = fs.stationary_distribution(torch.tensor(q)).numpy()
    else:
        p = fs.stationary_distribution(q)
    ref = fs.chain_stationary(up, down)
    big = ref > 1e-250
    np.testing.assert_allclose(p[big], ref[big], rtol=1e-12)
    assert np.all(p[~big] < 1e-240)


def test_numpy_input_never_imports_torch():
    # numpy in, numpy out, without torch (another issue makes `import fastslow_sim` torch-free;
    # here torch is made unimportable after the import, so any `import torch` would fail)
    code = (
        "import sys, numpy as np\n"
        "import fastslow_sim.stationary as st\n"
        "from fastslow_sim.generators import BirthDeath, random_generators, from_off_diagonal\n"
        "sys.modules['torch'] = None\n"
        "for m in st.STATIONARY_METHODS:\n"
        "    p = st.stationary_distribution(random_generators(20, 6, seed=1), m)\n"
        "    assert p.shape == (20, 6)\n"
        "p = st.stationary_distribution(BirthDeath(n=260, up=20.0, beta=0.0).rates(0.0))\n"
        "assert np.isfinite(p).all()\n"
        "off = np.zeros((3, 3)); off[0, 1] = 2.0; off[1, 2] = 1.0; off[2, 1] = 3.0\n"
        "st.stationary_distribution(from_off_diagonal(off), allow_transient=True)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --- neighbour chains in O(n): chain_stationary ------------------------------------------------


def _exact_chain(up, down):
    """`p_{i+1} / p_i = up_i / down_i` in exact rational arithmetic, correctly rounded."""
    w = [Fraction(1)]
    for u, d in zip(up, down):
        w.append(w[-1] * Fraction(float(u)) / Fraction(float(d)))
    total = sum(w)
    return np.array([float(v / total) for v in w])


@pytest.mark.parametrize("n", [2, 3, 17, 64])
def test_chain_stationary_against_exact_arithmetic(n):
    # rates from 1e-5 to 1e5 per link: the entries spread over up to 10 n orders of magnitude;
    # the bound is about (n + k) u per entry, asserted as 2 n u (with n u >= 4.4e-16)
    rng = np.random.default_rng(n)
    u = np.finfo(np.float64).eps
    for _ in range(10):
        up, down = 10.0 ** rng.uniform(-5, 5, (2, n - 1))
        exact = _exact_chain(up, down)
        _assert_relative(fs.chain_stationary(up, down), exact, rtol=2 * n * u)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_chain_stationary_of_one_state_is_one(batch):
    """A one-state chain (no links, rates of shape (..., 0)) failed in numpy's reshape; its
    p_st is [1.], as stationary_distribution gives for the 1 x 1 zero generator."""
    p = fs.chain_stationary(np.zeros(batch + (0,)), np.zeros(batch + (0,)))
    np.testing.assert_array_equal(p, fs.stationary_distribution(np.zeros(batch + (1, 1))))
    assert p.shape == batch + (1,) and p.dtype == np.float64


def test_chain_stationary_beyond_the_float_range_of_ratios():
    # up/down = 1e600 is not a float, and 1e300^k overflows in a naive product; the mass sits
    # at the far end (exact p = (1e-1200, 1e-600, 1) / sum; the dense GTH agrees)
    p = fs.chain_stationary([1e300, 1e300], [1e-300, 1e-300])
    assert np.array_equal(p, [0.0, 0.0, 1.0])
    up, down = np.array([1e300, 1.0]), np.array([1e-300, 1.0])
    np.testing.assert_array_equal(fs.chain_stationary(up, down), [0.0, 0.5, 0.5])
    dense = fs.stationary_distribution(fs.generators._neighbour_generator(up, down))
    np.testing.assert_array_equal(dense, [0.0, 0.5, 0.5])
    # 3,000 states with ratio 31.9 = 1.99 * 2^4: p_k spans 1e4500, and the mantissas' running
    # product (1.99^k) would overflow within 1,100 links without the blocks it is renormalised in
    # reference: p_k = r^(k-n+1) (1 - 1/r) / (1 - r^-n) in logs, relative error <= |log p_k| u
    # (below 2e-13 in the normal range; exact arithmetic takes minutes at this size)
    n, r = 3000, 31.9
    k = np.arange(n)
    exact = np.exp((k - n + 1) * np.log(r) + np.log1p(-1 / r) - np.log1p(-(r**-n)))
    _assert_relative(fs.chain_stationary(np.full(n - 1, r), np.ones(n - 1)), exact, 1e-12)


def test_chain_stationary_refuses_negative_or_non_finite_rates():
    for up in ([1.0, -1.0], [1.0, np.nan], [1.0, np.inf]):
        with pytest.raises(fs.InputError, match="finite, non-negative up and down rates"):
            fs.chain_stationary(up, [1.0, 1.0])
    with pytest.raises(fs.InputError, match=r"broadcast to one shape .*got shapes \(3,\) and \(4,\)"):
        fs.chain_stationary(np.ones(3), np.ones(4))


@pytest.mark.parametrize("gen", [fs.TwoState(beta=1.7), fs.BirthDeath(n=300, beta=3.0),
                                 fs.MichaelisMenten(N=40, k1=2.0)], ids=lambda g: g.name)  # fmt: skip
def test_critical_manifold_of_a_chain_is_the_dense_gth(gen):
    # the O(n) path and the dense elimination of the same generator, on a batch of y
    system = MasterEquationSystem(gen, LinearSlowLaw(readout_vector(gen.n_states)), eps=0.1)
    y = np.linspace(0.05, 2.0, 7)[:, None]
    fast = system.critical_manifold(y)
    dense = fs.stationary_distribution(gen.rates(y))
    assert fast.shape == dense.shape == (7, gen.n_states)
    big = dense > 1e-250
    assert np.max(np.abs(fast - dense)[big] / dense[big]) < 1e-12
    assert np.all(np.abs(fast - dense)[~big] <= 1e-250)
    np.testing.assert_allclose(fast, gen.closed_form(y), rtol=1e-10, atol=1e-300)


def test_critical_manifold_with_transient_states():
    # Michaelis-Menten at y = 0 binds nothing: state 0 absorbs the others, and the equilibrium
    # the fast dynamics reach is all mass there (the binomial closed form at bound fraction 0)
    gen = fs.MichaelisMenten(N=3)
    system = MasterEquationSystem(gen, LinearSlowLaw(readout_vector(gen.n_states)), eps=0.1)
    y = np.array([[0.0], [0.5]])
    np.testing.assert_allclose(system.critical_manifold(y), gen.closed_form(y), rtol=1e-14)
    assert np.array_equal(system.critical_manifold(np.array([0.0])), [1.0, 0, 0, 0])


def test_split_chains_against_the_dense_elimination():
    # zero rates split a chain into classes: the O(n) path finds the same closed classes and
    # transient states as the graph search of the dense path, and the same p where it is unique
    rng = np.random.default_rng(11)
    outcomes = set()
    for _ in range(300):
        n = int(rng.integers(2, 9))
        up, down = 10.0 ** rng.uniform(-3, 3, (2, n - 1)) * (rng.uniform(size=(2, n - 1)) < 0.8)
        q = fs.generators._neighbour_generator(up, down)
        for allow in (False, True):
            try:
                dense = fs.stationary_distribution(q, allow_transient=allow)
            except fs.ReducibleGeneratorError as e:
                with pytest.raises(fs.ReducibleGeneratorError) as got:
                    fs.chain_stationary(up, down, allow_transient=allow)
                assert str(got.value) == str(e)
                assert (got.value.closed_classes, got.value.transient) == (e.closed_classes, e.transient)
                outcomes.add(("raise", min(len(e.closed_classes), 2)))
                continue
            fast = fs.chain_stationary(up, down, allow_transient=allow)
            np.testing.assert_allclose(fast, dense, rtol=1e-12, atol=1e-300)
            outcomes.add(("p", bool(np.any(dense == 0))))
    assert outcomes == {("raise", 1), ("raise", 2), ("p", True), ("p", False)}


def test_critical_manifold_falls_back_to_the_dense_elimination():

    class Reshaped(fs.BirthDeath):  # changes the rates, not the neighbour rates: not a chain
        def rates(self, y):
            q = super().rates(y)
            q[..., 0, -1] += 1.0
            q[..., 0, 0] -= 1.0
            return q

    shaped = MasterEquationSystem(Reshaped(n=5), LinearSlowLaw(readout_vector(5)), eps=0.1)
    assert not shaped.chain_p_st
    y = np.array([0.3])
    np.testing.assert_allclose(shaped.critical_manifold(y),
                               fs.stationary_distribution(Reshaped(n=5).rates(y)), rtol=1e-14)  # fmt: skip
    x = np.full(5, 0.2)
    np.testing.assert_allclose(shaped.f(x, y), Reshaped(n=5).rates(y).T @ x, rtol=1e-14, atol=1e-16)


def test_chain_right_hand_side_is_the_dense_product():
    # the flux form of Q(y)^T x on a neighbour chain: the dense product, and 1^T f = 0
    gen = fs.BirthDeath(n=50, beta=2.0)
    system = MasterEquationSystem(gen, LinearSlowLaw(readout_vector(50)), eps=0.1)
    rng = np.random.default_rng(3)
    x, y = rng.dirichlet(np.ones(50), 4), rng.uniform(0, 1, (4, 1))
    f = system.f(x, y)
    dense = np.einsum("bji,bj->bi", gen.rates(y), x)
    np.testing.assert_allclose(f, dense, rtol=1e-13, atol=1e-15)
    assert np.max(np.abs(f.sum(-1))) < 1e-14


# --- the compiled GTH (stationary_kernel) against the vectorised elimination ------------------


def _both_gth(q, monkeypatch, check=True):
    import fastslow_sim.stationary as st

    monkeypatch.setattr(st, "_KERNEL", {"gth": None})  # the vectorised elimination
    vec = st._gth(q, check)
    monkeypatch.setattr(st, "_KERNEL", {})
    monkeypatch.setattr(st, "KERNEL_MIN_FLOPS", 0.0)  # the compiled one, whatever the size
    return vec, st._gth(q, check)


def test_compiled_gth_is_bit_for_bit_the_vectorised_one(monkeypatch):
    rng = np.random.default_rng(5)
    nasty = np.zeros((3, 3))
    nasty[0, 1] = nasty[1, 2] = 1.0
    nasty[1, 0] = nasty[2, 1] = 1e-200
    cases = [fs.random_generators(300, n, seed=n) for n in (2, 3, 8, 17, 40)]
    cases += [fs.BirthDeath(n=260, up=20.0, down=1.0, beta=0.0).rates(0.0)[None],
              from_off_diagonal(nasty)[None],
              from_off_diagonal(rng.uniform(0, 1, (50, 6, 6)) * (rng.uniform(size=(50, 6, 6)) < 0.3))]  # fmt: skip
    bad_rows = fs.random_generators(4, 5, seed=1)
    bad_rows[0, 1, 2] += 1e-3  # a row that does not sum to zero
    bad_rows[1, 3, 0] = -0.1  # a negative rate, in a row that sums to zero
    bad_rows[1] = from_off_diagonal(bad_rows[1])
    bad_rows[2, 2, 4] = np.nan
    bad_rows[3, 0, 1] = np.inf
    cases += [bad_rows[i : i + 1] for i in range(4)]
    # one dense generator: a batch of 1, where numpy would sum the (k, 1) columns pairwise
    cases += [fs.random_generators(1, n, seed=n) for n in (20, 37, 64)]
    # rates 1e+-300: entries leave the normal range, so the back-substitution is redone with
    # exponents apart (a whole batch, one chain of a batch, a batch of one; dense ones too)
    extreme = _extreme_chains(200, 7, seed=3)[0]
    cases += [extreme, np.concatenate([fs.random_generators(5, 7, seed=2), extreme[:1]]),
              extreme[1:2]]  # fmt: skip
    dense = from_off_diagonal(10.0 ** rng.uniform(-150, 150, (100, 6, 6)))
    cases += [dense, dense[:1]]
    flagged = invalid = redone = 0
    for q in cases:
        (pv, bv, iv), (pk, bk, ik) = _both_gth(q, monkeypatch)
        assert np.array_equal(pv, pk, equal_nan=True) and np.array_equal(bv, bk) and iv == ik
        flagged += int(bv.sum())
        invalid += int(iv)
        redone += int((~bv & (pv < np.finfo(float).tiny).any(-1)).sum())
    assert flagged > 0 and invalid == 4  # the reducible, NaN and inf cases were exercised
    assert redone > 100  # and the wide back-substitution, in both


def test_large_generators_are_eliminated_in_panels_to_rounding(monkeypatch):
    """From BLOCK_MIN states the compiled GTH delays the leading block's update to the end of
    each panel (one dgemm): the same sums of non-negative terms in another order, so `p` keeps
    its relative accuracy. Against the unblocked vectorised elimination (the same flags) on an
    ordinary and a sparse wide-range dense generator, and, for neighbour chains given as dense
    matrices (their mass spans far beyond the float range: screened and redone), against the
    O(n) chain formula."""
    import fastslow_sim.stationary as st
    from fastslow_sim.stationary_kernel import BLOCK_MIN, PANEL

    n = BLOCK_MIN + PANEL // 2 + 3  # a last panel of another size
    rng = np.random.default_rng(11)
    wide = 10.0 ** rng.uniform(-20, 20, (1, n, n)) * (rng.uniform(size=(1, n, n)) < 0.6)
    for q in (fs.random_generators(1, n, seed=1), from_off_diagonal(wide)):
        (pv, bv, _), (pk, bk, _) = _both_gth(q, monkeypatch)
        assert np.array_equal(bv, bk) and not bk.any()
        rel = np.abs(pk - pv) / pv
        assert 0 < rel.max() < 1e-12, rel.max()  # not the same code path, and as accurate
    q, up, down = _extreme_chains(2, n, seed=4)
    pk, bk, _ = st._gth(q, True)  # still the compiled kernel (_both_gth's settings)
    ref = fs.chain_stationary(up, down)
    big = ref > 1e-300
    assert not bk.any() and big.sum() >= 4
    assert np.max(np.abs(pk[big] - ref[big]) / ref[big]) < 1e-12


def test_underflow_that_carries_no_flow_is_certified_and_right():
    """The screen flags every chain where a product may underflow; `_underflow_is_harmless`
    clears those where the flows bound what it can cost (`stationary._underflow_is_harmless`),
    so they keep the float64 result instead of a long-double redo (34 s for a 1,024-state
    cycle, where the far fill-in underflows). Cycles with a tiny backward rate: flagged by the
    screen, certified, and right against exact rationals; many dense generators with rates
    1e+-300 are not certified."""
    from fastslow_sim.stationary_kernel import _censor, gth

    rng = np.random.default_rng(3)
    screened = certified = 0
    for _ in range(60):
        n = int(rng.integers(4, 10))
        off = np.zeros((n, n))
        i = np.arange(n)
        off[i, (i + 1) % n] = 10.0 ** rng.uniform(-5, 5, n)
        off[i, (i - 1) % n] += 10.0 ** rng.uniform(-300, -30, n)
        if not _censor(off.copy())[1]:  # the screen does not flag it
            continue
        screened += 1
        p, bad, risky, _ = gth(from_off_diagonal(off)[None], 1e-10, False)
        if bad[0] or risky[0]:
            continue
        certified += 1
        exact = np.array([float(e) for e in _exact_gth(off)])
        big = exact > 1e-300
        assert np.all(np.abs(p[0][big] - exact[big]) <= 1e-12 * exact[big])
        assert np.all(p[0][~big] < 1e-290)
    assert screened >= 40 and certified >= 0.8 * screened, (screened, certified)
    # dense generators with rates 10^U(-300, 300): much of their underflow may matter
    off = 10.0 ** rng.uniform(-300, 300, (200, 6, 6)) * (rng.uniform(size=(200, 6, 6)) < 0.6)
    _, bad, risky, _ = gth(from_off_diagonal(off), 1e-10, False)
    assert (risky & ~bad).sum() >= 50  # still redone in long double


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_a_long_cycle_keeps_its_float64_elimination():
    import fastslow_sim.stationary as st
    from fastslow_sim.stationary_kernel import _censor, gth

    n = 450  # from about 420 states the fill-in 0.2 (0.2/1.2)^d underflows
    q = fs.make_system("cycle", eps=0.125, states=n).generator.rates(np.array([[0.5]]))
    off = q[0].copy()
    np.fill_diagonal(off, 0.0)
    assert _censor(off)[1]  # far fill-in underflows: the screen flags it
    p, bad, risky, _ = gth(q, 1e-10, True)
    assert not bad[0] and not risky[0]  # certified: no long-double redo
    wide, bad_w = p.copy(), np.zeros(1, dtype=bool)
    st._redo_extended(q.reshape(1, -1), wide, bad_w, np.ones(1, dtype=bool))  # forced
    assert not bad_w[0] and np.max(np.abs(p - wide) / wide) < 1e-13


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_flush_to_zero_keeps_the_long_double_redo():
    """Under flush-to-zero (`torch.set_flush_denormal(True)`, or a library built with
    -ffast-math) a lost term can be as large as `tiny`, so the certificate, which assumes
    gradual underflow, is not used: the screened chain is redone in long double and right
    (the reviewer's chain was off by 1e-2 with the certificate in use)."""
    import fastslow_sim.stationary as st

    off = np.array([[0, 1e-306, 1.0], [1.0, 0, 0], [1e8, 1e-300, 0]])
    q = from_off_diagonal(off)
    exact = _exact_gth(off)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode to set")
    try:
        assert not st.gradual_underflow() and not st.gradual_underflow(torch.zeros(1))
        for qq in (q, torch.from_numpy(q), np.repeat(q[None], 20000, axis=0)):
            p = np.asarray(fs.stationary_distribution(qq)).reshape(-1, 3)[0]
            assert abs(p[1] - exact[1]) <= 1e-14 * exact[1], p
    finally:
        torch.set_flush_denormal(False)
    assert st.gradual_underflow() and st.gradual_underflow(torch.zeros(1, dtype=torch.float32))


def test_a_reducible_chain_is_not_redone_in_long_double(monkeypatch):
    """A zero pivot from the graph (two closed classes, or transient states) is no precision
    problem: the chain goes to the graph search without the O(n^3) long-double redo (47.9 s
    before the refusal at 1,024 states), and a long list of states is shortened in the
    sentence (the full lists stay on the error)."""
    import fastslow_sim.stationary as st

    calls = []
    real = st._gth_batch_last
    monkeypatch.setattr(st, "_gth_batch_last",
                        lambda a, exact=False: calls.append(exact) or real(a, exact))  # fmt: skip
    rng = np.random.default_rng(2)
    n, h = 40, 20
    off = rng.uniform(size=(n, n))
    off[:h, h:] = off[h:, :h] = 0.0
    for kernel in ({"gth": None}, {}):
        monkeypatch.setattr(st, "_KERNEL", kernel)
        monkeypatch.setattr(st, "KERNEL_MIN_FLOPS", 0.0)
        with pytest.raises(fs.ReducibleGeneratorError, match=r"2 closed classes \[\[0, 1, 2, 3, "
                           r"4, 5, 6, 7, \.\.\.\] \(20 states\), \[20, ") as err:  # fmt: skip
            fs.stationary_distribution(from_off_diagonal(off))
        assert [len(c) for c in err.value.closed_classes] == [20, 20]
        one_way = off.copy()
        one_way[h:, :h] = rng.uniform(size=(n - h, h))  # states 20-39 transient
        p = fs.stationary_distribution(from_off_diagonal(one_way), allow_transient=True)
        assert np.all(p[h:] == 0) and abs(p[:h].sum() - 1) < 1e-14
    assert True not in calls


def test_small_calls_do_not_load_the_compiled_gth(monkeypatch):
    import fastslow_sim.stationary as st

    monkeypatch.setattr(st, "_KERNEL", {})
    st.stationary_distribution(fs.BirthDeath(n=8).rates(np.linspace(0, 1, 5)))
    assert "gth" not in st._KERNEL  # 5 x 8^3 / 3 operations: not worth loading it
    st.stationary_distribution(fs.random_generators(3000, 24, seed=0))
    assert st._KERNEL["gth"] is not None


CY_Q = fs.Cycle().rates(0.3)
CY_DQ = fs.Cycle().rates_dy(0.3)
CY_P = fs.stationary_distribution(CY_Q)


@pytest.mark.parametrize(
    "p, fragment",
    [(CY_P[:3], r"p must have shape \(\.\.\., 6\), one entry per state.*got \(3,\)"),
     (np.stack([CY_P, np.full(6, 1 / 6)]),
      r"p must be a stationary distribution of Q \(batch index \(1,\)\)"),
     (np.ones(6), "p must be a stationary distribution of Q.*sum 6"),
     (np.full(6, 1 / 6), "p must be a stationary distribution of Q"),
     (np.where(np.arange(6) == 0, np.nan, CY_P), r"p must be finite; entry \(0,\) is nan"),
     (CY_P + 0j, "p must hold real numbers")],
    ids=["length", "extra-batch", "ones", "uniform", "nan", "complex"],
)  # fmt: skip
def test_a_given_p_is_checked_to_be_the_stationary_distribution(p, fragment):
    """p of the wrong length failed in numpy's broadcast, a non-stationary p (np.ones) gave a
    wrong derivative, a batch of p's against one Q was not checked p by p, NaN gave NaN."""
    for call in (lambda: fs.fundamental_matrix(CY_Q, p), lambda: fs.stationary_derivative(CY_Q, CY_DQ, p)):
        with pytest.raises(fs.InputError, match=fragment) as err:
            call()
        assert len(str(err.value).splitlines()) == 1


def test_a_given_p_broadcasts_against_q_as_before_the_check():
    """Batch axes of p and Q that broadcast were accepted before p was checked (Q (1, n, n)
    with p (n,), Q (n, n) with p (1, n) or a stack of its p's): they still are, with the results
    of the p computed here."""
    want = fs.stationary_derivative(CY_Q, CY_DQ)
    for q, dq, p in ((CY_Q[None], CY_DQ[None], CY_P), (CY_Q, CY_DQ, CY_P[None]),
                     (CY_Q, CY_DQ, np.stack([CY_P, CY_P]))):  # fmt: skip
        got = fs.stationary_derivative(q, dq, p)
        np.testing.assert_allclose(np.broadcast_to(want, got.shape), got, rtol=0, atol=1e-14)
        z = fs.fundamental_matrix(q, p)
        np.testing.assert_allclose(np.broadcast_to(fs.fundamental_matrix(CY_Q), z.shape), z,
                                   rtol=0, atol=1e-12)  # fmt: skip
    with pytest.raises(fs.InputError, match=r"batch axes that broadcast against Q's \(3,\)"):
        fs.fundamental_matrix(np.stack([CY_Q] * 3), np.stack([CY_P] * 2))


def test_a_given_stationary_p_is_accepted_as_a_list_and_on_stiff_chains():
    from fastslow_sim.stationary import _stationary_vector

    # a list was a TypeError in fundamental_matrix
    np.testing.assert_array_equal(fs.fundamental_matrix(CY_Q, list(CY_P)), fs.fundamental_matrix(CY_Q))
    np.testing.assert_array_equal(fs.stationary_derivative(CY_Q, CY_DQ, list(CY_P)),
                                  fs.stationary_derivative(CY_Q, CY_DQ))  # fmt: skip
    # GTH's p passes on chains whose rates span many decades (tested against max|Q|)
    off = np.zeros((3, 3))
    off[0, 1], off[1, 0], off[1, 2], off[2, 1] = 1e300, 1e-300, 1.0, 1.0
    rng = np.random.default_rng(5)
    wild = 10.0 ** rng.uniform(-300, 300, (40, 12, 12))
    for Q in (from_off_diagonal(off), fs.BirthDeath(n=200).rates(np.linspace(-40, 40, 9)),
              from_off_diagonal(wild)):  # fmt: skip
        p = fs.stationary_distribution(Q, allow_transient=True)
        _stationary_vector(p, Q, Q)  # (the solve after it may be singular in float64)
    gen = fs.MichaelisMenten(N=30)  # the O(n) chain's p and the closed form, with transients
    y = np.array([[0.0], [1e-3], [1.0], [1e6]])
    fs.stationary_derivative(gen.rates(y), gen.rates_dy(y), gen.closed_form(y))
    fs.stationary_derivative(gen.rates(y), gen.rates_dy(y),
                             fs.chain_stationary(*gen.neighbour_rates(y), allow_transient=True))


def test_a_non_finite_dQ_is_refused():
    """stationary_derivative returned NaN for a NaN dQ."""
    dq = CY_DQ.copy()
    dq[0, 2, 3] = np.inf
    for p in (None, CY_P):
        with pytest.raises(fs.InputError, match=r"^dQ must be finite; entry \(0, 2, 3\) is inf\.$"):
            fs.stationary_derivative(CY_Q, dq, p)


def test_complex_or_text_entries_are_refused_in_one_sentence():
    """Q + 1j E lost its imaginary part silently; an object array with text failed in numpy."""
    for Q in (CY_Q + 1j * np.eye(6), CY_Q + 0j, torch.tensor(CY_Q + 1j * np.eye(6))):
        for call in (fs.stationary_distribution, fs.fundamental_matrix):
            with pytest.raises(fs.InputError, match=r"^Q must hold real numbers; got dtype"):
                call(Q)
    with pytest.raises(fs.InputError, match=r"^dQ must hold real numbers; got dtype complex128"):
        fs.stationary_derivative(CY_Q, CY_DQ + 1j)
    text = np.array([[-1, 1], [1, "a"]], dtype=object)
    with pytest.raises(fs.InputError, match=r"^Q must hold real numbers; got 'a' in an array of dtype object\.$"):
        fs.stationary_distribution(text)
    numbers = np.array([[-1, 1], [2, -2]], dtype=object)  # numbers in an object array still work
    np.testing.assert_allclose(fs.stationary_distribution(numbers), [2 / 3, 1 / 3])
