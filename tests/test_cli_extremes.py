"""The ODE commands at the extremes (issue 13): every numeric option validated, failures in one
sentence, special files never replaced. These run as root too (no skip): /dev/full, a FIFO and
a socket refuse the same way for every user."""

import json
import os
import re
import socket
import stat

import numpy as np
import pytest
from click.testing import CliRunner

import fastslow_sim as fs
from fastslow_sim.cli import main
from fastslow_sim.io import atomic_path, save_dataset


def invoke(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


@pytest.mark.parametrize(
    "args, fragment",
    [
        # the cases of issue 13 that ended in a traceback
        (["integrate", "--eps", "1e-300"], "below 1e-12"),
        (["integrate", "--eps", "1e-200"], "below 1e-12"),
        (["integrate", "--P", "1" + "0" * 20], "below 1e-12"),
        (["convergence", "--eps", "1e-300,1e-301"], "must lie in [1e-05, 0.5]"),
        (["integrate", "--eps", "0.1", "--batch", "2", "--seed", "-1"], "--seed must be a non-neg"),
        (["manifold", "--kappa", "1e300"], "--kappa must be a finite number >= -30"),
        (["manifold", "--kappa", "-31"], "--kappa must be a finite number >= -30"),
        (["manifold", "--osc-eps", "1e-300"], "--osc-eps must be a finite number >= 1e-09"),
        (["manifold", "--osc-eps", "1e-10"], "--osc-eps must be a finite number >= 1e-09"),
        (["manifold", "--osc-eps", "2"], "<= 1"),
        (["convergence", "--eps", "0.01,0.01"], "must be distinct"),
        (["convergence", "--eps", "0.02,0.01,0.02"], "[0.02] repeated"),
        (["convergence", "--eps", "0.9,0.1"], "must lie in"),
        # integrated on (the explicit reduced solve's steps stay O(1)): it hung
        (["convergence", "--t-end", "1e300"], "--t-end=1e+300 is beyond 1000: "),
        (["convergence", "--t-end", "1000.001"], "--t-end=1000.001 is beyond 1000"),
        # and the rest of the numeric options
        (["integrate", "--eps", "0.1", "--n-eval", "1"], "--n-eval must be an integer from 2"),
        (["integrate", "--eps", "0.1", "--n-eval", "10000000"], "--n-eval must be an integer"),
        (["integrate", "--eps", "0.1", "--batch", "0"], "--batch must be an integer from 1"),
        (["integrate", "--eps", "0.1", "--rtol", "1"], "--rtol must be a positive number below 1"),
        (["integrate", "--eps", "0.1", "--rtol", "nan"], "--rtol must be a positive"),
        (["integrate", "--eps", "0.1", "--rtol", "1e-20"], "--rtol must be at least"),
        (["integrate", "--eps", "0.1", "--atol", "0"], "--atol must be a positive"),
        (["integrate", "--eps", "0.1", "--atol", "inf"], "--atol must be a positive"),
        (["integrate", "--eps", "0.1", "--t-end", "inf"], "--t-end must be a positive finite"),
        (["integrate", "--eps", "0.1", "--y0", "1e300"], "y0=[1e+300] is outside the birth-death "
                                                          "generator's domain [-inf, 177.023]"),
        # inside the domain, but the rates over eps are beyond float64 (e^706 / 1e-3)
        (["integrate", "--eps", "1e-3", "--y0", "177"], "not finite at y0 = [177.0]"),
        (["integrate", "--eps", "0.1", "--system", "cycle", "--y0", "-1e6"],
         "y0=[-1000000.0] is outside the cycle generator's domain [-1415.17, 1415.17], where its "
         "rates and their Jacobian are finite."),
        # domain() was the real line: "continuation stalled near y=354.545", exit status 1
        (["manifold", "--system", "two-state", "--kappa", "0", "--y-range", "-1e6", "1e6"],
         "Error: the y range [-1000000, 1000000] leaves the two-state generator's domain [-inf, "
         "353.995], where its rates and their Jacobian are finite."),
        (["manifold", "--system", "random", "--kappa", "0", "--y-range", "0", "1e6"],
         "leaves the random generator's domain [-364.899, 577.677]"),
        # 4.2e-5 beyond the edge, 177.0234584: the range is printed as given, the edge inward
        (["manifold", "--kappa", "0", "--y-range", "0", "177.0235"],
         "the y range [0, 177.0235] leaves the birth-death generator's domain [-176.599, "
         "177.023], where its rates are positive and finite."),
        (["integrate", "--eps", "0.1", "--y0", "nan"], "must be finite"),
        # rates of 1e174 at y0 = 100 (inside the domain): an explicit method's stable step is
        # 1e-174, so it never reaches t_end (rk45 ran for ever, dop853 stopped, failed)
        (["integrate", "--eps", "0.125", "--y0", "100", "--t-end", "1", "--method", "rk45"],
         "Error: the explicit method 'rk45' is stable only with steps up to about 5.84e-174"),
        (["integrate", "--eps", "0.125", "--y0", "100", "--method", "dopri5"],
         "below ten float64 spacings of the times near t_end (8.88e-15), so it cannot reach"),
        (["integrate", "--eps", "0.1", "--H", "0.5"], "--H is the block length"),
        (["integrate", "--eps", "0.1", "--method", "multirate", "--H", "0"], "--H must be"),
        (["integrate", "--eps", "0.1", "--method", "multirate", "--H", "nan"], "--H must be"),
        (["integrate", "--eps", "0.1", "--method", "multirate", "--H", "0.3"], "whole number"),
        (["integrate", "--eps", "0.3", "--method", "multirate", "--H", "0.5"], "not an integer"),
        # a saved state per block: blocks beyond what can be saved (a MemoryError traceback at
        # --t-end 1e9, "Maximum allowed dimension exceeded" at --H 1e-300) are refused
        (["integrate", "--eps", "0.1", "--method", "multirate", "--t-end", "1e9"], "blocks"),
        (["integrate", "--eps", "0.1", "--method", "multirate", "--H", "1e-300"], "blocks"),
        # a y0 of the wrong length ran silently from its first entry (y0 = 1)
        (["integrate", "--eps", "0.1", "--y0", "1,2"],
         "y0 must have 1 entry, one per slow variable of the birth-death system; got 2 "
         "([1.0, 2.0])."),
        (["integrate", "--eps", "0.1", "--system", "two-state", "--x0", "1,0,0"],
         "x0 must have 2 entries, one per state of the two-state system; got 3"),
        # options that did nothing, or contradicted each other, were accepted
        (["integrate", "--eps", "0.1", "--seed", "3"], "and no --batch was given (got --seed 3)"),
        (["integrate", "--eps", "0.1", "--plot", "a.png"],
         "--plot a.png asks for a plot and --no-plot for none"),
        (["integrate", "--eps", "0.1", "--batch", "2", "--seed", str(2**63)],
         f"at most 2**63 - 1 = {2**63 - 1:,}"),
        # P = 1e20 tokens per block ran, then the dataset's int P failed in h5py (a traceback)
        (["integrate", "--eps", "1e-20", "--method", "multirate", "--t-end", "0.01"],
         "P = 1e+20 tokens per block (eps = 1e-20) is more than 2**63 - 1"),
        (["integrate", "--P", str(2**63), "--method", "multirate", "--t-end", "0.01"],
         "is more than 2**63 - 1"),
        # 1/eps overflowed: OverflowError, exit status 1
        (["integrate", "--eps", "5e-324"], "below 1e-12"),
        (["integrate", "--eps", "5e-324", "--method", "multirate"], "1/eps = inf"),
        # t_eval of equal times: "t_eval not sorted" from scipy
        (["integrate", "--eps", "0.1", "--t-end", "5e-324"],
         "is too short for 401 distinct equally spaced saved times"),
        (["integrate", "--eps", "0.1", "--t-end", "1e-306"], "below 2.23e-308"),
        # the bound was 1e-150 for every method ('the tested range'); now each method's own
        (["integrate", "--eps", "0.1", "--atol", "1e-301"],
         "--atol must be at least 1e-300 with method 'auto' (it was tested down to 1e-300"),
        (["integrate", "--eps", "0.1", "--atol", "1e-160", "--method", "dop853"],
         "--atol must be at least 1e-155 with method 'dop853' (it was tested down to 1e-155; at "
         "1e-170 on the default run its error norm, the error over atol squared, overflows"),
        # '--plot --no-plot' took '--no-plot' as the plot's file name and wrote a PNG of that name
        (["integrate", "--eps", "0.1", "--plot"], "--plot takes a file name; got '--no-plot'"),
        # 'log(0.01) == log(0.010000000000000002)': the slopes' fit printed 0.948, 1.513 at exit 0
        (["convergence", "--system", "two-state", "--eps", "0.01,0.010000000000000002,0.1"],
         "--eps values 0.01, 0.010000000000000002 in '0.01,0.010000000000000002,0.1' have the "
         "same logarithm in float64"),
        # a numpy _ArrayMemoryError traceback after the draw of the initial conditions
        (["integrate", "--eps", "0.1", "--batch", "1000000", "--n-eval", "1000000"],
         "GiB of memory for the solution and its dataset, more than this machine's"),
    ],
)
def test_bad_numeric_options_are_one_sentence_and_exit_2(args, fragment, tmp_path, monkeypatch):
    res = invoke([*args, "--no-plot"], tmp_path, monkeypatch)
    assert res.exit_code == 2, res.output
    assert fragment in res.output
    assert res.output.startswith("Error: ") and res.output.count("\n") == 1
    # nothing on disk, not even the default output folder (integrate --y0 1,2 and --t-end
    # 5e-324 made ./fastslow-results before refusing)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args",
    [
        ["integrate", "--eps", "1e-12", "--method", "rodas4", "--t-end", "1"],
        ["integrate", "--eps", "1e-12", "--method", "multirate", "--H", "0.05", "--t-end", "1"],
        ["integrate", "--eps", "1e300", "--t-end", "1"],
        ["integrate", "--eps", "0.1", "--y0", "30", "--t-end", "0.5"],
        # rates of 1e173 and 1e294 (the domain ends at y = 177.02): status non_finite, a NaN
        # table and exit 1 before (the first step's norm of f(z0) / atol overflowed)
        ["integrate", "--eps", "0.125", "--y0", "100", "--t-end", "1"],
        ["integrate", "--eps", "0.125", "--y0", "170", "--t-end", "1", "--method", "lsoda"],
        ["integrate", "--eps", "0.125", "--y0", "170", "--t-end", "1", "--method", "bdf"],
        # radau ran for ever at y0 >~ 80: scipy kept its Jacobian from t = 0 (see
        # test_rodas4_extremes.test_rates_near_the_float_range)
        ["integrate", "--eps", "0.125", "--y0", "100", "--t-end", "1", "--method", "radau"],
        # |f(z0)| / atol beyond float64 (from y0 = 172): scipy's ValueError 'array must not
        # contain infs or NaNs' (radau, bdf) and 200,000 steps at t = 0 (lsoda) before
        ["integrate", "--eps", "0.125", "--y0", "175", "--t-end", "1", "--method", "radau"],
        ["integrate", "--eps", "0.125", "--y0", "177.02", "--t-end", "1", "--method", "bdf"],
        ["integrate", "--eps", "0.125", "--y0", "177.02", "--t-end", "1", "--method", "lsoda"],
        ["integrate", "--eps", "0.1", "--batch", "3", "--seed", "4", "--t-end", "1"],
        ["integrate", "--P", "16", "--method", "multirate", "--H", "0.25", "--t-end", "1"],
        # P = 999999999999999872 tokens per block (below 2**63): by doubling, and stored
        ["integrate", "--eps", "1e-18", "--method", "multirate", "--t-end", "0.01"],
    ],
)
def test_extreme_valid_input_integrates(args, tmp_path, monkeypatch):
    res = invoke([*args, "--no-plot", "--json", "--out", "r.nc"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    ds = fs.load_dataset(tmp_path / "r.nc")
    assert ds.attrs["status"] == "success"
    for k in ds.data_vars:
        if ds[k].dtype.kind == "f":
            assert np.all(np.isfinite(ds[k].values)), k
    assert np.max(np.abs(ds["mass_error"].values)) < 1e-7


@pytest.mark.parametrize("system, y_range", [("two-state", ("350", "353.995")),
                                              ("birth-death", ("170", "177.023"))])  # fmt: skip
def test_manifold_up_to_the_printed_edge_of_the_domain(system, y_range, tmp_path, monkeypatch):
    """The edge that the refusal prints (rounded inward) is inside the domain: the range up to it
    is traced to its end, one stable branch."""
    args = ["manifold", "--system", system, "--kappa", "0", "--y-range", *y_range, "--json"]
    res = invoke([*args, "--no-plot", "--out", "m.nc"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    (branch,) = json.loads(res.output)["branches"]
    assert branch["stable"] and [branch["y_min"], branch["y_max"]] == [float(v) for v in y_range]


def test_far_mass_run_of_issue_13_has_a_finite_p_st(tmp_path, monkeypatch):
    # issue 13: exit 0, status success, 124 of 401 p_st rows NaN
    args = ["integrate", "--eps", "0.1", "--y0", "30", "--t-end", "0.5", "--no-plot", "--out"]
    res = invoke([*args, "r.nc"], tmp_path, monkeypatch)
    assert res.exit_code == 0
    ds = fs.load_dataset(tmp_path / "r.nc")
    p = ds["p_st"].values
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(-1), 1.0, rtol=0, atol=1e-14)
    gen = fs.make_system("birth-death", eps=0.1).generator
    np.testing.assert_allclose(p, gen.closed_form(ds["y"].values), rtol=1e-12, atol=1e-300)


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path), None


def _socket(tmp_path):
    path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return str(path), s


def _device(tmp_path):
    return "/dev/full", None


@pytest.mark.parametrize("make", [_device, _fifo, _socket], ids=["device", "fifo", "socket"])
@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_special_file_target_is_refused_and_never_replaced(make, option, tmp_path, monkeypatch):
    # issue 13: --out /dev/full exited 0 after replacing the device with a regular file
    target, keep = make(tmp_path)
    before = os.stat(target)
    try:
        args = ["integrate", "--eps", "0.1", "--t-end", "0.5", option, target]
        if option == "--plot":
            args += ["--out", str(tmp_path / "r.nc")]
        res = invoke(args, tmp_path, monkeypatch)
        assert res.exit_code == 2, res.output
        assert "not a regular file" in res.output and res.output.count("\n") == 1
        after = os.stat(target)
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
        assert not stat.S_ISREG(after.st_mode) and after.st_ino == before.st_ino
        assert not list(tmp_path.rglob("*.part")) and not list(tmp_path.rglob("*.nc"))
    finally:
        if keep is not None:
            keep.close()


def test_atomic_write_refuses_a_target_that_became_special(tmp_path):
    # the check is repeated just before the rename: a FIFO that appears meanwhile survives
    target = tmp_path / "out.nc"
    ds = fs.integrate(fs.make_system("two-state", eps=0.1), (0, 1), n_eval=5)
    with pytest.raises(fs.InputError, match="FIFO, not a regular file"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"data")
            os.mkfifo(target)
    assert stat.S_ISFIFO(os.stat(target).st_mode)
    assert not list(tmp_path.glob("*.part"))
    # an earlier dataset of ours is replaced, and a link to one is followed (it stays a link)
    regular = tmp_path / "a.nc"
    save_dataset(fs.integrate(fs.make_system("birth-death", eps=0.1), (0, 1), n_eval=5), regular)
    link = tmp_path / "link.nc"
    link.symlink_to(regular)
    save_dataset(ds, link)
    assert link.is_symlink() and fs.load_dataset(regular).attrs["system"] == "two-state"
    # a file of the user's that appears meanwhile survives too
    with pytest.raises(fs.InputError, match="did not write"):
        with atomic_path(target.with_name("late.nc")) as tmp:
            tmp.write_bytes(b"data")
            target.with_name("late.nc").write_bytes(b"the user's")
    assert target.with_name("late.nc").read_bytes() == b"the user's"
    assert not list(tmp_path.glob("*.part"))


def test_states_sets_the_size_of_the_chain(tmp_path):
    r = CliRunner().invoke(main, ["integrate", "--eps", "0.01", "--states", "16", "--no-plot",
                                  "--out", str(tmp_path / "a.nc"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert len(summary["x_final"]) == 16 and abs(sum(summary["x_final"]) - 1) < 1e-12
    # on the manifold after the layer: p_st of the 16-state chain at the final y
    assert summary["manifold_distance_final"] < 1e-2
    for args, fragment in [
        (["--states", "1"], "states must be an integer >= 2 and <= 4096; got 1"),
        (["--states", "2", "--system", "cycle"], "states must be an integer >= 3"),
        (["--states", "3", "--system", "two-state"], "two-state system has 2 states"),
    ]:
        r = CliRunner().invoke(main, ["integrate", "--eps", "0.1", "--no-plot", "--out",
                                      str(tmp_path / "b.nc"), *args])  # fmt: skip
        assert r.exit_code == 2 and fragment in r.output, r.output
        assert not (tmp_path / "b.nc").exists()


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_failed_solve_reports_no_mass_error_and_strict_json(tmp_path, monkeypatch, failing_march):
    """A solve that went non-finite (rodas4 at rtol 2.3e-14 over 1e11) printed
    `max |1^T x - 1| = 0.0` (a NaN-ignoring max over NaN) and `--json` printed NaN, which strict
    JSON parsers refuse: now the mass error is NaN in text, null in JSON, and every number is
    finite or null. That run failed only because its error norm squared e / atol = 1e300 and
    overflowed; it succeeds now, so here the march fails as a march does, NaN from a step on
    with the status non_finite."""
    monkeypatch.chdir(tmp_path)
    args = ["integrate", "--eps", "0.1", "--t-end", "1", "--method", "rodas4", "--no-plot",
            "--out", "o.nc"]  # fmt: skip
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 1, r.output
    data = _strict_json(r.output)
    assert data["status"] == "non_finite"
    assert data["mass_error_max"] is None and data["x_final"][0] is None
    assert np.isnan(fs.load_dataset("o.nc")["mass_error"].values).any()


def test_a_scipy_solve_out_of_steps_is_a_failure_with_its_budget(tmp_path, monkeypatch):
    """No scipy solve runs for ever (radau at y0 = 100 did): one that spends its budget of steps
    ends with the status max_steps and a message naming the budget and how to raise it, exit 1,
    and no number of the states after it printed as a result."""
    from fastslow_sim.solvers import scipy_ivp

    monkeypatch.setattr(scipy_ivp, "MAX_STEPS", 20)
    args = ["integrate", "--eps", "0.125", "--y0", "100", "--t-end", "1", "--method", "radau",
            "--no-plot", "--out", "o.nc"]  # fmt: skip
    res = invoke(args, tmp_path, monkeypatch)
    assert res.exit_code == 1, res.output
    (status,) = [ln for ln in res.output.splitlines() if ln.startswith("status")]
    assert status.split()[1] == "max_steps:" and "success" not in status
    assert "radau stopped after max_steps = 20 steps at t = " in status
    assert "raise it with --max-steps N on the command line, max_steps=N in Python" in status
    data = _strict_json(invoke([*args, "--json"], tmp_path, monkeypatch).output)
    assert data["status"] == "max_steps" and data["y_final"] == [None]


@pytest.mark.parametrize("method", ["radau", "lsoda", "rodas4", "dopri5", "auto"])
def test_max_steps_sets_the_budget_that_the_message_names(method, tmp_path, monkeypatch):
    """The message of a spent budget said 'raise it with integrate(..., max_steps=N)', and the
    command line had no such option: --max-steps N sets it for every method that counts steps,
    and the message names it (and the Python argument). One saved interval (--n-eval 2), where
    torchdiffeq's old count of its budget between two saved times was the same as a whole run's."""
    args = ["integrate", "--eps", "0.125", "--t-end", "1", "--n-eval", "2", "--method", method,
            "--no-plot", "--out", "o.nc"]  # fmt: skip
    res = invoke([*args, "--max-steps", "5"], tmp_path, monkeypatch)
    assert res.exit_code == 1, res.output
    (status,) = [ln for ln in res.output.splitlines() if ln.startswith("status")]
    assert status.split()[1] == "max_steps:", status
    assert "max_steps = 5 steps" in status
    assert "raise it with --max-steps N on the command line, max_steps=N in Python" in status
    ok = invoke([*args, "--max-steps", "1e5", "--json"], tmp_path, monkeypatch)
    assert ok.exit_code == 0, ok.output
    assert _strict_json(ok.output)["status"] == "success"


@pytest.mark.parametrize("method, budget, rtol", [("dopri5", 20, "1e-8"), ("dopri8", 5, "1e-8"),
                                                  ("bosh3", 100, "1e-8"),
                                                  ("adaptive_heun", 100, "1e-4")])  # fmt: skip
def test_torchdiffeq_max_steps_bounds_the_whole_run(method, budget, rtol, tmp_path, monkeypatch):
    """torchdiffeq counted --max-steps between two saved times, so with the default 401 saved
    times a run could take 400 times the budget. On the two-state system at eps 0.5 over [0, 1]
    (measured: 60, 18, 579 and 251 steps in all, at most 2, 2, 17 and 16 between two saved
    times; adaptive_heun at rtol 1e-4, which at 1e-8 takes 24,420 steps, 30 s here) these
    budgets let each finish with status success. The budget is now the whole
    run's, as for every other method: it stops with status max_steps, the time reached and the
    wording of the others, exit 1, the saved times it passed equal to the finished run's and NaN
    after them."""
    args = ["integrate", "--system", "two-state", "--eps", "0.5", "--t-end", "1", "--method",
            method, "--rtol", rtol, "--atol", f"{float(rtol) / 100:g}", "--no-plot", "--out",
            "o.nc"]  # fmt: skip
    full = invoke([*args, "--json"], tmp_path, monkeypatch)
    assert full.exit_code == 0, full.output
    x_full = fs.load_dataset(tmp_path / "o.nc")["x"].values
    res = invoke([*args, "--max-steps", str(budget)], tmp_path, monkeypatch)
    assert res.exit_code == 1, res.output
    (status,) = [ln for ln in res.output.splitlines() if ln.startswith("status")]
    match = re.fullmatch(
        rf"status +max_steps: {method} stopped after max_steps = {budget:,} steps at t = (\S+), "
        r"the "
        r"budget that bounds its work; raise it with --max-steps N on the command line, "
        r"max_steps=N in Python if the run is slow but advancing\.",
        status,
    )
    assert match, status
    t_reached = float(match.group(1))
    ds = fs.load_dataset(tmp_path / "o.nc")
    assert ds.attrs["status"] == "max_steps"
    t, x = ds["time"].values, ds["x"].values
    passed = t <= t_reached
    assert 0 < t_reached < 1 and 1 < passed.sum() < len(t)
    np.testing.assert_array_equal(x[passed], x_full[passed])  # the same steps: the same values
    assert np.isnan(x[~passed]).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-steps", "0"], "--max-steps must be a positive integer; got '0'."),
        (["--max-steps", "1.5"], "--max-steps must be a positive integer; got '1.5'."),
        (["--max-steps", "many"], "--max-steps must be a positive integer; got 'many'."),
        (["--max-steps", "1e30"], "--max-steps must be at most 2**63 - 1 = "
                                  f"{2**63 - 1:,} (the rodas4 march counts its steps in a 64-bit "
                                  "integer); got '1e30'."),
        (["--method", "multirate", "--max-steps", "10"],
         "--max-steps bounds the steps of the ODE solvers, and --method multirate counts none; "
         "expected no --max-steps with it."),
        # accepted and ignored: rtol 0.5, atol 0.9 printed and stored, 501 saved times for 3
        (["--method", "multirate", "--rtol", "0.5"],
         "--rtol sets the ODE solvers' relative tolerance, and --method multirate takes no "
         "tolerance and saves one state per block of --H; expected no --rtol with it."),
        (["--method", "multirate", "--atol", "1e-10"],
         "--atol sets the ODE solvers' absolute tolerance, and --method multirate takes no "
         "tolerance and saves one state per block of --H; expected no --atol with it."),
        (["--method", "multirate", "--n-eval", "3"],
         "--n-eval sets the ODE solvers' saved times, and --method multirate takes no "
         "tolerance and saves one state per block of --H; expected no --n-eval with it."),
        (["--method", "multirate", "--rtol", "0.5", "--atol", "0.9", "--n-eval", "3"],
         "--rtol and --atol and --n-eval set the ODE solvers' tolerances and saved times, and "
         "--method multirate takes no tolerance and saves one state per block of --H; expected "
         "no --rtol or --atol or --n-eval with it."),
        # the library's argument names were printed (y0, x0, n_eval) for the options
        (["--y0", "1,2"], "--y0 must have 1 entry, one per slow variable of the birth-death "
                          "system; got 2 ([1.0, 2.0])."),
        (["--x0", "0.5,0.5"], "--x0 must have 8 entries, one per state of the birth-death "
                              "system; got 2 ([0.5, 0.5])."),
        (["--x0", "0.5,0.6,0,0,0,0,0,0"], "--x0 must be a probability vector"),
        # only the option at fault: the default --x0 was named beside it
        (["--y0", "nan"], "--y0 must be finite; got --y0=[nan]."),
        (["--x0", "nan,0,0,0,0,0,0,1", "--y0", "inf"],
         "--x0 and --y0 must be finite; got --x0=[nan, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], "
         "--y0=[inf]."),
        (["--t-end", "1e-303", "--n-eval", "1000000"],
         "is too short for 1,000,000 distinct equally spaced saved times: their spacing 1e-309 "
         "is below 2.23e-308, the smallest normal float64 (smaller times lose digits); expected "
         "a longer span or fewer saved times (--n-eval)."),
        # big numbers were printed without digit grouping (got 1000000000)
        (["--n-eval", "1000000000"], "--n-eval must be an integer from 2 to 1,000,000; got "
                                     "1,000,000,000."),
        (["--batch", "1000000000"], "--batch must be an integer from 1 to 1,000,000; got "
                                    "1,000,000,000."),
    ],
)
def test_integrate_refusals_name_the_options_in_one_sentence(args, message, tmp_path, monkeypatch):
    res = invoke(["integrate", "--eps", "0.125", *args, "--no-plot"], tmp_path, monkeypatch)
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith("Error: ") and message in line, line
    assert not (tmp_path / "fastslow-results").exists()


def test_json_text_is_strict():
    from fastslow_sim.cli.common import json_text

    text = json_text({"a": float("nan"), "b": [np.float32(1.5), float("inf"), np.int64(3)],
                      "c": np.array([1.0, np.nan]), "d": (None, "x")})  # fmt: skip
    assert _strict_json(text) == {"a": None, "b": [1.5, None, 3], "c": [1.0, None], "d": [None, "x"]}


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["mapping"], ["--help"], ["--version"], ["integrate", "--eps", "0.125", "--t-end", "0.5",
                                                "--no-plot", "--out", "d.nc", "--json"]])  # fmt: skip
def test_stdout_that_cannot_take_the_output_is_one_sentence(args, tmp_path):
    """`> /dev/full` ended in an OSError traceback: now one sentence on stderr and exit 1; the
    dataset a command writes is written first and complete."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this tree, not another installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "fastslow_sim", *args], stdout=full, env=env,
                           stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: standard output cannot take the printed output (No space left on device).")
    if "--out" in args:
        assert fs.load_dataset(tmp_path / "d.nc").attrs["status"] == "success"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.slow
def test_sweep_on_a_cluster_into_a_full_stdout_blames_stdout_not_the_store(tmp_path):
    """`sweep --workers 1 > /dev/full` said "a file operation failed on 's.zarr': No space left
    on device (no cell had finished: the new store is removed)." when its `dask:` line could
    not be printed: the print's error named no file and was taken for a write into the store.
    Now it is standard output that is blamed, as with --workers 0, and the store is kept."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this tree, not another installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "fastslow_sim", "sweep", "manifold", "--grid",
                            "kappa=0,1", "--workers", "1", "--store", "s.zarr"], stdout=full,
                           env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: standard output cannot take the printed output (No space left on device).")
    assert (tmp_path / "s.zarr" / "zarr.json").is_file()


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_long_p_st_analysis_is_announced_before_the_run(tmp_path, monkeypatch):
    """`--system cycle --states 2048` at the default 401 saved states means 401 GTH eliminations
    of 2048 x 2048 (1.1e12 operations, minutes here): a warning says so before the run starts; a
    small run prints none (1,024 states: 1.4e11, about 20 s), nor does a neighbour chain (O(n)
    per point) of 4096 states."""
    import fastslow_sim.integrators as integ

    class StopError(Exception):
        pass

    def refuse(*args, **kwargs):
        raise StopError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(integ, "integrate", refuse)  # the warning must come before the solve
    args = ["integrate", "--eps", "0.1", "--no-plot", "--system"]
    r = CliRunner().invoke(main, [*args, "cycle", "--states", "2048"])
    assert isinstance(r.exception, StopError)
    assert "Warning: p_st(y(t)) at 401 saved states of a 2048-state chain is about 1.1e+12" in r.output
    assert "1.5 to 3.8 minutes at the 5-13 GFLOP/s" in r.output
    for system, states in [("cycle", "64"), ("cycle", "1024"), ("birth-death", "4096")]:
        r = CliRunner().invoke(main, [*args, system, "--states", states])
        assert isinstance(r.exception, StopError) and "Warning" not in r.output


