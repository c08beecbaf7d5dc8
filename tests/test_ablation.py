"""The ablation: arms, the parameter-matched dense control, paired statistics, aligned blocks."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from scipy import stats

import fastslow_sim as fs
from fastslow_sim.bridge import FastSlowLM
from fastslow_sim.cli import main
from fastslow_sim.training import (
    TrainConfig,
    _batch,
    arm_config,
    matched_depth,
    paired_comparison,
    reproduce,
)

TINY = dict(block_size=32, batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=4,
            eval_batches=2, ckpt_interval=4, warmup_steps=2, progress=False)  # fmt: skip
SMALL_ME = "me:tokens=60000"


@pytest.mark.parametrize("seed", range(4))
def test_paired_interval_is_scipys(seed):
    rng = np.random.default_rng(seed)
    n = 5 + seed
    b = rng.normal(1.5, 0.02, n)
    a = b + rng.normal(0.004 * (seed - 1), 0.005, n)
    got = paired_comparison(a, b, margin=0.01)
    ref = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert got["df"] == n - 1
    np.testing.assert_allclose(got["ci95"], [ref.low, ref.high], rtol=1e-12)
    assert got["mean_diff"] == pytest.approx(np.mean(a - b), rel=1e-12)


@pytest.mark.parametrize("diffs, verdict", [
    ([0.001, -0.002, 0.0015, 0.0005, -0.001], "equivalent"),   # interval inside +-0.01
    ([0.05, 0.052, 0.049, 0.051, 0.048], "differs"),           # excludes 0, outside margin
    ([0.02, -0.03, 0.04, -0.01, 0.015], "inconclusive"),       # neither
    ([0.0, 0.0, 0.0, 0.0, 0.0], "equivalent"),                 # bit-identical arms
])  # fmt: skip
def test_verdicts(diffs, verdict):
    b = np.full(5, 1.4)
    assert paired_comparison(b + np.array(diffs), b, margin=0.01)["verdict"] == verdict


def test_one_seed_is_inconclusive():
    c = paired_comparison([1.0], [1.1])
    assert c["verdict"] == "inconclusive" and c["df"] == 0


@pytest.mark.parametrize("kw", [{}, {"n_layer": 2, "n_embd": 64, "n_head": 4}, {"P": 16}])
def test_matched_dense_has_the_coupled_parameter_count(kw):
    base = {**TINY, **kw}
    for V in (8, 256):
        cfg = TrainConfig(**{**base, **arm_config("dense-matched", base, V)})
        coupled = TrainConfig(**{**base, "variant": "coupled"})
        n_dense = sum(p.numel() for p in FastSlowLM(cfg.model_config(V)).parameters())
        n_coupled = sum(p.numel() for p in FastSlowLM(coupled.model_config(V)).parameters())
        assert cfg.variant == "dense" and cfg.n_layer == 2 * base["n_layer"]
        assert abs(n_dense / n_coupled - 1) <= 0.01


def test_matched_depth_refuses_what_cannot_match(monkeypatch):
    """With a narrow phi_theta (phi_mult 1) a slow path is half a dense layer: no depth fits."""
    from dataclasses import replace

    original = TrainConfig.model_config
    monkeypatch.setattr(
        TrainConfig, "model_config", lambda self, V: replace(original(self, V), phi_mult=1)
    )
    with pytest.raises(fs.InputError, match="within 1%"):
        matched_depth({**TINY, "n_layer": 1}, 8)


def test_batches_start_on_block_boundaries():
    data = np.arange(10_003)  # a token's value is its position
    g = torch.Generator().manual_seed(0)
    starts = []
    for _ in range(20):
        x, y = _batch(data, 32, 8, g, "cpu", align=8)
        assert torch.equal(x - x[:, :1], torch.arange(32).expand(8, 32))  # contiguous windows
        assert torch.equal(y[:, :-1], x[:, 1:])
        starts += x[:, 0].tolist()
    assert all(s % 8 == 0 for s in starts) and max(starts) + 33 <= len(data)
    assert len(set(starts)) > 100  # and they are spread over the split
    x1, _ = _batch(data, 32, 64, torch.Generator().manual_seed(0), "cpu")
    assert any(s % 8 for s in x1[:, 0].tolist())  # align=1 (text) is not aligned


def test_me_training_and_evaluation_windows_are_aligned():
    corpus = fs.corpora.load_corpus(SMALL_ME, P=4, context=32)
    assert corpus.block_len == 4 and len(corpus.train) % 4 == 0
    starts = corpus.window_starts("val", 32)
    assert np.all(starts % 4 == 0) and np.all(np.diff(starts) == 32)
    text = fs.corpora.random_corpus(5000)
    assert np.array_equal(text.window_starts("val", 32), np.arange(0, 500 - 32, 32))


@pytest.mark.slow  # 23 s; reproduce is covered in the default run by the text-table and retry tests
def test_reproduce_pairs_arms_and_reports_json(tmp_path):
    out = tmp_path / "abl"
    # 20,000 corpus tokens (62 validation windows of 32) and 4 steps of 128 tokens per run: half
    # the time of 60,000 and 9 steps; every arm's val loss is still 0.35-0.43 nats above the
    # Bayes floor (measured: 1.81-1.89 against 1.46), so "no arm beats the floor" is no closer call
    res = CliRunner().invoke(main, ["reproduce", "--corpus", "me:tokens=20000", "--tokens", "600", "--seeds", "2",
                                    "--P", "4", "--context", "32", "--batch-size", "4",
                                    "--arms", "dense,dense-matched,coupled,frozen-gate",
                                    "--out", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    arms = data["arms"]
    assert set(arms) == {"dense", "dense-matched", "coupled", "frozen-gate"}
    for a in arms.values():
        assert {"params", "flops_per_token", "val_loss", "tokens_per_s"} <= set(a)
        assert len(a["val_loss"]) == 2 and all(np.isfinite(a["val_loss"]))
    assert abs(arms["dense-matched"]["params"] / arms["coupled"]["params"] - 1) <= 0.01
    assert (
        arms["dense-matched"]["flops_per_token"]
        > arms["coupled"]["flops_per_token"]
        > arms["dense"]["flops_per_token"]
    )
    # frozen-gate is the dense model bit for bit (same seed, same data order, zero gate)
    assert arms["frozen-gate"]["val_loss"] == arms["dense"]["val_loss"]
    comps = {(c["a"], c["b"]): c for c in data["comparisons"]}
    assert set(comps) == {("dense-matched", "dense"), ("coupled", "dense"), ("frozen-gate", "dense"),
                          ("coupled", "dense-matched")}  # fmt: skip
    fg = comps[("frozen-gate", "dense")]
    assert fg["mean_diff"] == 0 and fg["ci95"] == [0, 0] and fg["verdict"] == "equivalent"
    for c in comps.values():
        ref = paired_comparison(arms[c["a"]]["val_loss"], arms[c["b"]]["val_loss"], 0.01)
        assert c["verdict"] == ref["verdict"] and c["df"] == 1
    # the floor of the same windows is reported, and no arm beats it
    ref = data["references"]
    assert ref["oracle_loss"] <= ref["bayes_floor_loss"] <= ref["ignore_y_loss"]
    assert all(v >= ref["bayes_floor_loss"] for a in arms.values() for v in a["val_loss"])
    ds = fs.load_dataset(out / "ablation.nc")
    assert ds["val_loss"].dims == ("arm", "seed") and ds["val_loss"].shape == (4, 2)
    assert ds["val_loss"].attrs["units"] == "nats/token"


@pytest.mark.slow
def test_reproduce_text_table(tmp_path, text_file):
    table = reproduce(f"text:{text_file}", 800, 2, ["dense", "coupled"], str(tmp_path / "t"), TINY,
                      log=lambda *a: None)  # fmt: skip
    # a second call reuses the finished runs of the same configuration, and only those
    lines = []
    again = reproduce(f"text:{text_file}", 800, 2, ["dense", "coupled"], str(tmp_path / "t"), TINY,
                      log=lines.append)  # fmt: skip
    assert len(lines) == 4 and all("(reused)" in line for line in lines)
    assert again["arms"]["coupled"]["val_loss"] == table["arms"]["coupled"]["val_loss"]
    lines.clear()
    before = (tmp_path / "t" / "dense-seed0" / "ckpt.pt").read_bytes()
    with pytest.raises(fs.InputError, match="holds a run of another configuration"):
        reproduce(f"text:{text_file}", 1000, 2, ["dense", "coupled"], str(tmp_path / "t"), TINY)
    assert (tmp_path / "t" / "dense-seed0" / "ckpt.pt").read_bytes() == before
    reproduce(f"text:{text_file}", 1000, 1, ["dense"], str(tmp_path / "t2"), TINY, log=lines.append)
    assert "(reused)" not in lines[0]  # other tokens, another folder: trained
    assert table["references"] is None
    assert [(c["a"], c["b"]) for c in table["comparisons"]] == [("coupled", "dense")]
    res = CliRunner().invoke(main, ["reproduce", "--corpus", f"text:{text_file}", "--margin", "-1",
                                    "--out", str(tmp_path / "m")])  # fmt: skip
    assert res.exit_code == 2 and "--margin must be a positive number" in res.output


def _tree(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_reproduce_rerun_with_other_settings_never_replaces_its_runs(tmp_path, text_file):
    """A rerun into the same --out with other settings was trained into the same ARM-seedS
    folders, replacing the first run's ckpt.pt, summary.json and train.nc; it is refused before
    any work, and the identical rerun still reuses the runs."""
    out = tmp_path / "r"
    args = ["reproduce", "--corpus", f"text:{text_file}", "--context", "32", "--batch-size", "4",
            "--P", "4", "--seeds", "1", "--arms", "dense", "--out", str(out), "--json"]  # fmt: skip
    first = CliRunner().invoke(main, [*args, "--tokens", "128"])
    assert first.exit_code == 0, first.output
    runs = _tree(out / "dense-seed0")
    assert set(map(str, runs)) == {"ckpt.pt", "summary.json", "train.nc"}
    again = CliRunner().invoke(main, [*args, "--tokens", "128"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["arms"] == json.loads(first.output)["arms"]
    assert _tree(out / "dense-seed0") == runs
    held = _tree(out)
    other = CliRunner().invoke(main, [*args, "--tokens", "256"])
    assert other.exit_code == 2, other.output
    assert other.output == (
        f"Error: dense seed 0: the run folder {str(out / 'dense-seed0')!r} holds a run of another "
        f"configuration (tokens = 128 there, 256 here), which this run would replace; expected "
        f"another output folder (--out of reproduce, --runs-dir of sweep), or that run's "
        f"settings to reuse it.\n"
    )
    assert _tree(out) == held  # the runs, the sweep store and ablation.nc, byte for byte


def test_reproduce_keeps_a_failed_run_until_told_to_retry_it(tmp_path, text_file, monkeypatch):
    """A run that failed once (a transient fault) was kept by every rerun, whose message read
    like a fresh failure; the rerun now says so, and --retry-failed trains it again."""
    original = FastSlowLM.forward
    fault = {"on": True}

    def flaky(self, idx, targets=None):
        if fault["on"] and self.config.variant == "coupled":
            raise RuntimeError("transient")
        return original(self, idx, targets)

    monkeypatch.setattr(FastSlowLM, "forward", flaky)
    out = tmp_path / "r"
    args = ["reproduce", "--corpus", f"text:{text_file}", "--context", "32", "--batch-size", "4",
            "--P", "4", "--seeds", "1", "--arms", "dense,coupled", "--tokens", "128",
            "--out", str(out), "--json"]  # fmt: skip
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 1 and "coupled seed 0: RuntimeError: transient" in first.output
    assert "earlier call" not in first.output  # this call's own failure
    fault["on"] = False
    kept = CliRunner().invoke(main, args)
    assert kept.exit_code == 1
    assert kept.output.rstrip().endswith(
        "; 1 run failed in an earlier call, which this one kept (--retry-failed trains it again)."
    ), kept.output
    again = CliRunner().invoke(main, [*args, "--retry-failed"])
    assert again.exit_code == 0, again.output
    assert set(json.loads(again.output)["arms"]) == {"dense", "coupled"}


def test_reproduce_never_reuses_a_run_made_on_other_contents_of_its_text_file(tmp_path, text_file):
    """Only the path and settings were compared: after the corpus file was replaced, a rerun
    printed '(reused)' with the old file's loss. The run is refused in one sentence naming the
    file, the runs stay as they were, and the file as it was is reused again."""
    out = tmp_path / "r"
    args = ["reproduce", "--corpus", f"text:{text_file}", "--context", "32", "--batch-size", "4",
            "--P", "4", "--seeds", "1", "--arms", "dense", "--tokens", "128", "--out", str(out)]  # fmt: skip
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    held = _tree(out)
    original = text_file.read_bytes()
    text_file.write_bytes(original.replace(b"slow", b"fast"))  # the same path, other contents
    changed = CliRunner().invoke(main, args)
    assert changed.exit_code == 2, changed.output
    assert changed.output == (
        f"Error: dense seed 0: the corpus file {str(text_file)!r} has changed since the run in "
        f"{str(out / 'dense-seed0')!r} was made (its contents' sha256 differs), which this run "
        f"would replace; expected another output folder (--out of reproduce, --runs-dir of "
        f"sweep), or the file as it was.\n"
    )
    assert _tree(out) == held
    text_file.write_bytes(original)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "(reused)" in again.output, again.output


def test_reproduce_reuses_the_runs_of_its_text_file_under_another_spelling(tmp_path, text_file,
                                                                           monkeypatch):
    """`--corpus text:./corpus.txt` after `text:corpus.txt` (or the absolute path, or a copy
    of the file) was refused as "another configuration (corpus = ...)" though the contents
    were the same. The same contents are the same corpus: the runs are reused, left as they
    were (their summary keeps the spelling they recorded), and the table is theirs. Other
    contents stay refused, under either spelling, with the messages of before."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r"
    tail = ["--context", "32", "--batch-size", "4", "--P", "4", "--seeds", "1", "--arms",
            "dense", "--tokens", "128", "--out", "r"]  # fmt: skip
    first = CliRunner().invoke(main, ["reproduce", "--corpus", "text:corpus.txt", *tail])
    assert first.exit_code == 0, first.output
    start = "  dense         seed 0: "  # after the sweep's progress bar
    val = first.output.split(start)[1].split("val ")[1].split(",")[0]
    held = {k: v for k, v in _tree(out).items() if k.parts[0] == "dense-seed0"}
    (tmp_path / "copy.txt").write_bytes(text_file.read_bytes())
    for spec in ("text:./corpus.txt", f"text:{text_file}", "text:copy.txt"):
        res = CliRunner().invoke(main, ["reproduce", "--corpus", spec, *tail])
        assert res.exit_code == 0, (spec, res.output)
        lines = (start + res.output.split(start)[1]).split("\n")
        assert lines[0].startswith(f"{start}(reused) val {val}, "), lines[0]
        assert lines[1].startswith(f"ablation on {spec}, 128 tokens per run, 1 seed"), lines[1]
        assert lines[4].startswith("| dense | 4 | ") and f"| {val} ± n/a (1 seed) |" in lines[4]
        assert {k: v for k, v in _tree(out).items() if k.parts[0] == "dense-seed0"} == held
        assert fs.load_dataset(out / "ablation.nc").attrs["corpus"] == spec
    summary = json.loads((out / "dense-seed0" / "summary.json").read_text())
    assert summary["train_config"]["corpus"] == "text:corpus.txt"
    # another file, of other contents: another configuration, as before
    (tmp_path / "other.txt").write_bytes(text_file.read_bytes().replace(b"slow", b"fast"))
    other = CliRunner().invoke(main, ["reproduce", "--corpus", "text:other.txt", *tail])
    assert other.exit_code == 2, other.output
    assert other.output == (
        "Error: dense seed 0: the run folder 'r/dense-seed0' holds a run of another configuration "
        "(corpus = 'text:corpus.txt' there, 'text:other.txt' here), which this run would replace; "
        "expected another output folder (--out of reproduce, --runs-dir of sweep), or that run's "
        "settings to reuse it.\n"
    )
    # the file itself changed: its own spelling is refused as changed, another as before
    text_file.write_bytes(text_file.read_bytes().replace(b"slow", b"fast"))
    same = CliRunner().invoke(main, ["reproduce", "--corpus", "text:corpus.txt", *tail])
    assert same.exit_code == 2, same.output
    assert same.output == (
        "Error: dense seed 0: the corpus file 'corpus.txt' has changed since the run in "
        "'r/dense-seed0' was made (its contents' sha256 differs), which this run would replace; "
        "expected another output folder (--out of reproduce, --runs-dir of sweep), or the file "
        "as it was.\n"
    )
    spelt = CliRunner().invoke(main, ["reproduce", "--corpus", "text:./corpus.txt", *tail])
    assert spelt.exit_code == 2, spelt.output
    assert "another configuration (corpus = 'text:corpus.txt' there, 'text:./corpus.txt' here)" \
        in spelt.output  # fmt: skip
    assert {k: v for k, v in _tree(out).items() if k.parts[0] == "dense-seed0"} == held


