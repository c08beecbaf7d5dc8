"""The multirate map at the extremes (issue 13): mass conserved at every eps, P tokens per block
by default, long blocks by doubling, spans that are not whole blocks refused."""

import re

import numpy as np
import pytest

import fastslow_sim as fs
from fastslow_sim.multirate import MAX_TOKENS, multirate_map


@pytest.mark.parametrize("eps", [0.5, 1e-2, 1e-6, 1e-8, 1e-10, 1e-12])
@pytest.mark.parametrize("P", [8, None])
def test_mass_is_conserved_to_round_off_at_every_eps(eps, P):
    # issue 13: max |1^T x - 1| was 9.8e-11 at eps 1e-6, 2.2e-7 at 1e-8 and 1.2e-3 at 1e-12
    system = fs.make_system("birth-death", eps=eps)
    run = multirate_map(system, 0.05, 20, P=P)
    assert run["P"] == (8 if P is not None else system.P)
    for key in ("x_blocks", "block_mean") + (("x_tokens",) if "x_tokens" in run else ()):
        assert np.all(run[key] >= 0)
        np.testing.assert_allclose(run[key].sum(-1), 1.0, rtol=0, atol=1e-12)


def test_long_blocks_by_doubling_match_the_token_walk():
    # P = 50 walked token by token (tokens kept) against the same blocks by doubling
    system = fs.make_system("birth-death", eps=0.02)
    walked = multirate_map(system, 0.05, 10, tokens=True)
    from fastslow_sim import multirate

    before = multirate._WALK
    multirate._WALK = 1  # force the doubling path
    try:
        doubled = multirate_map(system, 0.05, 10, tokens=False)
    finally:
        multirate._WALK = before
    assert "x_tokens" not in doubled and walked["x_tokens"].shape == (501, 8)
    np.testing.assert_allclose(walked["x_tokens"][::50], walked["x_blocks"], rtol=0, atol=0)
    for key in ("x_blocks", "block_mean", "y_blocks"):
        np.testing.assert_allclose(doubled[key], walked[key], rtol=0, atol=1e-14)


def test_tiny_eps_tracks_the_ode():
    # P = 1e12 tokens per block: tau = H, and the map converges to the ODE in H (first order)
    system = fs.make_system("birth-death", eps=1e-12)
    run = multirate_map(system, 0.05, 40)
    assert run["P"] == 10**12 and "x_tokens" not in run
    ref = fs.integrate(system, (0, 2), method="rodas4", rtol=1e-10, atol=1e-12,
                       t_eval=run["t_blocks"])  # fmt: skip
    err = np.max(np.abs(run["y_blocks"][:, 0] - ref["y"].values[:, 0]))
    assert 0 < err < 0.05  # O(H) with H = 0.05 (measured 1.2e-3 at eps 1e-6, P = 8)


def test_integrate_uses_the_systems_P_and_whole_blocks():
    system = fs.make_system("birth-death", P=16)
    ds = fs.integrate(system, (0, 0.5), method="multirate", H=0.05)
    assert ds.attrs["tokens_per_block"] == 16 and ds.attrs["P"] == 16 and ds.attrs["H"] == 0.05
    run = multirate_map(system, 0.05, 10)
    np.testing.assert_allclose(ds["y"].values, run["y_blocks"], rtol=0, atol=0)
    np.testing.assert_allclose(ds["x"].values, run["x_blocks"], rtol=0, atol=0)
    np.testing.assert_allclose(ds["time"].values, run["t_blocks"])
    # issue 13: (0, 0.001) with H = 0.01 silently ended at 0.01
    with pytest.raises(fs.InputError, match=r"span 0.001 is not a whole number of blocks"):
        fs.integrate(system, (0, 0.001), method="multirate", H=0.01)
    with pytest.raises(fs.InputError, match="not a whole number"):
        fs.integrate(system, (0, 0.125), method="multirate", H=0.05)
    with pytest.raises(fs.InputError, match="H must be a positive"):
        fs.integrate(system, (0, 1), method="multirate", H=float("nan"))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"H": 0.0}, "H .slow time per block. must be a positive"),
        ({"H": float("inf")}, "H .slow time per block. must be a positive"),
        ({"n_blocks": 0}, "n_blocks must be a positive integer"),
        ({"n_blocks": 2.5}, "n_blocks must be a positive integer"),
        ({"P": 0}, "P .tokens per block. must be a positive integer"),
        ({"P": 1.5}, "P .tokens per block. must be a positive integer"),
        ({"P": 10**6, "n_blocks": 2, "tokens": True}, "more than the"),
    ],
)
def test_bad_input(kwargs, fragment):
    system = fs.make_system("birth-death", eps=0.01)
    args = {"H": 0.05, "n_blocks": 2, **kwargs}
    with pytest.raises(fs.InputError, match=fragment):
        multirate_map(system, args.pop("H"), args.pop("n_blocks"), **args)


@pytest.mark.parametrize(
    "start",
    [
        {"x0": [2.0, 0.0]},  # was renormalised to mass 1
        {"x0": [1.5, -0.5]},  # a negative probability was accepted
        {"x0": [1.0, 0.0, 0.0]},  # numpy's reshape error
        {"x0": [float("nan"), 1.0]},
        {"y0": [1e3]},  # outside the two-state generator's domain (its rates overflow)
    ],
    ids=["mass-2", "negative", "wrong-size", "nan", "y0-outside"],
)
def test_invalid_start_is_the_same_input_error_as_integrate(start):
    """multirate_map checked neither x0 nor y0: it renormalised x0 silently (mass 2 became 1),
    took negative entries, and failed in numpy on a wrong size. It now refuses them with
    integrate's own sentence."""
    system = fs.make_system("two-state", eps=0.1)
    with pytest.raises(fs.InputError) as via_integrate:
        fs.integrate(system, (0, 0.1), method="multirate", H=0.1, **start)
    with pytest.raises(fs.InputError) as via_map:
        multirate_map(system, 0.1, 1, **start)
    assert str(via_map.value) == str(via_integrate.value)
    assert len(str(via_map.value).splitlines()) == 1


