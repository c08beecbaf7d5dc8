import json

import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.generators import from_off_diagonal, readout_vector
from fastslow_sim.manifold import h0, h1
from fastslow_sim.systems import LinearSlowLaw

ALL = [
    fs.TwoState(),
    fs.BirthDeath(),
    fs.Cycle(),
    fs.RandomIrreducible(seed=3),
    fs.MichaelisMenten(),
]


@pytest.mark.parametrize("gen", ALL, ids=lambda g: g.name)
def test_generators_are_valid_and_batched(gen):
    y = np.linspace(0.1, 1.5, 7).reshape(7, 1)
    Q = gen.rates(y)
    assert Q.shape == (7, gen.n_states, gen.n_states)
    fs.validate_generator(Q)
    np.testing.assert_allclose(Q.sum(-1), 0.0, atol=1e-14)
    # a scalar y and a (2, 3, 1) batch give the same matrices as the flat batch
    np.testing.assert_array_equal(gen.rates(0.4), gen.rates(np.array([0.4]))[...])
    yb = np.linspace(0.1, 1.0, 6).reshape(2, 3, 1)
    np.testing.assert_allclose(gen.rates(yb).reshape(6, *Q.shape[1:]), gen.rates(yb.reshape(6, 1)))


@pytest.mark.parametrize("gen", ALL, ids=lambda g: g.name)
def test_rates_dy_matches_finite_differences(gen):
    y = np.array([[0.3], [0.8]])
    h = 1e-6
    fd = (gen.rates(y + h) - gen.rates(y - h)) / (2 * h)
    np.testing.assert_allclose(gen.rates_dy(y)[:, 0], fd, rtol=1e-7, atol=1e-8)