class _FilterModel(torch.nn.Module):
    """A stand-in network whose next-token distribution is the Bayes filter's."""

    def __init__(self, corpus, cfg):
        super().__init__()
        from fastslow_sim.me_corpus import _start_prior

        self.cfg, self.prior = cfg, _start_prior(corpus, cfg)

    def forward(self, idx, targets):
        from fastslow_sim.me_corpus import bayes_filter

        win = torch.cat([idx, targets[:, -1:]], dim=1).numpy()
        nxt = torch.from_numpy(bayes_filter(win, self.cfg, self.prior, predictive=True)["next"])
        logits = torch.log(nxt)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        )
        return logits, loss


def test_model_loss_and_floor_are_scored_on_the_same_targets():
    """evaluate_windows with the filter as the model returns the reported floor exactly."""
    from fastslow_sim.me_corpus import MECorpusConfig
    from fastslow_sim.training import evaluate_windows

    corpus = fs.corpora.load_corpus(SMALL_ME, P=4, context=32)
    cfg = MECorpusConfig(**corpus.stats["config"])
    got = evaluate_windows(_FilterModel(corpus, cfg), corpus, 32, batch_size=7)
    assert got == pytest.approx(corpus.stats["bayes_floor_loss"], rel=0, abs=1e-9)


def test_spec_owns_its_seed_but_not_P_or_context():
    a = fs.corpora.load_corpus("me:tokens=60000,seed=3", P=4, context=32, seed=0)
    assert a.stats["config"]["seed"] == 3 and a.stats["config"]["P"] == 4
    for spec in ("me:tokens=60000,P=16", "me:context=64"):
        with pytest.raises(fs.InputError, match="not in the corpus spec"):
            fs.corpora.load_corpus(spec, P=4)
    with pytest.raises(fs.InputError, match="not a multiple of the"):
        train_cfg = TrainConfig(
            corpus=SMALL_ME, out="unused", tokens=500, **{**TINY, "block_size": 30}
        )
        from fastslow_sim.training import train

        train(train_cfg)