def test_a_plot_format_that_cannot_be_written_here_is_refused_before_any_work(tmp_path, monkeypatch):
    """`--plot p.xyz` (no such format) and `--plot p.pgf` without the TeX engine that matplotlib
    typesets .pgf with (it failed after the run): exit 2, one sentence, no folder made."""
    import shutil

    import fastslow_sim.integrators as integ

    def refuse(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(integ, "integrate", refuse)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if "tex" in name else real_which(name))
    for plot, words in [("p.xyz", "asks for format 'xyz', which matplotlib cannot write"),
                        ("p.pgf", "which matplotlib writes with xelatex (rcParams['pgf.texsystem']), "
                                  "and xelatex is not installed here")]:  # fmt: skip
        r = CliRunner().invoke(main, ["integrate", "--eps", "0.1", "--plot", plot])
        assert r.exit_code == 2 and words in r.output, r.output
        assert "Traceback" not in r.output and not list(tmp_path.iterdir())


def test_a_tex_engine_that_fails_is_one_sentence_after_the_dataset(tmp_path, monkeypatch):
    """xelatex on the PATH but broken: the dataset is written, the .pgf plot is not, and the
    failure is one sentence with exit status 1 (it was a 115-line LatexError traceback)."""
    fake = tmp_path / "bin" / "xelatex"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'broken install' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    r = invoke(["integrate", "--eps", "0.1", "--t-end", "0.5", "--out", "a.nc", "--plot", "p.pgf"],
               tmp_path, monkeypatch)  # fmt: skip
    assert r.exit_code == 1 and "xelatex failed to typeset the figure's text" in r.output
    assert (tmp_path / "a.nc").is_file() and not (tmp_path / "p.pgf").exists()
    assert not list(tmp_path.glob(".*part"))


