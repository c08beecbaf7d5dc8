"""`fastslow-sim figures` (issue 16): every figure is written, as PNG and PDF, from the saved
dataset its recipe names; a dataset made by the same recipe is reused, another is recomputed;
the data behind each figure is checked (values, variables, attributes), not the pixels."""

import dataclasses
import json
import re

import matplotlib

matplotlib.use("Agg")  # this test process only
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import fastslow_sim as fs  # noqa: E402
from fastslow_sim import gallery  # noqa: E402
from fastslow_sim.bridge import BridgeConfig  # noqa: E402
from fastslow_sim.bridge.cost import flops_per_token  # noqa: E402
from fastslow_sim.cli import main  # noqa: E402

# smaller than QUICK: seconds per figure
TINY = dataclasses.replace(
    gallery.QUICK, name="tiny", manifold_eps=(0.1, 0.03), convergence_eps=(0.04, 0.02),
    convergence_t_end=1.0, osc_t_end=4.0, multirate_eps=(1e-1, 1e-4), multirate_H=(0.2, 0.1),
    multirate_H_fixed=0.1, multirate_t_end=1.0, me_corpus="me:tokens=20000", tokens=1024,
    sweep_token_corpus="me:tokens=20000", sweep_tokens=(512, 1024), sweep_P=(4, 8),
    sweep_P_corpus="me:tokens=20000", sweep_P_tokens=512, phi_max_windows=40, phi_probe_windows=40,
    cost_T=(32, 64), cost_P=(4, 8), cost_model={"n_layer": 1, "n_head": 1, "n_embd": 16,
                                                "vocab_size": 32}, cost_batch=1, cost_rounds=1,
)  # fmt: skip


def _make(tmp_path, only, **kw):
    kw = {"out": tmp_path / "figs", "results": tmp_path / "res", "runs": tmp_path / "runs",
          "sizes": TINY, "progress": False, "text": None, **kw}  # fmt: skip
    records = gallery.make_figures(only=only, **kw)
    ctx = gallery._Context(kw["sizes"], kw["out"], kw["results"], kw["runs"], kw["text"], False, True)
    for r in records:
        assert "skipped" not in r, r
        # every file the figure wrote or read is one that make_figures checks before it starts
        # (a run's own phi_vs_pst.json and train.nc lie in run folders that reproduce checks)
        declared = {str(p) for p, _ in gallery._outputs(r["name"], ctx)}
        used = {p for p, _ in r["datasets"] if not p.endswith(("phi_vs_pst.json", "train.nc"))}
        assert used <= declared, (r["name"], used - declared)
        assert sorted(p.rsplit(".", 1)[1] for p in r["files"]) == ["pdf", "png"]
        for p in r["files"]:
            with open(p, "rb") as f:
                head = f.read(5)
            assert head in (b"\x89PNG\r", b"%PDF-"), p
    return {r["name"]: r for r in records}


@pytest.mark.slow
def test_multirate_and_cost_figures_come_from_their_datasets(tmp_path):
    rec = _make(tmp_path, ["multirate-map", "cost"])
    res = tmp_path / "res"
    # multirate: one cell recomputed independently, and the fitted order in H (theory 1)
    mr = fs.load_dataset(res / "multirate-map.nc")
    assert rec["multirate-map"]["datasets"] == [(str(res / "multirate-map.nc"), "computed")]
    assert list(mr["eps"].values) == [1e-1, 1e-4] and list(mr["H"].values) == [0.2, 0.1]
    system = fs.make_system("birth-death", eps=1e-4)
    run = fs.integrate(system, (0, 1.0), method="multirate", H=0.2)
    ref = fs.integrate(system, (0, 1.0), method="radau", rtol=1e-11, atol=1e-13,
                       t_eval=run["time"].values)  # fmt: skip
    np.testing.assert_allclose(mr["err_y"].values[1, 0],
                               np.max(np.abs(run["y"].values - ref["y"].values)), rtol=1e-6)  # fmt: skip
    assert abs(json.loads(mr.attrs["orders"])[1] - 1.0) < 0.15
    # cost: the FLOP model's numbers, one network per (variant, P)
    cost = fs.load_dataset(res / "cost.nc")
    assert list(cost["config"].values) == ["dense", "coupled P=4", "coupled P=8"]
    cfg = BridgeConfig(block_size=64, P=8, variant="coupled", **TINY.cost_model)
    assert cost["flops_per_token"].sel(config="coupled P=8", T=32) == flops_per_token(cfg, 32)["train"]
    assert np.all(cost["wall_per_token"].values > 0) and cost["wall_per_token"].attrs["units"] == "s"
    # a second call reuses every dataset; a changed recipe recomputes that one only
    again = _make(tmp_path, ["multirate-map", "cost"])
    assert all(how == "reused" for r in again.values() for _, how in r["datasets"])
    other = _make(tmp_path, ["multirate-map"], sizes=dataclasses.replace(TINY, multirate_eps=(1e-2, 1e-4)))
    assert other["multirate-map"]["datasets"][0][1] == "computed"
    assert list(fs.load_dataset(res / "multirate-map.nc")["eps"].values) == [1e-2, 1e-4]