def _runs(val_losses):
    """`{arm: [summary per seed]}` with the fields `ablation_table` reads."""
    return {arm: [{"val_loss": v, "wall_time_s": 1.0, "tokens_per_s": 100.0, "params": 10,
                   "flops_per_token_train": 1e6, "n_layer": 1, "gates": [0.5]} for v in vals]
            for arm, vals in val_losses.items()}  # fmt: skip


def test_one_seed_prints_no_spread_and_no_interval():
    """One seed has no standard deviation and no t interval (df 0): the table printed
    'nan' for both; now 'n/a (1 seed)', and the JSON holds null, never NaN."""
    from fastslow_sim.cli.common import json_text
    from fastslow_sim.cli.network import _format_ablation
    from fastslow_sim.training import ablation_table

    table = ablation_table(_runs({"dense": [1.5], "coupled": [1.4]}))
    text = _format_ablation(table, "random", 2048, 1)
    assert "nan" not in text.lower()
    assert "| 1.5000 ± n/a (1 seed) |" in text and "| 1.4000 ± n/a (1 seed) |" in text
    assert "| coupled - dense | -0.1000 | n/a (1 seed) | 0 | inconclusive |" in text
    assert json.loads(json_text(table))["comparisons"][0]["ci95"] == [None, None]
    # two seeds: the sample standard deviation and scipy's t interval, as before
    two = ablation_table(_runs({"dense": [1.5, 1.7], "coupled": [1.4, 1.5]}))
    text = _format_ablation(two, "random", 2048, 2)
    d = np.array([1.4, 1.5]) - np.array([1.5, 1.7])
    lo, hi = stats.t.interval(0.95, 1, loc=d.mean(), scale=d.std(ddof=1) / np.sqrt(2))
    assert f"| 1.6000 ± {np.std([1.5, 1.7], ddof=1):.4f} |" in text
    assert f"| -0.1500 | [{lo:+.4f}, {hi:+.4f}] | 1 |" in text


