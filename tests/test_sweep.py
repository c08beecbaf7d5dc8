"""Sweeps: the grid syntax, the store's layout, resuming, failed cells, dask clusters (local,
remote, a worker killed, the client killed), and results equal to the cells run one by one."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import fastslow_sim as fs
from fastslow_sim.cli import main
from fastslow_sim.errors import InputError
from fastslow_sim.sweep import CELLS, parse_grid, run_sweep

SHORT = {"t_end": "0.5", "n_eval": "5"}  # tiny integrate cells (about 0.1 s each)
FAST = {**SHORT, "eps": "0.125"}  # and eps, where it is not swept


def _one_by_one(system, eps, seed, t_end=0.5, n_eval=5):
    """The cell as one `integrate` call of its own (what `integrate --batch 1 --seed S` runs)."""
    s = fs.make_system(system, eps=eps)
    x0, y0 = fs.random_initial_conditions(s, 1, seed)
    return fs.integrate(s, (0.0, t_end), x0, y0, n_eval=n_eval).isel(batch=0)


def _cell_files(store):
    return sorted(p.name for p in (Path(store) / CELLS).glob("*.npz"))


# -- grid ----------------------------------------------------------------------------------------


def test_grid_values_are_typed_and_ranges_inclusive():
    g = parse_grid("integrate", ["eps=1,1e-2", "system=birth-death,cycle", "seed=0:3,7"])
    assert g == {"eps": [1.0, 0.01], "system": ["birth-death", "cycle"], "seed": [0, 1, 2, 3, 7]}
    assert all(isinstance(v, float) for v in g["eps"]) and all(isinstance(v, int) for v in g["seed"])
    assert parse_grid("train-network", ["context=32,64"]) == {"block_size": [32, 64]}
    assert parse_grid("manifold", ["kappa=-1:1"]) == {"kappa": [-1.0, 0.0, 1.0]}


@pytest.mark.parametrize(
    "spec, text",
    [
        ("epsilon=0.1", "'epsilon' is not a parameter of the integrate task"),
        ("eps=0.1,x", "eps must be a number; got 'x'"),
        ("seed=0:2", "give one of eps or P"),
        ("eps=-0.1", "eps must be a positive finite number; got -0.1"),
        ("seed=4:2", "a range is A:B with A <= B"),
        ("seed=0.5:2", "a range is A:B with integers"),
        ("seed=1,1", "repeats a value"),
        ("system=nope", "system must be one of"),
        ("eps", "--grid takes NAME=V1,V2,... or NAME=A:B"),
        ("time=0,1", "'time' is not a parameter"),
    ],
)
def test_bad_grid_is_one_sentence_and_writes_nothing(tmp_path, spec, text):
    store = tmp_path / "s.zarr"
    extra = [] if spec.startswith(("eps", "seed=0:2")) else ["--eps", "0.1"]
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", spec, "--store", str(store),
                                    "--workers", "0", *extra])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert text in res.output and "Traceback" not in res.output
    assert res.output.count("\n") == 1
    assert not store.exists()


# a 20k-token me corpus (random's 100k validation tokens made each finished run's closing
# evaluation over every window most of a training test's time)
TINY_TRAIN = ["--corpus", "me:tokens=20000", "--tokens", "256", "--block-size", "32", "--batch-size", "4",
              "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--P", "4"]  # fmt: skip


def _tiny_train(*swept):
    """TINY_TRAIN without the options named `swept` (a swept parameter is not also fixed)."""
    out, args = [], list(TINY_TRAIN)
    while args:
        name, value = args.pop(0), args.pop(0)
        if name not in swept:
            out += [name, value]
    return out


@pytest.mark.parametrize(
    "args, text",
    [  # values of the option's type that the task's own checks refuse: each was a failed cell
        (["integrate", "--grid", "eps=0.1,1e-13", "--grid", "seed=0,1", *sum(
            ([f"--{k.replace('_', '-')}", v] for k, v in SHORT.items()), [])],
         "--grid eps=1e-13, seed=0: eps = 1e-13 is below 1e-12, the smallest time-scale ratio"),
        (["integrate", "--grid", "eps=0.1,0.05", "--method", "multirate", "--t-end", "1e5"],
         "--t-end, --method: --t-end / --H is 1e+07 blocks of the multirate map, each a saved time "
         "point; expected at most 999,999 blocks"),
        (["integrate", "--grid", "method=rk45,dop853", "--atol", "1e-160", "--eps", "0.125",
          "--t-end", "0.5", "--n-eval", "5"],
         "--grid method=dop853 with --atol 1e-160: --atol must be at least 1e-155 with method 'dop853' (it was "
         "tested down to 1e-155; at 1e-170 on the default run its error norm, the error over atol "
         "squared, overflows float64 and the run fails); got 1e-160."),
        (["integrate", "--grid", "atol=1e-10,1e-301", "--eps", "0.125", "--t-end", "0.5"],
         "--grid atol=1e-301: --atol must be at least 1e-300 with method 'auto' (it was tested "
         "down to 1e-300"),
        (["integrate", "--grid", "eps=0.1,0.05", "--t-end", "1e-320", "--n-eval", "5"],
         "--t-end: the span (0.0, 1e-320) is too short for 5 distinct equally spaced "
         "saved times"),
        (["manifold", "--grid", "kappa=0,1", "--system", "cycle"],
         "--grid kappa=1 with --system cycle: system 'cycle' has no non-linear family; expected "
         "kappa = 0"),
        # the fixed option beside the cell with its value: 2 states are birth-death's, not cycle's
        (["integrate", "--grid", "states=2.0,3", "--system", "cycle", "--eps", "0.1", "--t-end", "0.2"],
         "--grid states=2 with --system cycle: states must be an integer >= 3 and <= 4096; got 2."),
        (["integrate", "--grid", "y0=0.5,-3", "--system", "michaelis-menten", "--eps", "0.1"],
         "--grid y0=-3 with --system michaelis-menten: y0 = -3 is outside the michaelis-menten "
         "generator's domain"),
        (["manifold", "--grid", "y_min=0,2", "--y-max", "1"],
         "--grid y_min=2: the y range must be two finite numbers A < B; got [2.0, 1.0]."),
        (["manifold", "--grid", "y_min=0,-1e308", "--y-max", "1"],
         "--grid y_min=-1e+308: the y range [-1e+308, 1] leaves the birth-death generator's "
         "domain [-176.599, 176.155], where its rates are positive and finite."),
        (["convergence", "--grid", "system=two-state,birth-death", "--eps", "0.5,0.01", "--t-end", "1"],
         "--grid system=birth-death: eps=0.5 is too large for t_end=1: the initial layer lasts"),
        (["convergence", "--grid", "system=two-state,cycle", "--eps", "0.02,0.01", "--t-end", "1e300"],
         "--t-end: t_end=1e+300 is beyond 1000: the slow variable settles"),
        (["train-network", "--grid", "n_layer=1,0", *_tiny_train("--n-layer")],
         "--grid n_layer=0: n_layer must be a positive integer; got 0."),
        (["train-network", "--grid", "lr=1e-3,1e38", *TINY_TRAIN],
         "--grid lr=1e+38: lr must be a positive number at most 3.40282e+37 (AdamW steps by up "
         "to the learning rate / (1 - 0.9), which must fit in the model's float32); got 1e+38."),
        # a fixed option at fault is named by its flag, not by the cell (it said "--grid seed=0:")
        (["train-network", "--grid", "seed=0,1", "--min-lr", "1e38", *TINY_TRAIN],
         "--min-lr: min_lr must be a positive number at most 3.40282e+37"),
        (["train-network", "--grid", "seed=0,1", "--threads", "0", *TINY_TRAIN],
         "--threads: threads must be an integer from 1 to"),
        # ... and beside the cell where the grid takes part
        (["train-network", "--grid", "batch_size=4,16", *_tiny_train("--batch-size")],
         "--grid batch_size=16 with --tokens 256: tokens must be from 512 (one batch: "
         "batch_size 16 x block_size 32)"),
        (["train-network", "--grid", "n_embd=32,33", *_tiny_train("--n-embd")], "--grid n_embd=33: "),
        # seeds are left out of the cells' checks: their option checks them (a failed cell before)
        (["train-network", "--grid", "seed=-1:1", *TINY_TRAIN],
         "--grid 'seed=-1:1': seed must be an integer from 0 to 18,446,744,073,709,550 (the data "
         "order's generator takes seed x 1000 + rank); got -1."),
        (["train-network", "--grid", "n_layer=1,2", "--seed", "18446744073709552",
          *_tiny_train("--n-layer")], "--seed: seed must be an integer from 0 to"),
    ],
)  # fmt: skip
def test_bad_cell_is_refused_before_any_cell_runs(tmp_path, monkeypatch, args, text):
    """Every cell is checked by its task's own checks before any runs or the store is made:
    one sentence naming the cell or the fixed option at fault, exit status 2 (it was a failed
    cell and exit 1 after the other cells' work)."""
    import fastslow_sim.sweep as sw

    def never(*a, **k):
        raise AssertionError("a cell ran before the grid was checked")

    monkeypatch.setattr(sw, "run_cells", never)
    store = tmp_path / "s.zarr"
    res = CliRunner().invoke(main, ["sweep", *args, "--store", str(store), "--workers", "0"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"Error: {text}") and res.output.count("\n") == 1, res.output
    assert not store.exists() and not (tmp_path / "s-runs").exists()


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_grid_too_large_is_refused_at_once(tmp_path, monkeypatch):
    """A range of 1e8 seeds, several ranges each under the cap, or a product of grids beyond it:
    one sentence, before any list longer than the cap is built (a 1e8 range hung, expanding;
    four ranges of 1e6 were all expanded first, 19 s and 0.8 GB)."""
    import fastslow_sim.sweep as sw

    typed = []
    real = sw._typed
    monkeypatch.setattr(sw, "_typed", lambda *a: typed.append(1) or real(*a))
    with pytest.raises(InputError, match="more than 1,000,000 cells"):
        parse_grid("integrate", ["eps=0.1", "seed=0:100000000"])
    assert len(typed) == 1  # eps=0.1 only: the range was refused unexpanded
    typed.clear()
    with pytest.raises(InputError, match="more than 1,000,000 cells"):
        parse_grid("integrate", ["seed=0:999999,1000000:1999999,2000000:2999999"])
    assert len(typed) == sw.MAX_CELLS  # the first range (within the cap), nothing after it
    monkeypatch.setattr(sw, "_typed", real)
    side = int(sw.MAX_CELLS**0.5) + 1
    store = tmp_path / "big.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", f"seed=0:{side - 1}",
                                    "--grid", f"P=1:{side}", "--store", str(store),
                                    "--workers", "0"])  # fmt: skip
    assert res.exit_code == 2 and "more than 1,000,000 cells" in res.output
    assert res.output.count("\n") == 1 and not store.exists()


def test_task_flags_pass_through_or_are_refused_by_name(tmp_path, monkeypatch):
    """`sweep integrate ... --no-plot` said "option --no-plot needs a value", and `--no-plot
    --P 8` took "--P" as its value, then refused "unexpected argument '8'". A flag (an option
    with no value) is now a boolean parameter of the task set to true, or refused in one
    sentence naming it; a parameter that takes a value still says it needs one."""
    import fastslow_sim.sweep as sw

    store = tmp_path / "s.zarr"
    base = ["sweep", "integrate", "--grid", "seed=0", "--store", str(store), "--workers", "0",
            "--eps", "0.1"]  # fmt: skip
    for extra, text in [(["--no-plot"], "'no-plot' is not a parameter of the integrate task"),
                        (["--no-plot", "--P", "8"], "'no-plot' is not a parameter of the integrate task"),
                        (["--plot", "x.png"], "'plot' is not a parameter of the integrate task"),
                        (["--t-end"], "option --t-end needs a value."),
                        (["--t-end", "--rtol", "1e-6"], "option --t-end needs a value.")]:  # fmt: skip
        res = CliRunner().invoke(main, base + extra)
        assert res.exit_code == 2 and text in res.output, (extra, res.output)
        assert res.output.count("\n") == 1 and "Traceback" not in res.output
        assert not store.exists() and not (tmp_path / "x.png").exists()
    seen = {}

    def capture(task, grids, options, *a, **k):
        seen.update(options)
        raise InputError("captured.")

    monkeypatch.setattr(sw, "run_sweep", capture)
    res = CliRunner().invoke(main, ["sweep", "train-network", "--grid", "seed=0", "--store",
                                    str(store), "--compile", "--lr", "1e-3"])  # fmt: skip
    assert res.exit_code == 2 and "captured." in res.output
    assert seen == {"compile": "true", "lr": "1e-3"}
    assert sw._typed(sw.get_task("train-network"), "compile", seen["compile"], "") is True


def test_bad_task_option_and_task_name(tmp_path):
    store = str(tmp_path / "s.zarr")
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "seed=0", "--store", store,
                                    "--eps", "0.1", "--t-ned", "1"])  # fmt: skip
    assert res.exit_code == 2 and "'t-ned' is not a parameter of the integrate task" in res.output
    res = CliRunner().invoke(main, ["sweep", "integrat", "--grid", "seed=0", "--store", store])
    assert res.exit_code == 2 and "unknown sweep task 'integrat'" in res.output
    res = CliRunner().invoke(main, ["sweep", "convergence", "--grid", "eps=0.1", "--store", store])
    assert res.exit_code == 2 and "cannot be swept in convergence" in res.output
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "seed=0", "--store",
                                    str(tmp_path / "other"), "--eps", "0.1"])  # fmt: skip
    assert res.exit_code == 2 and "is not a sweep store" in res.output


# -- in this process ----------------------------------------------------------------------------


def test_store_layout_resume_and_one_by_one(tmp_path):
    store = tmp_path / "s.zarr"
    grid = ["eps=0.1,0.05", "system=birth-death,two-state", "seed=0:1"]
    res = run_sweep("integrate", grid, SHORT, store, workers=0, chunk_size=1, progress=False,
                    log=lambda *a: None)  # fmt: skip
    assert (res["n_cells"], res["n_run"], res["n_failed"]) == (8, 8, 0)
    ds = xr.open_zarr(store)
    assert tuple(ds["x"].dims) == ("eps", "system", "seed", "time", "state")
    assert ds.sizes["state"] == 8  # birth-death's 8 states; two-state's 2, padded with NaN
    assert ds["eps"].values.tolist() == [0.1, 0.05] and ds["seed"].values.tolist() == [0, 1]
    assert (ds["status"].values == "done").all() and ds.attrs["n_done"] == 8
    assert ds.attrs["task"] == "integrate" and json.loads(ds.attrs["options"])["t_end"] == 0.5
    assert ds["x"].attrs["long_name"].startswith("fast variable")
    assert np.isnan(ds["x"].sel(system="two-state").values[..., 2:]).all()
    # each cell equals the same cell run alone, bit for bit (chunk_size=1: the same call)
    for e in (0.1, 0.05):
        for system in ("birth-death", "two-state"):
            for seed in range(2):
                one = _one_by_one(system, e, seed)
                cell = ds.sel(eps=e, system=system, seed=seed)
                n = one.sizes["state"]
                assert np.array_equal(cell["x"].values[:, :n], one["x"].values)
                assert np.array_equal(cell["y"].values, one["y"].values)
                assert int(cell["stat_nfev"]) == int(one["stat_nfev"])
    files = {p: p.stat().st_mtime_ns for p in (store / CELLS).glob("*.npz")}
    assert len(files) == 8
    # the same command again runs nothing and rewrites no cell
    again = run_sweep("integrate", grid, SHORT, store, workers=0, progress=False, log=lambda *a: None)
    assert (again["n_skipped"], again["n_run"]) == (8, 0)
    assert {p: p.stat().st_mtime_ns for p in (store / CELLS).glob("*.npz")} == files
    # a larger grid runs only its new cells
    more = run_sweep("integrate", ["eps=0.1,0.05,0.02", *grid[1:]], SHORT, store, workers=0,
                     progress=False, log=lambda *a: None)  # fmt: skip
    assert (more["n_skipped"], more["n_run"]) == (8, 4)
    assert xr.open_zarr(store).sizes["eps"] == 3


