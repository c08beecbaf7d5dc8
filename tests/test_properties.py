"""Property-based tests (issue 13) over the CLI's numeric options and the public entry points:
whatever the input, no traceback, no NaN reported as success, no partial or replaced file.

Examples are few and derandomised (the same inputs every run, so a failure reproduces), with no
deadline: the whole file stays within about a minute on two cores.
"""

import math
import os
import stat

import numpy as np
import pytest
import torch
import xarray as xr
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_stationary import _exact_gth

import fastslow_sim as fs
from fastslow_sim.cli import main
from fastslow_sim.generators import from_off_diagonal
from fastslow_sim.multirate import multirate_map

SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,  # nothing written under .hypothesis/
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


def one_sentence(err: Exception) -> bool:
    text = str(err)
    return text.endswith(".") and "\n" not in text and "Traceback" not in text


# --- stationary_distribution ----------------------------------------------------------------

log_rate = st.floats(-100, 100, allow_nan=False)


@st.composite
def irreducible_chains(draw):
    """Off-diagonal rates of an irreducible chain: a random cycle through all states (rates
    10^[-100, 100]) plus random extra edges, some of them zero."""
    n = draw(st.integers(2, 6))
    order = draw(st.permutations(range(n)))
    off = np.zeros((n, n))
    for i in range(n):
        off[order[i], order[(i + 1) % n]] = 10.0 ** draw(log_rate)
    for i in range(n):
        for j in range(n):
            if i != j and off[i, j] == 0 and draw(st.booleans()):
                off[i, j] = 10.0 ** draw(log_rate)
    return off