def test_table_says_what_its_verdicts_and_throughput_are():
    """The heading of the paired differences says what "equivalent" tests and how many
    comparisons share it (not adjusted); an arm identical to dense in every seed (frozen-gate, by
    design) says so rather than only "equivalent"; throughput is labelled not a cost comparison."""
    from fastslow_sim.cli.network import _format_ablation
    from fastslow_sim.training import ablation_table

    table = ablation_table(_runs({"dense": [1.5, 1.6, 1.55], "frozen-gate": [1.5, 1.6, 1.55],
                                  "coupled": [1.45, 1.52, 1.51]}))  # fmt: skip
    text = _format_ablation(table, "random", 2048, 3)
    assert ("margin ±0.01 (equivalent: the interval inside ±0.01, two one-sided tests at 2.5%; "
            "2 comparisons, not adjusted for multiplicity):") in text  # fmt: skip
    assert "| frozen-gate - dense | +0.0000 | [+0.0000, +0.0000] | 2 | equivalent (identical in every seed) |" in text
    assert "| coupled - dense |" in text and "identical" not in text.split("| coupled - dense |")[1]
    assert "tokens/s and wall / dense: each run's throughput on this machine" in text


def test_one_arm_table_says_there_is_no_comparison():
    """One arm (or arms with no compared pair) printed the paired-differences heading over an
    empty table, and a blank wall / dense cell where there is no dense arm."""
    from fastslow_sim.cli.network import _format_ablation
    from fastslow_sim.training import ablation_table

    text = _format_ablation(ablation_table(_runs({"coupled": [1.4, 1.5]})), "random", 2048, 2)
    assert text.splitlines()[-1] == "paired differences: none (one arm)"
    assert text.splitlines()[0] == "ablation on random, 2,048 tokens per run, 2 seeds"
    shifted = _format_ablation(ablation_table(_runs({"coupled": [1.4, 1.5]})), "random", 2048, 2, 3)
    assert shifted.splitlines()[0] == ("ablation on random, 2,048 tokens per run, 2 seeds, pooling "
                                       "grid from token 3 (--pool-offset)")  # fmt: skip
    assert "| a - b |" not in text and text.splitlines()[3].endswith("| 100 | - |")
    two = _format_ablation(ablation_table(_runs({"coupled": [1.4], "frozen-gate": [1.5]})),
                           "random", 2048, 1)  # fmt: skip
    assert two.splitlines()[-1].startswith("paired differences: none (each arm is compared with")