def test_batched_chunk_matches_cells_one_by_one(tmp_path):
    """Default chunking: the seeds and eps of one system are one rodas4 batch (eps per
    trajectory). The steps are the same as alone; only round-off of the folded 1/eps differs,
    so the states agree to 1e-12 (the solver's own tolerance is rtol 1e-8)."""
    store = tmp_path / "b.zarr"
    run_sweep("integrate", ["eps=0.1,0.05", "seed=0:3"], SHORT, store, workers=0, progress=False,
              log=lambda *a: None)  # fmt: skip
    ds = xr.open_zarr(store).load()
    assert len(set(ds["worker"].values.ravel())) == 1
    for e in (0.1, 0.05):
        for seed in range(4):
            one = _one_by_one("birth-death", e, seed)
            cell = ds.sel(eps=e, seed=seed)
            np.testing.assert_allclose(cell["x"].values, one["x"].values, rtol=0, atol=1e-12)
            assert int(cell["stat_naccept"]) == int(one["stat_naccept"])


def test_a_cell_out_of_steps_gives_advice_that_works_from_a_sweep(tmp_path, monkeypatch):
    """The solvers' advice, "raise it with --max-steps N on the command line", was refused by
    a sweep (no such parameter then); a cell's message says how a sweep takes it (fixed or
    swept: `test_H_march_and_max_steps_pass_through_as_integrate_takes_them`)."""
    import fastslow_sim.solvers.scipy_ivp as scipy_ivp
    from fastslow_sim.solvers import MAX_STEPS_HINT
    from fastslow_sim.sweep import SWEEP_MAX_STEPS_HINT

    monkeypatch.setattr(scipy_ivp, "MAX_STEPS", 5)  # rk45 runs out at once
    store = tmp_path / "m.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1", "--method", "rk45",
                                    "--store", str(store), "--workers", "0", "--t-end", "0.5",
                                    "--n-eval", "5", "--json"])  # fmt: skip
    assert res.exit_code == 1, res.output
    message = str(xr.open_zarr(store)["message"].values[0])
    assert message.startswith("solver status max_steps: rk45 stopped after max_steps = 5 steps")
    assert message.endswith(f"; {SWEEP_MAX_STEPS_HINT}.") and MAX_STEPS_HINT not in message


def test_out_of_steps_advice_names_a_stiff_method_only_after_an_explicit_one(tmp_path):
    """A cell of rodas4 (what auto takes for a batch), radau or lsoda that ran out of steps was
    told to "sweep a stiff method (--method radau, ...)"; that part is for explicit methods
    (`explicit_stability` in the registry) only, the advice to raise --max-steps for all."""
    from fastslow_sim.solvers import MAX_STEPS_HINT, METHODS, max_steps_message
    from fastslow_sim.sweep import SWEEP_MAX_STEPS_HINT, SWEEP_RAISE_HINT, _sweep_message

    for method, entry in METHODS.items():
        message = _sweep_message(max_steps_message(method, 3, 0.5), method)
        hint = SWEEP_MAX_STEPS_HINT if entry.explicit_stability else SWEEP_RAISE_HINT
        assert message.endswith(f"; {hint}.") and MAX_STEPS_HINT not in message, method
        assert ("stiff method" in message) == bool(entry.explicit_stability), method
    assert not METHODS["rodas4"].explicit_stability and METHODS["rk45"].explicit_stability
    store = tmp_path / "r.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1", "--method", "radau",
                                    "--max-steps", "3", "--t-end", "1", "--n-eval", "5",
                                    "--store", str(store), "--workers", "0", "--json"])  # fmt: skip
    assert res.exit_code == 1, res.output
    message = str(xr.open_zarr(store)["message"].values[0])
    assert "radau stopped after max_steps = 3 steps" in message
    assert message.endswith(f"; {SWEEP_RAISE_HINT}.") and "stiff method" not in message


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_failed_cell_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """A computation that raises (here a stand-in LinAlgError for eps = 0.05, in its batch and
    alone): the batch is re-run cell by cell, that eps's cells fail, the other cells finish."""
    import fastslow_sim.integrators as integrators

    real = integrators.integrate

    def singular(*a, **k):
        raise np.linalg.LinAlgError("Singular matrix")

    def integrate(system, *a, **k):
        return singular() if system.eps == 0.05 else real(system, *a, **k)

    monkeypatch.setattr(integrators, "integrate_batch", singular)
    monkeypatch.setattr(integrators, "integrate", integrate)
    store = tmp_path / "f.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1,0.05", "--grid",
                                    "seed=0,1", "--store", str(store), "--workers", "0",
                                    "--t-end", "0.5", "--n-eval", "5", "--json"])  # fmt: skip
    assert res.exit_code == 1, res.output
    out = json.loads(res.output)
    assert out["n_failed"] == 2 and out["n_run"] == 4
    ds = xr.open_zarr(store)
    status = ds["status"].values
    assert (status[0] == "done").all() and (status[1] == "failed").all()
    assert str(ds["message"].values[1, 0]) == "LinAlgError: Singular matrix"
    assert np.isnan(ds["x"].values[1]).all() and np.isfinite(ds["x"].values[0]).all()
    # failed cells are final unless asked: the same command runs nothing
    again = run_sweep("integrate", ["eps=0.1,0.05", "seed=0,1"], SHORT, store, workers=0,
                      progress=False, log=lambda *a: None)  # fmt: skip
    assert again["n_run"] == 0 and again["n_failed"] == 2
    retry = run_sweep("integrate", ["eps=0.1,0.05", "seed=0,1"], SHORT, store, workers=0,
                      retry_failed=True, progress=False, log=lambda *a: None)  # fmt: skip
    assert retry["n_run"] == 2 and retry["n_failed"] == 2
    monkeypatch.setattr(integrators, "integrate", real)  # the failure is gone: retried, done
    monkeypatch.setattr(integrators, "integrate_batch", fs.integrate_batch)
    fixed = run_sweep("integrate", ["eps=0.1,0.05", "seed=0,1"], SHORT, store, workers=0,
                      retry_failed=True, progress=False, log=lambda *a: None)  # fmt: skip
    assert fixed["n_run"] == 2 and fixed["n_failed"] == 0


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_an_unreadable_cell_file_is_computed_again_with_a_warning(tmp_path, damage):
    """A cell is written whole (a temporary file linked onto its name), so a cell file that
    cannot be read (cut short, overwritten) is no finished cell: the same command warns in one
    line naming it, computes the cell again and ends as the first run did (it raised
    BadZipFile, or numpy's pickle ValueError, with a traceback). `consolidate` alone refuses it
    in one sentence naming the file."""
    from fastslow_sim.sweep import (
        UnreadableCellError,
        consolidate,
        get_task,
        make_cells,
        parse_options,
    )

    store = tmp_path / "s.zarr"
    args = ["sweep", "integrate", "--grid", "eps=0.1,0.05", "--t-end", "0.5", "--n-eval", "5",
            "--store", str(store), "--workers", "0", "--json"]  # fmt: skip
    assert CliRunner().invoke(main, args).exit_code == 0
    before = xr.open_zarr(store).load()
    cell = store / CELLS / f"{before['cell_key'].values[0]}.npz"
    if damage == "truncated":
        os.truncate(cell, 1000)
    else:
        cell.write_bytes(bytes(range(256)) * 8)
    t = get_task("integrate")
    grid = parse_grid(t, ["eps=0.1,0.05"])
    fixed = parse_options(t, SHORT, grid)
    with pytest.raises(UnreadableCellError, match=f"the sweep cell file '{cell}' cannot be read "
                       r"\(not a whole \.npz file: .*\); expected a cell file that a sweep "
                       r"wrote: rerun the same sweep"):  # fmt: skip
        consolidate(store, t, grid, fixed, make_cells(t, grid, fixed))
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.output.splitlines() if ln.startswith("Warning:")]
    assert warned == [f"Warning: the sweep cell file '{cell}' cannot be read (not a whole .npz "
                      f"file: {'BadZipFile' if damage == 'truncated' else 'ValueError'}), so it "
                      f"is no finished cell; it is removed and the cell computed again."]  # fmt: skip
    out = json.loads(next(ln for ln in res.output.splitlines() if ln.startswith("{")))
    assert (out["n_skipped"], out["n_run"], out["n_failed"]) == (1, 1, 0)
    after = xr.open_zarr(store).load()
    assert (after["status"].values == "done").all()
    assert np.array_equal(after["x"].values, before["x"].values)
    assert _cell_files(store) == sorted(f"{k}.npz" for k in before["cell_key"].values)


def test_a_store_in_runs_makes_runs_and_another_missing_folder_is_refused(tmp_path, monkeypatch):
    """`--store runs/sweep.zarr`, as the README and --help type it, failed on a fresh clone
    ("folder 'runs' does not exist"): runs/ is the commands' own folder, made as needed."""
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "integrate", "--grid", "eps=0.1", "--workers", "0", "--t-end", "0.5",
            "--n-eval", "3", "--json", "--store"]  # fmt: skip
    res = CliRunner().invoke(main, [*args, "runs/s.zarr"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "runs" / "s.zarr" / "zarr.json").is_file()
    res = CliRunner().invoke(main, [*args, "other/s.zarr"])
    assert res.exit_code == 2 and "folder 'other' does not exist" in res.output
    assert not (tmp_path / "other").exists()


def test_solver_failure_is_a_failed_cell(tmp_path, failing_march):
    """A trajectory whose solver stops (rodas4's march going non-finite; the in-process cell sees
    the patched march) is a failed cell with the solver's status in its message, as `integrate`
    exits 1 on it."""
    store = tmp_path / "nf.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1", "--store",
                                    str(store), "--workers", "0", "--method", "rodas4",
                                    "--t-end", "0.5", "--n-eval", "3", "--json"])  # fmt: skip
    ds = xr.open_zarr(store).load()
    assert str(ds["solver_status"].values[0]) != "success"
    assert res.exit_code == 1, res.output
    assert json.loads(res.output)["n_failed"] == 1
    assert str(ds["status"].values[0]) == "failed" and ds.attrs["n_failed"] == 1
    assert str(ds["solver_status"].values[0]) in str(ds["message"].values[0])


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_manifold_and_convergence_cells(tmp_path):
    ds = run_sweep("manifold", ["kappa=0,1"], {"osc_eps": "0.01"}, tmp_path / "m.zarr",
                   workers=0, progress=False, log=lambda *a: None)["dataset"]  # fmt: skip
    # the linear identity holds to round-off at kappa = 0 (DESIGN 3.2), and the gap is the same
    # number `fastslow-sim manifold` reports
    assert float(ds["gap"].sel(kappa=0.0)) < 1e-12
    from fastslow_sim.nonlinear import family_for, manifold_dataset

    ref = manifold_dataset(family_for("birth-death", 1.0), (-1.0, 1.5), osc_eps=0.01)
    assert float(ds["gap"].sel(kappa=1.0)) == ref.attrs["gap"]
    # the birth-death family has an exact graph: the gap is its supremum, and the label says so
    assert ref.attrs["gap_kind"] == "sup" and ds["gap"].attrs["long_name"].startswith("sup ")
    conv = run_sweep("convergence", ["system=two-state"], {"eps": "0.02,0.01", "t_end": "1"},
                     tmp_path / "c.zarr", workers=0, progress=False, log=lambda *a: None)["dataset"]  # fmt: skip
    assert tuple(conv["err_h0"].dims) == ("system", "eps")
    assert abs(float(conv["slope_err_h0"][0]) - 1) < 0.1  # theory: slope 1
    assert str(conv["slope_err_h0_note"].values[0]) == ""  # determined: no reason given


# -- dask ----------------------------------------------------------------------------------------


@pytest.mark.slow  # 10 s; two workers on integrate cells stay in the default run
def test_local_cluster_of_two_workers_manifold(tmp_path):
    """The default engine: a local cluster of two worker processes, here on cheap manifold
    cells, equal bit for bit to `manifold_dataset` called in this process."""
    from fastslow_sim.nonlinear import family_for, manifold_dataset

    store = tmp_path / "m.zarr"
    res = CliRunner().invoke(main, ["sweep", "manifold", "--grid", "kappa=0,0.5,1", "--store",
                                    str(store), "--workers", "2", "--y-max", "1.0", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n_run"] == 3
    ds = xr.open_zarr(store).load()
    assert all(w.startswith("tcp://127.0.0.1:") for w in ds["worker"].values)
    for k in (0.0, 0.5, 1.0):
        ref = manifold_dataset(family_for("birth-death", k), (-1.0, 1.0), osc_eps=0.01)
        n = ref.sizes["point"]
        cell = ds.sel(kappa=k)
        assert np.array_equal(cell["curve_mean"].values[:n], ref["curve_mean"].values)
        assert np.isnan(cell["curve_mean"].values[n:]).all()  # padding of shorter curves
        assert float(cell["gap"]) == ref.attrs["gap"]


@pytest.mark.slow
def test_local_cluster_of_two_workers(tmp_path):
    """Two worker processes; the cells are spread over both and are, bit for bit, the cells
    run one by one; each worker's torch runs the threads it was given."""
    store = tmp_path / "d.zarr"
    lines = []
    res = run_sweep("integrate", ["eps=0.1,0.05", "seed=0:3"], SHORT, store, workers=2,
                    chunk_size=1, threads=1, progress=False, log=lines.append)  # fmt: skip
    assert res["n_run"] == 8 and res["n_failed"] == 0
    assert "2 workers" in lines[0]
    ds = xr.open_zarr(store).load()
    assert all(w.startswith("tcp://127.0.0.1:") for w in ds["worker"].values.ravel())
    for e in (0.1, 0.05):
        for seed in range(4):
            assert np.array_equal(ds["x"].sel(eps=e, seed=seed).values,
                                  _one_by_one("birth-death", e, seed)["x"].values)  # fmt: skip
    assert len(_cell_files(store)) == 8


def _threads_on_worker():
    from fastslow_sim.sweep import _limit_threads

    _limit_threads()
    import torch

    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


@pytest.mark.slow
def test_threads_per_worker_reach_torch():
    from distributed import Client

    from fastslow_sim.sweep import _local_cluster

    with _local_cluster(2, threads=2) as cluster, Client(cluster) as c:
        got = c.run(_threads_on_worker)
    assert set(got.values()) == {("2", 2)}


def _wait_for(pred, timeout=120.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("workers", [3, 1000])
def test_more_local_workers_than_cpus_are_refused(tmp_path, monkeypatch, workers):
    """`--workers 40` on 2 cores did not finish 2 cells in 55 s, and each worker process holds
    about 80 MB (`--workers 1000` would exhaust the memory): more than the CPUs this process
    may use are refused in one sentence naming both, before any process starts or the store
    is made; as many as the CPUs, or a scheduler's cluster, are not capped."""
    import fastslow_sim.sweep as sw

    monkeypatch.setattr(sw, "usable_cpus", lambda: 2, raising=False)  # (old code: no cap)
    monkeypatch.setattr(sw, "_local_cluster", lambda *a, **k: pytest.fail("a cluster started"))
    store = tmp_path / "s.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1,0.05", "--t-end", "1",
                                    "--store", str(store), "--workers", str(workers)])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert res.output == (f"Error: --workers {workers:,} asks for more local worker processes than "
                          f"the 2 CPUs this process may use; expected at most 2 (or --scheduler "
                          f"ADDRESS, a cluster of its own).\n")  # fmt: skip
    assert not store.exists()
    with pytest.raises(InputError, match=f"--workers {workers:,} asks for more"):
        run_sweep("integrate", ["eps=0.1"], {"t_end": 1.0}, store, workers=workers)
    assert not store.exists()
    from fastslow_sim.threads import usable_cpus

    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    # one usable CPU still takes two workers (the review: check_wheel.sh's `--workers 2` and
    # the tests' two-worker clusters were refused under `taskset -c 0`)
    monkeypatch.setattr(sw, "usable_cpus", lambda: 1, raising=False)
    with pytest.raises(pytest.fail.Exception, match="a cluster started"):
        run_sweep("integrate", ["eps=0.1"], {"t_end": 1.0}, store, workers=2, progress=False)
    with pytest.raises(InputError, match=r"--workers 3 asks for more local worker processes "
                                         r"than 2 \(the 1 CPU this process may use takes two at "
                                         r"most\); expected at most 2 "):  # fmt: skip
        run_sweep("integrate", ["eps=0.1"], {"t_end": 1.0}, store, workers=3)


@pytest.mark.parametrize("address, said", [
    ("bogus", "has no valid HOST:PORT"), ("tcp://bogus", "has no valid HOST:PORT"),
    ("", "has no valid HOST:PORT"), ("127.0.0.1:abc", "has no valid HOST:PORT"),
    ("foo://1.2.3.4:5", "has an unknown scheme 'foo'"),
    # known to distributed, but a traceback: sweeps set up neither in-process, TLS nor UCX
    ("inproc://x", "uses the scheme 'inproc'"), ("tls://127.0.0.1:1", "uses the scheme 'tls'"),
    ("ucx://127.0.0.1:1", "uses the scheme 'ucx'"),
])  # fmt: skip
def test_a_malformed_scheduler_address_is_one_sentence_and_leaves_no_store(tmp_path, address, said):
    """`--scheduler bogus` (or `tcp://bogus`, "", `foo://1.2.3.4:5`) was distributed's
    `ValueError` with a traceback and exit 1, where an unreachable address was one sentence."""
    store = tmp_path / "s.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1,0.05", "--t-end", "1",
                                    "--store", str(store), "--scheduler", address])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"Error: --scheduler {address!r} {said}")
    assert "tcp://127.0.0.1:8786" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not store.exists()
    with pytest.raises(InputError, match="not a dask|HOST:PORT|unknown scheme"):
        run_sweep("integrate", ["eps=0.1"], {"t_end": 1.0}, tmp_path / "t.zarr", scheduler=address)
    assert not (tmp_path / "t.zarr").exists()