def test_the_memory_refusal_names_the_size_and_the_options(tmp_path, monkeypatch):
    """--batch 1,000,000 at --n-eval 1,000,000 of the 9-variable default system: the solver's
    (n + m) states twice (solution and dataset), p_st and x - p_st (2n), the manifold distance
    and the mass error, 8 bytes each: 8e12 (2*9 + 17 + 1) = 2.88e14 bytes = 2.68e5 GiB."""
    res = invoke(["integrate", "--eps", "0.1", "--batch", "1000000", "--n-eval", "1000000",
                  "--no-plot"], tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 2, res.output
    # 8 bytes x 1e12 points x (2 x 9 variables + 17 for p_st, its temporary and the manifold
    # distance + 1 mass error) = 2.88e14 bytes, printed grouped as a count (it read 2.68e+05)
    assert "1,000,000 trajectories at 1,000,000 saved times of 9 variables need about " \
           "268,000 GiB" in res.output  # fmt: skip
    assert "expected fewer trajectories (--batch) or saved times (--n-eval)." in res.output
    assert not (tmp_path / "fastslow-results").exists()  # refused before the default folder


@pytest.mark.parametrize(
    "args",
    [
        # LSODA's first step 1/sqrt(1/(tol t_end^2) + ...) was 1/sqrt(inf) = 0: a hang
        ["--t-end", "1e-200"],
        ["--t-end", "1e-300", "--method", "lsoda"],
        # ... and 1/sqrt(... + tol (|f| / atol)^2) = 0 at fast rates over a tiny atol
        ["--atol", "1e-150", "--t-end", "0.5"],
        ["--eps", "1e-8", "--method", "lsoda", "--atol", "1e-150", "--t-end", "0.5"],
    ],
)
@pytest.mark.slow
def test_lsoda_at_a_tiny_span_or_atol_finishes(args, tmp_path):
    """In a subprocess under a time limit: before, these never returned."""
    import subprocess
    import sys

    eps = [] if "--eps" in args else ["--eps", "0.125"]
    cmd = [sys.executable, "-m", "fastslow_sim", "integrate", *eps, *args, "--no-plot",
           "--json", "--out", str(tmp_path / "r.nc")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [os.path.dirname(os.path.dirname(fs.__file__)),
                              os.environ.get("PYTHONPATH", "")])})  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "success" and out["method"] == "lsoda"
    assert abs(out["mass_error_max"]) < 1e-12