def test_eps_without_integer_P_needs_P():
    system = fs.make_system("birth-death", eps=0.3)
    with pytest.raises(fs.InputError, match="not an integer; pass P"):
        multirate_map(system, 0.05, 2)
    assert multirate_map(system, 0.05, 2, P=3)["P"] == 3
    assert MAX_TOKENS >= 10**6


def test_P_beyond_64_bits_is_refused_before_the_map_runs(tmp_path, monkeypatch):
    """eps = 1e-20 ran the map with P = 1e20 tokens per block, then failed writing the dataset
    (h5py has no type for an int beyond 64 bits): refused before any block now, in the map and
    in integrate. eps = 1e-18 (P = 999999999999999872 < 2**63) runs and its dataset round-trips."""
    import fastslow_sim.multirate as mr

    def no_blocks(*args, **kwargs):
        raise AssertionError("the map ran")

    system = fs.make_system("birth-death", eps=1e-20)
    monkeypatch.setattr(mr, "_propagator", no_blocks)
    for run in (lambda: multirate_map(system, 0.01, 1),
                lambda: fs.integrate(system, (0, 0.01), method="multirate")):  # fmt: skip
        with pytest.raises(fs.InputError, match=r"P = 1e\+20 tokens per block \(eps = 1e-20\) "
                                                r"is more than 2\*\*63 - 1"):  # fmt: skip
            run()
    with pytest.raises(fs.InputError, match="more than 2"):
        multirate_map(fs.make_system("birth-death", eps=0.1), 0.01, 1, P=2**63)
    monkeypatch.undo()
    system = fs.make_system("birth-death", eps=1e-18)
    assert system.P < 2**63
    ds = fs.integrate(system, (0, 0.02), method="multirate")
    fs.save_dataset(ds, tmp_path / "m.nc")
    back = fs.load_dataset(tmp_path / "m.nc")
    assert int(back.attrs["P"]) == system.P == int(back.attrs["tokens_per_block"])
    assert back.attrs["status"] == "success"


def test_a_slow_step_out_of_the_domain_stops_the_map():
    """Michaelis-Menten at H = 5: block 0's Euler step took y from 1 to -0.667, where Q(y) has a
    negative rate (-2.67) and expm an entry -6.73; the map clipped it into a stochastic matrix
    and went on (y = 1, -0.667, 3.009, 0.0056). It stops there now, with one sentence; at H = 2,
    which keeps y positive, it runs as before."""
    system = fs.make_system("michaelis-menten", eps=0.01)
    with pytest.raises(fs.InputError) as err:
        multirate_map(system, 5.0, 3, tokens=False)
    text = str(err.value)
    assert re.fullmatch(
        r"block 0's slow step y \+ H g\(mean x, y\) took y from \[1\.0\] to \[-0\.666666\d*\], "
        r"outside the michaelis-menten generator's domain \[0, 8\.98846e\+306\], where .*; "
        r"expected a smaller H than 5, which keeps y inside\.", text)  # fmt: skip
    assert err.value.block == 0 and err.value.y_blocks.tolist() == [[1.0]]
    # H = 2 keeps y positive: it runs as before, the map's numbers and integrate's the same
    run = multirate_map(system, 2.0, 5, tokens=False)
    np.testing.assert_allclose(run["y_blocks"][:3, 0], [1.0, 0.333300201, 0.0476584805], rtol=1e-8)
    ds = fs.integrate(system, (0.0, 10.0), method="multirate", H=2.0)
    assert ds.attrs["status"] == "success"
    assert ds.attrs["message"] == "5 blocks of slow time H=2, 100 tokens each"
    np.testing.assert_array_equal(ds["y"].values, run["y_blocks"])
    np.testing.assert_array_equal(ds["x"].values, run["x_blocks"])


def test_integrate_reports_the_step_out_of_the_domain_as_a_status():
    """Through integrate the same run ended as non_finite with 'non-finite values in the dataset:
    p_st (5), manifold_distance (1)' and made-up states after t = 5."""
    system = fs.make_system("michaelis-menten", eps=0.01)
    ds = fs.integrate(system, (0.0, 10.0), method="multirate", H=5.0)
    assert ds.attrs["status"] == "left_domain"
    assert re.fullmatch(r"multirate stopped: left_domain at t = 5 \(block 0's slow step .* took y "
                        r"from \[1\.0\] to \[-0\.666666\d*\], outside the michaelis-menten "
                        r"generator's domain .*; a smaller H keeps y inside\)",
                        ds.attrs["message"])  # fmt: skip
    np.testing.assert_array_equal(ds["time"].values, [0.0, 5.0, 10.0])
    np.testing.assert_array_equal(ds["y"].values[0], [1.0])
    np.testing.assert_array_equal(ds["x"].values[0], system.x0)
    assert np.isnan(ds["x"].values[1:]).all() and np.isnan(ds["y"].values[1:]).all()
    # a batch: each trajectory its own status, the one inside the domain unchanged
    y0 = np.array([[1.0], [100.0]])  # saturated: y falls by about 5 a block
    batch = fs.integrate(system, (0.0, 10.0), method="multirate", H=5.0, y0=y0)
    alone = multirate_map(system, 5.0, 2, x0=system.x0, y0=[100.0], tokens=False)
    assert batch["status"].values.tolist() == ["left_domain", "success"]
    np.testing.assert_array_equal(batch["y"].values[1], alone["y_blocks"])