@pytest.mark.slow
def test_remote_scheduler_and_worker_processes(tmp_path):
    """A `dask scheduler` and a `dask worker` started as their own processes on 127.0.0.1; the
    sweep goes to the scheduler's address."""
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    dask = [sys.executable, "-m", "dask"]
    procs = [subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]  # fmt: skip
    try:
        _wait_for(sched_file.exists, what="the scheduler file")
        _wait_for(lambda: "address" in sched_file.read_text(), what="the scheduler address")
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen([*dask, "worker", address, "--nworkers", "1", "--nthreads",
                                       "1", "--no-dashboard", "--host", "127.0.0.1"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        from distributed import Client

        with Client(address, timeout="30s") as c:
            c.wait_for_workers(1, timeout=120)
            remote_workers = set(c.scheduler_info(n_workers=-1)["workers"])
        store = tmp_path / "r.zarr"
        res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1,0.05", "--grid",
                                        "seed=0,1", "--store", str(store), "--scheduler",
                                        address, "--t-end", "0.5", "--n-eval", "5",
                                        "--chunk-size", "1"])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "4 run, 0 failed" in res.output
        ds = xr.open_zarr(store).load()
        assert set(ds["worker"].values.ravel()) <= remote_workers
        assert np.array_equal(ds["x"].sel(eps=0.05, seed=1).values,
                              _one_by_one("birth-death", 0.05, 1)["x"].values)  # fmt: skip
        bad = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "seed=0", "--store",
                                        str(tmp_path / "x.zarr"), "--eps", "0.1",
                                        "--scheduler", "tcp://127.0.0.1:1"])  # fmt: skip
        assert bad.exit_code == 2 and "cannot reach the dask scheduler" in bad.output
        assert not (tmp_path / "x.zarr").exists()
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.slow
def test_worker_killed_mid_sweep(tmp_path):
    """A worker process is killed while it runs a cell: the scheduler re-runs its tasks, the
    sweep completes, every cell is written exactly once and equals the cell run alone."""
    from distributed import Client

    from fastslow_sim.sweep import _local_cluster

    store = tmp_path / "k.zarr"
    killed = []
    opts = {"t_end": "2", "n_eval": "5"}

    with _local_cluster(2, threads=1) as cluster, Client(cluster) as c:

        def kill_one(results, chunk):
            if killed:
                return
            busy = [w for w, tasks in c.processing().items() if tasks]
            if not busy:
                return
            pid = c.run(os.getpid, workers=[busy[0]])[busy[0]]
            running = list(c.processing()[busy[0]])
            os.kill(pid, signal.SIGKILL)
            killed.append((busy[0], running))

        res = run_sweep("integrate", ["eps=0.1,0.05,0.02", "seed=0:5"], opts, store, client=c,
                        chunk_size=1, progress=False, log=lambda *a: None, on_chunk=kill_one)  # fmt: skip
    assert killed and killed[0][1], "no worker was busy to kill"
    # the cells of the task it was running were finished (by it before it died, or re-run)
    first_keys = {k.split("-")[-2] for k in map(str, killed[0][1])}
    assert res["n_failed"] == 0 and res["n_pending"] == 0
    ds = xr.open_zarr(store).load()
    assert (ds["status"].values == "done").all()
    keys = ds["cell_key"].values.ravel().tolist()
    assert sorted(f"{k}.npz" for k in keys) == _cell_files(store)  # each cell once, no other
    assert first_keys <= set(keys)
    for e in (0.1, 0.05, 0.02):
        for seed in (0, 5):
            one = _one_by_one("birth-death", e, seed, t_end=2.0)
            assert np.array_equal(ds["x"].sel(eps=e, seed=seed).values, one["x"].values)


@pytest.mark.slow
def test_client_killed_and_the_command_rerun(tmp_path):
    """The sweep command is killed (client and its local cluster) after a few cells; the same
    command again runs only the missing cells, and the finished ones keep their first write."""
    store = tmp_path / "c.zarr"
    cmd = [sys.executable, "-m", "fastslow_sim", "sweep", "integrate", "--grid",
           "eps=0.1,0.05,0.02,0.01", "--grid", "seed=0:3", "--store", str(store), "--workers",
           "2", "--chunk-size", "1", "--t-end", "2", "--n-eval", "5", "--json"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_for(lambda: len(_cell_files(store)) >= 3, timeout=300, what="three cells")
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    first = set(_cell_files(store))
    assert 3 <= len(first) < 16
    old = {f: (store / CELLS / f).stat().st_mtime_ns for f in first}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["n_skipped"] == len(first) and out["n_run"] == 16 - len(first)
    ds = xr.open_zarr(store).load()
    assert (ds["status"].values == "done").all() and len(_cell_files(store)) == 16
    assert {f: (store / CELLS / f).stat().st_mtime_ns for f in first} == old
    assert len(set(ds["run_id"].values.ravel())) == 2  # the killed run's cells, and the rerun's


@pytest.mark.slow
def test_reproduce_on_two_workers_is_the_in_process_table(tmp_path, text_file, monkeypatch):
    """`reproduce` on a local cluster of 2 workers gives the in-process table, bit for bit
    (CPU training with one thread per process is deterministic). The workers run one thread
    each (cores // workers here); a cell takes its threads from OMP_NUM_THREADS, so the
    in-process run is given one too (with two, its reductions differ in the last bits)."""
    import torch

    from fastslow_sim.training import reproduce

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    saved = torch.get_num_threads()

    tiny = dict(block_size=32, batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=4,
                eval_batches=2, ckpt_interval=4, warmup_steps=2, progress=False)  # fmt: skip
    try:
        here = reproduce(f"text:{text_file}", 800, 2, ["dense", "coupled"], str(tmp_path / "a"),
                         tiny, log=lambda *a: None)  # fmt: skip
    finally:
        torch.set_num_threads(saved)  # the cell set this process's to 1
    there = reproduce(f"text:{text_file}", 800, 2, ["dense", "coupled"], str(tmp_path / "b"),
                      tiny, log=lambda *a: None, workers=2)  # fmt: skip
    for arm in ("dense", "coupled"):
        assert there["arms"][arm]["val_loss"] == here["arms"][arm]["val_loss"]
    assert [c["verdict"] for c in there["comparisons"]] == [c["verdict"] for c in here["comparisons"]]
    sw = xr.open_zarr(tmp_path / "b" / "sweep.zarr")
    assert tuple(sw["val_loss"].dims) == ("arm", "seed") and (sw["status"].values == "done").all()
    assert len({w for w in sw["worker"].values.ravel()}) >= 1
    assert (tmp_path / "b" / "coupled-seed1" / "summary.json").is_file()


def test_train_cells_never_replace_a_run_of_another_configuration(tmp_path):
    """A train-network sweep's run folders: a cell whose folder holds a run of another
    configuration (or files of no readable run) is refused before any cell runs; a folder with
    an unfinished run of the cell's own configuration (a killed sweep) is trained again."""
    store, runs = tmp_path / "t.zarr", tmp_path / "t-runs"

    def sweep(*extra):
        return CliRunner().invoke(main, ["sweep", "train-network", "--grid", "variant=dense,coupled",
                                         "--store", str(store), "--workers", "0", "--json",
                                         *TINY_TRAIN, *extra])  # fmt: skip

    assert sweep().exit_code == 0
    kept = {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()}
    store_files = {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    res = sweep("--tokens", "512")
    assert res.exit_code == 2, res.output
    assert res.output == (f"Error: --grid variant=dense: the run folder {str(runs / 'dense')!r} "
                          f"holds a run of another configuration (tokens = 256 there, 512 here), "
                          f"which this run would replace; expected another output folder (--out "
                          f"of reproduce, --runs-dir of sweep), or that run's settings to reuse "
                          f"it.\n")  # fmt: skip
    assert {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()} == kept
    assert {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()} == store_files
    # the same command with the store gone: the finished runs are reused, nothing rewritten
    shutil.rmtree(store)
    res = sweep()
    assert res.exit_code == 0, res.output
    assert {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()} == kept
    assert xr.open_zarr(store)["reused"].values.tolist() == [1, 1]
    # a killed run of the same configuration (its checkpoint only) is trained again
    shutil.rmtree(store)
    (runs / "coupled" / "summary.json").unlink()
    (runs / "coupled" / "train.nc").unlink()
    res = sweep()
    assert res.exit_code == 0, res.output
    assert xr.open_zarr(store)["reused"].values.tolist() == [1, 0]
    # a file of the user's own where a run would go: refused, kept
    shutil.rmtree(store)
    (runs / "coupled" / "summary.json").write_text("the user's own notes")
    (runs / "coupled" / "ckpt.pt").write_text("not a checkpoint")
    res = sweep()
    assert res.exit_code == 2 and "(no readable configuration)" in res.output, res.output
    assert (runs / "coupled" / "summary.json").read_text() == "the user's own notes"
    assert not store.exists()


def test_store_of_another_task_is_not_taken_over(tmp_path):
    """A store that holds a manifold sweep keeps it: an integrate sweep into it is refused
    (it deleted the manifold sweep's root group and wrote its own)."""
    store = tmp_path / "k.zarr"
    run_sweep("manifold", ["kappa=0"], {"osc_eps": "0.01"}, store, workers=0, progress=False,
              log=lambda *a: None)  # fmt: skip
    before = sorted(p.name for p in store.iterdir())
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "seed=0", "--eps", "0.1",
                                    "--store", str(store), "--workers", "0"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "holds a sweep of manifold" in res.output and res.output.count("\n") == 1
    assert sorted(p.name for p in store.iterdir()) == before
    assert xr.open_zarr(store).attrs["task"] == "manifold"


def test_a_store_of_other_options_is_refused_not_replaced(tmp_path):
    """A rerun with another fixed option (--t-end 1 after --t-end 0.5) rebuilt the store's root
    from its own cells: the first sweep's results left the dataset, kept only as cell files
    (exit 0), while another task was refused. Another option, or a grid without some of the
    store's values, is refused in one sentence before any work; the same options resume
    (--workers, --chunk-size, --retry-failed and --json are no options of the cells; --march
    auto, the cell without it: `test_an_integrate_store_from_before_states_and_march_is_reused`),
    and a grid with more values or parameters extends the store."""
    store = tmp_path / "s.zarr"
    common = ["--method", "lsoda", "--n-eval", "5", "--store", str(store)]

    def files():
        return {p: p.stat().st_mtime_ns for p in sorted(store.rglob("*"))}

    _sweep_json(["integrate", "--grid", "eps=0.1,0.05", "--t-end", "0.5", *common])
    before = files()
    say = ("; expected a new store, or that sweep's options to resume it (a --grid with more "
           "values extends it): its root group would lose the cells this one lacks.\n")
    for args, what in [
        (["--grid", "eps=0.1,0.05", "--t-end", "1"], "with --t-end 0.5, and this one has --t-end 1"),
        (["--grid", "eps=0.1", "--t-end", "0.5"],
         "with --grid eps=0.1,0.05, and this one has --grid eps=0.1"),
        (["--grid", "eps=0.1,0.05", "--t-end", "0.5", "--rtol", "1e-6"],
         "with --rtol 1e-08, and this one has --rtol 1e-06"),
        (["--grid", "eps=0.1,0.05", "--grid", "t_end=1,2"],
         "with --t-end 0.5, and this one has --grid t_end=1,2"),
    ]:  # fmt: skip
        assert _refused(["integrate", *args, *common]) == (
            f"Error: --store {str(store)!r} holds a sweep of integrate {what}{say}")
        assert files() == before
    ds = xr.open_zarr(store)
    assert json.loads(ds.attrs["options"])["t_end"] == 0.5 and ds.sizes["eps"] == 2
    out = _sweep_json(["integrate", "--grid", "eps=0.05,0.1", "--t-end", "0.5", "--chunk-size",
                       "1", "--retry-failed", *common])  # fmt: skip
    assert (out["n_skipped"], out["n_run"]) == (2, 0)
    out = _sweep_json(["integrate", "--grid", "eps=0.1,0.05,0.02", "--grid", "t_end=0.5,1",
                       *common])  # fmt: skip
    assert (out["n_skipped"], out["n_run"], out["n_failed"]) == (2, 4, 0)
    ds = xr.open_zarr(store).load()
    assert dict(ds["status"].sizes) == {"eps": 3, "t_end": 2} and (ds["status"] == "done").all()


def test_a_store_whose_extension_stopped_resumes_with_its_first_grid(tmp_path, monkeypatch):
    """An extension (--grid eps=0.1,0.05 after eps=0.1) stopped before its new cell ran leaves
    the root listing that cell as pending; the first grid again loses nothing and runs (the
    store check had refused it, naming a cell with no result)."""
    import fastslow_sim.sweep as sweep_module

    store = tmp_path / "s.zarr"
    common = ["--t-end", "0.5", "--method", "lsoda", "--n-eval", "5", "--store", str(store)]
    _sweep_json(["integrate", "--grid", "eps=0.1", *common])

    def stopped(*args, **kwargs):
        raise RuntimeError("stopped before the new cell")

    monkeypatch.setattr(sweep_module, "_drive", stopped)
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.1,0.05", *common,
                                    "--workers", "0"])  # fmt: skip
    assert isinstance(res.exception, RuntimeError)
    monkeypatch.undo()
    assert xr.open_zarr(store)["status"].values.tolist() == ["done", "pending"]
    out = _sweep_json(["integrate", "--grid", "eps=0.1", *common])
    assert (out["n_skipped"], out["n_run"]) == (1, 0)
    # a finished cell the grid lacks is still refused
    _sweep_json(["integrate", "--grid", "eps=0.1,0.05", *common])
    assert "and this one has --grid eps=0.1;" in _refused(["integrate", "--grid", "eps=0.1", *common])
    # ... and so is one whose file is written though the root lists it pending (a run killed
    # before it rewrote the root)
    import zarr

    root = zarr.open_group(str(store), mode="r+")
    root["status"][...] = np.array(["done", "pending"], dtype=root["status"].dtype)
    assert xr.open_zarr(store)["status"].values.tolist() == ["done", "pending"]
    assert "and this one has --grid eps=0.1;" in _refused(["integrate", "--grid", "eps=0.1", *common])