@pytest.mark.parametrize("states, solver", [
    ("16", "eigvals"), pytest.param("1100", "matrix_balance", marks=pytest.mark.slow)])  # 8 s
def test_integrate_computes_the_stiffness_index_once(states, solver, tmp_path, monkeypatch):
    """The CLI checks the inputs (check_inputs, before it makes the output folder) and then
    integrates them; both took the stiffness index, an eigenvalue solve of ~1 s at 1,024 states
    (Gershgorin's bound on the balanced Jacobian above 1,024). It is solved once now, and the
    dataset records the same index as the library's."""
    import scipy.linalg

    calls, module = [], np.linalg if solver == "eigvals" else scipy.linalg
    original = getattr(module, solver)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, solver, counted)
    args = ["integrate", "--eps", "0.125", "--states", states, "--t-end", "0.01", "--method",
            "bdf", "--n-eval", "3", "--no-plot", "--json", "--out", "r.nc"]  # fmt: skip
    res = invoke(args, tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert len(calls) == 1
    from fastslow_sim.integrators import stiffness_index

    system = fs.make_system("birth-death", eps=0.125, states=int(states))
    expected = stiffness_index(system, np.concatenate([system.x0, system.y0]), (0.0, 0.01))
    assert json.loads(res.output)["stiffness_index"] == expected


def test_the_stiffness_index_of_another_jacobian_is_computed_again():
    """The kept rate is the last Jacobian's: another state, eps or span gives its own index,
    max |Re lambda(J(z0))| (t1 - t0) with J the one at that state and eps."""
    from fastslow_sim.integrators import stiffness_index

    def direct(system, z, span):
        return float(np.max(np.abs(np.linalg.eigvals(system.jacobian(0.0, z)).real))) * span

    system = fs.make_system("birth-death", eps=0.125, states=8)
    z0 = np.concatenate([system.x0, system.y0])
    z1 = np.concatenate([np.full(8, 1 / 8), system.y0])
    first = stiffness_index(system, z0, (0.0, 1.0))
    assert first == direct(system, z0, 1.0)
    assert stiffness_index(system, z1, (0.0, 2.0)) == direct(system, z1, 2.0) != 2 * first
    other = system.with_eps(0.25)
    assert stiffness_index(other, z0, (0.0, 1.0)) == direct(other, z0, 1.0) != first
    assert stiffness_index(system, z0, (0.0, 1.0)) == first


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs at `tmp_path/full` (mounting needs root: skipped where it fails),
    unmounted after the test."""
    yield from _tmpfs(tmp_path, 256)


@pytest.fixture
def full_disk_512k(tmp_path):
    """`full_disk` of 512 KiB: room for a sweep store's root once the filler is gone (a tmpfs
    takes a 4 KiB page a file, and a zarr variable is three files)."""
    yield from _tmpfs(tmp_path, 512)


def _tmpfs(tmp_path, kib: int):
    import subprocess

    where = tmp_path / "full"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {kib} KiB tmpfs to fill: {(r.stderr or r.stdout).strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # a file left open


@pytest.fixture
def no_inodes(tmp_path):
    """A tmpfs at `tmp_path/noino` with room but no free inode: no new file can be created
    there (mounting needs root: skipped where it fails), unmounted after the test."""
    import subprocess

    where = tmp_path / "noino"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=2", "tmpfs",
                        str(where)], capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs of 2 inodes: {(r.stderr or r.stdout).strip()}")
    try:
        (where / "last").touch()  # the root folder holds one inode, this file the other
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill_leaving(folder, free_bytes):
    """A file in `folder` that leaves about `free_bytes` of its file system free."""
    st = os.statvfs(folder)
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * (st.f_frsize * st.f_bfree - free_bytes))


def _run_here(args, cwd):
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this tree, not another installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          cwd=cwd, timeout=300)  # fmt: skip


def test_dataset_onto_a_full_disk_is_one_sentence_and_leaves_nothing(full_disk, tmp_path):
    """`integrate --out` onto a full file system crashed inside h5py (exit status 139, a
    segmentation fault, after two h5py tracebacks and "a file operation failed: Can't close
    file (...)"): h5py's file failed to close, and h5netcdf closed it again when the exception
    was freed. Now a dataset whose numbers do not fit is refused before h5py writes: one
    sentence naming the path and the sizes, exit 1, no file left."""
    out = full_disk / "run.nc"
    r = _run_here(["-m", "fastslow_sim", "integrate", "--eps", "0.125", "--n-eval", "4001",
                   "--no-plot", "--out", str(out)], tmp_path)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"Error: a file operation failed on {str(out)!r}: No space left on "
                        f"device (the dataset needs at least 625 KiB; its file system has 256 "
                        f"KiB free).\n")  # fmt: skip
    assert os.listdir(full_disk) == []


def test_dataset_that_fills_the_disk_as_it_is_written_leaves_nothing(full_disk, tmp_path):
    """The same crash where the numbers fit and the file does not (h5py hits the full disk):
    now HDF5 never sees the failed write, and `save_dataset` raises the OSError naming the
    path, with no temporary file left (the command line prints it as one sentence, exit 1)."""
    out = full_disk / "run.nc"
    # 68 KiB of numbers (the check passes) in a file of about 80 KiB, 72 KiB free: h5py writes
    _fill_leaving(full_disk, 72 * 1024)
    code = ("import numpy as np, xarray as xr; from fastslow_sim.io import save_dataset\n"
            "try:\n"
            f"    save_dataset(xr.Dataset({{'x': ('t', np.ones(8704))}}), {str(out)!r})\n"
            "except OSError as err:\n"
            "    print(err.errno, err.filename, err.strerror)\n")  # fmt: skip
    r = _run_here(["-c", code], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == f"28 {out} No space left on device\n", r.stdout
    assert os.listdir(full_disk) == ["filler"]


def test_checkpoint_and_json_onto_a_full_disk_name_the_path(full_disk):
    """train-network's checkpoint on a full disk ended in torch's traceback ("RuntimeError:
    [enforce fail at inline_container.cc:672] . unexpected pos 175296 vs 175184"), and a JSON
    file's OSError named no file: both are now an OSError (ENOSPC) naming the path, which the
    command line prints as one sentence, exit 1; no temporary file is left."""
    import errno

    import torch

    from fastslow_sim.io import save_json
    from fastslow_sim.training import _save_atomic

    ckpt = full_disk / "ckpt.pt"
    with pytest.raises(OSError) as info:
        _save_atomic({"w": torch.zeros(2**17)}, ckpt)  # 512 KiB
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(ckpt))
    _fill_leaving(full_disk, 0)
    with pytest.raises(OSError) as info:
        save_json({"a": list(range(10_000))}, full_disk / "summary.json")
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(full_disk / "summary.json"))
    assert os.listdir(full_disk) == ["filler"]


def _short_writes(monkeypatch, most: int, then_nothing_after: int | None = None):
    """Make every write of `io._SpaceWatch` take at most `most` bytes (a short write, as a disk
    that fills or frees part way gives), and none at all after `then_nothing_after` bytes."""
    from fastslow_sim import io as fio

    real = fio._SpaceWatch._write_some
    taken = [0]

    def write_some(self, view):
        if then_nothing_after is not None and taken[0] >= then_nothing_after:
            return 0
        wrote = real(self, view[:most])
        taken[0] += wrote
        return wrote

    monkeypatch.setattr(fio._SpaceWatch, "_write_some", write_some)
    return taken


def test_short_writes_still_write_the_whole_file(tmp_path, monkeypatch):
    """h5py and torch ignore the count a write returns: `_SpaceWatch.write` returned the full
    count after a short write, so the file went on with a hole and could be renamed into place
    with a valid digest. Now it writes the rest; the dataset and the checkpoint read back equal."""
    import torch

    from fastslow_sim.io import load_dataset
    from fastslow_sim.training import _save_atomic

    taken = _short_writes(monkeypatch, 997)
    values = np.linspace(0.0, 1.0, 20_000)
    save_dataset(xr_dataset(values), tmp_path / "d.nc")
    np.testing.assert_array_equal(load_dataset(tmp_path / "d.nc")["x"].values, values)
    w = torch.arange(50_000, dtype=torch.float64)
    _save_atomic({"w": w}, tmp_path / "c.pt")
    assert torch.equal(torch.load(tmp_path / "c.pt")["w"], w)
    assert taken[0] > 8 * (20_000 + 50_000)  # the writes went through the short-writing path


def test_a_write_that_takes_nothing_is_a_full_disk(tmp_path, monkeypatch):
    """A write that takes no bytes and raises nothing is a device that takes no more: an
    OSError (ENOSPC) naming the path, no file left, instead of a file missing its end."""
    import errno

    _short_writes(monkeypatch, 4096, then_nothing_after=40_000)
    out = tmp_path / "d.nc"
    with pytest.raises(OSError) as info:
        save_dataset(xr_dataset(np.ones(20_000)), out)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(out))
    assert os.listdir(tmp_path) == []


def xr_dataset(values):
    import xarray as xr

    return xr.Dataset({"x": ("t", values)})


def test_free_space_is_checked_where_a_link_points(full_disk, tmp_path):
    """The free-space check looked at the folder of a symbolic link, not of the file it
    points to (which `atomic_path` writes): a link on a full disk to a roomy folder was refused,
    and a link in a roomy folder to a full disk was let through to the write."""
    import errno

    roomy = tmp_path / "roomy"
    roomy.mkdir()
    (full_disk / "link.nc").symlink_to(roomy / "d.nc")
    values = np.ones(2**17)  # 1 MiB of numbers: more than the 256 KiB tmpfs has
    save_dataset(xr_dataset(values), full_disk / "link.nc")
    assert (roomy / "d.nc").stat().st_size > values.nbytes
    (roomy / "link.nc").symlink_to(full_disk / "e.nc")
    with pytest.raises(OSError) as info:
        save_dataset(xr_dataset(values), roomy / "link.nc")
    assert info.value.errno == errno.ENOSPC
    assert "needs at least 1 MiB" in info.value.strerror
    assert sorted(os.listdir(full_disk)) == ["link.nc"]


def test_sweep_that_fills_the_disk_names_the_store_and_leaves_no_root_cut_short(full_disk_512k,
                                                                                 tmp_path,
                                                                                 monkeypatch):
    """`sweep` onto a disk that filled as it wrote the store's root said "a file operation
    failed: No space left on device." (no path, exit 1) and left a root cut short that read as
    finished: status "done" in every cell, curve_x all NaN (its chunks were never written),
    fold_y missing. Now the sentence names the store, the root cut short is gone, the finished
    cells stay, and the same command, rerun once there is room, resumes the sweep."""
    import xarray as xr

    full_disk = full_disk_512k
    store = full_disk / "s.zarr"
    args = ["sweep", "manifold", "--grid", "kappa=0,1", "--store", str(store), "--workers", "0"]
    # in process (the command's own error handling, `Group.main`, runs under CliRunner too; a
    # subprocess per run cost about 4 s of imports): --workers 0 starts no process of its own
    _fill_leaving(full_disk, 100 * 1024)  # the two cells (16 KiB each) fit, the root does not
    r = invoke(args, tmp_path, monkeypatch)
    assert r.exit_code == 1, r.output[-2000:]
    assert r.stderr.splitlines()[-1] == (
        f"Error: a file operation failed on {str(store)!r}: No space left on device (2 finished "
        f"cells kept in the store; free space, then rerun the same command: it resumes from the "
        f"finished cells)."
    )  # fmt: skip
    assert sorted(os.listdir(store)) == ["cells"] and len(os.listdir(store / "cells")) == 2
    (full_disk / "filler").unlink()
    r = invoke(args, tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output[-2000:]
    assert "2 already in the store, 0 run" in r.stdout
    ds = xr.open_zarr(store)
    assert (ds["status"].values == "done").all() and np.isfinite(ds["curve_x"].values).any()


def test_sweep_onto_a_full_disk_removes_only_a_store_it_made(full_disk):
    """A new store in which no cell finished is removed; a store that was there before (a
    sweep resumed) keeps every cell it held."""
    from fastslow_sim.sweep import run_sweep

    store = full_disk / "s.zarr"
    quiet = {"workers": 0, "progress": False, "log": lambda *a: None}
    _fill_leaving(full_disk, 16 * 1024)
    with pytest.raises(OSError) as info:
        run_sweep("manifold", ["kappa=0,1"], {}, store, **quiet)
    assert info.value.filename == str(store)
    assert info.value.strerror.endswith("(no cell had finished: the new store is removed)")
    assert os.listdir(full_disk) == ["filler"]
    (full_disk / "filler").unlink()
    run_sweep("manifold", ["kappa=0"], {}, store, **quiet)
    (held,) = (store / "cells").iterdir()
    _fill_leaving(full_disk, 16 * 1024)
    with pytest.raises(OSError) as info:
        run_sweep("manifold", ["kappa=0,1,2,3"], {}, store, **quiet)
    assert info.value.filename == str(store)
    assert "kept in the store; free space, then rerun the same command: it resumes" in (
        info.value.strerror)
    assert held.is_file()


def test_train_that_fails_at_its_first_checkpoint_removes_the_folders_it_made(full_disk):
    """`train-network` on a full disk ended in one sentence naming ckpt.pt but left the run
    folder it had made behind, empty. Now the folders the run made (also those above it) go
    while nothing was written in them; a folder that was there before stays."""
    import errno

    from fastslow_sim.training import TrainConfig, train

    tiny = dict(corpus="random", tokens=256, block_size=32, batch_size=4, n_layer=1, n_head=2,
                n_embd=32, P=4, eval_interval=4, eval_batches=2, ckpt_interval=1, progress=False)  # fmt: skip
    _fill_leaving(full_disk, 0)
    for out in (full_disk / "run", full_disk / "a" / "b" / "run"):
        with pytest.raises(OSError) as info:
            train(TrainConfig(out=str(out), **tiny))
        assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(out / "ckpt.pt"))
        assert os.listdir(full_disk) == ["filler"]
    (full_disk / "mine").mkdir()
    with pytest.raises(OSError):
        train(TrainConfig(out=str(full_disk / "mine"), **tiny))
    assert sorted(os.listdir(full_disk)) == ["filler", "mine"]


def test_a_folder_without_free_inodes_is_not_called_not_writable(no_inodes, tmp_path,
                                                                  monkeypatch):
    """An output in a folder whose file system has no free inode was refused as "folder ... is
    not writable" (exit 2), which sends a user to its permissions: the probe file failed with
    ENOSPC. Now it is a file operation that failed on the folder, saying why, exit 1; a folder
    that is really not writable is still called so (test_cli)."""
    import errno

    from fastslow_sim.io import check_writable

    out = no_inodes / "run.nc"
    res = invoke(["integrate", "--eps", "0.125", "--no-plot", "--out", str(out)], tmp_path,
                 monkeypatch)  # fmt: skip
    assert res.exit_code == 1, res.output
    assert res.output == (f"Error: a file operation failed on {str(no_inodes)!r}: No space left "
                          f"on device (no new file can be created in this folder for the dataset "
                          f"{str(out)!r}: its file system has no free inodes).\n")  # fmt: skip
    with pytest.raises(OSError) as info:
        check_writable(no_inodes / "s.json", "summary")
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(no_inodes))
    assert os.listdir(no_inodes) == ["last"]
    (no_inodes / "last").unlink()  # room again: the check passes
    assert check_writable(out, "dataset") == out


def test_a_folder_that_cannot_be_made_on_a_full_disk_is_no_bad_input(no_inodes, tmp_path,
                                                                       monkeypatch):
    """`sweep --store` and `train-network` turned ENOSPC from making their folders into bad
    input ("cannot create the output folder ...: No space left on device.", exit 2), where
    `integrate` said exit 1. Now it is an OSError naming the folder (exit 1), and nothing is
    left; a folder the user cannot make (a file in the way) is still bad input."""
    import errno

    from fastslow_sim.errors import InputError
    from fastslow_sim.sweep import run_sweep
    from fastslow_sim.training import TrainConfig, train

    store = no_inodes / "a" / "s.zarr"
    with pytest.raises(OSError) as info:
        run_sweep("manifold", ["kappa=0"], {}, store, workers=0, progress=False,
                  log=lambda *a: None, parents=True)  # fmt: skip
    assert not isinstance(info.value, InputError)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(store))
    assert "no free inodes" in info.value.strerror
    out = no_inodes / "a" / "run"
    with pytest.raises(OSError) as info:
        train(TrainConfig(out=str(out), corpus="random", tokens=256, block_size=32, batch_size=4,
                          n_layer=1, n_head=2, n_embd=32, P=4, progress=False))  # fmt: skip
    assert not isinstance(info.value, InputError)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(out))
    assert os.listdir(no_inodes) == ["last"]
    # one free inode: the store's folder is made, its cells/ folder is not (the command line)
    (no_inodes / "last").unlink()
    res = invoke(["sweep", "manifold", "--grid", "kappa=0", "--workers", "0", "--store",
                  str(no_inodes / "s.zarr")], tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 1, res.output
    assert res.output == (f"Error: a file operation failed on {str(no_inodes / 's.zarr')!r}: No "
                          f"space left on device (the sweep store cannot be made: its file "
                          f"system has no free inodes).\n")  # fmt: skip
    assert os.listdir(no_inodes) == []
    from fastslow_sim.io import creation_error

    denied = creation_error(PermissionError(errno.EACCES, "Permission denied"), out, "folder")
    assert isinstance(denied, InputError)
    assert str(denied) == f"cannot create the folder {str(out)!r}: Permission denied."


def test_a_save_that_takes_the_last_free_inode_is_not_refused(no_inodes):
    """With one free inode every save was refused after the file was fully written: the check
    before the rename probed the folder with a new file while the temporary file held the last
    inode (OSError ENOSPC "no new file can be created in this folder"). Now that check creates
    no probe file; the save succeeds."""
    import json

    from fastslow_sim.io import save_json

    (no_inodes / "last").unlink()
    save_json({"a": 1}, no_inodes / "s.json")
    assert json.loads((no_inodes / "s.json").read_text())["a"] == 1
    assert os.listdir(no_inodes) == ["s.json"]


def test_a_link_is_checked_in_the_folder_of_the_file_it_points_to(no_inodes, tmp_path,
                                                                   monkeypatch):
    """`check_writable` probed the folder of a symbolic link, while `atomic_path` writes the
    file it points to: `integrate --out` onto a link in a folder without free inodes to a file
    in a roomy folder was refused (exit 1), though the write goes to the roomy folder."""
    from fastslow_sim.io import check_writable

    roomy = tmp_path / "roomy"
    roomy.mkdir()
    (no_inodes / "last").unlink()
    (no_inodes / "x.nc").symlink_to(roomy / "x.nc")  # takes the last free inode
    assert check_writable(no_inodes / "x.nc", "dataset") == no_inodes / "x.nc"
    res = invoke(["integrate", "--eps", "0.125", "--no-plot", "--out", str(no_inodes / "x.nc")],
                 tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (roomy / "x.nc").stat().st_size > 0 and os.listdir(no_inodes) == ["x.nc"]
    # and the other way: a link in a roomy folder to a folder without free inodes is refused
    (roomy / "y.nc").symlink_to(no_inodes / "y.nc")
    with pytest.raises(OSError, match="a link to"):
        check_writable(roomy / "y.nc", "dataset")


def test_an_io_error_in_the_flush_names_the_target_and_the_flush_is_never_skipped(tmp_path,
                                                                                    monkeypatch):
    """An EIO in the flush of the temporary file named the temporary `.NAME.xxxx.part` file
    (deleted right after); now it names the path asked for. And a temporary file that could not
    be opened to read was not flushed at all: now it is opened to write and flushed."""
    import errno

    from fastslow_sim.io import save_json

    real_fsync, real_open = os.fsync, os.open
    opened = {}  # file descriptor -> the path it was last opened on
    flushed = []

    def fake_open(path, flags, *a, **k):
        if no_read[0] and str(path).endswith(".part") and flags == os.O_RDONLY:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        fd = real_open(path, flags, *a, **k)
        opened[fd] = str(path)
        return fd

    def fake_fsync(fd):
        if opened.get(fd, "").endswith(".part"):
            flushed.append(opened[fd])
            if eio[0]:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    no_read, eio = [False], [True]
    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "fsync", fake_fsync)
    out = tmp_path / "s.json"
    with pytest.raises(OSError) as info:
        save_json({"a": 1}, out)
    assert (info.value.errno, info.value.filename) == (errno.EIO, str(out))
    assert len(flushed) == 1 and os.listdir(tmp_path) == []
    no_read[0], eio[0] = True, False
    save_json({"a": 2}, out)
    assert len(flushed) == 2 and json.loads(out.read_text())["a"] == 2


def test_a_non_utf8_output_name_is_written(tmp_path, monkeypatch):
    # Linux names are bytes: 'bad\xfe.nc' ended in "the computation failed (UnicodeEncodeError)",
    # exit status 1, from the file-name length check, then (on a strict stream, as the
    # runner's) from printing the name after the files were written
    name = os.fsdecode(b"bad\xfe.nc")
    res = invoke(["integrate", "--eps", "0.1", "--t-end", "1", "--out", name], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert re.search(r"^dataset +bad\\udcfe\.nc$", res.output, re.M), res.output
    assert sorted(os.listdir(tmp_path)) == [name, os.fsdecode(b"bad\xfe.png")]
    with fs.load_dataset(tmp_path / name) as ds:
        assert ds.attrs["eps"] == 0.1