@pytest.mark.slow
def test_the_other_ode_figures_come_from_their_datasets(tmp_path):
    rec = _make(tmp_path, ["ode"])
    assert set(rec) == {"integrate-birth-death", "equilibrium-manifold", "convergence",
                        "nonlinear-branches", "multirate-map"}  # fmt: skip
    res = tmp_path / "res"
    conv = fs.load_dataset(res / "convergence.nc")
    assert list(conv["eps"].values) == [0.04, 0.02] and "slopes" in conv.attrs
    br = fs.load_dataset(res / "nonlinear-branches.nc")
    assert br.attrs["kappa"] == 3.0 and len(json.loads(br.attrs["folds"])) == 2 and "osc_y" in br
    runs = [fs.load_dataset(res / f"equilibrium-manifold-eps{e:g}.nc") for e in (0.1, 0.03)]
    assert [r.attrs["eps"] for r in runs] == [0.1, 0.03]
    assert fs.load_dataset(res / "integrate-birth-death.nc").attrs["eps"] == 0.125
    again = _make(tmp_path, ["ode"])
    assert all(how == "reused" for r in again.values() for _, how in r["datasets"])


@pytest.mark.slow
def test_training_figures_come_from_the_runs(tmp_path):
    rec = _make(tmp_path, ["training"])
    runs = tmp_path / "runs"
    ab = fs.load_dataset(runs / "reproduce-me" / "ablation.nc")
    assert ab.attrs["corpus"] == TINY.me_corpus and int(ab.attrs["tokens"]) == TINY.tokens
    assert list(ab["arm"].values) == list(gallery.ARMS) and ab.sizes["seed"] == TINY.seeds
    assert rec["training-ablation"]["datasets"] == [(str(runs / "reproduce-me" / "ablation.nc"), "reused")]
    table = json.loads(ab.attrs["table"])
    c = next(c for c in table["comparisons"] if (c["a"], c["b"]) == ("coupled", "dense"))
    d = ab["val_loss"].sel(arm="coupled").values - ab["val_loss"].sel(arm="dense").values
    assert c["mean_diff"] == pytest.approx(d.mean(), rel=1e-12)
    phi = {p for p, _ in rec["phi-vs-pst"]["datasets"] if p.endswith("phi_vs_pst.json")}
    assert len(phi) == len(gallery.ARMS)
    rows = gallery.sweep_rows(runs / "phi-sweep" / "phi_vs_pst_sweep.json")
    assert sorted((r["sweep"], r["P"], r["arm"]) for r in rows) == sorted(
        (sw, P, arm) for sw, _, arm, _, P in gallery.sweep_plan(TINY))
    # nothing is retrained the second time
    mtime = (runs / "reproduce-me" / "coupled-seed0" / "ckpt.pt").stat().st_mtime
    again = _make(tmp_path, ["training-gates", "phi-vs-pst-sweep"])
    assert all(how == "reused" for r in again.values() for _, how in r["datasets"])
    assert (runs / "reproduce-me" / "coupled-seed0" / "ckpt.pt").stat().st_mtime == mtime


def test_compute_false_skips_missing_data_and_only_is_checked(tmp_path):
    rec = gallery.make_figures(only="training", runs=tmp_path / "none", out=tmp_path / "f",
                               compute=False, progress=False)  # fmt: skip
    assert all("skipped" in r and not r["files"] for r in rec)
    with pytest.raises(fs.InputError, match="--only must name"):
        gallery.select("ode,pictures")
    res = CliRunner().invoke(main, ["figures", "--only", "pictures"])
    assert res.exit_code == 2 and "--only must name" in res.output
    (tmp_path / "file").write_text("x")
    res = CliRunner().invoke(main, ["figures", "--only", "ode", "--out", str(tmp_path / "file")])
    assert res.exit_code == 2 and "is a file" in res.output
    res = CliRunner().invoke(main, ["figures", "--only", "ode", "--text", str(tmp_path / "none.txt")])
    assert res.exit_code == 2 and "is not a file" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_quick_finishes_and_writes_every_figure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["figures", "--quick"])
    assert res.exit_code == 0, res.output
    for name in gallery.FIGURES:
        for ext in ("png", "pdf"):
            assert (tmp_path / "fastslow-results" / "quick" / "figures" / f"{name}.{ext}").stat().st_size > 5000