@settings(max_examples=60, **SETTINGS)
@given(irreducible_chains())
def test_stationary_distribution_is_exact_or_refused(off):
    exact = _exact_gth(off)
    Q = from_off_diagonal(off)
    try:
        p = fs.stationary_distribution(Q)
    except fs.InputError as err:  # rates whose censored ratios leave the float range
        assert one_sentence(err) and "cannot be computed" in str(err)
        return
    assert np.all(np.isfinite(p)) and np.all(p >= 0)
    assert abs(p.sum() - 1.0) <= 1e-14 * p.size
    normal = exact > 1e-290
    np.testing.assert_allclose(p[normal], exact[normal], rtol=1e-12, atol=0)
    assert np.all(p[~normal] <= 1e-290)
    # batched and torch: the same numbers
    pb = fs.stationary_distribution(np.stack([Q, Q[::-1, ::-1]]))
    np.testing.assert_allclose(pb[0], p, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(pb[1][::-1], p, rtol=1e-12, atol=1e-300)
    pt = fs.stationary_distribution(torch.tensor(Q)).numpy()  # sums in another order: ulps
    np.testing.assert_allclose(pt, p, rtol=1e-14, atol=1e-300)


# --- integrate, integrate_batch, multirate_map ------------------------------------------------

eps_values = st.floats(1e-12, 0.5).map(lambda e: float(f"{e:.3g}"))
log_eps = st.floats(-12, math.log10(0.5)).map(lambda v: float(f"{10.0**v:.3g}"))


def check_dataset(ds):
    """Success means every value finite and the mass conserved; any other status is named."""
    if ds.attrs["status"] == "success":
        for k in ds.data_vars:
            if ds[k].dtype.kind == "f":
                assert np.all(np.isfinite(ds[k].values)), k
        # mass is conserved up to rounding in the stage solves, whose conditioning grows like
        # 1/eps (the columns of s I - Q^T/eps sum to s): measured 6.7e-7 (torch march) and
        # 1.1e-6 (compiled march) at eps = 1e-12, rtol 1.6e-5; 1e-6 above eps = 2e-12
        bound = max(1e-6, 1e-2 * np.finfo(float).eps / ds.attrs["eps"])
        assert np.max(np.abs(ds["mass_error"].values)) < bound
    else:
        assert ds.attrs["message"]


@settings(max_examples=12, **SETTINGS)
@given(
    system=st.sampled_from(["birth-death", "two-state", "michaelis-menten"]),
    eps=log_eps,
    method=st.sampled_from(["auto", "rodas4", "lsoda", "multirate"]),
    y0=st.floats(-5, 5),
    t_end=st.sampled_from([0.05, 0.5, 2.0]),
)
def test_integrate_never_reports_nan_as_success(system, eps, method, y0, t_end):
    s = fs.make_system(system, eps=eps)
    if system == "michaelis-menten":
        y0 = abs(y0)
    try:
        kw = {"H": t_end / 5} if method == "multirate" else {"n_eval": 21}
        ds = fs.integrate(s, (0, t_end), y0=[y0], method=method, rtol=1e-6, atol=1e-9, **kw)
    except fs.InputError as err:
        assert one_sentence(err)
        return
    check_dataset(ds)


@settings(max_examples=8, **SETTINGS)
@given(
    eps=st.lists(log_eps, min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    t_end=st.sampled_from([0.1, 1.0]),
)
def test_integrate_batch_never_reports_nan_as_success(eps, seed, t_end):
    s = fs.make_system("birth-death", eps=0.1)
    x0, y0 = fs.random_initial_conditions(s, len(eps), seed)
    ds = fs.integrate_batch(s, (0, t_end), x0, y0, eps=eps, rtol=1e-6, atol=1e-9, n_eval=11)
    for b in range(len(eps)):
        if ds["status"].values[b] == "success":
            assert np.all(np.isfinite(ds["x"].values[b])) and np.all(np.isfinite(ds["p_st"][b]))
    assert (ds.attrs["status"] == "success") == all(ds["status"].values == "success")


@settings(max_examples=25, **SETTINGS)
@given(
    eps=st.floats(1e-300, 1.0).map(lambda e: float(f"{e:.3g}")),
    H=st.floats(1e-4, 2.0),
    n_blocks=st.integers(1, 12),
    P=st.one_of(st.none(), st.integers(1, 40), st.sampled_from([10**6, 10**12])),
)
@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_multirate_map_conserves_mass_or_refuses(eps, H, n_blocks, P):
    s = fs.make_system("birth-death", eps=eps)
    try:
        run = multirate_map(s, H, n_blocks, P=P)
    except fs.InputError as err:
        assert one_sentence(err)
        return
    for key in ("x_blocks", "block_mean"):
        assert np.all(np.isfinite(run[key])) and np.all(run[key] >= 0)
        np.testing.assert_allclose(run[key].sum(-1), 1.0, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(run["y_blocks"]))


def bad_input_sentence(output: str) -> bool:
    """Exactly `Error: <one sentence>.`, ours or click's for an unparsable value (which then
    points at the command's help)."""
    lines = output.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("Error: ") and lines[0].endswith(".")


# --- the CLI's numeric options ----------------------------------------------------------------

specials = st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e-300", "1e300", "abc", "1e-13"])


def number(lo, hi):
    """A valid value four times in five (so that whole runs happen), else a special one."""
    valid = st.floats(lo, hi).map(lambda v: f"{v:.3g}")
    return st.one_of(valid, valid, valid, valid, specials)


def _previous(out, ours: bool) -> bytes:
    """Put a file at `out`: an earlier fastslow-sim dataset (`ours`) or the user's notes."""
    out.unlink(missing_ok=True)  # tmp_path is shared by the examples
    if ours:
        fs.save_dataset(xr.Dataset(attrs={"status": "previous"}), out)
    else:
        out.write_bytes(b"previous")
    return out.read_bytes()


@settings(max_examples=30, **SETTINGS)
@given(
    eps=number(1e-12, 0.5),
    t_end=number(0.01, 1.0),
    rtol=number(1e-10, 1e-3),
    atol=number(1e-12, 1e-6),
    y0=number(-3, 3),
    n_eval=st.sampled_from(["11", "2", "11", "11", "0", "1", "2000000", "x"]),
    seed=st.sampled_from(["0", "7", "7", str(2**40), "-1", "1e3"]),
    batch=st.sampled_from([None, None, "2", "0", "-3"]),
    method=st.sampled_from(["auto", "rodas4", "lsoda", "multirate"]),
    ours=st.sampled_from([True, True, True, False]),
)
def test_cli_integrate_options(eps, t_end, rtol, atol, y0, n_eval, seed, batch, method, ours,
                               tmp_path):  # fmt: skip
    out = tmp_path / "r.nc"
    previous = _previous(out, ours)  # an earlier run's dataset: replaced only by a finished run
    args = ["integrate", "--eps", eps, "--t-end", t_end, "--rtol", rtol, "--atol", atol,
            "--n-eval", n_eval, "--method", method, "--out", str(out),
            "--no-plot", "--json"]  # fmt: skip
    if batch is None:
        args += ["--y0", y0]
    else:  # --seed seeds the batch's draw (refused without --batch)
        args += ["--batch", batch, "--seed", seed]
    if method == "multirate":
        args += ["--H", t_end]
    res = CliRunner().invoke(main, args)
    event(f"exit {res.exit_code}: {res.output.strip().splitlines()[-1][:60]}")
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code in (0, 1, 2), res.output
    assert not list(tmp_path.glob("*.part"))
    if not ours:  # a file that fastslow-sim did not write is never replaced, whatever else
        assert res.exit_code == 2 and out.read_bytes() == previous, res.output
    if res.exit_code == 2:  # bad input: one sentence (after click's usage line for a value
        # that is not a number at all), the old file untouched
        assert bad_input_sentence(res.output), res.output
        assert out.read_bytes() == previous
        return
    if res.output.startswith("Error: "):  # a failed computation: one sentence, file untouched
        assert res.exit_code == 1 and out.read_bytes() == previous
        return
    ds = fs.load_dataset(out)  # a finished run replaced it with a complete dataset
    assert stat.S_ISREG(os.stat(out).st_mode)
    if res.exit_code == 0:
        assert "success" in ds.attrs["status"] or ds.attrs["status"] == "success"
        check_dataset(ds) if "batch" not in ds.dims else None
    else:
        assert ds.attrs["status"] != "success"


@settings(max_examples=12, **SETTINGS)
@given(
    kappa=number(-40, 40),
    osc_eps=number(1e-3, 0.5),
    y_lo=number(-3, 0),
    y_hi=number(0.5, 3),
)
def test_cli_manifold_options(kappa, osc_eps, y_lo, y_hi, tmp_path):
    out = tmp_path / "m.nc"
    previous = _previous(out, True)
    args = ["manifold", f"--kappa={kappa}", f"--osc-eps={osc_eps}", "--y-range", y_lo, y_hi,
            "--out", str(out), "--no-plot", "--json"]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code in (0, 1, 2), res.output
    if res.exit_code != 0:
        assert "Error: " in res.output and out.read_bytes() == previous
    else:
        assert fs.load_dataset(out).attrs["gap"] >= 0
    assert not list(tmp_path.glob("*.part"))


@pytest.mark.parametrize("values", ["0.02,0.01", "0.02,0.02", "1e-300,1e-301", "0.5,0.4,nan"])
@pytest.mark.slow
def test_cli_convergence_eps_lists(values, tmp_path):
    res = CliRunner().invoke(main, ["convergence", "--eps", values, "--t-end", "1",
                                    "--out", str(tmp_path / "c.nc"), "--no-plot", "--json"])  # fmt: skip
    assert "Traceback" not in res.output and res.exit_code in (0, 1, 2), res.output
    if res.exit_code == 2:
        assert bad_input_sentence(res.output), res.output


@settings(max_examples=10, **SETTINGS)
@given(
    log_eps=st.floats(-12, math.log10(0.5)),
    t_end=st.floats(0.05, 2.0),
    rtol=st.floats(1e-9, 1e-4),
    method=st.sampled_from(["auto", "rodas4", "lsoda", "multirate"]),
    system=st.sampled_from(["birth-death", "two-state", "michaelis-menten"]),
)
def test_cli_integrate_valid_options_run(log_eps, t_end, rtol, method, system, tmp_path):
    # valid values only: every run finishes with a complete, finite dataset (or a named failure).
    # The neighbour chains only: on the dense 8-state `random` system at eps = 1e-12 rodas4 needs
    # 35,773 steps (76 s) at rtol 1e-8, where the birth-death chain needs 421 (see NOTES-13)
    out = tmp_path / "r.nc"
    P = max(1, round(10.0**-log_eps))
    args = ["integrate", "--system", system, "--P", str(P), "--t-end", f"{t_end:.3g}",
            "--method", method, "--out", str(out), "--no-plot", "--json"]  # fmt: skip
    if method == "multirate":  # the map takes no tolerance: --rtol with it is refused
        args += ["--H", f"{float(f'{t_end:.3g}') / 4:.17g}"]
    else:
        args += ["--rtol", f"{rtol:.3g}"]
    res = CliRunner().invoke(main, args)
    event(f"exit {res.exit_code}")
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert res.exit_code in (0, 1), res.output
    ds = fs.load_dataset(out)
    if res.exit_code == 0:
        check_dataset(ds)
    else:
        assert ds.attrs["status"] != "success"