def test_conflicting_cell_is_an_input_error_before_any_write(tmp_path):
    store = tmp_path / "unused.zarr"
    with pytest.raises(InputError, match="give either eps or P, not both"):
        run_sweep("integrate", ["P=4"], FAST, store, workers=0)
    assert not store.exists()


@pytest.mark.slow
def test_train_network_cells_equal_their_runs(tmp_path, text_file):
    """A train-network sweep (in this process) gives the run that `train` makes alone, bit for
    bit, in a run folder named by the swept values."""
    from fastslow_sim.training import TrainConfig, train

    tiny = ["--block-size", "32", "--batch-size", "4", "--n-layer", "1", "--n-head", "2",
            "--n-embd", "32", "--P", "4", "--eval-interval", "4", "--eval-batches", "2",
            "--warmup-steps", "2", "--device", "cpu"]  # fmt: skip
    store = tmp_path / "t.zarr"
    res = CliRunner().invoke(main, ["sweep", "train-network", "--grid", "variant=dense,coupled",
                                    "--store", str(store), "--workers", "0", "--corpus",
                                    f"text:{text_file}", "--tokens", "800", *tiny])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = xr.open_zarr(store).load()
    assert (tmp_path / "t-runs" / "coupled" / "summary.json").is_file()
    cfg = TrainConfig(variant="coupled", corpus=f"text:{text_file}", tokens=800, block_size=32,
                      batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=4,
                      eval_batches=2, warmup_steps=2, device="cpu", out=str(tmp_path / "alone"),
                      progress=False)  # fmt: skip
    alone = train(cfg, log=lambda *a: None)
    assert float(ds["val_loss"].sel(variant="coupled")) == alone["val_loss"]
    assert float(ds["gate"].sel(variant="coupled")[0]) == float(np.mean(alone["gates"][0]))
    assert int(ds["params"].sel(variant="dense")) < int(ds["params"].sel(variant="coupled"))


def test_users_folder_with_a_cells_subfolder_is_refused_untouched(tmp_path):
    """A user's folder that happens to hold a `cells/` subfolder is not a sweep store: refused
    in one sentence, nothing in it deleted or written (it lost important.txt and sub/)."""
    mine = tmp_path / "mine"
    (mine / "cells").mkdir(parents=True)
    (mine / "important.txt").write_text("keep me")
    (mine / "sub").mkdir()
    (mine / "sub" / "f").write_text("mine too")
    before = sorted(str(p.relative_to(mine)) for p in mine.rglob("*"))
    res = CliRunner().invoke(main, ["sweep", "integrate", "--workers", "0", "--t-end", "0.5",
                                    "--grid", "eps=0.1,0.05", "--store", str(mine)])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "is not a sweep store" in res.output and res.output.count("\n") == 1
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == before
    assert (mine / "important.txt").read_text() == "keep me"
    assert (mine / "sub" / "f").read_text() == "mine too"
    # a cells/ folder holding a file the project never writes is not taken for its cells either
    (mine / "important.txt").unlink()
    shutil.rmtree(mine / "sub")
    (mine / "cells" / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="is not a sweep store"):
        run_sweep("integrate", ["eps=0.1"], SHORT, mine, workers=0, progress=False)
    assert sorted(p.name for p in mine.rglob("*")) == ["cells", "notes.txt"]


def test_rerun_keeps_a_users_file_in_a_real_store(tmp_path):
    """The root is rebuilt by deleting only what the project wrote: a file (and a folder) that
    a user put at the top of a real store survive a rerun; a store whose root was never
    written (only cells/) is still resumed."""
    store = tmp_path / "s.zarr"
    kw = dict(workers=0, progress=False, log=lambda *a: None)
    run_sweep("integrate", ["seed=0:1"], FAST, store, **kw)
    (store / "notes.txt").write_text("my notes")
    (store / "extra").mkdir()
    (store / "extra" / "f").write_text("mine")
    again = run_sweep("integrate", ["seed=0:2"], FAST, store, **kw)
    assert (again["n_skipped"], again["n_run"]) == (2, 1)
    assert (store / "notes.txt").read_text() == "my notes"
    assert (store / "extra" / "f").read_text() == "mine"
    assert xr.open_zarr(store).sizes["seed"] == 3
    # interrupted before its root was written: cells/ only
    for entry in store.iterdir():
        if entry.name not in (CELLS, "notes.txt", "extra"):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    shutil.rmtree(store / "extra")
    (store / "notes.txt").unlink()
    res = run_sweep("integrate", ["seed=0:2"], FAST, store, **kw)
    assert (res["n_skipped"], res["n_run"]) == (3, 0)
    assert xr.open_zarr(store).attrs["n_done"] == 3


def test_grid_over_a_parameter_that_is_also_a_cell_variable(tmp_path):
    """`method` is both swept and a variable of each integrate cell (the method that ran):
    consolidation failed with 'variables {'method'} are found in both data_vars and coords'.
    Where every cell ran its swept value the copy is dropped; where not (auto) it is kept as
    method_cell."""
    store = tmp_path / "m.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--workers", "0", "--t-end", "0.5",
                                    "--n-eval", "5", "--eps", "0.1", "--grid",
                                    "method=lsoda,radau", "--store", str(store)])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = xr.open_zarr(store)
    assert ds["method"].values.tolist() == ["lsoda", "radau"] and "method" in ds.coords
    assert "method_cell" not in ds and (ds["status"].values == "done").all()
    again = CliRunner().invoke(main, ["sweep", "integrate", "--workers", "0", "--t-end", "0.5",
                                      "--n-eval", "5", "--eps", "0.1", "--grid",
                                      "method=auto,rodas4", "--store", str(tmp_path / "a.zarr")])  # fmt: skip
    assert again.exit_code == 0, again.output
    ds = xr.open_zarr(tmp_path / "a.zarr")
    assert ds["method"].values.tolist() == ["auto", "rodas4"]
    assert ds["method_cell"].values.tolist() == ["rodas4", "rodas4"]


def test_fixed_option_that_is_also_swept_is_refused(tmp_path):
    """`--grid eps=... --eps 0.5` ran the grid's eps and recorded eps 0.5 nowhere: one of them
    was silently dropped. Refused in one sentence naming the parameter (an alias too)."""
    store = tmp_path / "s.zarr"
    for args, text in [
        (["integrate", "--grid", "eps=0.1,0.01", "--eps", "0.5"],
         "--eps 0.5 sets eps, which --grid eps=... sweeps; expected eps either fixed (--eps) or "
         "swept (--grid), not both."),
        (["train-network", "--grid", "context=32,64", "--context", "16", *_tiny_train("--block-size")],
         "--context 16 sets block_size, which --grid block_size=... sweeps"),
    ]:  # fmt: skip
        res = CliRunner().invoke(main, ["sweep", *args, "--store", str(store), "--workers", "0"])
        assert res.exit_code == 2, res.output
        assert res.output.startswith(f"Error: {text}") and res.output.count("\n") == 1
        assert not store.exists() and not (tmp_path / "s-runs").exists()


def test_integer_values_are_exact_or_refused_naming_the_bound(tmp_path):
    """A seed went through float(): 99999999999999999999999 became 99999999999999991611392 and
    2**53 + 1 became 2**53. Integers are read exactly; beyond int64 (what the store keeps)
    they are refused in one sentence, a range or a huge exponent unexpanded."""
    g = parse_grid("integrate", ["seed=9007199254740993,9223372036854775807,1e3"])
    assert g["seed"] == [2**53 + 1, 2**63 - 1, 1000]
    for spec in ["seed=99999999999999999999999", "seed=9223372036854775808", "seed=0:1e30",
                 "seed=1e999999999"]:  # fmt: skip
        with pytest.raises(InputError, match=r"seed must be an integer from -2\*\*63 to 2\*\*63 - 1 "
                           r"\(9,223,372,036,854,775,807\), which the store keeps as 64-bit"):  # fmt: skip
            parse_grid("integrate", [spec])
    store = tmp_path / "s.zarr"
    res = run_sweep("integrate", ["seed=9007199254740993"], FAST, store, workers=0, progress=False,
                    log=lambda *a: None)  # fmt: skip
    ds = res["dataset"]
    assert ds["seed"].dtype == np.int64 and int(ds["seed"].values[0]) == 2**53 + 1
    x0, _ = fs.random_initial_conditions(fs.make_system("birth-death", eps=0.125), 1, 2**53 + 1)
    assert np.array_equal(ds["x0"].values[0], x0[0])  # the cell ran the seed it names
    assert json.loads(ds.attrs["grid"])["seed"] == [2**53 + 1]


def test_grid_value_the_task_cannot_run_leaves_nothing_on_disk(tmp_path, monkeypatch):
    """`--grid P=8,1e20` (multirate takes any eps) passed the checks, then writing the store's
    P coordinate raised and left a half-made store. A P that eps = 1/P does not give back
    exactly is refused (as integrate refuses it); and a store that fails as it is made is
    removed."""
    import fastslow_sim.sweep as sw

    store = tmp_path / "s.zarr"
    bad = 3451244358460717  # 1/P in float64 gives back P + 1
    assert fs.systems._integer_inverse(1.0 / bad) == bad + 1
    for P, text in [("1e20", "P must be an integer from -2**63 to 2**63 - 1"),
                    (str(bad), f"P = {bad} is not held exactly by eps = 1/P in float64 (1/P "
                               f"rounds to {1.0 / bad!r}, which gives back P = {bad + 1}); "
                               f"expected P at most 2**51 = 2,251,799,813,685,248, or a larger "
                               f"one that comes back exactly")]:  # fmt: skip
        res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", f"P=8,{P}", "--method",
                                        "multirate", "--store", str(store), "--workers", "0"])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert text in res.output and res.output.count("\n") == 1 and "Traceback" not in res.output
        assert not store.exists()
    s = fs.make_system("birth-death", eps=1.0 / 2**51)
    assert s.P == 2**51  # the bound itself comes back exactly

    def broken(*a, **k):
        raise RuntimeError("the root could not be written")

    monkeypatch.setattr(sw, "consolidate", broken)
    with pytest.raises(RuntimeError):
        run_sweep("integrate", ["seed=0"], FAST, store, workers=0, progress=False)
    assert not store.exists()


def test_sweep_takes_the_P_that_integrate_takes(tmp_path):
    """`sweep --grid P=2**52` was refused "at most 2**51, the largest that eps = 1/P gives back
    exactly" while `integrate --P 2**52` ran (and 2**52 = 1/2**-52 comes back exactly); and
    integrate ran P = 3451244358460717 as P + 1 (the system holds eps = 1/P only). Both now
    take every P that eps = 1/P gives back (all up to 2**51, the powers of two beyond) and
    refuse the others with the same sentence."""
    bad = 3451244358460717
    for P in (2**51, 2**52, 2**62, bad):
        assert (fs.systems._integer_inverse(1.0 / P) == P) == (P != bad)
    common = ["--method", "multirate", "--t-end", "0.02"]
    res = CliRunner().invoke(main, ["integrate", "--P", str(bad), *common, "--no-plot", "--out",
                                    str(tmp_path / "i.nc")])  # fmt: skip
    assert res.exit_code == 2 and f"P = {bad} is not held exactly" in res.output, res.output
    assert res.output.count("\n") == 1 and not (tmp_path / "i.nc").exists()
    # --P was read through float: 2**63 - 1 became 2**63 and was refused as "more than 2**63 - 1"
    for digits in (str(2**63 - 1), "9223372036854775296"):
        res = CliRunner().invoke(main, ["integrate", "--P", digits, *common, "--no-plot"])
        assert res.exit_code == 2, res.output
        assert f"P = {digits} is not held exactly" in res.output and "more than" not in res.output
    for P in (2**52, 2**62):
        res = CliRunner().invoke(main, ["integrate", "--P", str(P), *common, "--no-plot", "--out",
                                        str(tmp_path / f"i{P}.nc"), "--json"])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["P"] == P
    store = tmp_path / "s.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", f"P={2**52},{2**62}", *common,
                                    "--store", str(store), "--workers", "0", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = xr.open_zarr(store)
    assert ds["P"].values.tolist() == [2**52, 2**62] and set(ds["status"].values) == {"done"}
    for i, P in enumerate((2**52, 2**62)):  # each cell ran the P it names, as integrate did
        assert float(ds["eps_used"].values[i]) == 1.0 / P
        one = xr.open_dataset(tmp_path / f"i{P}.nc")
        assert one.attrs["tokens_per_block"] == P
        np.testing.assert_array_equal(ds["x"].isel(P=i).values, one["x"].values)


def test_store_and_runs_folders_are_checked_before_any_work(tmp_path):
    """`--store a/b/c.zarr` made a/ and a/b/ silently; `--runs-dir FILE` was not looked at
    until a cell ran. Both are refused up front as every command's outputs are: the folder
    that holds an output must exist, and no folder on the way is a file."""
    (tmp_path / "file").write_text("mine")
    cases = [
        (["integrate", "--grid", "seed=0", "--eps", "0.1", "--store", str(tmp_path / "a/b/c.zarr")],
         f"cannot write the sweep store '{tmp_path}/a/b/c.zarr': folder '{tmp_path}/a/b' does "
         f"not exist."),
        (["integrate", "--grid", "seed=0", "--eps", "0.1", "--store", str(tmp_path / "file/c.zarr")],
         f"'{tmp_path}/file' (above the sweep store '{tmp_path}/file/c.zarr') exists and is not "
         f"a folder"),
        (["integrate", "--grid", "seed=0", "--eps", "0.1", "--store", "/dev/null"],
         "--store '/dev/null' is a character device; expected a new or existing sweep folder"),
        (["train-network", "--grid", "seed=0,1", *TINY_TRAIN, "--store", str(tmp_path / "s.zarr"),
          "--runs-dir", str(tmp_path / "file")],
         f"'{tmp_path}/file' exists and is not a folder; expected the runs folder to be a folder"),
        (["train-network", "--grid", "seed=0,1", *TINY_TRAIN, "--store", str(tmp_path / "s.zarr"),
          "--runs-dir", str(tmp_path / "q/r")],
         f"cannot write the runs folder '{tmp_path}/q/r': folder '{tmp_path}/q' does not exist."),
        (["integrate", "--grid", "seed=0", "--eps", "0.1", "--store", str(tmp_path / "s.zarr"),
          "--runs-dir", str(tmp_path / "r")],
         f"--runs-dir '{tmp_path}/r' is for the run folders of train-network; the integrate task "
         f"writes none."),
    ]  # fmt: skip
    for args, text in cases:
        res = CliRunner().invoke(main, ["sweep", *args, "--workers", "0"])
        assert res.exit_code == 2, res.output
        assert res.output.startswith(f"Error: {text}") and res.output.count("\n") == 1, res.output
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    assert (tmp_path / "file").read_text() == "mine"


def test_an_error_that_is_not_a_write_into_the_store_is_raised_as_it_is(tmp_path):
    """`run_sweep` wrapped any OSError without a file name (a closed pipe that `log` writes
    to, a cluster that cannot start, an error from `on_chunk`) as a write into the store that
    failed: the message named the store and said "... kept in the store" or "(no cell had
    finished: the new store is removed)", and removed a new store. Now only a full disk or an
    I/O error in the store is; anything else is raised unchanged and the store stays."""
    import errno

    raised = OSError(errno.EMFILE, "Too many open files")

    def on_chunk(results, chunk):
        raise raised

    store = tmp_path / "s.zarr"
    with pytest.raises(OSError) as info:
        run_sweep("manifold", ["kappa=0,1"], {}, store, workers=0, progress=False,
                  on_chunk=on_chunk)  # fmt: skip
    assert info.value is raised
    assert len(_cell_files(store)) == 1
    assert xr.open_zarr(store)["status"].values.tolist() == ["done", "pending"]