def _held_ablation(out, arms, seeds):
    """An ablation.nc of `arms` x `seeds`, as reproduce writes it (its arm and seed grid)."""
    import xarray as xr

    out.mkdir()
    ds = xr.Dataset({"val_loss": (("arm", "seed"), np.ones((len(arms), seeds)))},
                    coords={"arm": arms, "seed": np.arange(seeds)})  # fmt: skip
    fs.io.save_dataset(ds, out / "ablation.nc")
    return (out / "ablation.nc").read_bytes()


@pytest.mark.parametrize("arms, seeds", [("coupled", "2"), ("dense,coupled", "1")])
def test_reproduce_never_replaces_the_table_of_a_larger_grid(tmp_path, arms, seeds):
    """`--arms coupled` (or `--seeds 1`) on a folder of a 2-arm, 2-seed ablation replaced its
    ablation.nc, which training-figures reads, with the smaller table: refused before any work."""
    from fastslow_sim.training import _check_held_ablation

    out = tmp_path / "abl"
    held = _held_ablation(out, ["dense", "coupled"], 2)
    res = CliRunner().invoke(main, ["reproduce", "--corpus", "random", "--arms", arms, "--seeds",
                                    seeds, "--tokens", "4k", "--context", "32", "--batch-size",
                                    "2", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert res.output.startswith(f"Error: {str(out / 'ablation.nc')!r} holds the ablation of "
                                 f"dense, coupled x 2 seeds, which this call's ")  # fmt: skip
    assert res.output.endswith("would replace; expected those arms and seeds or more (finished "
                               "runs are reused), another folder (--out), or that file moved "
                               "away.\n")  # fmt: skip
    assert (out / "ablation.nc").read_bytes() == held and len(list(out.iterdir())) == 1
    # the same grid or a larger one replaces it, as before
    _check_held_ablation(out / "ablation.nc", ["dense", "coupled"], 2)
    _check_held_ablation(out / "ablation.nc", ["coupled", "frozen-gate", "dense"], 3)


@pytest.mark.slow  # two reproduce calls, 37 s
def test_reproduce_with_its_table_moved_away_runs_a_smaller_grid(tmp_path):
    """With ablation.nc moved away (as its refusal advises), a smaller grid on the folder had
    been refused by the sweep store's own check, in --store/--grid words reproduce has not."""
    out = tmp_path / "abl"
    args = ["reproduce", "--corpus", "random", "--tokens", "256", "--context", "16",
            "--batch-size", "2", "--out", str(out)]  # fmt: skip
    assert CliRunner().invoke(main, [*args, "--arms", "dense,coupled", "--seeds", "2"]).exit_code == 0
    (out / "ablation.nc").rename(tmp_path / "moved.nc")
    res = CliRunner().invoke(main, [*args, "--arms", "coupled", "--seeds", "1"])
    assert res.exit_code == 0 and "--store" not in res.output, res.output
    assert fs.load_dataset(out / "ablation.nc")["arm"].values.tolist() == ["coupled"]


@pytest.mark.parametrize("device, fragment", [
    ("gpu", "--device must be auto, cpu or cuda; got 'gpu'."),
    ("cuda:x", "--device must be auto, cpu or cuda; got 'cuda:x'."),
    pytest.param("cuda", "--device cuda was requested, but no CUDA device is available here.",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")),
])  # fmt: skip
@pytest.mark.parametrize("workers", [[], ["--workers", "1"]])
def test_reproduce_refuses_a_bad_device_before_writing(tmp_path, monkeypatch, device, fragment,
                                                       workers):  # fmt: skip
    """A bad --device wrote OUT/sweep.zarr, failed every run (exit 1) and kept the failed cells
    on a rerun; refused now in train-network's sentence, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["reproduce", "--arms", "dense,coupled", "--tokens", "4k",
                                    "--context", "32", "--batch-size", "2", "--seeds", "2",
                                    "--device", device, "--out", "rpx", *workers])  # fmt: skip
    assert res.exit_code == 2 and res.output == f"Error: {fragment}\n"
    assert not list(tmp_path.iterdir())


def test_a_cluster_may_train_on_a_cuda_device_this_process_lacks(monkeypatch):
    """--scheduler: the workers may have the GPU this process lacks; only the name is checked."""
    from fastslow_sim.training import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_device("cuda:1", here=False)
    with pytest.raises(fs.InputError, match="no CUDA device"):
        check_device("cuda:1")
    with pytest.raises(fs.InputError, match="got 'gpu'"):
        check_device("gpu", here=False)


@pytest.mark.slow
def test_reproduce_labels_the_tokens_each_run_trained(tmp_path, text_file):
    """`reproduce --tokens 255` with steps of 4 x 32 = 128 tokens trains one step (128 tokens)
    per run, as train-network does, but its table, JSON and ablation.nc said 255 tokens per
    run; they give the runs' own tokens now, and the requested ones beside them."""
    out = tmp_path / "abl"
    batch, context, requested = 4, 32, 255
    step = batch * context
    trained = (requested // step) * step  # 128: whole steps only
    args = ["reproduce", "--corpus", f"text:{text_file}", "--tokens", str(requested), "--seeds", "2",
            "--P", "4", "--context", str(context), "--batch-size", str(batch),
            "--arms", "dense,coupled", "--threads", "1", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    header = f"ablation on text:{text_file}, {trained} tokens per run ({requested} requested: " \
             f"whole steps of {step}), 2 seeds"  # fmt: skip
    assert header in res.output.splitlines()
    for arm in ("dense", "coupled"):
        for seed in range(2):
            s = json.loads((out / f"{arm}-seed{seed}" / "summary.json").read_text())
            assert (s["tokens"], s["steps"]) == (trained, 1)
    data = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)  # the runs reused
    assert (data["tokens"], data["tokens_requested"]) == (trained, requested)
    assert data["arms"]["coupled"]["tokens"] == [trained, trained]
    ds = fs.load_dataset(out / "ablation.nc")
    assert (int(ds.attrs["tokens"]), int(ds.attrs["tokens_requested"])) == (trained, requested)
    assert ds["tokens"].values.tolist() == [[trained, trained], [trained, trained]]
    import xarray as xr

    held = json.loads(xr.open_zarr(out / "sweep.zarr").attrs["reproduce"])
    assert held["tokens_requested"] == requested and "tokens" not in held
    # fewer tokens than one step would train none: refused, as train-network refuses them
    few = CliRunner().invoke(main, [*args[:4], str(step - 1), *args[5:-1], str(tmp_path / "few")])
    assert few.exit_code == 2
    assert f"--tokens must be from {step} (one batch: --batch-size {batch} x --context {context})" \
           in few.output  # fmt: skip
    assert not (tmp_path / "few").exists()


def test_ablation_header_says_so_when_runs_trained_other_tokens():
    from fastslow_sim.cli.network import _format_ablation
    from fastslow_sim.training import ablation_table

    runs = _runs({"dense": [1.5, 1.6], "coupled": [1.4, 1.5]})
    for arm, rs in runs.items():
        done = [(2048, 1), (4096, 2)] if arm == "coupled" else [(2048, 1)] * 2
        for r, (tokens, steps) in zip(rs, done):
            r.update(tokens=tokens, steps=steps)
    text = _format_ablation(ablation_table(runs), "random", 4000, 2)
    assert text.splitlines()[0] == ("ablation on random, the runs trained different tokens "
                                    "(2,048, 4,096; 4,000 requested), 2 seeds")  # fmt: skip
    # every run as requested: the header as before
    for rs in runs.values():
        for r in rs:
            r.update(tokens=4096, steps=2)
    text = _format_ablation(ablation_table(runs), "random", 4096, 2)
    assert text.splitlines()[0] == "ablation on random, 4,096 tokens per run, 2 seeds"


PHI_TINY = dict(block_size=16, batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=4,
                eval_batches=2, ckpt_interval=4, warmup_steps=2, progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def phi_runs(tmp_path_factory):
    """A finished me run, one stopped after 4 of 32 steps, and a run on `random` stopped after 1
    of 4 (a finished one's closing evaluation reads all 6,250 validation windows of 16 tokens:
    most of this fixture's time; phi-vs-pst refuses the run for its corpus either way)."""
    from fastslow_sim.training import train

    root = tmp_path_factory.mktemp("phi")
    for name, corpus, tokens, stop in (("done", "me:tokens=20k", 256, None),
                                       ("cut", "me:tokens=20k", 2048, 4),
                                       ("rand", "random", 256, 1)):  # fmt: skip
        train(TrainConfig(corpus=corpus, out=str(root / name), tokens=tokens,
                          stop_after_steps=stop, **PHI_TINY))  # fmt: skip
    return root


def test_phi_vs_pst_of_a_stopped_run_gives_the_tokens_trained(phi_runs, tmp_path):
    # an interrupted run printed its planned tokens (64,000) and nothing said it was unfinished
    import shutil

    run = tmp_path / "cut"
    shutil.copytree(phi_runs / "cut", run)
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run), "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert (r["tokens"], r["steps"], r["steps_planned"], r["finished"]) == (4 * 64, 4, 32, False)
    assert r["tokens_planned"] == 2048
    saved = json.loads((run / "phi_vs_pst.json").read_text())
    assert (saved["tokens"], saved["finished"]) == (256, False)
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run)])
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.output.splitlines() if ln.startswith(f"| {run} |"))
    assert "| 256 (stopped early) |" in row and "2,048" not in row
    assert f"note: run {run} stopped early: its checkpoint holds 4 of 32 steps (256 of 2,048 " \
           "tokens trained)." in res.output


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_phi_vs_pst_plans_whole_steps(tmp_path):
    """A run asked for 300 tokens in steps of 4 x 16 = 64 plans 4 steps, 256 tokens; phi-vs-pst
    gave tokens_planned 300 beside steps_planned 4."""
    from fastslow_sim.training import train

    run, requested = tmp_path / "odd", 300
    step = PHI_TINY["batch_size"] * PHI_TINY["block_size"]
    planned = requested // step
    train(TrainConfig(corpus="me:tokens=20k", out=str(run), tokens=requested, stop_after_steps=1,
                      **PHI_TINY))  # fmt: skip
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run), "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert (r["steps"], r["steps_planned"], r["tokens"]) == (1, planned, step)
    assert r["tokens_planned"] == planned * step == 256
    assert json.loads((run / "phi_vs_pst.json").read_text())["tokens_planned"] == 256
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run)])
    assert res.exit_code == 0, res.output
    assert f"note: run {run} stopped early: its checkpoint holds 1 of {planned} steps ({step} of " \
           f"{planned * step} tokens trained)." in res.output  # fmt: skip