def test_random_family_is_seeded():
    a = fs.RandomIrreducible(n=6, seed=7).rates(0.5)
    b = fs.RandomIrreducible(n=6, seed=7).rates(0.5)
    c = fs.RandomIrreducible(n=6, seed=8).rates(0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    np.testing.assert_array_equal(
        fs.random_generators(5, 4, seed=1), fs.random_generators(5, 4, seed=1)
    )


@pytest.mark.parametrize(
    "count, n, fragment",
    [(-1, 3, "count must be an integer >= 0; got -1"), (2, 0, r"n \(states\) must be an integer >= 1"),
     (2.5, 3, "count must be an integer"), (True, 3, "count must be an integer; got True"),
     (2, True, r"n \(states\) must be an integer; got True")],
)  # fmt: skip
def test_random_generators_refuse_negative_sizes_in_one_sentence(count, n, fragment):
    """random_generators(-1, 3) failed in numpy ("negative dimensions are not allowed")."""
    with pytest.raises(fs.InputError, match=fragment):
        fs.random_generators(count, n)
    assert fs.random_generators(0, 3).shape == (0, 3, 3)


@pytest.mark.parametrize("batch", [-1, 2.5, "x", True])
def test_random_initial_conditions_refuse_a_bad_batch_in_one_sentence(batch):
    """random_initial_conditions(s, -1) failed in numpy ("negative dimensions")."""
    s = fs.make_system("two-state", eps=0.1)
    with pytest.raises(fs.InputError, match=rf"^batch must be an integer >= 0; got {batch!r}\.$"):
        fs.random_initial_conditions(s, batch)
    x0, y0 = fs.random_initial_conditions(s, 3, seed=0)
    assert x0.shape == (3, 2) and y0.shape == (3, 1)
    np.testing.assert_allclose(x0.sum(1), 1.0, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "Q, fragment",
    [
        (np.array([[-1.0, 1.0], [-0.5, 0.5]]), "non-negative off-diagonal"),
        (np.array([[-1.0, 1.0], [0.5, -0.4]]), "sum to zero"),
        (np.array([[-1.0, np.nan], [0.5, -0.5]]), "finite"),
        (np.array([[-1.0, np.inf], [0.5, -0.5]]), "finite"),
        (np.ones((2, 3)), "square"),
        (np.ones(3), "square"),
    ],
)
def test_validator_rejects_with_one_sentence(Q, fragment):
    with pytest.raises(fs.InputError, match=fragment) as info:
        fs.validate_generator(Q)
    msg = str(info.value)
    assert msg.endswith(".") and "\n" not in msg


def test_validator_accepts_torch_and_from_off_diagonal():
    import torch

    Q = from_off_diagonal(np.array([[0, 2.0, 1.0], [1.0, 0, 0], [0, 3.0, 0]]))
    np.testing.assert_allclose(Q.diagonal(), [-3.0, -1.0, -3.0])
    fs.validate_generator(torch.tensor(Q))


def test_an_infinite_rate_is_one_sentence_without_a_numpy_warning():
    # 1e300 in float32 is inf, so the row sum is inf - inf: the screen's sum must not leak
    # numpy's "invalid value encountered in reduce" before the sentence
    import warnings

    off = np.zeros((3, 3))
    off[0, 1], off[1, 0], off[1, 2], off[2, 1] = 1e300, 1.0, 1.0, 1.0
    q = torch.tensor(from_off_diagonal(off), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(fs.InputError, match=r"Q must be finite; entry \(0, 0\) is -inf"):
            fs.stationary_distribution(q)


EXPONENTIAL = [
    fs.TwoState(beta=2.0),
    fs.TwoState(a=0.3, b=2.0, beta=-1.5),
    fs.BirthDeath(),
    fs.BirthDeath(n=5, up=0.5, down=3.0, beta=-3.0, y_mid=2.0),
    fs.Cycle(),
    fs.Cycle(n=9, forward=0.3, backward=0.5),
    fs.RandomIrreducible(),
    fs.RandomIrreducible(n=5, seed=3),
    fs.MichaelisMenten(),
]


@pytest.mark.parametrize("gen", EXPONENTIAL, ids=lambda g: f"{g.name}-{g.n_states}")
def test_the_domain_ends_where_the_rates_and_jacobian_overflow(gen):
    """domain() said "the real line" for every built-in, while e^{beta y} overflowed beyond y =
    354.5 (two-state, the CLI's beta 2: the manifold's continuation stalled there). At each
    finite end, the rates, rates_dy and the Jacobian of the critical-manifold equations are
    computed without an overflow; a little beyond an end that overflow bounds (all but
    michaelis-menten's y = 0), n (|Q_ij| + |dQ_ij/dy|) of some rate is infinite."""
    from fastslow_sim.nonlinear import LinearFamily

    ends = [(e, side) for e, side in zip(gen.domain(), (-1, 1)) if np.isfinite(e)]
    assert ends
    n, off = gen.n_states, ~np.eye(gen.n_states, dtype=bool)
    for e, side in ends:
        with np.errstate(over="raise"):
            Q, dQ = gen.rates(e), gen.rates_dy(e)
            Fx, Fy = LinearFamily(gen).field_jacobians(np.full(n, 1.0 / n), np.array([e]))
        for a in (Q, dQ, Fx, Fy):
            assert np.all(np.isfinite(a))
        if e == 0:  # michaelis-menten: below 0 the binding rate is negative
            assert gen.rates(-1e-9)[0, 1] < 0
            continue
        beyond = e + side * 1e-3 * abs(e)
        with np.errstate(over="ignore"):
            Q, dQ = gen.rates(beyond), gen.rates_dy(beyond)[0]
            assert not np.all(np.isfinite(n * (np.abs(Q[off]) + np.abs(dQ[off]))))


@pytest.mark.parametrize("gen", EXPONENTIAL[:4], ids=lambda g: f"{g.name}-{g.n_states}")
def test_where_the_up_rate_underflows_the_domain_stays_open(gen):
    """Far on the underflow side the chain's up rates are 0 and state 0 absorbs; p_st puts all
    the mass there (its limit) and h1 is finite, so domain() does not end there."""
    beta = gen.beta
    far = -1e6 if beta > 0 else 1e6
    assert not np.isfinite(gen.domain()[0 if beta > 0 else 1])
    system = fs.MasterEquationSystem(gen, LinearSlowLaw(readout_vector(gen.n_states)), 0.1)

    np.testing.assert_array_equal(h0(system, far), np.eye(gen.n_states)[0])
    assert np.all(np.isfinite(h1(system, far)))


def test_a_family_of_huge_constant_rates_has_no_domain():
    with pytest.raises(fs.InputError, match="leave no y where its rates"):
        fs.TwoState(b=1e308).domain()


def test_a_system_records_its_generator_and_slow_law_parameters_apart():
    """Two-state's rates are called a and b, as are the linear law's; the law's had replaced the
    generator's in every saved dataset's system_params (rate b = 0: an absorbing chain)."""
    system = fs.MasterEquationSystem(fs.generators.TwoState(a=2.0, b=3.0, beta=1.0),
                                     LinearSlowLaw(np.array([0.0, 1.0])), 0.1)  # fmt: skip
    params = system.params()
    assert (params["a"], params["b"], params["beta"]) == (2.0, 3.0, 1.0)
    assert (params["slow_law_a"], params["slow_law_b"], params["slow_law_c"]) == (1.0, 0.0, [0.0, 1.0])
    ds = fs.integrate(system, (0, 0.1), [1.0, 0.0], [0.5], method="radau", n_eval=3)
    saved = json.loads(ds.attrs["system_params"])
    assert (saved["a"], saved["b"], saved["slow_law_b"]) == (2.0, 3.0, 0.0)


@pytest.mark.parametrize(
    "make, fragment",
    [(lambda: fs.TwoState(a=-1), r"two-state generator's rate a must be a finite number >= 0; got -1\."),
     (lambda: fs.TwoState(a=0.0, b=0.0), r"needs a or b positive .*got a=0\.0, b=0\.0\."),
     (lambda: fs.TwoState(beta=np.inf), r"two-state generator's beta must be a finite number; got inf"),
     (lambda: fs.TwoState(a="1"), r"rate a must be a finite number >= 0; got '1'\."),
     (lambda: fs.Cycle(backward=-1), r"cycle generator's rate backward must be a finite number >= 0"),
     (lambda: fs.Cycle(forward=0, backward=0), "positive rate forward or backward"),
     (lambda: fs.MichaelisMenten(k1=-1), r"rate k1 must be a finite number >= 0; got -1\."),
     (lambda: fs.MichaelisMenten(k2=np.nan), r"rate k2 must be a finite number >= 0; got nan"),
     (lambda: fs.MichaelisMenten(k1=0, k_minus1=0, k2=0), r"needs k1 or k_minus1 \+ k2 positive"),
     (lambda: fs.BirthDeath(beta=np.nan), r"birth-death generator's beta must be a finite number"),
     (lambda: fs.BirthDeath(up=np.inf), r"rate up must be a finite number > 0; got inf"),
     (lambda: fs.BirthDeath(y_mid=np.nan), r"y_mid must be a finite number; got nan"),
     (lambda: fs.RandomIrreducible(density=2), r"density must be a finite number >= 0 and <= 1; got 2\."),
     (lambda: fs.RandomIrreducible(density=-1), r"density must be a finite number >= 0 and <= 1"),
     (lambda: fs.random_generators(2, 3, density=np.nan), r"^density must be a finite number >= 0 and <= 1; got nan\.$")],
)  # fmt: skip
def test_generator_constants_are_refused_at_construction(make, fragment):
    """TwoState(a=-1), Cycle(backward=-1), BirthDeath(beta=nan), RandomIrreducible(density=2)...
    constructed, and the integration ended in a non-finite status."""
    with pytest.raises(fs.InputError, match=fragment) as err:
        make()
    assert len(str(err.value).splitlines()) == 1


def test_rates_that_may_be_zero_keep_the_chain_irreducible():
    # either direction alone goes round a cycle; k_minus1 or k2 alone empties the complex; the
    # random Hamiltonian cycle alone is irreducible
    for gen in (fs.Cycle(backward=0.0), fs.Cycle(forward=0.0), fs.MichaelisMenten(k2=0.0),
                fs.MichaelisMenten(k_minus1=0.0), fs.RandomIrreducible(density=0.0)):  # fmt: skip
        p = fs.stationary_distribution(gen.rates(0.7))
        assert np.all(p > 0) and abs(p.sum() - 1) < 1e-14
    assert fs.random_generators(2, 3, density=0.0).shape == (2, 3, 3)
    a = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    assert fs.TwoState(a=a).a is a  # a rate being differentiated stays a tensor


def test_a_zero_rate_with_one_closed_class_is_taken():
    """TwoState(a=0), MichaelisMenten(k1=0) or (k_minus1=k2=0): one absorbing state and the
    others transient, as MichaelisMenten at y = 0; p_st is that state's indicator (the solvers
    take transient states), so these are valid generators, not refused."""
    for gen, absorbing in ((fs.TwoState(a=0.0), 0), (fs.TwoState(b=0.0), 1),
                           (fs.MichaelisMenten(k1=0.0), 0),
                           (fs.MichaelisMenten(k_minus1=0.0, k2=0.0), 4)):  # fmt: skip
        p = fs.stationary_distribution(gen.rates(0.7), allow_transient=True)
        np.testing.assert_array_equal(p, np.eye(gen.n_states)[absorbing])


@pytest.mark.parametrize("atol", [-1, np.nan, np.inf, "x", None])
def test_validate_generator_refuses_a_bad_atol(atol):
    """atol=-1 refused every row ("sums to 5.6e-17"), NaN accepted any, 'x' failed in numpy."""
    Q = fs.Cycle().rates(0.3)
    if atol is None:
        fs.validate_generator(np.array([[-1.0, 1.0], [2.0, -2.0]]), atol=0.0)  # exact sums
        return
    with pytest.raises(fs.InputError, match=rf"^atol must be a finite number >= 0; got {atol!r}\.$"):
        fs.validate_generator(Q, atol=atol)


@pytest.mark.parametrize("y", ["a", [1 + 1j], np.array([0.5 + 2j])])
def test_rates_refuse_a_y_that_is_no_real_number(y):
    """BirthDeath().rates('a') failed in numpy; a complex y lost its imaginary part."""
    for gen in (fs.BirthDeath(), fs.TwoState()):
        with pytest.raises(fs.InputError, match=r"^y \(the slow variable\) must be a real number"):
            gen.rates(y)