def test_a_runs_folder_inside_the_store_is_refused(tmp_path):
    """`--runs-dir` inside `--store` was accepted, and a store that failed was removed with
    `rmtree`, training runs included. Now such a runs folder is refused (exit 2, nothing run)."""
    store = tmp_path / "s.zarr"
    store.mkdir()  # an empty folder: a new store
    for runs in (store / "r", store):
        res = CliRunner().invoke(main, ["sweep", "train-network", "--grid", "seed=0", *TINY_TRAIN,
                                        "--store", str(store), "--runs-dir", str(runs),
                                        "--workers", "0"])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert res.output == (f"Error: --runs-dir {str(runs)!r} lies inside the sweep store "
                              f"{str(store)!r}; expected a folder outside it (a store that fails "
                              f"is cleaned up, and the run folders must not go with it).\n")
        assert os.listdir(store) == []


def test_a_failed_new_store_keeps_what_it_did_not_write(tmp_path):
    """A new store in which no cell finished was removed whole (`rmtree`): a folder someone
    put in it went too. Now only what the run wrote goes (the root, cells/)."""
    import errno

    from fastslow_sim.sweep import _store_failed

    store = tmp_path / "s.zarr"
    run_sweep("manifold", ["kappa=0"], {}, store, workers=0, progress=False)
    for cell in _cell_files(store):
        (store / CELLS / cell).unlink()
    (store / "mine").mkdir()
    (store / "mine" / "notes.txt").write_text("mine")
    err = _store_failed(OSError(errno.ENOSPC, "No space left on device"), store, created=True)
    assert err.filename == str(store)
    assert err.strerror.endswith("(no cell had finished: what this run wrote in the store is "
                                 "removed)")
    assert os.listdir(store) == ["mine"] and (store / "mine" / "notes.txt").read_text() == "mine"
    shutil.rmtree(store / "mine")
    run_sweep("manifold", ["kappa=0"], {}, store, workers=0, progress=False)
    for cell in _cell_files(store):
        (store / CELLS / cell).unlink()
    err = _store_failed(OSError(errno.ENOSPC, "No space left on device"), store, created=True)
    assert err.strerror.endswith("(no cell had finished: the new store is removed)")
    assert not store.exists()


def test_a_root_write_that_fails_removes_only_the_root_it_was_writing(tmp_path, monkeypatch):
    """The cleanup of a root write that failed removed every entry that appeared in the store
    meanwhile (`rmtree`), someone else's folder too; now only the root's metadata files and a
    folder per variable go."""
    import errno

    from fastslow_sim.sweep import _write_root

    store = tmp_path / "s.zarr"
    (store / CELLS).mkdir(parents=True)
    ds = xr.Dataset({"x": ("k", np.arange(3.0))})

    def to_zarr(self, where, **kwargs):
        (Path(where) / "x").mkdir()
        (Path(where) / "zarr.json").write_text("{")
        (Path(where) / "theirs").mkdir()  # a folder someone made as the root was written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(xr.Dataset, "to_zarr", to_zarr)
    with pytest.raises(OSError):
        _write_root(ds, store)
    assert sorted(os.listdir(store)) == [CELLS, "theirs"]


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_only_a_write_into_the_store_is_a_store_failure(tmp_path, monkeypatch):
    """Any ENOSPC/EDQUOT/EIO that named no file was taken for a failed write into the store:
    a file `on_chunk` writes on a full disk, or a print to a hung-up terminal (EIO), aborted
    the sweep as "a file operation failed on STORE" and removed a new store. Now every write
    into the store names its file, and only an error naming a file in the store is a store
    failure; any other is raised as it is, and the store is left alone."""
    import errno

    import fastslow_sim.sweep as sweep

    quiet = {"workers": 0, "progress": False, "log": lambda *a: None}
    for code in (errno.ENOSPC, errno.EIO):
        def on_chunk(results, chunk, code=code):  # its own file on a full disk, a hang-up
            raise OSError(code, os.strerror(code))

        store = tmp_path / f"s{code}.zarr"
        with pytest.raises(OSError) as info:
            run_sweep("manifold", ["kappa=0,1"], {}, store, on_chunk=on_chunk, chunk_size=1, **quiet)
        assert (info.value.errno, info.value.filename) == (code, None)
        assert info.value.strerror == os.strerror(code)  # as raised, not a sentence on the store
        assert len(_cell_files(store)) == 1 and (store / "zarr.json").is_file()

    # a write into the store that names no file (np.savez, a chunk of the root) still is one
    real_dump = sweep._dump_cell

    def dump(ds, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sweep, "_dump_cell", dump)
    store = tmp_path / "cell.zarr"
    with pytest.raises(OSError) as info:
        run_sweep("manifold", ["kappa=0"], {}, store, **quiet)
    assert info.value.filename == str(store)
    assert info.value.strerror.endswith("(no cell had finished: the new store is removed)")
    assert not store.exists()
    monkeypatch.setattr(sweep, "_dump_cell", real_dump)
    run_sweep("manifold", ["kappa=0"], {}, store, **quiet)

    def to_zarr(self, where, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(xr.Dataset, "to_zarr", to_zarr)
    with pytest.raises(OSError) as info:
        run_sweep("manifold", ["kappa=0,1"], {}, store, **quiet)
    assert info.value.filename == str(store)
    assert "1 finished cell kept in the store" in info.value.strerror
    assert len(_cell_files(store)) == 1


def test_a_store_that_failed_with_an_io_error_is_not_told_to_free_space(tmp_path):
    """The advice after a failed write into a store that keeps its cells was "free space, then
    rerun the same command" for EIO too, where space is not what failed. Now it is worded by
    the error: ENOSPC and EDQUOT free space, EIO check the device."""
    import errno

    from fastslow_sim.sweep import _store_failed

    store = tmp_path / "s.zarr"
    run_sweep("manifold", ["kappa=0"], {}, store, workers=0, progress=False)
    err = _store_failed(OSError(errno.EIO, os.strerror(errno.EIO)), store, created=False)
    assert (err.errno, err.filename) == (errno.EIO, str(store))
    assert err.strerror == (f"{os.strerror(errno.EIO)} (1 finished cell kept in the store; check "
                            f"the device, then rerun the same command: it resumes from the "
                            f"finished cells)")  # fmt: skip
    for code in (errno.ENOSPC, errno.EDQUOT):
        err = _store_failed(OSError(code, os.strerror(code)), store, created=False)
        assert err.strerror == (f"{os.strerror(code)} (1 finished cell kept in the store; free "
                                f"space, then rerun the same command: it resumes from the "
                                f"finished cells)")  # fmt: skip
    assert len(_cell_files(store)) == 1


def test_a_store_another_run_made_meanwhile_keeps_its_cells(tmp_path, monkeypatch):
    """Whether the run made the store was decided (`not store.exists()`) before its cluster
    started, and a failed new store lost every file in cells/ named as a cell: when another
    run made the same store in that window, or wrote into the store this run made, its cells
    went too. Now the run made the store only when its own mkdir did, and a failed store loses
    only the cells this run wrote."""
    import errno

    import fastslow_sim.sweep as sweep

    quiet = {"workers": 0, "progress": False, "log": lambda *a: None}
    theirs = tmp_path / "theirs.zarr"
    run_sweep("manifold", ["kappa=0,1"], {}, theirs, **quiet)
    (cell, _) = _cell_files(theirs)
    real_create = sweep._create_store

    def to_zarr(self, where, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    for before in (True, False):  # the other run made the store first, or wrote into ours
        store = tmp_path / f"s{before}.zarr"

        def create(store, parents=False, before=before):
            if before:
                (store / CELLS).mkdir(parents=True)
                shutil.copy(theirs / CELLS / cell, store / CELLS / cell)
            made = real_create(store, parents)
            if not before:
                shutil.copy(theirs / CELLS / cell, store / CELLS / cell)
            return made

        monkeypatch.setattr(sweep, "_create_store", create)
        monkeypatch.setattr(xr.Dataset, "to_zarr", to_zarr)
        with pytest.raises(OSError) as info:
            run_sweep("manifold", ["kappa=0,1"], {}, store, **quiet)
        assert info.value.filename == str(store)
        assert "1 finished cell kept in the store" in info.value.strerror
        assert _cell_files(store) == [cell]
        assert (store / CELLS / cell).read_bytes() == (theirs / CELLS / cell).read_bytes()
        monkeypatch.undo()


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_a_failed_new_store_removes_only_the_cells_this_run_wrote(tmp_path):
    """`_remove_made` removed every file in cells/ named as a cell; now only the cells of the
    run's keys that the run wrote (their run_id), not another run's of the same key."""
    from fastslow_sim.sweep import _remove_made

    store = tmp_path / "s.zarr"
    run_sweep("manifold", ["kappa=0,1"], {}, store, workers=0, progress=False)
    ours, theirs = _cell_files(store)
    run_id = str(xr.open_zarr(store).attrs["run_id"])
    other = tmp_path / "o.zarr"
    run_sweep("manifold", ["kappa=0,1"], {}, other, workers=0, progress=False)
    shutil.copy(other / CELLS / theirs, store / CELLS / theirs)  # another run's of that key
    keys = [name.removesuffix(".npz") for name in (ours, theirs)]
    _remove_made(store, run_id, keys)
    assert os.listdir(store) == [CELLS] and _cell_files(store) == [theirs]
    _remove_made(other, run_id, keys)  # none of these is this run's
    assert len(_cell_files(other)) == 2


# -- the drift of the total probability, per cell -------------------------------------------------


def test_sweep_keeps_each_cells_mass_drift_and_warns_once_at_the_end(tmp_path):
    """radau from y0 = 150 at eps 1e-12 drifts 1^T x by 2.7e-7 or 2.7e-6 (by the machine)
    against its budget 1.1e-7 (test_integrate); from y0 = 0.5 it does not. The sweep keeps, per cell, the drift, its
    budget, whether it warned and integrate's own sentence; the command ends with one line in
    integrate's form naming how many cells warned and the first, and no Python warning."""
    store = tmp_path / "d.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "y0=150,0.5", "--eps", "1e-12",
                                    "--t-end", "1", "--method", "radau", "--store", str(store),
                                    "--workers", "0", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    warned = [ln for ln in lines if ln.startswith("Warning:")]
    assert len(warned) == 1 and "MassDriftWarning" not in res.output
    ds = xr.open_zarr(store).load()
    text = str(ds["mass_drift_warning"].sel(y0=150.0).values)
    assert warned[0] == (f"Warning: 1 cell of 2 warned of a drift of the total probability "
                         f"(mass_drift_warned in the store); the first, y0=150: {text}")  # fmt: skip
    # the drift and the count of evaluations depend on the machine's BLAS (2.7e-7 and 5,732 on
    # one, 2.7e-6 and 5,809 on another): read from the sentence, checked against the store
    m = re.match(r"the total probability 1\^T x drifted by up to ([\d.]+e-0\d), more than its "
                 r"budget 1\.1e-07 \(10 times the larger of rtol \+ sum\(atol\) = 1\.1e-08 "
                 r"and the round-off of [\d,]+ evaluations of f\)", text)  # fmt: skip
    assert m, text
    assert m[1] == f"{float(ds['mass_drift'].sel(y0=150.0)):.2g}"  # 2.7e-07, or 3e-06
    assert ds["mass_drift_warned"].values.tolist() == [True, False]
    assert str(ds["mass_drift_warning"].sel(y0=0.5).values) == ""
    assert 1.08e-7 < float(ds["mass_drift"].sel(y0=150.0)) < 1e-5
    assert float(ds["mass_drift"].sel(y0=0.5)) < 1e-14
    assert ds["mass_drift_budget"].values.tolist() == [pytest.approx(1.08e-7)] * 2
    assert ds.attrs["n_mass_drift"] == 1 and (ds["status"].values == "done").all()
    assert "MassDriftWarning" in ds["mass_drift_warned"].attrs["long_name"]
    summary = json.loads(next(ln for ln in lines if ln.startswith("{")))
    assert summary["n_mass_drift"] == 1
    assert summary["mass_drift"] == [{"cell_key": str(ds["cell_key"].sel(y0=150.0).values),
                                      "cell": {"y0": 150.0}, "warning": text}]  # fmt: skip


def test_a_grid_with_y0_and_seed_is_refused_naming_the_cell(tmp_path):
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "y0=0.5", "--grid", "seed=3",
                                    "--eps", "0.1", "--store", str(tmp_path / "s.zarr"),
                                    "--workers", "0"])  # fmt: skip
    assert res.exit_code == 2
    assert res.output == ("Error: --grid y0=0.5, seed=3: y0 = 0.5 sets the initial slow state "
                          "and seed = 3 draws a random one; expected one of them.\n")  # fmt: skip
    assert not (tmp_path / "s.zarr").exists()


def _drifting_manifold(monkeypatch, text, before=None):
    """`nonlinear.manifold_dataset` as if the kappa = 1 cell's oscillation drifted: the real
    dataset with `text` as its `mass_drift_warning`, and the `MassDriftWarning` issued unless
    `warn=False`, as integrate does. `before(kappa)` runs first (the threads' rendezvous)."""
    import warnings

    from fastslow_sim import nonlinear

    real = nonlinear.manifold_dataset

    def drifting(family, y_range, warn=True, **kw):
        if before is not None:
            before(family.kappa)
        ds = real(family, y_range, warn=warn, **kw)
        if family.kappa == 1.0:
            ds.attrs["mass_drift_warning"] = text
            if warn:
                warnings.warn(text, fs.MassDriftWarning, stacklevel=2)
        return ds

    monkeypatch.setattr(nonlinear, "manifold_dataset", drifting)


def test_a_manifold_cell_records_the_drift_warning_of_its_run(tmp_path, monkeypatch):
    """A task that integrates one cell per call (manifold, convergence) keeps the drift its
    run reported (the result's `mass_drift_warning`) as the cell's own, and a cell without
    one says so."""
    _drifting_manifold(monkeypatch, "the total probability 1^T x drifted (test)")
    res = run_sweep("manifold", ["kappa=0,1"], {"y_min": "0", "y_max": "0.5"}, tmp_path / "m.zarr",
                    workers=0, progress=False, log=lambda *a: None)  # fmt: skip
    assert res["n_mass_drift"] == 1 and res["n_failed"] == 0
    ds = res["dataset"]
    assert ds["mass_drift_warned"].values.tolist() == [False, True]
    assert ds["mass_drift_warning"].values.tolist() == ["", "the total probability 1^T x drifted (test)"]
    assert "unknown, not checked" in ds["mass_drift_warned"].attrs["note"]


def test_cells_running_at_once_in_threads_each_keep_their_own_drift(tmp_path, monkeypatch):
    """A multi-threaded `dask worker` (`--scheduler`) runs cells at once in one process. The
    kappa = 1 cell warns while the kappa = 0 cell runs: each cell gets its own flag, and the
    process's warning filters are as they were. (Recording the warnings with
    `warnings.catch_warnings(record=True)`, process-wide, put kappa = 1's warning on the
    kappa = 0 cell, which had entered its block last, and left the filters altered.)"""
    import threading
    import warnings

    import fastslow_sim.sweep as sw

    inside = {0.0: threading.Event(), 1.0: threading.Event()}
    warned = threading.Event()

    def rendezvous(kappa):
        inside[kappa].set()
        if kappa == 1.0:  # warn while the other cell is inside its own run
            assert inside[0.0].wait(30)
        else:  # and return only after that
            assert warned.wait(30)

    text = "the total probability 1^T x drifted (kappa = 1)"
    _drifting_manifold(monkeypatch, text, before=rendezvous)
    cells = {}
    for kappa in (0.0, 1.0):
        params = {**sw.parse_options("manifold", {"y_min": "0", "y_max": "0.5"}), "kappa": kappa}
        cells[kappa] = (kappa, sw.cell_key("manifold", params), params)
    out, errors = {}, []

    def run(kappa):
        try:
            out[kappa] = sw.run_cells("manifold", [cells[kappa]], tmp_path)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
        finally:
            if kappa == 1.0:
                warned.set()

    filters = list(warnings.filters)
    one = threading.Thread(target=run, args=(1.0,))
    one.start()
    assert inside[1.0].wait(60)  # the kappa = 1 cell is inside its run first
    zero = threading.Thread(target=run, args=(0.0,))
    zero.start()
    one.join(60)
    zero.join(60)
    assert not errors and out == {k: [(cells[k][1], "done")] for k in (0.0, 1.0)}
    got = {k: sw._load_cell(tmp_path / f"{cells[k][1]}.npz") for k in (0.0, 1.0)}
    assert bool(got[1.0]["mass_drift_warned"]) is True and bool(got[0.0]["mass_drift_warned"]) is False
    assert str(got[1.0]["mass_drift_warning"].values) == text
    assert str(got[0.0]["mass_drift_warning"].values) == ""
    assert warnings.filters == filters