@pytest.mark.parametrize("other", ["missing", "rand"])
def test_phi_vs_pst_checks_every_folder_before_writing(phi_runs, tmp_path, other):
    # `phi-vs-pst good nonexist_dir` exited 2 having written good/phi_vs_pst.json
    import shutil

    run = tmp_path / "done"
    shutil.copytree(phi_runs / "done", run)
    if other == "rand":
        shutil.copytree(phi_runs / "rand", tmp_path / "rand")
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run), str(tmp_path / other)])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and "Traceback" not in res.output
    assert ("no checkpoint" if other == "missing" else "needs an 'me' corpus") in res.output
    assert not (run / "phi_vs_pst.json").exists()


def _untrained_run(path, corpus, **settings):
    """A run folder whose checkpoint holds `PHI_TINY`'s network as initialised (no training:
    phi-vs-pst reads any checkpoint), on the me `corpus` at context 16 and P=4."""
    from dataclasses import asdict

    cfg = TrainConfig(corpus=corpus, out=str(path), tokens=64, **{**PHI_TINY, **settings})
    mcfg = cfg.model_config(8)  # the me corpus's 8 states
    torch.manual_seed(0)
    path.mkdir()
    torch.save({"model": FastSlowLM(mcfg).state_dict(), "model_config": mcfg.to_dict(),
                "train_config": asdict(cfg), "step": 1, "world_size": 1}, path / "ckpt.pt")  # fmt: skip
    return path


