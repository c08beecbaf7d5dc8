import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import fastslow_sim as fs
from fastslow_sim.cli import main

JSON_KEYS = {
    "system",
    "eps",
    "P",
    "method",
    "t_end",
    "x_final",
    "y_final",
    "manifold_distance_final",
    "mass_error_max",
    "nfev",
    "status",
    "wall_time_s",
    "out",
}


def run(args, **kw):
    return CliRunner().invoke(main, args, catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def manifold_run(tmp_path_factory):
    """`manifold *ARGS --no-plot --out DIR/m.nc` run once per ARGS in this module and its result
    kept: several tests read the text or the JSON of the same run (the default run, and the
    cycle's on [1, 100], took 2-4 s each time)."""
    done = {}

    def get(*args):
        if args not in done:
            out = tmp_path_factory.mktemp("manifold") / "m.nc"
            done[args] = run(["manifold", *args, "--no-plot", "--out", str(out)])
        return done[args]

    return get


def test_integrate_default_writes_dataset_and_plot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run(["integrate", "--eps", "0.125"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "fastslow-results" / "integrate-birth-death-eps0.125.nc"
    assert out.is_file() and out.with_suffix(".png").is_file()
    assert "|x - p_st(y)|_1" in res.output and "nfev" in res.output
    ds = fs.load_dataset(out)
    assert ds.attrs["eps"] == 0.125 and ds.attrs["P"] == 8 and ds.attrs["status"] == "success"


def test_default_names_tell_close_values_apart(tmp_path, monkeypatch):
    """The default name rounded eps to 6 digits: eps 0.12345671 and 0.12345672 both wrote
    integrate-birth-death-eps0.123457.nc, the second replacing the first. Values that `:g`
    gives back exactly keep today's names (eps0.125, eps0.0001)."""
    from fastslow_sim.cli.common import name_number

    assert [name_number(v) for v in (0.125, 1e-4, 1e-20, 3.0, 0.0)] == [
        "0.125", "0.0001", "1e-20", "3", "0"]  # fmt: skip
    assert name_number(0.12345671) == "0.12345671" and name_number(1 / 3) == "0.3333333333333333"
    monkeypatch.chdir(tmp_path)
    common = ["--t-end", "0.1", "--n-eval", "3", "--no-plot", "--json"]
    outs = []
    for eps in ("0.12345671", "0.12345672", "1e-4"):
        res = run(["integrate", "--eps", eps, *common])
        assert res.exit_code == 0, res.output
        outs.append(json.loads(res.output)["out"])
    assert outs == [f"fastslow-results/integrate-birth-death-eps{e}.nc"
                    for e in ("0.12345671", "0.12345672", "0.0001")]  # fmt: skip
    assert [fs.load_dataset(tmp_path / o).attrs["eps"] for o in outs] == [0.12345671, 0.12345672, 1e-4]
    for kappa in ("1.0000001", "1.0000002"):
        res = run(["manifold", "--kappa", kappa, "--no-plot", "--json", "--y-range", "0", "1",
                   "--osc-eps", "0.1"])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["out"] == f"fastslow-results/manifold-birth-death-kappa{kappa}.nc"


def test_integrate_json(tmp_path):
    out = tmp_path / "r.nc"
    res = run(
        [
            "integrate",
            "--P",
            "16",
            "--system",
            "two-state",
            "--t-end",
            "2",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert JSON_KEYS <= set(data)
    assert data["P"] == 16 and data["eps"] == 1 / 16 and data["out"] == str(out)
    assert data["plot"] == str(out.with_suffix(".png"))
    ds = fs.load_dataset(out)
    np.testing.assert_allclose(data["x_final"], ds["x"].values[-1])
    assert data["manifold_distance_final"] < 0.1 and data["mass_error_max"] < 1e-10


def test_march_option_chooses_the_march_and_both_agree(tmp_path):
    """`--march torch` and `--march compiled` run the same tableau and step control: the same
    step counts and final states to rounding; the summary says which march ran."""
    out = {}
    for march in ("torch", "compiled"):
        res = run(["integrate", "--eps", "1e-4", "--states", "16", "--t-end", "2", "--batch", "16",
                   "--method", "rodas4", "--rtol", "1e-6", "--atol", "1e-9", "--march", march,
                   "--n-eval", "3", "--out", str(tmp_path / f"{march}.nc"), "--no-plot",
                   "--json"])  # fmt: skip
        assert res.exit_code == 0, res.output
        out[march] = json.loads(res.output)
        assert out[march]["march"] == march
    assert out["torch"]["nfev"] == out["compiled"]["nfev"]
    np.testing.assert_allclose(out["torch"]["x_final"], out["compiled"]["x_final"], rtol=0,
                               atol=1e-10)  # fmt: skip
    res = run(["integrate", "--eps", "0.125", "--batch", "4", "--n-eval", "3", "--out",
               str(tmp_path / "a.nc"), "--no-plot"])  # fmt: skip
    assert res.exit_code == 0 and "compiled march" in res.output  # auto picks it for a chain


def test_auto_passes_rodas4_options_only_to_rodas4(tmp_path):
    """`auto` accepts rodas4's options; where it picks LSODA (not stiff), those LSODA lacks do
    not reach it, and a warning names them (in the CLI too). `max_steps`, the bound on the work
    that every method takes, reaches it."""
    system = fs.make_system("two-state", eps=0.1)
    with pytest.warns(fs.IgnoredOptionWarning, match=r"auto picked lsoda .*\['march'\]"):
        ds = fs.integrate(system, (0.0, 1.0), method="auto", march="torch")
    assert ds.attrs["method"] == "lsoda" and ds.attrs["status"] == "success"
    ds = fs.integrate(system, (0.0, 1.0), method="auto", max_steps=10)
    assert ds.attrs["method"] == "lsoda" and ds.attrs["status"] == "max_steps"
    assert "lsoda stopped after max_steps = 10 steps" in ds.attrs["message"]
    res = CliRunner().invoke(main, ["integrate", "--system", "two-state", "--eps", "0.1",
                                    "--t-end", "1", "--march", "torch", "--no-plot", "--out",
                                    str(tmp_path / "a.nc")])  # fmt: skip
    assert res.exit_code == 0 and "Warning: auto picked lsoda" in res.output, res.output


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_help_shows_a_command_line_of_its_own(command):
    """The README promises that each `--help` teaches by example (mapping's had none)."""
    res = CliRunner().invoke(main, [command, "--help"], prog_name="fastslow-sim")
    assert res.exit_code == 0
    body = res.output.split("Options:")[0].splitlines()[1:]  # past the usage line
    assert any(line.strip().startswith(f"fastslow-sim {command}") for line in body), res.output


def test_help_lists_systems_and_methods():
    res = run(["integrate", "--help"])
    for name in list(fs.SYSTEMS) + ["radau", "bdf", "lsoda", "dopri5", "auto"]:
        assert name in res.output
    assert run(["--version"]).output.strip().endswith(fs.__version__)


def test_explicit_method_warning_is_printed(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "integrate",
            "--eps",
            "0.01",
            "--t-end",
            "1",
            "--method",
            "rk45",
            "--out",
            str(tmp_path / "a.nc"),
            "--no-plot",
        ],
    )
    assert res.exit_code == 0
    assert "Warning: the problem is stiff" in res.output


def test_explicit_method_warning_comes_before_the_solve(tmp_path, monkeypatch):
    """The warning that rk45 on a stiff problem needs ~1e5 evaluations was printed after those
    evaluations; it is printed as it is issued now, before the solver starts."""
    import dataclasses

    from fastslow_sim.integrators import METHODS

    class StopError(Exception):
        pass

    def solve(*args, **kwargs):
        raise StopError

    monkeypatch.setitem(METHODS, "rk45", dataclasses.replace(METHODS["rk45"], solve=solve))
    res = CliRunner().invoke(main, ["integrate", "--eps", "0.01", "--t-end", "1", "--method",
                                    "rk45", "--out", str(tmp_path / "a.nc"), "--no-plot"])  # fmt: skip
    assert isinstance(res.exception, StopError)
    assert res.output.startswith("Warning: the problem is stiff (stiffness index")


def test_integrate_batch_warns_of_a_stiff_row_that_is_not_the_first(tmp_path):
    """`--batch 4 --seed 1` at eps 0.02 draws y0 = 0.61, 0.92, 0.04, 0.53: rk45's stiffness
    indices 244, 528, 95, 204; judged at the first row, no warning was said. The stiffest row
    is named, the summary says its index is the largest, the file keeps each row's."""
    import xarray as xr

    out = tmp_path / "b.nc"
    res = run(["integrate", "--eps", "0.02", "--t-end", "1", "--batch", "4", "--seed", "1",
               "--method", "rk45", "--n-eval", "5", "--no-plot", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert ("Warning: the problem is stiff (stiffness index 528 at trajectory 2 of 4, the "
            "stiffest (batch index 1, eps=0.02)); the explicit method 'rk45'") in res.output
    assert "(requested rk45; largest stiffness index 528)" in res.output
    with xr.open_dataset(out) as ds:
        index = ds["stiffness_index_batch"].values
        assert ds.attrs["stiffness_index"] == index[1] == index.max() > 500 > index[0]


def test_a_P_that_is_no_integer_is_not_printed(tmp_path):
    """1/1.5e-9 = 666,666,666.67: 'P = 666666667' was printed and saved."""
    res = run(["integrate", "--eps", "1.5e-9", "--t-end", "0.01", "--n-eval", "3", "--no-plot",
               "--out", str(tmp_path / "r.nc")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.output.startswith("birth-death: eps = 1.5e-09, t in [0, 0.01]\n")
    assert fs.load_dataset(tmp_path / "r.nc").attrs["P"] == -1
    res = run(["integrate", "--eps", "1e-4", "--t-end", "0.01", "--n-eval", "3", "--no-plot",
               "--out", str(tmp_path / "s.nc"), "--json"])  # fmt: skip
    assert json.loads(res.output)["P"] == 10_000


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--eps", "0"], "eps must be a positive"),
        (["--eps", "-0.5"], "eps must be a positive"),
        (["--eps", "nan"], "eps must be a positive"),
        (["--eps", "inf"], "eps must be a positive"),
        (["--eps", "abc"], "eps must be a positive"),
        (["--eps", "0.1", "--P", "10"], "not both"),
        (["--P", "2.5"], "positive integer"),
        (["--P", "0"], "positive integer"),
        (["--P", "-3"], "positive integer"),
        ([], "give one of eps or P"),
        (["--eps", "0.1", "--system", "lorenz"], "'lorenz' is not one of"),
        (["--eps", "0.1", "--method", "magic"], "'magic' is not one of"),
        (["--eps", "0.1", "--x0", "0.5,0.6,0,0,0,0,0,0"], "probability vector"),
        (["--eps", "0.1", "--x0", "1,0"], "8 entries"),
        (["--eps", "0.1", "--x0", "a,b"], "comma-separated"),
        # "1 5" ran as y0 = 15, "0 .5" as 0.5, "1,,0,..." dropped its empty entry
        (["--eps", "0.125", "--y0", "1 5"], "--y0 entry '1 5' of '1 5' has a space inside it"),
        (["--eps", "0.125", "--y0", "0 .5"], "--y0 entry '0 .5' of '0 .5' has a space inside"),
        (["--eps", "0.125", "--x0", "1,,0,0,0,0,0,0"], "--x0 entry 2 of '1,,0,0,0,0,0,0' is empty"),
        (["--eps", "0.125", "--x0", "1,0,0,0,0,0,0,0,"], "--x0 entry 9 of '1,0,0,0,0,0,0,0,' is empty"),
        (["--eps", "0.1", "--out", "/nonexistent-dir/x.nc"], "does not exist"),
        (["--eps", "0.1", "--t-end", "-1"], "t-end"),
        (["--eps", "0.1", "--rtol", "0"], "rtol must be a positive"),
        (["--eps", "0.1", "--method", "lsoda", "--march", "torch"], "--march chooses the march"),
        (["--eps", "0.1", "--method", "rodas4", "--march", "fast"], "'fast' is not one of"),
        (["--eps", "0.1", "--system", "cycle", "--method", "rodas4", "--march", "compiled"],
         "the compiled march needs a neighbour-chain system"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["integrate", *args])
    assert res.exit_code == 2, res.output
    assert fragment in res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    # nothing half-written
    assert not list(tmp_path.rglob("*.nc")) and not list(tmp_path.rglob("*.part"))


@pytest.mark.parametrize(
    "args, line",
    [
        (["integrate", "--epz", "1"], "Error: No such option '--epz' (did you mean one of: "
         "'--eps', '--help'?); see 'fastslow-sim integrate --help'."),
        (["integrat"], "Error: No such command 'integrat' (did you mean 'integrate'?); see "
         "'fastslow-sim --help'."),
        (["integrate", "--batch", "abc"], "Error: Invalid value for '--batch': 'abc' is not a "
         "valid integer; see 'fastslow-sim integrate --help'."),
        (["integrate", "--method"], "Error: Option '--method' requires an argument; see "
         "'fastslow-sim integrate --help'."),
        (["--bogus"], "Error: No such option '--bogus'; see 'fastslow-sim --help'."),
        (["phi-vs-pst"], "Error: Missing argument 'RUN_DIR...'; see "
         "'fastslow-sim phi-vs-pst --help'."),
    ],
)  # fmt: skip
def test_click_usage_errors_are_one_line_and_exit_2(args, line, tmp_path, monkeypatch):
    """click's own usage errors (unknown option or command, unparsable value, missing argument)
    come as one line naming the command's help, not its three lines of usage and hint."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args, prog_name="fastslow-sim")
    assert res.exit_code == 2
    assert res.output.strip() == line
    assert not list(tmp_path.iterdir())


SWEEP = ["sweep", "integrate", "--grid", "seed=0:1", "--store", "no-such-folder/s.zarr"]


@pytest.mark.parametrize(
    "args, name, value",
    [
        ([*SWEEP, "--chunk-size", "1_5"], "--chunk-size", "1_5"),  # click INT read it as 15
        (["integrate", "--eps", "0.1", "--n-eval", "1_0"], "--n-eval", "1_0"),
        (["integrate", "--eps", "0.1", "--t-end", "1_0"], "--t-end", "1_0"),  # click FLOAT
        (["integrate", "--P", "1_6"], "--P", "1_6"),
        (["integrate", "--eps", "0.1_2"], "--eps", "0.1_2"),
        (["integrate", "--eps", "0.1", "--x0", "1_0,0"], "--x0 entry 1", "1_0"),
        (["integrate", "--eps", "0.1", "--max-steps", "1_000"], "--max-steps", "1_000"),
        (["manifold", "--y-range", "0", "1_5"], "--y-range", "1_5"),
        (["train-network", "--tokens", "10_000"], "--tokens", "10_000"),
        (["train-network", "--batch-size", "1_6"], "--batch-size", "1_6"),
        (["corpus", "me:seed=1_0"], "corpus option seed", "1_0"),
        (["sweep", "integrate", "--grid", "seed=0:1_0", "--store", "s.zarr"], "seed", "1_0"),
        (["sweep", "integrate", "--grid", "eps=1_0", "--store", "s.zarr"], "eps", "1_0"),
        ([*SWEEP, "--t-end", "1_0"], "t_end", "1_0"),
    ],
)  # fmt: skip
def test_numbers_with_underscores_are_refused_in_one_sentence(args, name, value, tmp_path,
                                                              monkeypatch):  # fmt: skip
    """Python's int(), float() and Decimal read "1_5" as 15: every number typed is refused with
    an underscore, naming the option and the value, before any work."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args, prog_name="fastslow-sim")
    assert res.exit_code == 2, res.output
    assert f"{name} must be a number written without underscores; got {value!r}." in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args, name, value",
    [
        (["integrate", "--P", "\u0668"], "--P", "\u0668"),  # ran with P = 8
        (["integrate", "--eps", "\u0660.1"], "--eps", "\u0660.1"),
        (["integrate", "--P", "8", "--n-eval", "\u0663"], "--n-eval", "\u0663"),
        (["integrate", "--P", "8", "--seed", "\u0663"], "--seed", "\u0663"),
        (["integrate", "--P", "8", "--max-steps", "\u0663"], "--max-steps", "\u0663"),
        (["corpus", "me:seed=\u0663"], "corpus option seed", "\u0663"),
    ],
)  # fmt: skip
def test_digits_outside_ascii_are_refused_in_one_sentence(args, name, value, tmp_path,
                                                          monkeypatch):  # fmt: skip
    """int(), float() and Decimal read Arabic-Indic digits ("\u0668" is 8): a number typed in
    them ran silently; every one is refused, naming the option and the value."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args, prog_name="fastslow-sim")
    assert res.exit_code == 2, res.output
    assert f"{name} must be a number written in ASCII digits; got {value!r}." in res.output
    assert len(res.output.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("P", ["9007199254740993", "9007199254740993.0", "9007199254740993e0"])
def test_P_in_any_decimal_form_is_read_exactly(P, tmp_path, monkeypatch):
    """--P 9007199254740993.0 went through float and ran as 2**53 (eps printed for P =
    9007199254740992), while the digits were refused: every form is read exactly and refused
    alike."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["integrate", "--P", P, "--method", "multirate", "--no-plot"],
                             prog_name="fastslow-sim")  # fmt: skip
    assert res.exit_code == 2, res.output
    assert res.output.startswith("Error: P = 9007199254740993 is not held exactly by eps = 1/P")
    assert not list(tmp_path.iterdir())


def test_max_steps_is_read_exactly_up_to_its_bound():
    """--max-steps went through float: its documented maximum 2**63 - 1 was refused (it became
    2**63) and 9223372036854775000 ran with the budget 9223372036854774784."""
    from fastslow_sim.errors import InputError
    from fastslow_sim.solvers import check_max_steps
    from fastslow_sim.validation import positive_int

    assert check_max_steps("9223372036854775807", "--max-steps") == 2**63 - 1
    assert check_max_steps("9223372036854775000") == 9223372036854775000
    assert check_max_steps(2**63 - 1) == 2**63 - 1 and check_max_steps("1e3") == 1000
    assert positive_int("n", 7.0) == 7 and positive_int("n", np.int64(5)) == 5
    with pytest.raises(InputError, match=r"--max-steps must be at most 2\*\*63 - 1"):
        check_max_steps("9223372036854775808", "--max-steps")
    for bad in ("1.5", "0", "-3", 2.5, True, "abc"):
        with pytest.raises(InputError, match="n must be a positive integer; got"):
            positive_int("n", bad)


@pytest.mark.parametrize("args, line", [
    (["integrate", "--eps", "0.1", "--batch", "ten_k"],
     "Error: Invalid value for '--batch': 'ten_k' is not a valid integer; see 'fastslow-sim "
     "integrate --help'."),
    (["integrate", "--eps", "0.1", "--t-end", "one_half"],
     "Error: Invalid value for '--t-end': 'one_half' is not a valid float; see 'fastslow-sim "
     "integrate --help'."),
    (["sweep", "integrate", "--grid", "seed=a_b", "--store", "s.zarr"],
     "Error: --grid 'seed=a_b': seed must be an integer; got 'a_b'."),
])  # fmt: skip
def test_text_that_is_no_number_is_not_blamed_on_its_underscore(args, line, tmp_path,
                                                                monkeypatch):  # fmt: skip
    """'ten_k' was refused as "a number written without underscores", as if 'tenk' would do:
    text that no reading makes a number gets the parse's own sentence."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args, prog_name="fastslow-sim")
    assert res.exit_code == 2 and res.output.strip() == line, res.output


def test_an_integer_in_digits_is_read_exactly_at_any_size():
    """`as_int` refused digits of 1e19 or more (OverflowError), so `corpus me:seed=` lost the
    seeds from 1e19 to 2**64 - 1 that it took before; digits are read exactly, and a bound says
    more (the sweep's int64), while an exponent form of 1e19 or more is never expanded."""
    from fastslow_sim.errors import InputError
    from fastslow_sim.me_corpus import parse_me_spec
    from fastslow_sim.validation import as_int

    assert as_int(" 18446744073709551615 ") == 2**64 - 1 and as_int("-12") == -12
    assert as_int("1e3") == 1000
    with pytest.raises(OverflowError):
        as_int("1e19")
    assert parse_me_spec("me:seed=18446744073709551615").seed == 2**64 - 1
    with pytest.raises(InputError, match=r"seed='1e20' is 1e19 or more written with an exponent"):
        parse_me_spec("me:seed=1e20")


@pytest.mark.parametrize("option", ["--chunk-size", "--workers"])
def test_integer_options_take_a_whole_number_like_1e3_as_the_grid_does(option, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    """--chunk-size 1e3 was refused while --grid seed=0:1e3 ran: every integer option takes a
    whole number in any decimal form (here refused only later, for the store's folder), and a
    number that is not whole stays a usage error naming the option and the value."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, [*SWEEP, option, "1e0"], prog_name="fastslow-sim")
    assert res.exit_code == 2 and option not in res.output, res.output
    assert "no-such-folder" in res.output
    res = CliRunner().invoke(main, [*SWEEP, option, "1.5"], prog_name="fastslow-sim")
    assert res.exit_code == 2
    assert res.output.strip() == (f"Error: Invalid value for '{option}': '1.5' is not a valid "
                                  f"integer; see 'fastslow-sim sweep --help'.")  # fmt: skip


def test_bare_command_prints_its_help():
    # no error to one-line: click's help, as before the usage errors became one line
    res = CliRunner().invoke(main, [], prog_name="fastslow-sim")
    assert res.output.startswith("Usage: fastslow-sim [OPTIONS] COMMAND [ARGS]...")
    assert "Commands:" in res.output and "Error" not in res.output


@pytest.mark.parametrize(
    "paths, fragment",
    [
        (["--out", "r.png"], "is also the dataset path"),  # the default plot is r.png too
        (["--out", "a.nc", "--plot", "./a.nc"], "is also the dataset path"),
        (["--out", "a.nc", "--plot", "a.txt"], "format 'txt'"),
    ],
)
def test_plot_path_clash_or_format_refused_before_work(paths, fragment, tmp_path, monkeypatch):
    """The plot must neither replace the dataset just written nor fail after the work."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["integrate", "--eps", "0.125", "--t-end", "0.5", *paths])
    assert res.exit_code == 2, res.output
    assert fragment in res.output and res.output.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_unwritable_output_folder(tmp_path):
    # as root a chmod 0500 folder is still writable, so root gets a read-only mount instead
    # (/sys: os.access says yes to root, creating a file there fails)
    if os.geteuid() == 0:
        assert os.path.isdir("/sys")
        target = "/sys/a.nc"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = str(ro / "a.nc")
    try:
        res = CliRunner().invoke(main, ["integrate", "--eps", "0.1", "--out", target])
        assert res.exit_code == 2 and "not writable" in res.output, res.output
    finally:
        if os.geteuid() != 0:
            (tmp_path / "ro").chmod(0o700)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_installed_command(tmp_path):
    exe = shutil.which("fastslow-sim")
    if exe is None:
        pytest.skip("fastslow-sim is not on PATH (install with scripts/setup.sh)")
    res = subprocess.run(
        [
            exe,
            "integrate",
            "--eps",
            "0.125",
            "--t-end",
            "1",
            "--json",
            "--out",
            str(tmp_path / "a.nc"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["status"] == "success"
    bad = subprocess.run(
        [exe, "integrate", "--eps", "nan"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


def test_convergence_command_json(tmp_path):
    out = tmp_path / "conv.nc"
    res = run(["convergence", "--system", "two-state", "--eps", "0.02,0.01,0.005", "--out", str(out),
               "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["slopes"]) == {"err_h0", "err_h1", "err_y"}
    assert abs(data["slopes"]["err_h0"] - 1) < 0.15 and abs(data["slopes"]["err_h1"] - 2) < 0.25
    assert len(data["errors"]["err_h0"]) == 3
    assert out.is_file() and out.with_suffix(".png").is_file()


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_manifold_command_json(tmp_path):
    out = tmp_path / "m.nc"
    res = run(["manifold", "--kappa", "3", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["folds"]) == 2 and len(data["branches"]) == 3
    assert [b["stable"] for b in data["branches"]] == [True, False, True]
    assert data["gap"] > 0.3 and data["identity_max_abs_diff"] <= 1e-12
    assert data["oscillation"]["status"] == "success"
    res0 = run(
        ["manifold", "--kappa", "0", "--no-plot", "--out", str(tmp_path / "m0.nc"), "--json"]
    )
    data0 = json.loads(res0.output)
    assert data0["gap"] <= 1e-12 and data0["folds"] == [] and data0["oscillation"] is None


@pytest.mark.parametrize("args", [["--osc-eps", "1"], ["--kappa", "10"]])
@pytest.mark.slow
def test_manifold_period_not_determined(tmp_path, args):
    """Fewer than two maxima of y in the run's second half (eps 1: too slow to turn twice by
    t = 20; kappa 10: one long cycle): the text said "period nan"; now a sentence, and the JSON
    a null with the reason."""
    out = str(tmp_path / "m.nc")
    res = run(["manifold", *args, "--no-plot", "--out", out])
    assert res.exit_code == 0, res.output
    assert "nan" not in res.output
    assert ("period not determined: fewer than two maxima of y in the second half of the run "
            "(t in [10, 20])") in res.output  # fmt: skip
    data = json.loads(run(["manifold", *args, "--no-plot", "--out", out, "--json"]).output)
    assert data["oscillation"]["period"] is None
    assert "fewer than two maxima of y" in data["oscillation"]["period_note"]


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_manifold_period_is_printed(manifold_run):
    res = manifold_run("--json")
    osc = json.loads(res.output)["oscillation"]
    assert osc["period"] == pytest.approx(1.6, abs=1e-6) and "period_note" not in osc


def test_manifold_on_a_range_above_the_folds(tmp_path):
    """`--y-range 1 2` at kappa 3 lies above both folds: only the upper branch is there, and
    Newton from the low state does not reach it (it used to end in "continuation stalled")."""
    res = run(["manifold", "--kappa", "3", "--y-range", "1", "2", "--no-plot",
               "--out", str(tmp_path / "m.nc"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["folds"] == [] and len(data["branches"]) == 1
    (branch,) = data["branches"]
    assert branch["stable"] and branch["mean_min"] > 0.99
    assert (branch["y_min"], branch["y_max"]) == (1.0, 2.0)


def test_spaces_around_vector_entries_are_allowed(tmp_path, monkeypatch):
    """Entries are split at commas and stripped ("1, 0.5"); only a space inside one is refused."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["integrate", "--eps", "0.125", "--y0", " 0.5 ", "--x0",
                                    "1, 0, 0,0,0,0,0, 0", "--t-end", "0.1", "--n-eval", "3",
                                    "--out", "v.nc", "--no-plot"])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = xr.open_dataset(tmp_path / "v.nc")
    assert ds["y"].values[0, 0] == 0.5 and ds["x"].values[0, 0] == 1.0
    ds.close()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["convergence", "--eps", ""], "at least one number"),
        (["convergence", "--eps", "0.01"], "at least two"),
        # it ran eps = 0.01, 0.005
        (["convergence", "--eps", "0.0 1,0.005"], "--eps entry '0.0 1' of '0.0 1,0.005' has a space"),
        (["convergence", "--eps", "0.01,,0.005"], "--eps entry 2 of '0.01,,0.005' is empty"),
        (["convergence", "--eps", "0.01,-0.02"], "positive finite"),
        (["convergence", "--eps", "0.01,0,0.005"], "positive finite"),
        (["manifold", "--kappa", "nan"], "kappa must be a finite"),
        (["manifold", "--kappa", "inf"], "kappa must be a finite"),
        (["manifold", "--y-range", "1", "0"], "A < B"),
        (
            ["manifold", "--system", "michaelis-menten", "--kappa", "0", "--y-range", "-1", "1"],
            "domain",
        ),
        (["manifold", "--system", "cycle", "--kappa", "2"], "no non-linear family"),
        # the up rate exp(4 (y - 1/2)) underflows below y = -176.6: state 0 would absorb
        (["manifold", "--y-range", "-1e308", "1.5"], "domain [-176.599, 176.155], where its rates"),
    ],
)
def test_analysis_commands_bad_input(args, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert fragment in res.output and "Traceback" not in res.output
    assert not list(tmp_path.rglob("*.nc"))


def test_convergence_refuses_a_short_t_end_before_any_integration(tmp_path, monkeypatch):
    """eps = 0.5 has an initial layer of about 1.6 > t_end / 2: refused in one sentence before
    the reduced system or any eps is integrated (the check ran after the first integration)."""
    import fastslow_sim.integrators
    import fastslow_sim.manifold

    def never(*a, **k):
        raise AssertionError("integrated before the check")

    monkeypatch.setattr(fastslow_sim.integrators, "integrate", never)
    monkeypatch.setattr(fastslow_sim.manifold, "integrate_reduced", never)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["convergence", "--eps", "0.001,0.5", "--t-end", "1"])
    assert res.exit_code == 2, res.output
    assert res.output == ("Error: eps=0.5 is too large for --t-end=1: the initial layer lasts "
                          "about 1.63, and must last less than half of --t-end (0.5); expected "
                          "smaller eps or --t-end above 3.26.\n")  # fmt: skip
    assert not list(tmp_path.iterdir())  # not even the default fastslow-results/


@pytest.mark.parametrize(
    "t_end, shown",
    [("1e300", "1e+300"), ("1e6", "1000000"), ("1000.0001", "1000.0001"),
     (repr(float(np.nextafter(1000.0, 2000.0))), "1000.0000000000001")],
)  # fmt: skip
def test_convergence_refuses_a_huge_t_end_before_any_integration(t_end, shown, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    """1e300 hung (the explicit reduced solve's steps stay O(1) at the equilibrium); 1e6 ran
    8 minutes to report round-off as slopes (two-state: -0.597, -0.597, 0.000). Both are
    beyond the bound, refused in one sentence before anything is integrated or written. The
    sentence names the option and shows the value as given: 1000.0001 was "t_end=1000 is
    beyond 1000" (the library's name, the value rounded by :g)."""
    import fastslow_sim.integrators
    import fastslow_sim.manifold

    def never(*a, **k):
        raise AssertionError("integrated before the check")

    monkeypatch.setattr(fastslow_sim.integrators, "integrate", never)
    monkeypatch.setattr(fastslow_sim.manifold, "integrate_reduced", never)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["convergence", "--system", "two-state", "--t-end", t_end])
    assert res.exit_code == 2, res.output
    assert res.output == (
        f"Error: --t-end={shown} is beyond 1000: the slow variable settles by t of order 10, "
        "so a longer run adds only equilibrium, where the errors are the solver's round-off, "
        "at a cost that grows with --t-end; expected --t-end <= 1000.\n"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_convergence_slope_at_the_solver_floor_is_n_d(tmp_path):
    """|x - h0 - eps h1| at eps 4e-5 to 1e-5 (two-state) is ~1e-13, under 10 x the solver's
    floor: the command printed slope 0.669 (theory 2); now n/d and the reason, null in JSON."""
    args = ["convergence", "--system", "two-state", "--eps", "4e-5,2e-5,1e-5", "--t-end", "1",
            "--no-plot", "--out", str(tmp_path / "c.nc")]  # fmt: skip
    res = run(args)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    (slope,) = [ln for ln in lines if ln.startswith("     slope ")]  # the table's row
    assert slope.split()[1:4] == ["1.000", "n/d", "1.000"]
    # (the error is at the floor, round-off: its third digit follows the solver's arithmetic)
    note = re.compile(
        r"slope of \|x-h0-eps h1\| not determined: the error at eps=4e-05 \(1\.9\de-13\) is not "
        r"above 10 times its floor 8\.7e-12 \(the solver's tolerance and round-off\), so the "
        r"solver, not eps, may set it"
    )
    assert any(note.fullmatch(ln) for ln in lines), res.output
    assert "nan" not in res.output.lower()
    data = json.loads(run([*args, "--json"]).output)
    assert data["slopes"]["err_h1"] is None and data["slopes_smallest_pair"]["err_h1"] is None
    assert abs(data["slopes"]["err_h0"] - 1) < 0.1 and abs(data["slopes"]["err_y"] - 1) < 0.1
    assert set(data["slope_notes"]) == {"err_h1"}
    assert data["slope_notes"]["err_h1"].startswith("not determined: the error at eps=4e-05")
    ds = fs.load_dataset(tmp_path / "c.nc")
    assert np.isnan(ds.attrs["slope_err_h1"])


def test_mapping_command():
    res = run(["mapping", "--json"])
    rows = json.loads(res.output)
    assert {"ode", "network", "holds", "gap"} <= set(rows[0])
    assert any("eps = 1/P" in r["ode"] and r["holds"] == "exact" for r in rows)
    md = run(["mapping", "--markdown"]).output
    assert md.startswith("| ODE object |") and md.count("\n") == len(rows) + 2  # header, rule, rows
    both = run(["mapping", "--markdown", "--json"])  # printed JSON alone, silently
    assert both.exit_code == 2 and "expected one of them" in both.output


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_figures_command_writes_the_figures_it_is_asked_for(tmp_path):
    # every figure and its data: tests/test_gallery.py; here the command's options and output
    names = ("integrate-birth-death", "equilibrium-manifold")
    res = run(["figures", "--only", ",".join(names), "--out-dir", str(tmp_path / "figs"),
               "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert res.exit_code == 0, res.output
    for name in names:
        for ext in ("png", "pdf"):
            assert (tmp_path / "figs" / f"{name}.{ext}").stat().st_size > 10_000
        assert name in res.output
    assert len(list((tmp_path / "res").glob("*.nc"))) == 5  # one trajectory, three eps, h0/h1
    assert "(computed)" in res.output and "total" in res.output


def test_batch_dataset_records_its_seed_and_reproduces(tmp_path):
    """`--batch N --seed S` draws the initial conditions from S: the saved dataset names S (the
    parameters that made it), and the same S draws the same initial states again."""
    saved = {}
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        out = tmp_path / f"{name}.nc"
        res = run(["integrate", "--system", "two-state", "--eps", "0.1", "--t-end", "0.2",
                   "--batch", "2", "--seed", seed, "--n-eval", "3", "--out", str(out),
                   "--no-plot"])  # fmt: skip
        assert res.exit_code == 0, res.output
        saved[name] = fs.load_dataset(out)
    assert int(saved["a"].attrs["seed"]) == 7 and int(saved["c"].attrs["seed"]) == 8
    x0, y0 = fs.random_initial_conditions(fs.make_system("two-state", eps=0.1), 2, 7)
    np.testing.assert_array_equal(saved["a"]["x"].values[:, 0], x0)
    np.testing.assert_array_equal(saved["a"]["y"].values[:, 0], y0)
    np.testing.assert_array_equal(saved["a"]["x"].values, saved["b"]["x"].values)
    assert not np.array_equal(saved["a"]["x"].values[:, 0], saved["c"]["x"].values[:, 0])


def test_long_vectors_are_summarised_in_the_printed_summary():
    from fastslow_sim.cli.common import fmt_vec

    assert fmt_vec(np.arange(16) / 16) == "[" + ", ".join(f"{i / 16:.4g}" for i in range(16)) + "]"
    v = np.arange(4096) / 4096
    assert fmt_vec(v) == "[0, 0.0002441, 0.0004883, 0.0007324, 0.0009766, 0.001221, 0.001465, " \
        "0.001709, ..., 0.9995, 0.9998] (4,096 entries)"


@pytest.mark.parametrize("kind", ["file", "dangling link"])
@pytest.mark.parametrize("args", [["integrate", "--eps", "0.125", "--t-end", "0.5"],
                                  ["convergence"], ["manifold"],
                                  ["figures", "--quick", "--only", "integrate-birth-death"]])
def test_default_output_folder_that_is_not_a_folder(tmp_path, monkeypatch, kind, args):
    """./fastslow-results as a regular file or a link to nothing: one sentence naming it, exit
    status 2, nothing written (was FileExistsError from mkdir, NotADirectoryError in figures)."""
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "fastslow-results"
    if kind == "file":
        results.write_text("the user's own file")
    else:
        results.symlink_to(tmp_path / "nowhere")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "'fastslow-results'" in err and "expected" in err, err
    assert "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fastslow-results"]
    if kind == "file":
        assert results.read_text() == "the user's own file"
    else:
        assert results.is_symlink() and not results.exists()


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_manifold_linear_cycle_at_large_y_is_stable(manifold_run):
    """A linear generator's manifold attracts; `--system cycle --kappa 0 --y-range 1 100`
    printed "repelling (max Re lambda 8.99e+05)", round-off of the full matrix's eigenvalues.
    Re lambda is -0.19999999959 at y = 100 (mpmath): the maximum over the range is above it."""
    args = ["--system", "cycle", "--kappa", "0", "--y-range", "1", "100"]
    res = manifold_run(*args)
    assert res.exit_code == 0, res.output
    assert "repelling" not in res.output and "branch 0: y in [1.0000, 100.0000]" in res.output
    (branch,) = json.loads(manifold_run(*args, "--json").output)["branches"]
    assert branch["stable"] is True and branch["unresolved_points"] == 0
    assert -0.19999999959 < branch["max_real_eigenvalue"] < 0


@pytest.mark.parametrize("y_range, line", [
    (("1", "100"), "branch 0: y in [1.0000, 100.0000], mean c.x in [0.000, 0.382], stable"),
    (("-0.00001", "1"), "branch 0: y in [0.0000, 1.0000], mean c.x in [0.382, 0.500], stable"),
])  # fmt: skip
@pytest.mark.slow
def test_manifold_prints_no_signed_zero(manifold_run, y_range, line):
    """`--system cycle --kappa 0 --y-range 1 100` printed "mean c.x in [-0.000, 0.382]": the
    continuation's point at y = 95 had entries of -5e-20 (its points are now p_st by GTH,
    every entry >= 0), and a number that rounds to zero was printed with its sign (now without,
    in every manifold line: the range's end -1e-05 is "0.0000" at 4 decimals)."""
    args = ["--system", "cycle", "--kappa", "0", "--y-range", *y_range]
    res = manifold_run(*args)  # the run on [1, 100] is the one of the test above
    assert res.exit_code == 0, res.output
    assert line in res.output
    # a signed zero as a number, not as a name's "-0" (pytest's folder "pytest-0/" in the path)
    assert not re.search(r"(?<![\w/])-0\.?0*(?![0-9.])", res.output), res.output
    (branch,) = json.loads(manifold_run(*args, "--json").output)["branches"]
    assert branch["mean_min"] >= 0


def test_numbers_that_round_to_zero_have_no_sign():
    from fastslow_sim.cli.common import fmt_vec
    from fastslow_sim.cli.common import unsigned_zero as _num

    assert [_num(v, ".3f") for v in (-2e-20, -0.0, -0.0004, -0.0006, 0.0)] == [
        "0.000", "0.000", "0.000", "-0.001", "0.000"]  # fmt: skip
    assert _num(-0.0, "g") == "0" and _num(-1e-5, "g") == "-1e-05"
    assert _num(-2e-20, ".2e") == "-2.00e-20"  # its real size where the format shows it
    # integrate's state vectors go through it too: -0.0 printed "-0", -2e-20 keeps its size
    assert fmt_vec([-0.0, -2e-20, 0.5]) == "[0, -2e-20, 0.5]"


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_manifold_default_run_prints_the_supremum_of_the_gap(manifold_run):
    """The default run: the gap printed 0.6187, the maximum over the continuation's points; the
    supremum along the exact graph is 0.61995 (tests/test_nonlinear.py checks it against a
    closed form on 2,000,001 points). The branches, folds and period are unchanged."""
    res = manifold_run()
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "gap = sup over the curve of max_i |phi_i(y) - p_st,i(Q(x_ref, y))| = 0.6200" in lines
    for part in ["branch 0: y in [-1.0000, 0.2271], mean c.x in [0.000, 0.175], stable",
                 "branch 1: y in [0.0229, 0.2271], mean c.x in [0.175, 0.825], repelling",
                 "branch 2: y in [0.0229, 1.5000], mean c.x in [0.825, 1.000], stable",
                 "fold at y = 0.227106, mean c.x = 0.1752", "fold at y = 0.022894, mean c.x = 0.8248",
                 "period 1.600"]:  # fmt: skip
        assert part in res.output
    data = json.loads(manifold_run("--json").output)
    assert data["gap"] == pytest.approx(0.61995, abs=1e-5) and data["gap_kind"] == "sup"


@pytest.mark.slow
def test_manifold_oscillation_range_is_over_a_cycle_or_named_so(tmp_path, manifold_run):
    """`--kappa 30` printed "relaxation oscillation ...: y in [-6.3648, -2.7877]", y over
    t in [10, 20], a stretch of the upper branch's way down (the cycle, period ~25, runs up to
    y ~ -0.11 past the fold at -0.162): now named as such. The default run's range is over its
    last cycle (between the last two maxima of y, one period apart) and crosses both folds."""
    out = str(tmp_path / "m.nc")
    res = run(["manifold", "--kappa", "30", "--no-plot", "--out", out])
    assert res.exit_code == 0, res.output
    assert "y in [-6.3648, -2.7877] over t in [10, 20], not a full cycle" in res.output
    osc = json.loads(manifold_run("--json").output)["oscillation"]  # the default run
    a, b = osc["y_window"]
    assert osc["y_window_kind"] == "last cycle" and 10 <= a < b <= 20
    assert b - a == pytest.approx(osc["period"], abs=0.011)  # maxima on a grid of 0.005
    assert osc["y_min"] < 0.022894 and osc["y_max"] > 0.227106


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_manifold_oscillation_range_reaches_past_the_folds(tmp_path, monkeypatch):
    """`--osc-eps 1e-6` printed "y in [0.0229, 0.2270]" with the folds at 0.022894 and
    0.227106: the saved points' range, short of the turning points (y moves 0.0016 between
    saved points; the trajectory leaves a fold 2 eps^(2/3) = 2e-4 past it). The turning points
    are located now: the printed range holds both folds, to the digits printed."""
    from fastslow_sim import nonlinear

    # the oscillation to t = 4 (2.5 cycles), not 20: its last cycle's range is the same to 1e-11
    # (measured: y in [0.0227574337, 0.2272999803] either way) in a third of the time (2.0 s, 5.8 s)
    real = nonlinear.manifold_dataset
    monkeypatch.setattr(nonlinear, "manifold_dataset",
                        lambda *a, **kw: real(*a, **{**kw, "osc_t_end": 4.0}))  # fmt: skip
    out = tmp_path / "m.nc"
    res = run(["manifold", "--osc-eps", "1e-6", "--no-plot", "--out", str(out)])
    assert res.exit_code == 0, res.output
    lo, hi = map(float, re.search(r"y in \[([-\d.]+), ([-\d.]+)\] over its last cycle",
                                  res.output).groups())  # fmt: skip
    ds = fs.load_dataset(out)
    folds = sorted(f["y"] for f in json.loads(ds.attrs["folds"]))
    assert lo < folds[0] < folds[1] < hi
    assert (lo, hi) == (round(ds.attrs["osc_y_min"], 4), round(ds.attrs["osc_y_max"], 4))


def test_a_count_of_one_takes_the_singular(tmp_path):
    """The CLI printed '1 trajectories', '1 blocks of slow time H=0.01, 1 tokens each' and
    '1 cells over seed': every count printed with its noun goes through one helper."""
    from fastslow_sim.wording import plural

    assert [plural(n, "step") for n in (0, 1, 2)] == ["0 steps", "1 step", "2 steps"]
    assert (plural(1, "trajectory"), plural(3, "trajectory")) == ("1 trajectory", "3 trajectories")
    assert (plural(1, "entry"), plural(2, "day")) == ("1 entry", "2 days")
    assert plural(12345, "token", spec=",") == "12,345 tokens"
    common = ["--t-end", "0.01", "--n-eval", "2", "--no-plot"]
    res = run(["integrate", "--batch", "1", "--eps", "0.1", *common, "--out", str(tmp_path / "b.nc")])
    assert res.exit_code == 0 and "batch       1 trajectory: {'success': 1}" in res.output
    res = run(["integrate", "--method", "multirate", "--eps", "1", "--t-end", "0.01", "--no-plot",
               "--out", str(tmp_path / "m.nc")])  # fmt: skip  (the map takes no --n-eval)
    assert res.exit_code == 0 and "success: 1 block of slow time H=0.01, 1 token each" in res.output
    # the map takes no tolerance: the summary claimed "rtol 1e-08, atol 1e-10"
    assert "no tolerance (the map's fast propagation is exact per token)" in res.output
    assert "rtol" not in res.output and "atol" not in res.output
    res = run(["sweep", "integrate", "--grid", "seed=0", "--eps", "0.1", "--t-end", "0.01",
               "--n-eval", "2", "--store", str(tmp_path / "s.zarr"), "--workers", "0"])  # fmt: skip
    assert res.exit_code == 0 and "integrate: 1 cell over seed; " in res.output


def test_integrate_prints_and_saves_a_drift_of_the_mass(tmp_path):
    """radau far from state 0 at eps 1e-12 drifts the total probability beyond the tolerance
    of the sum (2.7e-7 against 1.1e-8) with status success: the command prints the warning,
    the JSON summary and the dataset carry it, and the exit status stays 0."""
    import json

    res = CliRunner().invoke(main, ["integrate", "--eps", "1e-12", "--y0", "150", "--t-end",
                                    "1", "--method", "radau", "--out", str(tmp_path / "a.nc"),
                                    "--no-plot", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    warning, summary = res.output.split("\n", 1)
    assert warning.startswith("Warning: the total probability 1^T x drifted by up to 2.")
    summary = json.loads(summary)
    assert summary["status"] == "success"
    assert warning == f"Warning: {summary['mass_drift_warning']}"
    saved = fs.load_dataset(tmp_path / "a.nc")
    assert saved.attrs["mass_drift_warning"] == summary["mass_drift_warning"]


def _drifting(monkeypatch, module, name, text):
    """`module.name` issuing a MassDriftWarning with `text` twice (a repeated warning) first."""
    import warnings

    real = getattr(module, name)

    def f(*args, **kwargs):
        for _ in range(2):
            warnings.warn(text, fs.MassDriftWarning, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, f)


def test_manifold_and_figures_print_a_drift_of_the_mass_as_integrate_does(tmp_path, monkeypatch):
    """The relaxation-oscillation run of `manifold` and the solves of `figures` warn as
    `integrate` does: one line `Warning: ...` on stderr, once per text, never Python's
    `file:line: MassDriftWarning: ...`."""
    from fastslow_sim import gallery, nonlinear

    text = "the total probability 1^T x drifted by up to 3e-07 (a test)"
    _drifting(monkeypatch, nonlinear, "manifold_dataset", text)
    res = CliRunner().invoke(main, ["manifold", "--kappa", "0", "--y-range", "0", "0.5",
                                    "--no-plot", "--out", str(tmp_path / "m.nc")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == f"Warning: {text}"
    assert res.output.count(text) == 1 and "MassDriftWarning" not in res.output
    assert res.output.splitlines()[1] == "birth-death, kappa = 0, y in [0, 0.5]"

    def figures_that_drift(**kw):  # the gallery's solves warn; no figure is drawn
        import warnings

        for _ in range(2):
            warnings.warn(text, fs.MassDriftWarning, stacklevel=2)
        return []

    monkeypatch.setattr(gallery, "make_figures", figures_that_drift)
    res = CliRunner().invoke(main, ["figures", "--only", "ode", "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"Warning: {text}", "total 0.0 s"]


def test_integrate_prints_no_python_warning_lines(tmp_path, monkeypatch):
    """radau overflowing at rates near the float range: numpy's floating-point warnings from
    inside scipy (`radau.py:455: RuntimeWarning: overflow encountered ...` and its source line)
    are not shown, the status says what came of them; another warning of the run, here one
    the library issues (as when numba does not import), is one `Warning:` line, said once."""
    res = CliRunner().invoke(main, ["integrate", "--method", "radau", "--y0", "176.9", "--eps",
                                    "1", "--t-end", "0.5", "--n-eval", "5", "--no-plot", "--out",
                                    str(tmp_path / "ovf.nc")])  # fmt: skip
    assert "status      failed: radau stopped at t = 0: its Newton iteration overflowed" \
        in res.output, res.output  # fmt: skip
    assert "RuntimeWarning" not in res.output and ".py:" not in res.output, res.output
    assert "Warning" not in res.output, res.output

    from fastslow_sim import integrators

    solve = integrators.METHODS["bdf"].solve
    text = "fastslow-sim: the compiled CPU kernels are unavailable (a test)"

    def solve_and_warn(*args, **kwargs):
        import warnings

        for _ in range(2):
            warnings.warn(text, RuntimeWarning, stacklevel=1)
        return solve(*args, **kwargs)

    import dataclasses

    monkeypatch.setitem(integrators.METHODS, "bdf",
                        dataclasses.replace(integrators.METHODS["bdf"], solve=solve_and_warn))
    res = CliRunner().invoke(main, ["integrate", "--method", "bdf", "--eps", "0.1", "--t-end", "1", "--n-eval",
                                    "3", "--no-plot", "--out", str(tmp_path / "w.nc")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.output.count(f"Warning: {text}") == 1 and ".py:" not in res.output, res.output


@pytest.mark.parametrize("args, name, what", [
    (["train-network", "--out", ""], "--out", "folder"),
    (["reproduce", "--out", ""], "--out", "folder"),
    (["training-figures", "--out-dir", ""], "--out-dir", "folder"),
    (["training-figures", "--runs", ""], "--runs", "folder"),
    (["figures", "--out", ""], "--out/--out-dir", "folder"),
    (["figures", "--results-dir", ""], "--results-dir", "folder"),
    (["figures", "--runs", ""], "--runs", "folder"),
    (["figures", "--text", ""], "--text", "file"),
    (["integrate", "--P", "8", "--out", ""], "--out", "file"),
    (["integrate", "--P", "8", "--plot", ""], "--plot", "file"),
    (["convergence", "--out", ""], "--out", "file"),
    (["manifold", "--plot", ""], "--plot", "file"),
    (["sweep", "integrate", "--store", ""], "--store", "zarr store"),
    (["sweep", "train-network", "--store", "s.zarr", "--runs-dir", ""], "--runs-dir", "folder"),
    (["phi-vs-pst", "run", ""], "RUN_DIR", "run folder"),
])  # fmt: skip
def test_an_empty_path_is_refused_in_one_sentence(args, name, what, tmp_path, monkeypatch):
    # train-network --out "" trained into the current folder; reproduce --out "" named
    # runs/reproduce-me, a path never typed; training-figures --out-dir "" wrote here
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output == f"Error: {name} must name a {what}; got an empty string.\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, name, what, value", [
    (["integrate", "--eps", "0.1", "--out", "--json"], "--out", "file", "--json"),
    (["convergence", "--out", "--no-plot"], "--out", "file", "--no-plot"),
    (["manifold", "--plot", "-x.png"], "--plot", "file", "-x.png"),
    (["train-network", "--out", "--resume"], "--out", "folder", "--resume"),
    (["sweep", "integrate", "--store", "--workers", "2"], "--store", "zarr store", "--workers"),
    (["figures", "--out", "--quick"], "--out/--out-dir", "folder", "--quick"),
])  # fmt: skip
def test_a_path_option_given_an_option_is_refused(args, name, what, value, tmp_path, monkeypatch):
    # click gives an option the next word: 'integrate --out --json' wrote a dataset named
    # '--json' and printed text; 'convergence --out --no-plot' wrote a plot
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output == (f"Error: {name} takes a {what} name; got {value!r}, which looks like an "
                          f"option (a name that starts with '-' is given as ./{value}).\n")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["training-figures", "--runs", "runs", "--out-dir", "nodir/x"],
                                  ["figures", "--only", "cost", "--out", "nodir/x"],
                                  ["figures", "--only", "cost", "--results-dir", "nodir/x"],
                                  ["figures", "--quick", "--only", "phi-vs-pst-sweep", "--runs",
                                   "nodir/x"]])  # fmt: skip
def test_figure_folders_above_the_one_given_are_not_made(args, tmp_path, monkeypatch):
    # training-figures --out-dir nodir/x made nodir/ silently; other commands refuse it;
    # figures --runs nodir/x made nodir/x/phi-sweep (or reproduce-me) and trained there (an
    # hour at full sizes)
    from fastslow_sim import gallery, training

    def trains(*a, **kw):
        raise AssertionError("trained")

    monkeypatch.setattr(training, "reproduce", trains)
    monkeypatch.setattr(gallery, "phi_sweep", trains)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    what = {"--results-dir": "results", "--runs": "runs"}.get(args[-2], "figure")
    assert res.output == (f"Error: cannot write the {what} folder 'nodir/x': folder 'nodir' "
                          "does not exist.\n")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.parametrize("max_steps, line", [
    ("300", "(the 3 that reached t_end)"),
    ("50", "y(t_end)    none (no trajectory reached t_end)"),
])  # fmt: skip
def test_a_batch_with_failed_trajectories_says_whose_y_range_it_prints(tmp_path, max_steps, line):
    """The y(t_end) range skips the trajectories that stopped (NaN): it had been printed as the
    batch's, and as 'from nan to nan' where none finished."""
    res = CliRunner().invoke(main, ["integrate", "--eps", "0.125", "--batch", "6", "--seed", "0",
                                    "--max-steps", max_steps, "--method", "rodas4", "--no-plot",
                                    "--out", str(tmp_path / "b.nc")])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert line in res.output and "from nan" not in res.output, res.output


@pytest.mark.parametrize(
    "system, first_line",
    [("cycle", "cycle, kappa = 0, y in [-1, 1.5]"),
     ("michaelis-menten", "michaelis-menten, kappa = 0, y in [0, 1.5]")],
)  # fmt: skip
def test_manifold_defaults_suit_every_system(tmp_path, system, first_line):
    """`manifold --system cycle` was refused for the default `--kappa 3` (only birth-death has a
    non-linear family) and `--system michaelis-menten` for the default `--y-range -1 1.5` (its
    domain is y >= 0): kappa defaults to 0 for the linear systems and the range is cut to the
    domain. Birth-death keeps kappa 3 (see test_manifold_default_run_prints_...)."""
    out = tmp_path / "m.nc"
    res = CliRunner().invoke(main, ["manifold", "--system", system, "--no-plot", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == first_line
    ds = fs.load_dataset(out)
    lo = float(first_line.split("[")[1].split(",")[0])
    assert ds.attrs["kappa"] == 0.0 and list(ds.attrs["y_range"]) == [lo, 1.5]
    assert float(ds["curve_y"].min()) == lo and float(ds["curve_y"].max()) == 1.5


def test_manifold_kappa_minus_zero_is_zero_in_the_header_and_the_name(tmp_path, monkeypatch):
    """--kappa -0 printed "kappa = -0" and wrote manifold-birth-death-kappa-0.nc beside the
    kappa0 file of the same run."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["manifold", "--kappa", "-0", "--no-plot"], prog_name="fastslow-sim")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("birth-death, kappa = 0, y in [-1, 1.5]\n")
    assert [p.name for p in (tmp_path / "fastslow-results").iterdir()] == ["manifold-birth-death-kappa0.nc"]
    with xr.open_dataset(tmp_path / "fastslow-results" / "manifold-birth-death-kappa0.nc") as ds:
        assert np.copysign(1.0, ds.attrs["kappa"]) == 1.0  # +0, not -0


@pytest.mark.parametrize("args, line", [
    (["integrate", "--P", "8", "--t-end", "1e999"],
     "Error: Invalid value for '--t-end': '1e999' is beyond the range of a float (magnitude at "
     "most about 1.8e308); see 'fastslow-sim integrate --help'."),
    (["integrate", "--P", "8", "--n-eval", "9" * 5000],
     "Error: Invalid value for '--n-eval': '999999999999...' (5,000 characters) is not an "
     "integer of at most 4,300 digits; see 'fastslow-sim integrate --help'."),
])  # fmt: skip
def test_numbers_beyond_what_python_reads_are_named_not_echoed_as_inf(args, line, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """--t-end 1e999 was refused as "got inf", a value not typed; 5,000 digits as "not a valid
    integer" (Python's int() reads at most 4,300) echoing all of them."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args, prog_name="fastslow-sim")
    assert res.exit_code == 2 and res.output.strip() == line, res.output


@pytest.mark.parametrize("args, message", [
    (["train-network", "--pool-offset", "8"],
     "Error: --pool-offset must be an integer from 0 to P - 1 = 7 (--P 8); got 8.\n"),
    (["reproduce", "--P", "4", "--pool-offset", "-1"],
     "Error: --pool-offset must be an integer from 0 to P - 1 = 3 (--P 4); got -1.\n"),
])  # fmt: skip
def test_a_pool_offset_outside_the_block_is_refused_before_any_work(args, message, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and res.output == message
    assert not list(tmp_path.iterdir())