def test_convergence_reports_the_drift_of_its_runs_with_their_eps(monkeypatch):
    """`convergence` integrates once per eps: its `mass_drift_warning` names the eps of the
    run that drifted (of several: how many, and the first), and `warn=False` issues none."""
    import warnings

    from fastslow_sim import integrators
    from fastslow_sim.manifold import convergence

    real = integrators.integrate
    drifting = set()

    def integrate(system, *a, **kw):
        ds = real(system, *a, **kw)
        if system.eps in drifting:
            ds.attrs["mass_drift_warning"] = f"drifted at {system.eps:g} (test)"
        return ds

    monkeypatch.setattr(integrators, "integrate", integrate)
    system = fs.make_system("birth-death", eps=0.02)
    # the sentences are what is checked, not the errors: rtol 1e-6 instead of the default 1e-11
    # takes about 1,200 function evaluations per eps instead of 16,900 (0.5 s a call, not 5.5 s)
    tol = {"t_end": 2.0, "n_eval": 201, "rtol": 1e-6, "atol": 1e-9, "warn": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warn=False: none issued
        clean = convergence(system, [0.02, 0.01], **tol)
        drifting.add(0.01)
        one = convergence(system, [0.02, 0.01], **tol)
        drifting.add(0.02)
        two = convergence(system, [0.02, 0.01], **tol)
    assert "mass_drift_warning" not in clean.attrs
    assert one.attrs["mass_drift_warning"] == "at eps = 0.01, drifted at 0.01 (test)"
    assert two.attrs["mass_drift_warning"] == ("2 runs warned; the first, at eps = 0.02: "
                                               "drifted at 0.02 (test)")  # fmt: skip


def test_integrate_without_warnings_keeps_their_sentences_in_the_attributes():
    """`integrate(warn=False)` issues no warning and leaves the sentence it would have issued
    in the attributes, the same as `warn=True` issues."""
    import warnings

    s = fs.make_system("birth-death", eps=0.01)
    with pytest.warns(fs.StiffnessWarning) as caught:
        loud = fs.integrate(s, (0.0, 1.0), method="rk45", n_eval=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = fs.integrate(s, (0.0, 1.0), method="rk45", n_eval=5, warn=False)
    assert quiet.attrs["stiffness_warning"] == loud.attrs["stiffness_warning"] == str(caught[0].message)
    assert quiet.attrs["stiffness_warning"].startswith("the problem is stiff (stiffness index 1.01e+03 "
                                                       "at eps=0.01); the explicit method 'rk45'")  # fmt: skip
    assert "stiffness_warning" not in fs.integrate(s, (0.0, 1.0), method="radau", n_eval=5).attrs


def test_sweep_keeps_each_cells_stiffness_warning_and_says_it_once(tmp_path):
    """rk45 at eps 0.01 is stiff (integrate's StiffnessWarning), at 0.1 not: the cell keeps the
    sentence, and the command ends with one line for it, no Python warning."""
    store = tmp_path / "k.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "eps=0.01,0.1", "--method", "rk45",
                                    "--t-end", "1", "--n-eval", "5", "--store", str(store),
                                    "--workers", "0"])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = xr.open_zarr(store).load()
    text = str(ds["stiffness_warning"].sel(eps=0.01).values)
    assert text.startswith("the problem is stiff (stiffness index 1.01e+03 at eps=0.01)")
    assert str(ds["stiffness_warning"].sel(eps=0.1).values) == ""
    warned = [ln for ln in res.output.splitlines() if ln.startswith("Warning:")]
    assert warned == [f"Warning: 1 cell of 2 warned that the problem is stiff for its explicit "
                      f"method (stiffness_warning in the store); the first, eps=0.01: {text}"]  # fmt: skip
    assert "StiffnessWarning" not in res.output


@pytest.mark.parametrize("order", [("0.5", "5"), ("5", "0.5")])
def test_a_cells_stiffness_warning_is_its_own_in_any_grid_order(tmp_path, order):
    """rk45 on the cycle at eps 0.02 is stiff from y0 = 5 (stiffness index 635), not from
    y0 = 0.5, as `integrate --y0` says; with both cells in one batch call, whose stiffness is
    judged at its first row, one order missed the stiff cell and the other flagged both."""
    store = tmp_path / "o.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", f"y0={','.join(order)}",
                                    "--system", "cycle", "--eps", "0.02", "--method", "rk45",
                                    "--t-end", "1", "--n-eval", "5", "--store", str(store),
                                    "--workers", "0"])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = xr.open_zarr(store).load()
    assert str(ds["stiffness_warning"].sel(y0=0.5).values) == ""
    assert str(ds["stiffness_warning"].sel(y0=5.0).values).startswith(
        "the problem is stiff (stiffness index 635 ")
    assert sum(ln.startswith("Warning: 1 cell of 2 warned") for ln in res.output.splitlines()) == 1


def test_cell_keys_of_integrate_without_y0_are_those_before_y0(tmp_path):
    """Keys computed by the code before y0 was added (commit 5ecf7de, run on these cells):
    unset y0 leaves the key as it was, so stores written then resume."""
    opts = {"t_end": "1", "method": "lsoda", "n_eval": "5"}
    seeded = run_sweep("integrate", ["seed=3"], {**opts, "eps": "0.1"}, tmp_path / "a.zarr",
                       workers=0, progress=False, log=lambda *a: None)  # fmt: skip
    assert seeded["dataset"]["cell_key"].values.tolist() == ["94bb77d3c3de56d29632"]
    own = run_sweep("integrate", ["eps=0.1,0.05"], opts, tmp_path / "b.zarr", workers=0,
                    progress=False, log=lambda *a: None)  # fmt: skip
    assert own["dataset"]["cell_key"].values.tolist() == ["4c58e82728ad602e79de", "058e3427cb04596486c0"]


def test_a_cell_written_before_the_drift_was_recorded_reads_not_checked(tmp_path):
    """A cell without the drift variables (written before they were) reads
    `mass_drift_warned = False` like a clean cell, and `mass_drift_checked = False` where every
    cell that recorded it reads True."""
    import fastslow_sim.sweep as sw

    store, grid = tmp_path / "o.zarr", ["seed=3:4"]
    opts = {"t_end": "1", "method": "lsoda", "n_eval": "5", "eps": "0.1"}
    first = run_sweep("integrate", grid, opts, store, workers=0, progress=False, log=lambda *a: None)
    key = str(first["dataset"]["cell_key"].values[0])
    path = store / CELLS / f"{key}.npz"
    old = sw._load_cell(path).drop_vars(["mass_drift_checked", "mass_drift_warned", "mass_drift_warning",
                                         "mass_drift", "mass_drift_budget", "stiffness_warning"])  # fmt: skip
    path.unlink()
    assert sw._write_cell(old, store / CELLS, key)
    ds = run_sweep("integrate", grid, opts, store, workers=0, progress=False, log=lambda *a: None)["dataset"]
    assert ds["mass_drift_checked"].values.tolist() == [False, True]
    assert ds["mass_drift_warned"].values.tolist() == [False, False]
    assert np.isnan(ds["mass_drift"].values[0]) and 0 <= ds["mass_drift"].values[1] < 1e-12
    assert ds["mass_drift_warned"].attrs["note"].startswith("where mass_drift_checked is False")


def test_a_y0_outside_the_generators_domain_is_one_number(tmp_path):
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "y0=0.5,2000", "--system", "cycle",
                                    "--eps", "0.1", "--store", str(tmp_path / "y.zarr"),
                                    "--workers", "0"])  # fmt: skip
    assert res.exit_code == 2
    assert res.output.startswith("Error: --grid y0=2000: y0 = 2000 is outside the cycle "
                                 "generator's domain [-1415.17, 1415.17]")  # fmt: skip


# -- temporary cell files that killed writers left ----------------------------------------------


def test_a_finished_cells_stale_temporary_file_is_removed_and_nothing_else(tmp_path):
    """`cells/.KEY.HEX.part` that a killed writer left: removed by the next run when its cell
    is finished and it is older than PART_STALE_S; a fresh one (a live writer of a concurrent
    run may hold it), one whose cell is not finished, and a file named otherwise are kept."""
    from fastslow_sim.sweep import PART_STALE_S

    store = tmp_path / "p.zarr"
    grid, opts = ["seed=0:1"], {**FAST, "method": "lsoda"}  # not rodas4's first compile
    first = run_sweep("integrate", grid, opts, store, workers=0, progress=False, log=lambda *a: None)
    assert first["n_leftovers_removed"] == 0
    cells = store / CELLS
    key = str(first["dataset"]["cell_key"].values[0])
    old = time.time() - PART_STALE_S - 60
    stale = cells / f".{key}.0123abcd.part"  # its cell is finished: removed
    fresh = cells / f".{key}.89abcdef.part"  # finished too, but written a moment ago: kept
    unfinished = cells / f".{'e' * 20}.0123abcd.part"  # no cell e...e.npz: kept
    other = cells / ".notes.part"  # not a name the sweep writes: kept
    for p in (stale, fresh, unfinished, other):
        p.write_bytes(b"partial")
    for p in (stale, unfinished, other):
        os.utime(p, (old, old))
    again = run_sweep("integrate", grid, opts, store, workers=0, progress=False, log=lambda *a: None)
    assert (again["n_skipped"], again["n_run"], again["n_leftovers_removed"]) == (2, 0, 1)
    assert sorted(p.name for p in cells.iterdir() if p.name.startswith(".")) == sorted(
        p.name for p in (fresh, unfinished, other))
    assert len(_cell_files(store)) == 2


def test_a_writer_whose_temporary_file_was_removed_under_a_finished_cell_loses_nothing(
        tmp_path, monkeypatch):  # fmt: skip
    """The race the rule allows: a concurrent run still writing the cell's temporary file when
    another removes it. Its link then finds no file, and the cell is there: "exists", no error."""
    import fastslow_sim.sweep as sw

    res = run_sweep("integrate", ["seed=0"], {**FAST, "method": "lsoda"}, tmp_path / "r.zarr",
                    workers=0, progress=False, log=lambda *a: None)  # fmt: skip
    cells = tmp_path / "r.zarr" / CELLS
    key = str(res["dataset"]["cell_key"].values[0])
    cell = sw._load_cell(cells / f"{key}.npz")
    link = os.link

    def removed_first(src, dst):
        os.unlink(src)  # `_remove_leftovers` of another run, between the write and the link
        return link(src, dst)

    monkeypatch.setattr(sw.os, "link", removed_first)
    assert sw._write_cell(cell, cells, key) is False
    with pytest.raises(FileNotFoundError):  # and where the cell is not there, it is an error
        sw._write_cell(cell, cells, "f" * 20)
    assert sorted(p.name for p in cells.iterdir()) == [f"{key}.npz"]


def test_a_train_network_cell_on_a_changed_text_file_is_not_taken_as_done(tmp_path):
    """A cell's key hashed the corpus spec, a path: after the file changed, the cell made on
    its old contents was skipped as done. The key holds the file's contents; the me corpus's
    keys (their spec determines them) are those of the stores written before."""
    import hashlib

    import fastslow_sim.sweep as sw

    path = tmp_path / "c.txt"
    path.write_text("the slow manifold " * 200)
    params = sw.parse_options("train-network", {"corpus": f"text:{path}"})
    key = sw.cell_key("train-network", params)
    assert sw.cell_key("train-network", params) == key  # the same contents, the same key
    grid = {"seed": [0, 1]}
    cells = sw.make_cells(sw.get_task("train-network"), grid, params, tmp_path / "runs")
    assert [c[1] for c in cells] == [sw.cell_key("train-network", {**params, "seed": s}) for s in (0, 1)]
    path.write_text("the fast manifold " * 200)
    assert sw.cell_key("train-network", params) != key
    me = sw.parse_options("train-network", {"corpus": "me:tokens=20k"})
    # the key never held the folder, nor pool_offset at 0 (added later: the keys stay those before)
    me_params = {k: v for k, v in me.items() if k not in ("out", "pool_offset")}
    old = json.dumps({"task": "train-network", "params": me_params}, sort_keys=True, default=str)
    assert sw.cell_key("train-network", me) == hashlib.sha256(old.encode()).hexdigest()[:20]


def test_train_cells_of_close_values_get_folders_of_their_own(tmp_path):
    """lr=0.001 and lr=0.0010000001 were both named `lr0.001` (floats written with 6 digits):
    the second run replaced the first in the one folder, and both cells named it. A value that
    6 digits write exactly keeps its old name (the folders of earlier sweeps are found)."""
    import fastslow_sim.sweep as sw

    store, runs = tmp_path / "t.zarr", tmp_path / "t-runs"
    res = CliRunner().invoke(main, ["sweep", "train-network", "--grid", "lr=0.001,0.0010000001",
                                    "--store", str(store), "--workers", "0", "--json",
                                    *TINY_TRAIN])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in runs.iterdir()) == ["lr0.001", "lr0.0010000001"]
    for name, lr in (("lr0.001", 0.001), ("lr0.0010000001", 0.0010000001)):
        assert json.loads((runs / name / "summary.json").read_text())["train_config"]["lr"] == lr
    assert xr.open_zarr(store)["run_dir"].values.tolist() == [str(runs / "lr0.001"),
                                                              str(runs / "lr0.0010000001")]
    grid = {"lr": [1e-5, 0.3, 0.1 + 0.2, -0.0, 0.0], "seed": [0]}
    assert [sw._label(grid, [v, 0]) for v in grid["lr"]] == [
        "lr1e-05-seed0", "lr0.3-seed0", "lr0.30000000000000004-seed0", "lr-0-seed0", "lr0-seed0"]


# (--grid tokens=4k,4K was the case-folding example: it is one count twice, refused as such)
@pytest.mark.parametrize("values, shared", [
    (["text:{d}/a b", "text:{d}/a_b"], "corpustext_{d}_a_b"),  # characters written as _
    (["text:{d}/A", "text:{d}/a"], "corpustext_{d}_A"),  # one folder where case is not told apart
])  # fmt: skip
def test_train_cells_that_would_share_a_folder_are_refused_before_any_work(tmp_path, values, shared):
    key = "corpus" if values[0].startswith("text:") else "tokens"
    values = [v.format(d=tmp_path) for v in values]
    for v in values:
        if v.startswith("text:"):
            Path(v[5:]).write_text("the slow manifold " * 200)
    store = tmp_path / "t.zarr"
    args = _tiny_train(f"--{key}")
    res = CliRunner().invoke(main, ["sweep", "train-network", "--grid", f"{key}={','.join(values)}",
                                    "--store", str(store), "--workers", "0", *args])  # fmt: skip
    assert res.exit_code == 2, res.output
    shared = shared.format(d=str(tmp_path).replace("/", "_"))
    assert res.output.startswith(f"Error: --grid cells {key}={values[0]!r} and {key}={values[1]!r} "
                                 f"would share the run folder {shared!r}")
    assert res.output.count("\n") == 1 and "Traceback" not in res.output
    assert not store.exists() and not (tmp_path / "t-runs").exists()