def test_phi_vs_pst_refuses_a_corpus_with_one_validation_window(tmp_path):
    """me:tokens=340 at context 16 had one validation window: phi-vs-pst printed `± nan` with
    RuntimeWarnings and exited 0; the corpus now needs two (360 tokens), and says so."""
    run = _untrained_run(tmp_path / "r340", "me:tokens=340")
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run)])
    assert res.exit_code == 2 and "nan" not in res.output
    assert res.output == (f"Error: run {str(run)!r}: the me corpus needs an integer tokens >= 360 "
                          f"(two validation windows of the context 16 in its last tenth, 9 blocks "
                          f"of P=4); got 340.\n")  # fmt: skip
    assert not (run / "phi_vs_pst.json").exists()


def test_phi_vs_pst_of_one_window_has_no_standard_error_and_no_empty_bin(tmp_path):
    """One window (max_windows=1) gave se NaN, and the y bins without a block "Mean of empty
    slice" (a RuntimeWarning, an error here); se is now None, shown as n/a, and such bins are
    left out."""
    from fastslow_sim.cli.network import _mean_se
    from fastslow_sim.probe import phi_vs_pst

    r = phi_vs_pst(_untrained_run(tmp_path / "r", "me:tokens=360"), max_windows=1, write=False)
    assert r["windows"] == 1 and all(tv["se"] is None for tv in r["tv"].values())
    assert _mean_se(r["tv"]["uniform"]).endswith(" ± n/a")
    assert 1 <= len(r["binned"]["y"]) <= r["blocks"] == 3
    assert all(len(v) == len(r["binned"]["y"]) and np.isfinite(v).all()
               for v in r["binned"].values())  # fmt: skip


def test_phi_vs_pst_computes_a_folder_given_twice_once(tmp_path):
    """`phi-vs-pst r1 r1` computed the run twice, printed two rows and wrote the file twice."""
    run = _untrained_run(tmp_path / "r1", "me:tokens=360")
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run), f"{run}/", "--json"])
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["run"] for line in res.stdout.splitlines()] == [str(run)]
    assert res.stderr == f"note: {run}/ is the run folder {run} again; it is computed once.\n"


def test_phi_vs_pst_over_the_seeds_of_an_arm(capsys):
    """Runs of one arm and setting with other seeds get each readout's mean ± s.d. over the
    runs and the network's readouts minus their controls paired by run (t interval, df =
    runs - 1); a lone run, or one of another setting, gets none."""
    from scipy import stats

    from fastslow_sim.cli.network import _echo_over_runs

    head, probe, untrained = [0.085, 0.086, 0.083], [0.032, 0.029, 0.031], [0.070, 0.069, 0.068]

    def run(arm, seed, tokens=4096, finished=True, **tv):
        return {"arm": arm, "corpus": "me", "tokens": tokens, "steps": tokens // 256, "P": 8,
                "windows": 468, "finished": finished, "seed": seed,
                "tv": {k.replace("_", " "): {"mean": v, "se": 0.001} for k, v in tv.items()}}

    base = {"Bayes_filter,_head_readout": 0.074, "probe_on_the_past_blocks'_histograms": 0.018}
    results = [run("coupled", k, model_head=head[k], **{"slow-state_probe": probe[k],
                   "slow-state_probe,_untrained_network": untrained[k]}, **base) for k in range(3)]
    # a lone dense run, a coupled run of other tokens, and a stopped one (not a replicate)
    results += [run("dense", 0, model_head=0.14, **base), run("coupled", 0, tokens=8192,
                model_head=0.08, **base), run("coupled", 3, finished=False, model_head=0.2,
                **base)]  # fmt: skip
    cols = ["model head", "slow-state probe", "Bayes filter, head readout"]
    _echo_over_runs(results, cols)
    out = capsys.readouterr().out.splitlines()
    row = next(ln for ln in out if ln.startswith("| coupled |"))
    sd = np.std(head, ddof=1)
    assert row == (f"| coupled | 3 (0, 1, 2) | {np.mean(head):.4f} ± {sd:.4f} | "
                   f"{np.mean(probe):.4f} ± {np.std(probe, ddof=1):.4f} | 0.0740 ± 0.0000 |")
    assert not any(ln.startswith("| dense |") for ln in out)  # one run: nothing over runs
    assert "coupled (me, 4,096 tokens, P = 8), paired by run, 95% t interval, df 2:" in out

    def line(a, b, x, y):
        d = np.subtract(x, y)
        half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
        return f"  {a} - {b}: {d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}]"

    assert out[-3:] == [
        line("slow-state probe", "slow-state probe, untrained network", probe, untrained),
        line("slow-state probe", "probe on the past blocks' histograms", probe, [0.018] * 3),
        line("model head", "Bayes filter, head readout", head, [0.074] * 3)]  # fmt: skip
    _echo_over_runs(results[3:], cols)  # no arm with two seeds of one setting
    assert capsys.readouterr().out == ""
    _echo_over_runs(results[:3] + [results[0]], cols)  # seed 0 twice: said, not summarised
    out, err = capsys.readouterr()
    assert out == "" and err == ("note: coupled (me, 4,096 tokens) has seed 0 more than once; "
                                 "its runs are not summarised over seeds.\n")
    del results[1]["tv"]["slow-state probe"]  # one run without the probe: no probe pairs
    _echo_over_runs(results[:3], cols)
    out = capsys.readouterr().out.splitlines()
    assert next(ln for ln in out if ln.startswith("| coupled |")).split(" | ")[3] == "-"
    assert out[-3:-1] == [
        "  slow-state probe - slow-state probe, untrained network: - (not every run has both)",
        "  slow-state probe - probe on the past blocks' histograms: - (not every run has both)"]


