"""CLI messages that state a rule: the rule stated is the one the code applies."""

import re

import pytest
from click.testing import CliRunner

from fastslow_sim.cli import main
from fastslow_sim.errors import InputError
from fastslow_sim.multirate import block_tokens
from fastslow_sim.systems import P_EXACT, make_system


def test_eps_below_the_ode_floor_names_the_P_multirate_accepts(tmp_path, monkeypatch):
    """The refusal of eps = 1e-20 offered multirate "for any integer P up to 2**63 - 1", which
    multirate then refused (P = 2**63 - 1 does not come back from eps = 1/P in float64)."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["integrate", "--no-plot", "--out", "a.nc",
                                    "--P", "9" * 20, "--t-end", "0.01"])  # fmt: skip
    assert res.exit_code == 2, res.output
    m = re.search(r"P at most 2\*\*51 = ([\d,]+)", res.output)
    assert m and int(m.group(1).replace(",", "")) == P_EXACT == 2**51, res.output
    assert "up to 2**63 - 1" not in res.output
    # multirate's own check takes the P stated (and 2**62, a power of two below 2**63)
    assert block_tokens(1.0 / P_EXACT) == P_EXACT and block_tokens(2.0**-62) == 2**62


def test_convergence_short_t_end_states_the_half_rule_and_a_t_end_that_passes(tmp_path,
                                                                              monkeypatch):  # fmt: skip
    """The message "the initial layer lasts about 0.537; expected ... a longer --t-end" hid the
    rule (t_layer < t_end / 2): --t-end 1 is longer than 0.537 and was refused."""
    import numpy as np

    import fastslow_sim.manifold as mf

    monkeypatch.chdir(tmp_path)
    args = ["convergence", "--no-plot", "--json", "--system", "random", "--out", "cv.nc",
            "--eps", "0.02,0.01", "--t-end", "1"]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    m = re.fullmatch(
        r"Error: eps=0\.02 is too large for --t-end=1: the initial layer lasts about (\S+), and "
        r"must last less than half of --t-end \(0\.5\); expected smaller eps or --t-end above "
        r"(\S+)\.\n",
        res.output,
    )
    assert m, res.output
    system = make_system("random", eps=0.02)
    t_layer = mf.initial_layer_duration(system, factor=6.0)
    assert m.group(1) == f"{t_layer:.3g}" == "0.537"
    bound = float(m.group(2))
    assert bound == 1.074 and bound > 2 * t_layer  # every --t-end above the bound passes
    mf.check_convergence(system, [0.02, 0.01], t_end=float(np.nextafter(bound, 2.0)))
    with pytest.raises(InputError, match="too large"):  # and one just under twice the layer not
        mf.check_convergence(system, [0.02, 0.01], t_end=float(np.nextafter(2 * t_layer, 0.0)))
    assert not (tmp_path / "cv.nc").exists()


def test_convergence_help_states_the_eps_range():
    import fastslow_sim.manifold as mf

    res = CliRunner().invoke(main, ["convergence", "--help"], terminal_width=200)
    assert (f"each from {mf.CONVERGENCE_EPS_MIN:g} to {mf.CONVERGENCE_EPS_MAX:g}"
            in " ".join(res.output.split()))  # fmt: skip
    with pytest.raises(InputError, match=r"must lie in \[1e-05, 0.5\]"):
        mf.check_convergence(make_system("random", eps=0.02), [0.6, 0.01])
    with pytest.raises(InputError, match=r"must lie in \[1e-05, 0.5\]"):
        mf.check_convergence(make_system("random", eps=0.02), [9e-6, 0.01])
    mf.check_convergence(make_system("random", eps=0.02), [0.5, 1e-5], t_end=1000)


def test_corpus_help_says_its_time_grows_as_P_falls():
    """`corpus me --P 1` ran for over a minute with no word in --help: the build is a loop over
    the corpus's blocks, tokens/P, and --help now says so with the times at P = 8 and 1 (the
    old build's loop took 123 s at P = 1, now 29 s)."""
    res = CliRunner().invoke(main, ["corpus", "--help"], terminal_width=200)
    text = " ".join(res.output.split())
    assert res.exit_code == 0
    assert "with their number of blocks, tokens/P" in text
    assert "about 15 s at P = 8 and 30 s at --P 1" in text
    assert "small P: more blocks, a slower build" in text