def test_compute_false_does_not_reuse_a_phi_result_older_than_its_run(tmp_path):
    # a run retrained in its folder (reproduce with other --tokens) leaves the old
    # phi_vs_pst.json behind: training-figures must not draw it beside the new run
    import os
    from types import SimpleNamespace

    run = tmp_path / "coupled-seed0"
    run.mkdir()
    (run / "phi_vs_pst.json").write_text(json.dumps({"tokens": 2048}))
    (run / "ckpt.pt").write_bytes(b"newer checkpoint")
    os.utime(run / "phi_vs_pst.json", (1_000_000, 1_000_000))
    ctx = SimpleNamespace(compute=False, used=[])
    with pytest.raises(gallery._MissingError, match="older than"):
        gallery._phi_result(ctx, run, "phi_theta against p_st")
    assert ctx.used == []


def _foreign_netcdf(path):
    import xarray as xr

    xr.Dataset({"other": ("x", np.arange(3.0))}).to_netcdf(path, engine="h5netcdf")


@pytest.mark.parametrize(
    "name, write, said",
    [
        ("reproduce-me/ablation.nc", _foreign_netcdf, "the ablation results {path!r} were not "
         "written by fastslow-sim; expected the ablation.nc that fastslow-sim reproduce writes "
         "there."),
        ("reproduce-me/ablation.nc", lambda p: p.write_text("not a dataset\n"), "the file "
         "{path!r} is not a NetCDF-4 dataset that can be read ("),
        # ours, cut short: not "not written by fastslow-sim"
        ("reproduce-me/ablation.nc", lambda p: (fs.save_dataset(__import__("xarray").Dataset(
            {"val_loss": ("x", np.arange(300.0))}), p), p.write_bytes(p.read_bytes()[:800])),
         "the file {path!r} is not a NetCDF-4 dataset that can be read ("),
        ("reproduce-me/ablation.nc", lambda p: fs.save_dataset(
            __import__("xarray").Dataset({"other": ("x", np.arange(3.0))}), p),
         "the ablation results {path!r} lack arm, seed, val_loss, wall_time_s, corpus, tokens, "
         "table, corpus_summary; expected"),
        ("phi-sweep/phi_vs_pst_sweep.json", lambda p: p.write_text('{"rows": [{"sw'),
         "the file {path!r} is not a phi-vs-pst sweep ({{\"rows\": [...]}}) that fastslow-sim "
         "can read; expected the file it writes there (remove or move this one)."),
        ("phi-sweep/phi_vs_pst_sweep.json", lambda p: p.write_text('{"rows": [{"bad": 1}]}'),
         "the file {path!r} is not a phi-vs-pst sweep"),
        # a row without its x value (tokens) or TV means: the plot's KeyError
        ("phi-sweep/phi_vs_pst_sweep.json", lambda p: p.write_text(
            '{"rows": [{"sweep": "tokens", "arm": "dense", "run": "r", "tv": {}}]}'),
         "the file {path!r} is not a phi-vs-pst sweep"),
        ("phi-sweep/phi_vs_pst_sweep.json", lambda p: p.write_bytes(b"\xff\xfe\x00garbage"),
         "the file {path!r} is not a phi-vs-pst sweep"),
    ],
)
def test_training_figures_refuse_a_saved_result_they_cannot_read(tmp_path, monkeypatch, name, write,
                                                                  said):
    """A file at a saved result's path that fastslow-sim did not write, or not in the form it
    writes, is one sentence naming it and exit status 2 (it was a KeyError, JSONDecodeError or
    h5py OSError traceback, or 'a file operation failed: OSError.'), and is left as it was."""
    path = tmp_path / "runs" / name
    path.parent.mkdir(parents=True)
    write(path)
    before = path.read_bytes()
    res = CliRunner().invoke(main, ["training-figures", "--runs", str(tmp_path / "runs"),
                                    "--out-dir", str(tmp_path / "f")])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert res.output.startswith("Error: " + said.format(path=str(path))), res.output
    # `figures` (which computes what is missing) refuses it too, before any training
    only = "training-ablation" if name.endswith(".nc") else "phi-vs-pst-sweep"
    monkeypatch.chdir(tmp_path)  # no ../shared/data/tinyshakespeare.txt: no text ablation
    res = CliRunner().invoke(main, ["figures", "--only", only, "--runs", str(tmp_path / "runs"),
                                    "--out-dir", str(tmp_path / "f")])  # fmt: skip
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]  # after the note that there is no text corpus
    assert "Traceback" not in res.output and last.startswith("Error: ")
    assert repr(str(path)) in last, res.output
    assert path.read_bytes() == before