def test_phi_vs_pst_command_summarises_two_seeds(tmp_path):
    runs = [str(_untrained_run(tmp_path / f"s{k}", "me:tokens=360", seed=k)) for k in (0, 1)]
    res = CliRunner().invoke(main, ["phi-vs-pst", *runs])
    assert res.exit_code == 0, res.output
    assert "over the runs of one arm and setting, other seeds: mean ± s.d. across runs" in res.output
    assert "| coupled | 2 (0, 1) |" in res.output
    assert "  model head - Bayes filter, head readout: " in res.output  # the gate is shut: no probe
    assert "slow-state probe - " not in res.output


def test_channel_gates_are_sized_by_their_mean_magnitude():
    """gate_abs_per_layer was |mean(g)|: channel gates of both signs cancelled to 0."""
    from fastslow_sim.training import ablation_table

    runs = _runs({"dense": [1.5, 1.6], "coupled": [1.4, 1.5]})
    for r in runs["coupled"]:
        r["gates"] = [[0.1, -0.1, 0.2, -0.2]]
    table = ablation_table(runs)
    assert table["arms"]["coupled"]["gate_abs_per_layer"] == [pytest.approx(0.15)]
    assert table["arms"]["dense"]["gate_abs_per_layer"] == [0.5]  # a scalar gate: its size


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_reproduce_sizes_channel_gates_by_their_mean_magnitude(tmp_path, monkeypatch):
    """The sweep cells kept a channel gate as its signed mean per layer, and reproduce's table
    and ablation.nc took |mean| of that: gates of both signs cancelled to 0."""
    from fastslow_sim import training

    real = training.train

    def channel_gates(cfg, corpus=None, log=print):
        s = real(cfg, corpus, log=log)
        s["gates"] = [[0.1, -0.1, 0.2, -0.2] for _ in s["gates"]]
        return s

    monkeypatch.setattr(training, "train", channel_gates)
    res = CliRunner().invoke(main, ["reproduce", "--corpus", "me:tokens=20000", "--tokens", "256",
                                    "--seeds", "1", "--P", "4", "--context", "32", "--batch-size",
                                    "4", "--arms", "coupled", "--out", str(tmp_path / "r")])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = fs.load_dataset(tmp_path / "r" / "ablation.nc")
    np.testing.assert_allclose(ds["gate_abs"].sel(arm="coupled").values, 0.15)


def test_phi_vs_pst_refuses_a_run_whose_pooling_grid_is_shifted(tmp_path):
    """A run with --pool-offset 2 pools blocks that straddle the corpus's: phi-vs-pst, which
    reads the slow state once per corpus block, refuses it in one sentence and writes nothing."""
    run = _untrained_run(tmp_path / "r", "me:tokens=720", pool_offset=2)
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run)])
    assert res.exit_code == 2 and res.output == (
        f"Error: run {str(run)!r}: its pooling grid starts at token 2 (--pool-offset), off the "
        f"corpus's blocks; phi-vs-pst reads the slow state once per corpus block, so it expects a "
        f"run with --pool-offset 0.\n")  # fmt: skip
    assert not (run / "phi_vs_pst.json").exists()


def test_phi_vs_pst_refuses_a_run_whose_P_is_not_its_corpus_block(tmp_path):
    """`me:block=8` with P=4 (a pooling grid that is not the corpus's) trains, but phi-vs-pst
    reads p_st once per corpus block and the slow state once per P: it says so, naming both;
    with block=4, the model's own P, the same run is read."""
    run = _untrained_run(tmp_path / "r8", "me:tokens=720,block=8")
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run)])
    assert res.exit_code == 2 and res.output == (
        f"Error: run {str(run)!r}: the model's P=4 differs from its corpus's block length 8 "
        f"(me:tokens=720,block=8); phi-vs-pst reads the slow state once per corpus block, so it "
        f"expects a run whose P is the corpus's block length.\n")  # fmt: skip
    assert not (run / "phi_vs_pst.json").exists()
    run = _untrained_run(tmp_path / "r4", "me:tokens=720,block=4")
    res = CliRunner().invoke(main, ["phi-vs-pst", str(run)])
    assert res.exit_code == 0 and (run / "phi_vs_pst.json").exists(), res.output


@pytest.mark.slow  # 8-13 s; its parts are checked in the default run (folder name, heading)
def test_reproduce_with_a_shifted_grid_says_so_and_keeps_apart(tmp_path, monkeypatch):
    """--pool-offset: the default folder gets -offsetO (the aligned run's folder was refused),
    the table's heading names the grid, the runs and ablation.nc record the offset."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["reproduce", "--corpus", "me:tokens=20000", "--tokens", "128",
                                    "--seeds", "1", "--P", "4", "--pool-offset", "2", "--context",
                                    "32", "--batch-size", "4", "--arms", "coupled"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = tmp_path / "runs" / "reproduce-me-offset2"
    assert ("ablation on me:tokens=20000, 128 tokens per run, 1 seed, pooling grid from token 2 "
            "(--pool-offset)") in res.output  # fmt: skip
    assert json.loads(fs.load_dataset(out / "ablation.nc").attrs["base_config"])["pool_offset"] == 2
    summary = json.loads((out / "coupled-seed0" / "summary.json").read_text())
    assert summary["train_config"]["pool_offset"] == 2
    ckpt = torch.load(out / "coupled-seed0" / "ckpt.pt", weights_only=False)
    assert ckpt["model_config"]["pool_offset"] == 2