def test_a_train_cell_whose_finished_run_was_made_on_another_device_is_refused_by_its_worker(
        tmp_path):  # fmt: skip
    """The sweep's client cannot tell where `--device auto` trains (its workers may have CUDA),
    so the device kind of a finished run in a cell's folder is judged by the worker: a run made
    on CUDA (bf16) is neither reused beside float32 runs nor trained over; the cell fails with
    the sentence and the folder is as it was."""
    store, runs = tmp_path / "t.zarr", tmp_path / "t-runs"

    def sweep(seeds="seed=0"):
        return CliRunner().invoke(main, ["sweep", "train-network", "--grid", seeds,
                                         "--store", str(store), "--workers", "0", *TINY_TRAIN])  # fmt: skip

    assert sweep().exit_code == 0
    summary = runs / "seed0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "device": "cuda:0"}))
    kept = {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()}
    shutil.rmtree(store)
    res = sweep()
    assert res.exit_code == 1, res.output
    assert "(made on cuda, this run on cpu)" in res.output, res.output
    assert {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()} == kept


def test_a_stored_train_cell_of_another_device_kind_is_refused_not_reused(tmp_path, monkeypatch):
    """A cell of `--device auto` keeps the kind it trained on (device_kind); a rerun that
    would train new cells beside it on another kind refuses to reuse it (one sentence, exit
    status 2, the store as it was): CUDA trains in bf16, the CPU in float32, and one sweep
    mixed them. A rerun that trains nothing reuses the store's cells as they are."""
    import torch

    store = tmp_path / "t.zarr"

    def sweep(seeds="seed=0"):
        return CliRunner().invoke(main, ["sweep", "train-network", "--grid", seeds,
                                         "--store", str(store), "--workers", "0", *TINY_TRAIN])  # fmt: skip

    assert sweep().exit_code == 0
    ds = xr.open_zarr(store)
    assert ds["device_kind"].values.tolist() == ["cpu"]
    assert "kind of device" in ds["device_kind"].attrs["long_name"]
    kept = {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}

    class Props:  # a simulated GPU, as tests/test_training.py's: auto would train on cuda
        total_memory = 80 * 2**30

    for name, value in [("is_available", lambda: True), ("device_count", lambda: 1),
                        ("current_device", lambda: 0), ("get_device_properties", lambda i: Props)]:  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)
    res = sweep("seed=0,1")  # seed 1 would train on cuda beside seed 0's cpu cell
    assert res.exit_code == 2, res.output
    assert res.output.startswith("Error: --grid seed=0: the store holds this cell trained on cpu, "
                                 "and --device auto trains on cuda here"), res.output  # fmt: skip
    assert res.output.count("\n") == 1 and "Traceback" not in res.output
    assert {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()} == kept
    res = sweep()  # nothing to train: the store's cells are the sweep, of one kind as before
    assert res.exit_code == 0 and "1 already in the store" in res.output, res.output
    monkeypatch.undo()  # the same kind: reused as before
    res = sweep()
    assert res.exit_code == 0 and "1 already in the store" in res.output, res.output

    class Cluster:  # a cluster's workers decide where auto trains: asked, not this process
        def __init__(self, kinds):
            self.kinds = kinds

        def run(self, f):
            return dict(zip(("tcp://a:1", "tcp://b:1"), self.kinds))

        def scheduler_info(self, **kw):  # past the check: the cells would train now
            raise RuntimeError("past the check")

    opts = dict(zip(TINY_TRAIN[::2], TINY_TRAIN[1::2]))

    def rerun(grid, cluster):
        return run_sweep("train-network", grid, {k[2:]: v for k, v in opts.items()}, store,
                         client=cluster, progress=False, log=lambda *a: None)  # fmt: skip

    # seed 1 is to train beside the held seed 0: judged by where the workers train
    with pytest.raises(InputError, match=r"trains on cpu and cuda on the cluster's workers"):
        rerun(["seed=0,1"], Cluster(["cpu", "cuda"]))
    with pytest.raises(RuntimeError, match="past the check"):  # no worker yet: nothing to judge
        rerun(["seed=0,1"], Cluster([]))  # by (it said "trains on  on the cluster's workers")
    # nothing to train: the held cells are reused without asking the cluster (it was required)
    assert rerun(["seed=0"], None)["n_skipped"] == 1


def test_a_train_cell_written_before_device_kind_was_recorded_reads_its_run_folder(tmp_path):
    """A cell without device_kind (older stores) is judged by its run folder's summary; with
    neither it is of an unrecorded device, as training judges a run that recorded none."""
    from fastslow_sim.sweep import _held_train_kind

    run = tmp_path / "run"
    run.mkdir()
    cell = xr.Dataset({"run_dir": ((), str(run))})
    assert _held_train_kind({"device": "cpu"}, cell) is None  # an explicit device is in the key
    assert _held_train_kind({"device": "auto"}, cell) == ""
    (run / "summary.json").write_text(json.dumps({"device": "cuda:0"}))
    assert _held_train_kind({"device": "auto"}, cell) == "cuda"
    assert _held_train_kind({"device": "auto"}, cell.assign(device_kind=((), "cpu"))) == "cpu"


def test_a_train_cell_of_an_unrecorded_device_kind_is_reused_with_a_warning(tmp_path):
    """A finished cell of `--device auto` from before cells recorded device_kind, whose run
    folder's summary.json is gone, says nothing of where it trained: it does not block a
    sweep that extends the store (it was an error no sweep could satisfy, exit status 2) but
    is reused, with one Warning line naming how many such cells there are; the store records
    nothing of its device kind ('', not recorded) and the new cell its own."""
    import fastslow_sim.sweep as sw

    store, runs = tmp_path / "t.zarr", tmp_path / "t-runs"

    def sweep(seeds):
        return CliRunner().invoke(main, ["sweep", "train-network", "--grid", seeds,
                                         "--store", str(store), "--workers", "0", *TINY_TRAIN])  # fmt: skip

    assert sweep("seed=0").exit_code == 0
    (key,) = xr.open_zarr(store)["cell_key"].values.tolist()
    path = store / CELLS / f"{key}.npz"
    old = sw._load_cell(path).drop_vars("device_kind")  # as a cell of an older store
    with open(path, "wb") as f:
        sw._dump_cell(old, f)
    (runs / "seed0" / "summary.json").unlink()
    assert sw._held_train_kind({"device": "auto"}, old) == ""
    res = sweep("seed=0,1")
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.output.splitlines() if ln.startswith("Warning:")]
    assert warned == ["Warning: 1 finished cell in the store trained on a device whose kind was "
                      "not recorded (no device_kind in the cell, no summary.json in its run "
                      "folder); it is reused, so this sweep may mix device kinds (CUDA trains "
                      "in bf16 autocast, the CPU in float32)."]  # fmt: skip
    assert "Error" not in res.output and "2 cells over seed; 1 already in the store, 1 run, " \
        "0 failed" in res.output, res.output  # fmt: skip
    ds = xr.open_zarr(store).load()
    assert ds["cell_key"].values.tolist()[0] == key and ds["status"].values.tolist() == ["done"] * 2
    assert ds["device_kind"].values.tolist() == ["", "cpu"]  # nothing said of the held cell
    assert "'' where not recorded" in ds["device_kind"].attrs["long_name"]
    assert sw._load_cell(path).identical(old)  # reused as it was, not trained again
    assert not (runs / "seed0" / "summary.json").exists()
    res = sweep("seed=0,1")  # nothing to train: no cell sits beside it anew, nothing said
    assert res.exit_code == 0 and "Warning" not in res.output, res.output