@pytest.mark.slow  # 4.4 s run alone on a busy machine: the first import of torch (training's ARMS)
@pytest.mark.parametrize("flag", ["--arms", "--variants"])
@pytest.mark.parametrize("arms, k", [("dense,", 2), ("dense,,coupled", 2), (",dense", 1)])
def test_reproduce_refuses_an_empty_arm_before_any_work(flag, arms, k, tmp_path, monkeypatch):
    """`--arms dense,` ran as `--arms dense`, where `--eps 0.1,,0.05` was refused."""
    import fastslow_sim.training

    def never(*a, **kw):
        raise AssertionError("trained before the check")

    monkeypatch.setattr(fastslow_sim.training, "reproduce", never)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["reproduce", "--corpus", "me", flag, arms])
    assert res.exit_code == 2, res.output
    assert res.output == (f"Error: --arms entry {k} of {arms!r} is empty; expected arm names "
                          f"separated by single commas, as 'dense, coupled'.\n")  # fmt: skip
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, fragment", [
    (["convergence", "--grid", "system=two-state,cycle", "--eps", "0.02,,0.01"],
     "eps entry 2 of '0.02,,0.01' is empty"),
    (["integrate", "--grid", "eps=0.1,"], "--grid 'eps=0.1,' has an empty value"),
    (["integrate", "--grid", "eps=0.1,,0.2"], "--grid 'eps=0.1,,0.2' has an empty value"),
])  # fmt: skip
def test_sweep_list_options_refuse_an_empty_entry(args, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["sweep", *args, "--store", "s.zarr"])
    assert res.exit_code == 2 and fragment in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["integrate"], ["sweep", "integrate", "--grid", "eps=0.1",
                                                 "--store", "s.zarr"]])  # fmt: skip
def test_ctrl_c_is_one_line_and_exit_status_130(args, monkeypatch):
    """Ctrl-C ended in click's "Aborted!" and exit status 1, a failed run's status."""

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(main.commands[args[0]], "callback", interrupted)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 130, (res.exit_code, res.output)
    assert res.output == "Interrupted.\n"


def test_osc_eps_below_the_floor_is_refused_before_the_run(tmp_path, monkeypatch):
    """--osc-eps 1e-10, which --help allowed, ran for minutes and broke its mass budget (1^T x
    drifted 2.4e-7, budget 1.1e-7); the floor is now 1e-9, stated alike by --help and sweep."""
    import fastslow_sim.nonlinear as nl

    def never(*a, **kw):
        raise AssertionError("ran before the check")

    monkeypatch.setattr(nl, "manifold_dataset", never)
    monkeypatch.chdir(tmp_path)
    assert nl.OSC_EPS_MIN == 1e-9
    res = CliRunner().invoke(main, ["manifold", "--no-plot", "--out", "o.nc", "--osc-eps", "1e-10"])
    assert res.exit_code == 2, res.output
    assert res.output == "Error: --osc-eps must be a finite number >= 1e-09 and <= 1; got 1e-10.\n"
    res = CliRunner().invoke(main, ["manifold", "--help"], terminal_width=200)
    assert "from 1e-9 to 1." in " ".join(res.output.split())
    res = CliRunner().invoke(main, ["sweep", "manifold", "--grid", "osc_eps=1e-10", "--store",
                                    "s.zarr"])  # fmt: skip
    assert res.exit_code == 2 and "osc_eps must be from 1e-9 to 1; got 1e-10." in res.output
    assert not list(tmp_path.iterdir())