def test_load_dataset_refuses_a_file_that_is_no_netcdf_naming_it(tmp_path):
    path = tmp_path / "x.nc"
    path.write_text("text, not HDF5\n")
    with pytest.raises(fs.InputError, match=f"the file '{path}' is not a NetCDF-4 dataset that "
                       r"can be read \(.*signature not found.*\); expected a dataset that "
                       r"fastslow-sim wrote\.$"):  # fmt: skip
        fs.load_dataset(path)


def test_only_names_each_choice_once_and_help_lists_every_figure():
    """`--only`'s choices named `cost` twice (a group and a figure), and `figures --help` did
    not list the figures: now each choice once, and one help line per figure saying what it
    shows."""
    import re

    res = CliRunner().invoke(main, ["figures", "--only", "pictures"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    choices = re.findall(r"'([^']+)'", res.output.split("out of", 1)[1].split("; got")[0])
    assert sorted(choices) == sorted(set(gallery.GROUPS) | set(gallery.FIGURES))
    assert len(choices) == len(set(choices))
    res = CliRunner().invoke(main, ["figures", "--help"])
    assert res.exit_code == 0
    lines = res.output.split("\n")
    for name, fig in gallery.FIGURES.items():
        (line,) = [ln for ln in lines if ln.split()[:1] == [name]]
        assert line.split(None, 1)[1] == fig.shows  # the whole description, on the name's line
    for group in gallery.GROUPS:
        assert group in res.output


@pytest.mark.parametrize(
    "only, note",
    [(None, True), ("training", True), ("training-gates", True), ("ode", False), ("cost", False),
     ("phi-vs-pst", False), ("phi-vs-pst-sweep", False), ("multirate-map,training-ablation", True)],
)  # fmt: skip
def test_text_note_only_for_figures_that_read_the_text(tmp_path, monkeypatch, only, note):
    """The note on a missing tinyshakespeare.txt was printed for every selection, `--only cost`
    included; now only where a selected figure reads the text ablation. The note follows what
    the recipes read: phi-vs-pst draws the me runs only, and checks only the me ablation."""
    monkeypatch.chdir(tmp_path)  # no ../shared/data/tinyshakespeare.txt from here
    monkeypatch.setattr(gallery, "make_figures", lambda **kw: [])
    res = CliRunner().invoke(main, ["figures"] + ([] if only is None else ["--only", only]))
    assert res.exit_code == 0, res.output
    assert ("tinyshakespeare.txt" in res.output) == note, res.output
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be " * 100)
    ctx = gallery._Context(TINY, tmp_path / "f", tmp_path / "r", tmp_path / "runs", str(text),
                           False, True)  # fmt: skip
    read = {p.parent.name for n in gallery.select(only) for p, _ in gallery._outputs(n, ctx)
            if p.name == "ablation.nc"}  # fmt: skip
    assert ("reproduce-text" in read) == note


def test_sweep_rows_read_nulls_as_nan(tmp_path):
    """`save_json` writes strict JSON, so the standard error of a single validation window (NaN)
    is null in phi_vs_pst_sweep.json; the rows read it back as NaN, a number the figure's error
    bars take, not None."""
    from fastslow_sim.io import save_json

    refs = ("Bayes filter, head readout", "Bayes filter p_st", "corpus frequencies")
    row = {"sweep": "P", "P": 8, "arm": "coupled", "run": "r",
           "tv": {k: {"mean": 0.1, "se": float("nan")} for k in (*refs, "model head")}}  # fmt: skip
    path = save_json({"rows": [row]}, tmp_path / "phi_vs_pst_sweep.json")
    assert '"se": null' in path.read_text()
    (back,) = gallery.sweep_rows(path)
    assert all(v["mean"] == 0.1 and np.isnan(v["se"]) for v in back["tv"].values())


class _RecordingBar:
    """A stand-in for `_Context.bar`'s tqdm: records every update."""

    def __init__(self, total):
        self.total, self.n, self.updates = total, 0, []

    def update(self, k=1):
        self.n += k
        self.updates.append(k)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_ablation_bar_moves_as_each_run_finishes(tmp_path, monkeypatch):
    """The ablation's bar was moved by `reproduce`'s log, whose per-run lines come only once
    the whole sweep is done: it sat at 0/N during all the training. Now it moves by one as each
    run finishes (`run_sweep`'s `on_chunk`), before the sweep returns; runs reused from the
    store (an earlier call cut short) fill it at the end."""
    import fastslow_sim.sweep as sweep

    sizes = dataclasses.replace(TINY, seeds=1, tokens=512)
    ctx = gallery._Context(sizes, tmp_path / "f", tmp_path / "r", tmp_path / "runs", None, False,
                           True)  # fmt: skip
    bars = []

    def bar(what, total):
        bars.append(_RecordingBar(total))
        return bars[-1]

    monkeypatch.setattr(ctx, "bar", bar)
    at_return = []
    real = sweep.run_sweep

    def run_sweep(*a, **kw):
        res = real(*a, **kw)
        at_return.append(bars[-1].n)  # where the bar stood as the sweep returned
        return res

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    n = len(gallery.ARMS)
    dirs = gallery._ablations(ctx, ("me",))
    assert dirs == {"me": tmp_path / "runs" / "reproduce-me"}
    assert at_return == [n] and bars[0].updates == [1] * n and bars[0].n == bars[0].total == n
    # the sweep's store holds every run; without its ablation.nc the call reuses them all
    (tmp_path / "runs" / "reproduce-me" / "ablation.nc").unlink()
    gallery._ablations(ctx, ("me",))
    assert at_return[1] == 0 and bars[1].updates == [n] and bars[1].n == n


def test_text_ablation_is_reused_under_another_spelling_of_its_file(tmp_path, monkeypatch):
    """`figures --text corpus.txt` and then `--text ./corpus.txt` (or the absolute path):
    the saved ablation did not match (its corpus spelt otherwise), and recomputing it was
    refused as "another configuration (corpus = ...)" over its own runs. The same contents
    are the same corpus: the ablation is reused as it was; another file's contents are not
    (recomputed, over runs of another configuration: refused as before, naming the option of
    `figures` that places the runs, not reproduce's --out and sweep's --runs-dir)."""
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be, that is the question " * 400)
    sizes = dataclasses.replace(TINY, seeds=1, tokens=512)

    def ctx_of(path):
        return gallery._Context(sizes, tmp_path / "f", tmp_path / "r", tmp_path / "runs", path,
                                False, True)  # fmt: skip

    ctx = ctx_of("corpus.txt")
    assert gallery._ablations(ctx, ("text",)) == {"text": tmp_path / "runs" / "reproduce-text"}
    nc = tmp_path / "runs" / "reproduce-text" / "ablation.nc"
    assert ctx.used == [(str(nc), "computed")]
    held = nc.read_bytes()
    for path in ("./corpus.txt", str(text)):
        ctx = ctx_of(path)
        assert gallery._ablations(ctx, ("text",)) == {"text": nc.parent}
        assert ctx.used == [(str(nc), "reused")] and nc.read_bytes() == held
    ds = gallery._checked_ablation(nc)
    assert ds.attrs["corpus"] == "text:corpus.txt"
    assert gallery._ablation_matches(ds, "text:./corpus.txt", sizes)
    assert not gallery._ablation_matches(ds, "text:./corpus.txt", dataclasses.replace(sizes, tokens=1024))
    (tmp_path / "other.txt").write_text("to be or not to be, that is the answer " * 400)
    assert not gallery._ablation_matches(ds, "text:other.txt", sizes)
    with pytest.raises(fs.InputError) as err:
        gallery._ablations(ctx_of("other.txt"), ("text",))
    assert str(err.value) == (
        f"dense seed 0: the run folder {str(nc.parent / 'dense-seed0')!r} holds a run of another "
        f"configuration (corpus = 'text:corpus.txt' there, 'text:other.txt' here), which this run "
        f"would replace; expected another output folder (--runs of figures), or that run's "
        f"settings to reuse it.")  # fmt: skip
    assert nc.read_bytes() == held
    # an ablation whose summary lacks the file's fingerprint matches its own spelling only
    ds.attrs["corpus_summary"] = json.dumps({k: v for k, v in json.loads(
        ds.attrs["corpus_summary"]).items() if k != "sha256"})  # fmt: skip
    assert gallery._ablation_matches(ds, "text:corpus.txt", sizes)
    assert not gallery._ablation_matches(ds, "text:./corpus.txt", sizes)


def test_text_ablation_of_a_file_changed_since_is_not_reused(tmp_path, monkeypatch):
    """The same spelling of a file whose contents changed matched the saved ablation, so the
    training figures showed the old contents' runs as the file's."""
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be, that is the question " * 400)
    sizes = dataclasses.replace(TINY, seeds=1, tokens=512)
    ctx = gallery._Context(sizes, tmp_path / "f", tmp_path / "r", tmp_path / "runs", "corpus.txt",
                           False, True)  # fmt: skip
    gallery._ablations(ctx, ("text",))
    ds = gallery._checked_ablation(tmp_path / "runs" / "reproduce-text" / "ablation.nc")
    assert gallery._ablation_matches(ds, "text:corpus.txt", sizes)
    text.write_text("to be or not to be, that is the answer " * 400)
    assert not gallery._ablation_matches(ds, "text:corpus.txt", sizes)


def test_reproduce_reports_each_run_as_it_finishes_and_logs_as_before(tmp_path):
    """`reproduce(on_chunk=...)` passes `run_sweep`'s hook through: one call per run, each
    before any per-run line of `log` (those come once the grid is done, unchanged)."""
    from fastslow_sim.training import reproduce

    events = []
    base = {**TINY.base, "progress": False}
    reproduce("me:tokens=20000", 512, 2, ["coupled"], str(tmp_path / "a"), base,
              log=lambda msg: events.append(("log", msg)),
              on_chunk=lambda results, chunk: events.append(("chunk", len(chunk),
                                                             [s for _, s in results])))  # fmt: skip
    assert [e[0] for e in events] == ["chunk", "chunk", "log", "log"]
    assert [e[1:] for e in events[:2]] == [(1, ["done"]), (1, ["done"])]
    assert [e[1].split(":")[0] for e in events[2:]] == ["  coupled       seed 0",
                                                         "  coupled       seed 1"]


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_cost_dataset_is_timed_on_one_thread_and_restores_torchs(tmp_path, monkeypatch):
    """The cost figure (captioned "CPU, one thread") was timed on torch's default threads (the
    dataset said 'cpu, 2 thread(s)'), and a cost.nc timed on other threads was reused. Now it
    is timed on one thread, torch's setting is restored after, and the thread count is part
    of the recipe: a cost.nc without it is recomputed."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ds = gallery.cost_dataset((16,), (4,), TINY.cost_model, rounds=1)
        assert ds.attrs["device"] == "cpu, 1 thread(s)"
        assert torch.get_num_threads() == 2
        rec = _make(tmp_path, ["cost"])
        cost = fs.load_dataset(tmp_path / "res" / "cost.nc")
        assert cost.attrs["device"] == "cpu, 1 thread(s)" and torch.get_num_threads() == 2
        assert json.loads(cost.attrs["gallery_recipe"])["threads"] == 1
        assert rec["cost"]["datasets"] == [(str(tmp_path / "res" / "cost.nc"), "computed")]
        # a cost.nc whose recipe names no threads (timed before this) is not reused
        from fastslow_sim.io import save_dataset

        recipe = json.loads(cost.attrs["gallery_recipe"])
        del recipe["threads"]
        cost.attrs["gallery_recipe"] = json.dumps(recipe, sort_keys=True)
        cost.attrs["device"] = "cpu, 2 thread(s)"
        save_dataset(cost.load(), tmp_path / "res" / "cost.nc")
        rec = _make(tmp_path, ["cost"])
        assert rec["cost"]["datasets"] == [(str(tmp_path / "res" / "cost.nc"), "computed")]
        assert fs.load_dataset(tmp_path / "res" / "cost.nc").attrs["device"] == "cpu, 1 thread(s)"
        assert _make(tmp_path, ["cost"])["cost"]["datasets"][0][1] == "reused"
    finally:
        torch.set_num_threads(before)


def test_multirate_error_dataset_ends_exactly_at_t_end():
    """`h_min * arange(n + 1)` ended at 0.05 * 24 = 1.2000000000000002 for t_end = 1.2: the
    reference run refused it ('t_eval must lie inside t_span (0.0, 1.2).'). The last point is
    t_end itself; the errors are those at the block ends of every H."""
    ds = gallery.multirate_error_dataset([0.125], [0.1, 0.05], 0.1, t_end=1.2)
    assert list(ds["H"].values) == [0.1, 0.05] and ds.attrs["t_end"] == 1.2
    assert np.all(np.isfinite(ds["err_y"].values)) and np.all(ds["err_y"].values > 0)
    assert np.all(np.isfinite(ds["err_x"].values))
    # a span of no whole blocks is refused before any reference run
    with pytest.raises(fs.InputError, match=r"the span 1\.23 is not a whole number of blocks"):
        gallery.multirate_error_dataset([0.125], [0.1, 0.05], 0.1, t_end=1.23)


def test_cost_dataset_refuses_a_thread_count_in_one_sentence():
    # torch's RuntimeError ("set_num_threads expects a positive integer") came through
    with pytest.raises(fs.InputError, match=r"^threads must be an integer from 1 to \d+ \(the CPUs "
                                            r"this process may use\); got 0\.$"):  # fmt: skip
        gallery.cost_dataset([16], [4], {}, threads=0)


def test_runs_folder_is_checked_only_where_a_selected_figure_uses_it(tmp_path, monkeypatch):
    """`figures --only ode --runs no/runs` was refused for the runs folder's missing parent,
    though no ODE figure reads or writes the runs; a training figure still is."""
    monkeypatch.chdir(tmp_path)
    for name in ("integrate-birth-death", "phi-vs-pst-sweep"):  # drawn instantly, from nothing
        monkeypatch.setitem(gallery.FIGURES, name,
                            gallery.FIGURES[name]._replace(recipe=lambda ctx: {}))  # fmt: skip
    runs = str(tmp_path / "no" / "runs")
    ode = CliRunner().invoke(main, ["figures", "--only", "integrate-birth-death", "--runs", runs])
    assert ode.exit_code == 0, ode.output
    both = CliRunner().invoke(main, ["figures", "--only", "integrate-birth-death,phi-vs-pst-sweep",
                                     "--runs", runs])  # fmt: skip
    assert both.exit_code == 2, both.output
    assert both.output == (f"Error: cannot write the runs folder {runs!r}: folder "
                           f"{str(tmp_path / 'no')!r} does not exist.\n")  # fmt: skip
    assert not (tmp_path / "no").exists()


def _saved_ablation(folder, summary=None, arms=("coupled", "dense"), seeds=2, references=None):
    """A reproduce folder as fastslow-sim writes it, without training: ablation.nc (of
    `summary` as its corpus summary, `references` as its table's) and each run's train.nc."""
    import xarray as xr

    summary = {"oracle_loss": 1.1, "bayes_floor_loss": 1.2, "ignore_y_loss": 1.4} \
        if summary is None else summary  # fmt: skip
    folder.mkdir(parents=True)
    table = {"margin": 0.01, "comparisons": [], "references": references}
    fs.save_dataset(xr.Dataset(
        {"val_loss": (("arm", "seed"), np.full((len(arms), seeds), 1.3)),
         "wall_time_s": (("arm", "seed"), np.ones((len(arms), seeds)))},
        coords={"arm": list(arms), "seed": np.arange(seeds)},
        attrs={"corpus": "me", "tokens": 1024, "table": json.dumps(table),
               "corpus_summary": json.dumps(summary)}), folder / "ablation.nc")  # fmt: skip
    for arm in arms:
        for seed in range(seeds):
            (folder / f"{arm}-seed{seed}").mkdir()
            fs.save_dataset(xr.Dataset(
                {"gate": (("step", "layer"), np.full((2, 1), 0.1)),
                 "val_loss": ("eval_step", [1.6, 1.5])},
                coords={"step": [1, 2], "eval_step": [1, 2]}),
                folder / f"{arm}-seed{seed}" / "train.nc")  # fmt: skip
    return folder


def test_data_line_names_the_runs_the_training_curves_read(tmp_path, capsys):
    """The gates and validation-loss figures read every run's train.nc besides ablation.nc;
    their "data:" line named ablation.nc alone."""
    from fastslow_sim.cli.figures import _print_figure_records

    me = _saved_ablation(tmp_path / "runs" / "reproduce-me")
    records = gallery.make_figures(out=tmp_path / "f", runs=tmp_path / "runs", compute=False,
                                   progress=False, only=["training-gates", "training-val-loss"])  # fmt: skip
    _print_figure_records(records)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("data: ")[1] for ln in lines if "data: " in ln] == [
        f"{me / 'ablation.nc'} (reused), {me / 'ARM-seedS' / 'train.nc'} (reused)"
    ] * 2


@pytest.mark.parametrize("summary, drawn", [
    ({"corpus": "random"}, {}),
    ({"corpus": "me", "oracle_loss": 1.1, "bayes_floor_loss": 1.2}, {"oracle": 1.1, "Bayes floor": 1.2}),
])  # fmt: skip
def test_references_of_an_ablation_without_them_are_left_out_with_a_warning(tmp_path, summary,
                                                                            drawn):  # fmt: skip
    """A random-corpus ablation under reproduce-me: `_references` raised KeyError
    ('oracle_loss'), and the validation-loss figure was not drawn."""
    from fastslow_sim.analysis import plot_val_loss

    me = _saved_ablation(tmp_path / "reproduce-me", summary=summary)
    lack = "oracle_loss, bayes_floor_loss, ignore_y_loss" if not drawn else "ignore_y_loss"
    with pytest.warns(UserWarning) as caught:
        refs = gallery._references({"me": me})
    assert [str(w.message) for w in caught] == [
        f"the ablation results {str(me / 'ablation.nc')!r} (corpus {summary['corpus']!r}) hold "
        f"no {lack} in their corpus summary, which the me corpus has; the validation loss is "
        f"drawn without those references."]  # fmt: skip
    assert refs == ({"me": drawn} if drawn else {})
    ax = plot_val_loss({"me": me}, refs).axes[0]
    assert sorted(t.get_text().split()[0] for t in ax.texts) == sorted(
        n.split()[0] for n in drawn)  # fmt: skip


def test_references_are_the_tables_on_the_windows_of_the_final_losses(tmp_path):
    """The reference lines came from the corpus summary, computed at the corpus's own
    reference context; the table's are on the windows (and context) of the runs' final losses,
    which the diamonds show. A file without them in its table falls back to the summary."""
    table = {"oracle_loss": 1.01, "bayes_floor_loss": 1.02, "ignore_y_loss": 1.03}
    me = _saved_ablation(tmp_path / "a", references=table)
    assert gallery._references({"me": me}) == {
        "me": {"oracle": 1.01, "Bayes floor": 1.02, "ignore-y": 1.03}}  # fmt: skip
    old = _saved_ablation(tmp_path / "b")  # no references in its table
    assert gallery._references({"me": old}) == {
        "me": {"oracle": 1.1, "Bayes floor": 1.2, "ignore-y": 1.4}}  # fmt: skip


@pytest.mark.parametrize("data", [{"rows": []}, []])
def test_sweep_rows_of_no_row_refuse_naming_the_file(tmp_path, data):
    """`{"rows": []}` passed the check, and the figure then stopped with "rows is []", which
    names no file; the file is refused, named, in one sentence."""
    path = tmp_path / "phi_vs_pst_sweep.json"
    path.write_text(json.dumps(data))
    with pytest.raises(fs.InputError, match=rf"^the phi-vs-pst sweep {re.escape(repr(str(path)))} "
                       r"holds no rows; expected at least one row \(.*\)\.$"):  # fmt: skip
        gallery.sweep_rows(path)


def test_training_figures_print_a_warning_as_one_line_as_figures_does(monkeypatch):
    """training-figures printed a figure's warning (`_references`') in Python's form, file:line:
    UserWarning: and the source line; it prints one `Warning:` line, as `figures` does."""
    import warnings

    def make_figures(**kw):
        warnings.warn("the validation loss is drawn without those references.", stacklevel=2)
        return [{"name": "training-val-loss", "seconds": 0.0, "files": ["f.png"],
                 "datasets": []}]  # fmt: skip

    monkeypatch.setattr(gallery, "make_figures", make_figures)
    res = CliRunner().invoke(main, ["training-figures", "--runs", "runs", "--out-dir", "f"])
    assert res.exit_code == 0, res.output
    assert res.stderr == "Warning: the validation loss is drawn without those references.\n"


def test_multirate_error_dataset_refuses_a_run_that_left_the_domain():
    """At H = 5 the Michaelis-Menten map's slow step leaves y >= 0; the dataset held NaN errors
    (and NaN orders) without a word, which the figure titled "slow error nan"."""
    with pytest.raises(fs.InputError, match=r"^the multirate map at eps = 0.01, H = 5 did not "
                                            r"reach t_end \(multirate stopped: left_domain"):
        gallery.multirate_error_dataset([0.01], [5.0, 2.5], 2.5, t_end=10.0,
                                        system="michaelis-menten")  # fmt: skip


@pytest.mark.parametrize("text, empty", [('{"rows": []}', True), ("[]", True),
                                          ('{"rows": [1]}', False), ("{", False)])
def test_an_empty_sweep_file_is_redone_when_computing(tmp_path, text, empty):
    """`sweep_rows` refuses a file of no rows (naming it); computing, the gallery redoes the
    sweep over such a file, as it did before the refusal, and leaves the judging of any other
    file to `sweep_rows`."""
    path = tmp_path / "s.json"
    path.write_text(text)
    assert gallery._no_rows(path) is empty