def test_manifold_cells_take_the_manifold_commands_defaults_per_system(tmp_path):
    """`sweep manifold --grid system=...` at default options computes what `fastslow-sim
    manifold --system S` does: kappa 0 for a linear system (3 was refused), and the y range
    cut to its domain (michaelis-menten: 0 to 1.5, where -1 was refused); explicit values win."""
    import fastslow_sim.sweep as sw

    store = tmp_path / "s.zarr"
    res = CliRunner().invoke(main, ["sweep", "manifold", "--grid", "system=michaelis-menten",
                                    "--store", str(store), "--workers", "0"])  # fmt: skip
    assert res.exit_code == 0, res.output
    cell = xr.open_zarr(store).sel(system="michaelis-menten").load()
    out = tmp_path / "m.nc"
    res = CliRunner().invoke(main, ["manifold", "--system", "michaelis-menten", "--json",
                                    "--no-plot", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    cli, ref = json.loads(res.output), xr.load_dataset(out)
    assert (cli["kappa"], cli["y_range"]) == (0.0, [0.0, 1.5])
    held = sw._load_cell(store / CELLS / f"{cell['cell_key'].values}.npz")
    params = json.loads(held.attrs["params"])
    assert (params["kappa"], params["y_min"], params["y_max"]) == (0.0, 0.0, 1.5)
    # the store says what each cell ran with (its options attribute holds null: not given)
    assert [float(cell[f"{v}_used"]) for v in ("kappa", "y_min", "y_max")] == [0.0, 0.0, 1.5]
    assert json.loads(xr.open_zarr(store).attrs["options"])["kappa"] is None
    n = ref.sizes["point"]
    for v in ref.data_vars:
        assert np.array_equal(cell[v].values[:n], ref[v].values), v
    assert float(cell["gap"]) == cli["gap"]
    assert float(cell["identity_max_abs_diff"]) == cli["identity_max_abs_diff"]
    assert int(cell["n_branches"]) == len(cli["branches"])
    # explicit values still win, and a default birth-death cell keeps its key (kappa 3, -1..1.5)
    t = sw.get_task("manifold")
    fixed = sw.parse_options(t, {"y_min": "0.5"})
    grid = {"system": ["michaelis-menten", "birth-death"]}
    (_, _, mm), (_, _, bd) = sw.make_cells(t, grid, fixed)
    assert (mm["kappa"], mm["y_min"], mm["y_max"]) == (0.0, 0.5, 1.5)
    assert (bd["kappa"], bd["y_min"], bd["y_max"]) == (3.0, 0.5, 1.5)
    old = {"system": "birth-death", "kappa": 3.0, "y_min": -1.0, "y_max": 1.5, "osc_eps": 0.01}
    ((_, key, _),) = sw.make_cells(t, {"system": ["birth-death"]}, sw.parse_options(t, {}))
    assert key == sw.cell_key("manifold", old)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_an_older_manifold_store_extended_says_what_its_old_cells_ran_with(tmp_path):
    """A manifold cell written before cells recorded kappa_used, y_min_used and y_max_used
    (they were NaN in the extended store) has them from its own params, resolved as its run
    resolved them: birth-death's defaults, kappa 3 and y from -1 to 1.5. A cell whose params
    do not say keeps none (NaN in the store: not recorded, as the long name says)."""
    import fastslow_sim.sweep as sw
    from fastslow_sim.nonlinear import default_kappa, default_y_range, family_for

    store = tmp_path / "s.zarr"

    def sweep(systems):
        return CliRunner().invoke(main, ["sweep", "manifold", "--grid", f"system={systems}",
                                         "--store", str(store), "--workers", "0", "--json"])  # fmt: skip

    assert sweep("birth-death").exit_code == 0
    (key,) = xr.open_zarr(store)["cell_key"].values.tolist()
    path = store / CELLS / f"{key}.npz"
    used = ["kappa_used", "y_min_used", "y_max_used"]
    old = sw._load_cell(path).drop_vars(used)  # as a cell of an older store
    with open(path, "wb") as f:
        sw._dump_cell(old, f)
    res = sweep("birth-death,michaelis-menten")  # extends it: the old cell is reused
    assert res.exit_code == 0, res.output
    out = json.loads(next(ln for ln in res.output.splitlines() if ln.startswith("{")))
    assert (out["n_skipped"], out["n_run"], out["n_failed"]) == (1, 1, 0)
    assert sw._load_cell(path).identical(old)  # the cell file is left as it was written
    ds = xr.open_zarr(store).load()
    bd = ds.sel(system="birth-death")
    kappa = default_kappa("birth-death")
    lo, hi = default_y_range(family_for("birth-death", kappa))
    assert [float(bd[v]) for v in used] == [kappa, lo, hi] == [3.0, -1.0, 1.5]
    mm = ds.sel(system="michaelis-menten")
    assert [float(mm[v]) for v in used] == [0.0, 0.0, 1.5]  # recorded by its own run
    for v in used:
        assert ds[v].attrs["long_name"].endswith("(NaN: the cell did not finish, or did not "
                                                 "record it)")  # fmt: skip
    # a null in the params is the default its run resolved; params that do not say: nothing
    params = json.loads(old.attrs["params"])
    nulls = old.assign_attrs(params=json.dumps({**params, "kappa": None, "y_min": None}))
    assert [float(sw._manifold_recorded(nulls)[v]) for v in used] == [3.0, -1.0, 1.5]
    unsaid = old.assign_attrs(params=json.dumps({"system": "birth-death"}))
    assert not set(used) & set(sw._manifold_recorded(unsaid).data_vars)
    with open(path, "wb") as f:
        sw._dump_cell(unsaid, f)
    assert sweep("birth-death,michaelis-menten").exit_code == 0
    ds = xr.open_zarr(store).load()
    assert [np.isnan(float(ds.sel(system="birth-death")[v])) for v in used] == [True] * 3


def test_an_older_train_store_extended_says_the_tokens_its_old_cells_trained(tmp_path):
    """A train-network cell written before cells recorded `tokens` showed -1 ("tokens trained")
    in the extended store; it has them from its own steps and params: steps x batch x context."""
    import fastslow_sim.sweep as sw

    store = tmp_path / "s.zarr"

    def sweep(seeds):
        return CliRunner().invoke(main, ["sweep", "train-network", "--grid", f"seed={seeds}",
                                         "--store", str(store), "--runs-dir", str(tmp_path / "r"),
                                         "--workers", "0", "--tokens", "300", "--context", "16",
                                         "--batch-size", "2", "--n-layer", "1", "--n-embd", "16",
                                         "--corpus", "random", "--json"])  # fmt: skip

    assert sweep("0").exit_code == 0
    (key,) = xr.open_zarr(store)["cell_key"].values.ravel().tolist()
    path = store / CELLS / f"{key}.npz"
    old = sw._load_cell(path).drop_vars("tokens")  # as a cell of an older store
    with open(path, "wb") as f:
        sw._dump_cell(old, f)
    res = sweep("0,1")
    assert res.exit_code == 0, res.output
    ds = xr.open_zarr(store).load()
    assert ds["steps"].values.tolist() == [9, 9]  # 300 // (2 x 16)
    assert ds["tokens"].values.tolist() == [288, 288]  # the old cell's from its params
    assert sw._load_cell(path).identical(old)
    unsaid = old.assign_attrs(params=json.dumps({"seed": 0}))
    assert "tokens" not in sw._train_recorded(unsaid)


def test_tokens_spelled_another_way_are_the_same_cells(tmp_path):
    """`--tokens 300` then `--tokens 0.3k` was refused as another sweep ("holds a sweep of
    train-network with --tokens 300, and this one has --tokens 0.3k"): the same count is one
    setting, spelled as the store has it, so the cells (and their keys) are the store's; a
    count twice in a --grid is refused; the keys of stores written before are unchanged."""
    import fastslow_sim.sweep as sw

    def sweep(store, *tokens):
        return CliRunner().invoke(main, ["sweep", "train-network", "--grid", "seed=0", *tokens,
                                         "--store", str(tmp_path / store), "--runs-dir",
                                         str(tmp_path / f"{store}-runs"), "--workers", "0",
                                         "--context", "16", "--batch-size", "2", "--n-layer", "1",
                                         "--n-embd", "16", "--corpus", "random"])  # fmt: skip

    assert sweep("a.zarr", "--tokens", "32").exit_code == 0
    res = sweep("a.zarr", "--tokens", "0.032k")
    assert res.exit_code == 0 and "1 already in the store, 0 run" in res.output, res.output
    assert sweep("b.zarr", "--grid", "tokens=32,64").exit_code == 0
    res = sweep("b.zarr", "--grid", "tokens=0.032k,64")
    assert res.exit_code == 0 and "2 already in the store, 0 run" in res.output, res.output
    assert xr.open_zarr(tmp_path / "b.zarr")["tokens"].values.tolist() == ["32", "64"]
    assert sorted(p.name for p in (tmp_path / "b.zarr-runs").iterdir()) == [
        "seed0-tokens32", "seed0-tokens64"]  # the store's spellings, no folder of 0.032k
    res = sweep("c.zarr", "--grid", "tokens=300,0.3k")  # one count twice
    assert res.exit_code == 2 and "repeats a value" in res.output, res.output

    # keys as 2b9eb43 computed them: sweep's default spelling and reproduce's (digits)
    params = {k: o.default for k, o in sw.tasks()["train-network"].options.items() if k != "out"}
    assert sw.cell_key("train-network", params) == "14fc43c38eb1c0ed8de9"
    assert sw.cell_key("train-network", {**params, "tokens": "500000"}) == "42bd24db6df6c98a36f2"


def test_minus_zero_in_a_grid_is_the_cell_of_zero(tmp_path):
    """--grid kappa=-0 then kappa=0 computed the manifold twice (two cell keys, two files)."""
    store = tmp_path / "s.zarr"

    def sweep(kappa):
        return CliRunner().invoke(main, ["sweep", "manifold", "--grid", f"kappa={kappa}",
                                         "--store", str(store), "--workers", "0", "--json"])  # fmt: skip

    assert sweep("-0").exit_code == 0
    res = sweep("0")
    out = json.loads(next(ln for ln in res.output.splitlines() if ln.startswith("{")))
    assert (out["n_skipped"], out["n_run"]) == (1, 0)
    assert len(list((store / CELLS).iterdir())) == 1


# -- integrate's --states, --H, --march and --max-steps; manifold's --y-range ------------------


def _sweep_json(args) -> dict:
    res = CliRunner().invoke(main, ["sweep", *args, "--workers", "0", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(next(ln for ln in res.output.splitlines() if ln.startswith("{")))


def _refused(args) -> str:
    res = CliRunner().invoke(main, ["sweep", *args, "--workers", "0"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "Traceback" not in res.output
    return res.output


def test_a_sweep_over_states_runs_integrate_with_those_states(tmp_path):
    """`sweep integrate --grid states=4,8` (and a fixed `--states`) was refused ("'states' is
    not a parameter of the integrate task"); each cell now runs what `integrate --states N`
    runs, the smaller chain padded with NaN beside the larger."""
    common = ["--eps", "0.125", "--method", "lsoda", "--t-end", "0.5", "--n-eval", "5"]
    store = tmp_path / "s.zarr"
    _sweep_json(["integrate", "--grid", "states=4,8", "--store", str(store), *common])
    ds = xr.open_zarr(store).load()
    assert ds["states"].values.tolist() == [4, 8] and set(ds["status"].values) == {"done"}
    for n in (4, 8):
        out = tmp_path / f"i{n}.nc"
        res = CliRunner().invoke(main, ["integrate", "--states", str(n), *common, "--no-plot",
                                        "--out", str(out)])  # fmt: skip
        assert res.exit_code == 0, res.output
        one = xr.open_dataset(out)
        cell = ds.sel(states=n)
        np.testing.assert_array_equal(cell["x"].values[:, :n], one["x"].values)
        np.testing.assert_array_equal(cell["y"].values, one["y"].values)
        assert np.isnan(cell["x"].values[:, n:]).all()
    fixed = tmp_path / "f.zarr"
    _sweep_json(["integrate", "--grid", "seed=0", "--states", "16", "--store", str(fixed), *common])
    assert xr.open_zarr(fixed).sizes["state"] == 16
    assert _refused(["integrate", "--grid", "states=1", "--store", str(tmp_path / "b.zarr"),
                     *common]) == ("Error: --grid states=1: states must be an integer >= 2 and "
                                   "<= 4096; got 1.\n")  # fmt: skip
    assert not (tmp_path / "b.zarr").exists()


def test_an_integrate_store_from_before_states_and_march_is_reused(tmp_path):
    """Cells written before states, H, march and max_steps were parameters (their params lack
    them; the keys are those the code of then computed, commit d053b8f) are found as they were:
    rerun, and extended over states (8, birth-death's own, is its cells) or with march auto,
    nothing of theirs runs again."""
    import fastslow_sim.sweep as sw

    store = tmp_path / "s.zarr"
    common = ["--method", "lsoda", "--t-end", "0.5", "--n-eval", "5", "--store", str(store)]
    _sweep_json(["integrate", "--grid", "eps=0.125,0.1", *common])
    keys = ["beaca8bdf1958e7d9237", "69b2cc5bb6f1894af8ef"]  # computed by d053b8f's code
    assert xr.open_zarr(store)["cell_key"].values.tolist() == keys
    new = ("states", "H", "march", "max_steps")
    old = {}
    for key in keys:  # as the cells of then: params without the new parameters
        path = store / CELLS / f"{key}.npz"
        ds = sw._load_cell(path)
        params = json.loads(ds.attrs["params"])
        assert {k: params[k] for k in new} == dict.fromkeys(new)
        ds.attrs["params"] = json.dumps({k: v for k, v in params.items() if k not in new})
        ds = ds.drop_vars("march")  # nor did they keep the march
        with open(path, "wb") as f:
            sw._dump_cell(ds, f)
        old[key] = path.read_bytes()
    out = _sweep_json(["integrate", "--grid", "eps=0.125,0.1", *common])
    assert (out["n_skipped"], out["n_run"]) == (2, 0)
    out = _sweep_json(["integrate", "--grid", "eps=0.125,0.1", "--grid", "states=8,4", *common])
    assert (out["n_skipped"], out["n_run"], out["n_failed"]) == (2, 2, 0)
    ds = xr.open_zarr(store).load()
    assert ds["cell_key"].sel(states=8).values.tolist() == keys
    assert all((store / CELLS / f"{k}.npz").read_bytes() == b for k, b in old.items())
    assert ds["march"].sel(states=8).values.tolist() == ["", ""]  # not kept then: ''
    # rodas4 with march auto is the cell without --march (and one of torch is another)
    r4 = ["--method", "rodas4", "--eps", "0.125", "--t-end", "0.5", "--n-eval", "5"]
    plain = _sweep_json(["integrate", "--grid", "seed=0", *r4, "--store", str(tmp_path / "r.zarr")])
    assert plain["n_run"] == 1
    auto = _sweep_json(["integrate", "--grid", "seed=0", *r4, "--march", "auto", "--store",
                        str(tmp_path / "r.zarr")])  # fmt: skip
    assert (auto["n_skipped"], auto["n_run"]) == (1, 0)


def test_H_march_and_max_steps_pass_through_as_integrate_takes_them(tmp_path):
    """--H, --march and --max-steps were refused as no parameters of the integrate task; they
    now reach each cell's run, and are refused per cell where integrate refuses them."""
    store = tmp_path / "h.zarr"
    _sweep_json(["integrate", "--grid", "H=0.05,0.1", "--method", "multirate", "--P", "8",
                 "--t-end", "0.5", "--store", str(store)])  # fmt: skip
    ds = xr.open_zarr(store).load()
    for H in (0.05, 0.1):
        one = fs.integrate(fs.make_system("birth-death", eps=1 / 8), (0.0, 0.5), method="multirate",
                           H=H, warn=False)  # fmt: skip
        cell = ds.sel(H=H)
        n = one.sizes["time"]
        assert n == round(0.5 / H) + 1
        np.testing.assert_array_equal(cell["x"].values[:n], one["x"].values)
    common = ["--eps", "0.125", "--t-end", "0.5", "--n-eval", "5"]
    store = tmp_path / "m.zarr"
    _sweep_json(["integrate", "--grid", "march=torch,compiled", "--method", "rodas4", *common,
                 "--store", str(store)])  # fmt: skip
    ds = xr.open_zarr(store).load()
    assert ds["march"].values.tolist() == ["torch", "compiled"] and "march_cell" not in ds
    store = tmp_path / "s.zarr"
    res = CliRunner().invoke(main, ["sweep", "integrate", "--grid", "max_steps=3,100000",
                                    "--method", "rk45", *common, "--store", str(store),
                                    "--workers", "0", "--json"])  # fmt: skip
    assert res.exit_code == 1, res.output
    ds = xr.open_zarr(store).load()
    assert ds["status"].values.tolist() == ["failed", "done"]
    message = str(ds["message"].sel(max_steps=3).values)
    assert "rk45 stopped after max_steps = 3 steps" in message
    assert "raise it with --max-steps N or --grid max_steps=" in message
    where = ["--store", str(tmp_path / "bad.zarr")]
    assert _refused(["integrate", "--grid", "seed=0", "--method", "rk45", "--H", "0.05", *common,
                     *where]) == "Error: --H is the block length of --method multirate; got --method rk45.\n"
    assert _refused(["integrate", "--grid", "method=rk45,multirate", "--max-steps", "100", *common,
                     *where]) == ("Error: --grid method=multirate with --max-steps 100: --max-steps "
                                  "bounds the steps of the ODE solvers, and --method multirate "
                                  "counts none; expected no --max-steps with it.\n")  # fmt: skip
    assert "--march chooses the march of rodas4, rodas3" in _refused(
        ["integrate", "--grid", "seed=0", "--method", "bdf", "--march", "torch", *common, *where])
    assert _refused(["integrate", "--grid", "seed=0", "--max-steps", "0", *common, *where]) == \
        "Error: --max-steps must be a positive integer; got '0'.\n"  # fmt: skip
    assert not (tmp_path / "bad.zarr").exists()


def test_manifold_sweep_takes_manifolds_y_range(tmp_path):
    """`sweep manifold --y-range 0 1` was refused ("unexpected argument '1'"): manifold's own
    option now sets y_min and y_max, the cells of `--y-min 0 --y-max 1`; a --y-range without
    two numbers, or beside --y-min/--y-max, is one sentence naming what to give."""
    store = tmp_path / "q.zarr"
    out = _sweep_json(["manifold", "--grid", "kappa=0,1", "--y-range", "0", "1", "--store", str(store)])
    assert (out["n_run"], out["n_failed"]) == (2, 0)
    ds = xr.open_zarr(store).load()
    assert ds["y_min_used"].values.tolist() == [0.0, 0.0]
    assert ds["y_max_used"].values.tolist() == [1.0, 1.0]
    out = _sweep_json(["manifold", "--grid", "kappa=0,1", "--y-min", "0", "--y-max", "1",
                       "--store", str(store)])  # fmt: skip
    assert (out["n_skipped"], out["n_run"]) == (2, 0)  # the same cells
    where = ["--grid", "kappa=0", "--store", str(tmp_path / "bad.zarr")]
    fix = "expected --y-range A B (two numbers), or --y-min A --y-max B."
    assert _refused(["manifold", *where, "--y-range", "0"]) == \
        f"Error: option --y-range needs two values, A B; {fix}\n"  # fmt: skip
    assert _refused(["manifold", *where, "--y-range", "0", "--osc-eps", "0.1"]) == \
        f"Error: option --y-range needs two values, A B; {fix}\n"  # fmt: skip
    assert _refused(["manifold", *where, "--y-range=0,1"]) == \
        f"Error: --y-range=0,1 is not how --y-range takes its ends; {fix}\n"  # fmt: skip
    assert "expected either --y-range or --y-min/--y-max, once." in _refused(
        ["manifold", *where, "--y-range", "0", "1", "--y-min", "0"])
    assert _refused(["manifold", *where, "--y-range", "a", "1"]) == \
        "Error: --y-range must be a finite number; got 'a'.\n"  # fmt: skip
    assert not (tmp_path / "bad.zarr").exists()


def test_manifold_sweep_y_range_needs_its_ends_in_order(tmp_path):
    """`--y-range 0.8 0.2` was refused by the cell as "--y-min, --y-max: ...", options the user
    did not type; it is refused as --y-range, before any cell."""
    store = tmp_path / "r.zarr"
    res = CliRunner().invoke(main, ["sweep", "manifold", "--grid", "kappa=0,1", "--y-range", "0.8",
                                    "0.2", "--store", str(store)])  # fmt: skip
    assert res.exit_code == 2
    assert res.output.strip() == "Error: --y-range A B needs A < B; got 0.8 0.2."
    assert not store.exists()


def _descendants(pid):
    """The pids of the processes below `pid` (from /proc), or [] where /proc is missing."""
    kids = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        found = kids.get(todo.pop(), [])
        out += found
        todo += found
    return out


def test_a_ctrl_c_while_waiting_on_workers_is_polled_not_lost():
    """Python's SIGINT handler raised KeyboardInterrupt wherever the main thread was, and one
    raised in distributed's gc callback was printed as "Exception ignored" and dropped: the
    sweep ran on and exited 0 (seen with `sweep manifold --workers 2`, Ctrl-C 1.5 s in). While
    the wait loop runs, a Ctrl-C is noted and raised at the loop's poll or the block's end;
    an ignored SIGINT stays ignored; the handler before is put back."""
    import signal

    import fastslow_sim.sweep as sw

    before = signal.getsignal(signal.SIGINT)
    with sw._ctrl_c_polled():
        os.kill(os.getpid(), signal.SIGINT)  # noted, raises nothing here
        time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt):
            sw._raise_polled_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is before and not sw._CTRL_C.is_set()
    with pytest.raises(KeyboardInterrupt), sw._ctrl_c_polled():  # noted after the last poll
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sw._ctrl_c_polled():  # nohup, a background job: SIGINT stays ignored
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            sw._raise_polled_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.slow  # 3 runs of 8-15 s each on two busy cores
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker processes in /proc")
def test_ctrl_c_while_workers_start_prints_only_interrupted(tmp_path):
    """SIGINT to the whole process group (as a terminal's Ctrl-C), at several moments after two
    processes below it appear (the workers, spawned; in the instant while they are spawned,
    SIGINT is ignored: `sweep._started_cluster`): the workers printed KeyboardInterrupt tracebacks from their
    imports, and the half-started cluster one from its atexit close, before "Interrupted."."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for k, delay in enumerate([0.1, 0.6, 1.5]):
        cmd = [sys.executable, "-m", "fastslow_sim", "sweep", "manifold", "--grid", "kappa=0,3",
               "--store", str(tmp_path / f"s{k}.zarr"), "--workers", "2"]  # fmt: skip
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while len(_descendants(p.pid)) < 2 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert (p.returncode, err) == (130, "Interrupted.\n"), f"SIGINT {delay} s into start-up"
        time.sleep(0.5)
        assert not _descendants(p.pid)


def test_train_network_cell_keys_at_pool_offset_0_are_those_before_it():
    """The key of a train-network cell with every default, computed by the code before
    pool_offset was added (7878846): offset 0 leaves it as it was, so stores written then
    resume; another offset is another cell."""
    import fastslow_sim.sweep as sw

    opts = sw.tasks()["train-network"].options
    params = {k: o.default for k, o in opts.items() if k != "out"}
    params.update(arm="coupled", seed=1, tokens="4096", corpus="me:tokens=20k")
    assert params["pool_offset"] == 0
    assert sw.cell_key("train-network", params) == "682fd7ff1f04da1f0a0b"
    assert sw.cell_key("train-network", {**params, "pool_offset": 4}) != "682fd7ff1f04da1f0a0b"


def test_a_bad_cells_text_values_read_as_the_shell_takes_them():
    """A value with a space was printed bare (`--grid corpus=text:a b.txt`, two words); it is
    quoted as a shell needs it, plain values stay plain."""
    from fastslow_sim.sweep import CellInputError

    err = CellInputError({"corpus": "text:a b.txt", "eps": 1e-13}, "bad.", ("--system cycle",))
    assert str(err) == "--grid corpus='text:a b.txt', eps=1e-13 with --system cycle: bad."
    assert str(CellInputError({"device": ""}, "bad.")) == "--grid device='': bad."
    assert str(CellInputError({"corpus": "me:tokens=20k,block=8"}, "bad.")) == (
        "--grid corpus=me:tokens=20k,block=8: bad.")
