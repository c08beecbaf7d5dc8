import numpy as np
import pytest
import torch

import fastslow_sim as fs
from fastslow_sim.generators import from_off_diagonal

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
