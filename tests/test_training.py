"""Corpora, training runs (determinism, resume, failures), the ablation and phi-vs-pst."""

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fastslow_sim as fs
from fastslow_sim.bridge import FastSlowLM
from fastslow_sim.cli import main
from fastslow_sim.corpora import load_corpus, random_corpus, text_corpus
from fastslow_sim.training import TrainConfig, TrainingDivergedError, parse_tokens, reproduce, train

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
TINY = dict(block_size=32, batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=4,
            eval_batches=2, ckpt_interval=4, warmup_steps=2, progress=False)  # fmt: skip


@pytest.mark.parametrize("text, value", [("500k", 500_000), ("2M", 2_000_000), ("250000", 250_000),
                                         ("1.5m", 1_500_000), ("1e3", 1_000)])  # fmt: skip
def test_parse_tokens(text, value):
    assert parse_tokens(text) == value


def test_parse_tokens_refuses_underscores():
    # "10_000" was read as 10,000, as Python reads it; no number a user types takes underscores
    with pytest.raises(fs.InputError, match="--tokens must be a number written without underscores"):
        parse_tokens("10_000")


@pytest.mark.parametrize("text", ["0", "-5", "abc", "1.5", "", "k", "inf", "nan", "0x10", "\u0661\u0660k",
                                  "1.0000000000000000000000000001k"])  # fmt: skip
def test_parse_tokens_rejects(text):
    # the last: 28 digits of precision would round it to a whole 1,000 (read exactly: refused)
    with pytest.raises(fs.InputError, match="--tokens must be a positive count"):
        parse_tokens(text)


@pytest.mark.parametrize("text, value", [("1,000,000", 1_000_000), ("1,000.5k", 1_000_500),
                                         ("+5", 5), ("9007199254740993", 9_007_199_254_740_993),
                                         ("9999999999999999999", 10**19 - 1)])  # fmt: skip
def test_parse_tokens_thousands_and_exact(text, value):
    # commas group thousands; digits are read as a decimal (float made 2^53 + 1 even)
    assert parse_tokens(text) == value


@pytest.mark.parametrize("text", ["1,5m", "2,50k", "1,000,", "10,00", "0,500m", "00,001k"])
def test_parse_tokens_refuses_commas_not_grouping_thousands(text):
    # "1,5m" (a decimal comma) was read as 15 million tokens
    with pytest.raises(fs.InputError, match=f"commas only between groups of three digits, as in "
                                            f"1,000,000; got '{text}'"):  # fmt: skip
        parse_tokens(text)


def test_parse_tokens_refuses_digits_outside_ascii():
    with pytest.raises(fs.InputError, match="--tokens must be a number written in ASCII digits"):
        parse_tokens("\u0661\u0660")


def test_count_text_of_large_counts():
    from fastslow_sim.wording import count_text

    assert [count_text(v) for v in (10**16 - 1, 10**16 + 1, 10**20 + 3, 10**300, 10**999)] == [
        "9,999,999,999,999,999", "1e+16", "1e+20", "1e+300", "1e+999"]  # fmt: skip


def test_parse_tokens_reads_large_counts_exactly_and_refuses_absurd_exponents():
    # a large count is the range check's to refuse, with the range (test below); an exponent
    # of a billion would have been expanded into a billion digits
    assert parse_tokens("1e300") == 10**300 and parse_tokens("1e18k") == 10**21
    with pytest.raises(fs.InputError, match=r"--tokens must be a count below 1e1000; got '1e999999999'"):
        parse_tokens("1e999999999")


def test_text_corpus_split_and_errors(tmp_path, text_file):
    c = text_corpus(text_file)
    assert c.vocab_size == 256 and c.tokens == text_file.stat().st_size
    assert len(c.val) == int(c.tokens * 0.1) and c.stats["utf8"]
    assert bytes(np.asarray(c.train[:8])) == text_file.read_bytes()[:8]
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 ".encode("latin-1") * 100)
    c2 = text_corpus(bad)
    assert c2.stats["utf8"] is False and "accept any bytes" in c2.stats["note"]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(fs.InputError, match="is empty"):
        text_corpus(empty)
    with pytest.raises(fs.InputError, match="does not exist"):
        text_corpus(tmp_path / "missing.txt")
    short = tmp_path / "short.txt"
    short.write_text("hello world")
    with pytest.raises(fs.InputError, match="fewer than one sequence"):
        text_corpus(short).check_fits(32, 4)


@pytest.mark.skipif(
    not SHAKESPEARE.is_file(), reason="../shared/data/tinyshakespeare.txt is absent"
)
def test_shakespeare_corpus():
    c = load_corpus(f"text:{SHAKESPEARE}")
    assert c.tokens == 1_115_394 and c.vocab_size == 256 and c.stats["utf8"]


def test_random_corpus_floor():
    c = random_corpus(50_000)
    assert c.stats["floor_loss"] == pytest.approx(math.log(256))


def _cfg(tmp_path, name, corpus, **kw):
    return TrainConfig(corpus=corpus, out=str(tmp_path / name), **{**TINY, **kw})


def test_same_seed_same_losses_and_schedule(tmp_path, text_file):
    corpus = text_corpus(text_file)
    spec = f"text:{text_file}"
    a = train(_cfg(tmp_path, "a", spec, tokens=2000), corpus)
    b = train(_cfg(tmp_path, "b", spec, tokens=2000), corpus)
    la = fs.load_dataset(tmp_path / "a" / "train.nc")
    lb = fs.load_dataset(tmp_path / "b" / "train.nc")
    assert np.array_equal(la["loss"].values, lb["loss"].values) and a["val_loss"] == b["val_loss"]
    lr = la["lr"].values
    assert lr[0] < lr[1] and lr[-1] < lr.max()  # warm-up, then decay
    assert la["gate"].dims == ("step", "layer") and la["val_loss"].size >= 3
    assert set(json.loads((tmp_path / "a" / "summary.json").read_text())) >= {
        "variant", "corpus", "vocab_size", "tokens", "train_loss", "val_loss", "gates",
        "tokens_per_s", "wall_time_s", "out"}  # fmt: skip


def test_mfu_is_over_the_training_steps():
    """mfu = F * step_tokens_per_s / peak (bf16), not F * tokens_per_s / peak."""
    from fastslow_sim.training import _step_mfu

    s = {"flops_per_token_train": 6e6, "step_tokens_per_s": 921.0, "tokens_per_s": 728.0}
    assert _step_mfu(s, "NVIDIA H200") == 6e6 * 921.0 / 989e12
    assert _step_mfu(s, "NVIDIA A100-SXM4-80GB") == 6e6 * 921.0 / 312e12
    assert _step_mfu(s, "NVIDIA GeForce RTX 4090") is None  # no peak in the table
    assert _step_mfu({**s, "step_tokens_per_s": None}, "NVIDIA H200") is None  # no step ran


@pytest.mark.slow  # 9-11 s on two shared cores (a run stopped at step 8, resumed twice)
def test_step_throughput_leaves_out_evaluations_and_checkpoints(tmp_path, text_file):
    """step_time_s = sum of the steps' dt (train.nc's tokens/s per step), <= wall_time_s, which
    adds the evaluations and checkpoints (every 4 steps here); mfu = F * step_tokens_per_s / peak."""
    from fastslow_sim.training import _step_mfu

    # stopped at 8 of 16 steps: the full validation pass after the last step is skipped
    s = train(_cfg(tmp_path, "a", f"text:{text_file}", tokens=2048, stop_after_steps=8),
              text_corpus(text_file))  # fmt: skip
    per_step = fs.load_dataset(tmp_path / "a" / "train.nc")["tokens_per_s"].values
    assert s["steps"] == 8 and s["tokens"] == 8 * 128
    assert s["step_time_s"] == pytest.approx(float(np.sum(128 / per_step)), rel=1e-12)
    assert 0 < s["step_time_s"] <= s["wall_time_s"]
    assert s["step_tokens_per_s"] == s["tokens"] / s["step_time_s"]
    assert s["tokens_per_s"] == s["tokens"] / s["wall_time_s"]  # kept: the training loop's wall-clock
    mfu = _step_mfu(s, "NVIDIA H200")
    assert mfu == s["flops_per_token_train"] * s["step_tokens_per_s"] / 989e12
    assert mfu >= s["flops_per_token_train"] * s["tokens_per_s"] / 989e12
    assert _step_mfu(s, "NVIDIA GeForce RTX 4090") is None  # no peak in the table
    # resumed: the checkpoint carries step_time_s on (read back: the resumed run's sum covers
    # steps 1-12, not only its own 9-12)
    ckpt = tmp_path / "a" / "ckpt.pt"
    held = torch.load(ckpt, weights_only=False)
    assert held["step_time_s"] == s["step_time_s"]
    r = train(_cfg(tmp_path, "a", f"text:{text_file}", tokens=2048, stop_after_steps=12,
                   resume=True), text_corpus(text_file))  # fmt: skip
    per_step = fs.load_dataset(tmp_path / "a" / "train.nc")["tokens_per_s"].values
    assert r["steps"] == 12 and per_step.size == 12
    assert r["step_time_s"] == pytest.approx(float(np.sum(128 / per_step)), rel=1e-12)
    assert r["step_tokens_per_s"] == r["tokens"] / r["step_time_s"]
    # one written before it kept none has the steps' dt back from their tokens/s
    held = torch.load(ckpt, weights_only=False)
    assert held["step"] == 12 and held["step_time_s"] == r["step_time_s"]
    del held["step_time_s"]
    torch.save(held, ckpt)
    r = train(_cfg(tmp_path, "a", f"text:{text_file}", tokens=2048, resume=True),
              text_corpus(text_file))  # fmt: skip
    per_step = fs.load_dataset(tmp_path / "a" / "train.nc")["tokens_per_s"].values
    assert r["steps"] == 16 and r["finished"] and per_step.size == 16
    assert r["step_time_s"] == pytest.approx(float(np.sum(128 / per_step)), rel=1e-12)
    assert r["step_tokens_per_s"] == r["tokens"] / r["step_time_s"]


def test_resume_ends_with_the_same_parameters(tmp_path, text_file):
    corpus = text_corpus(text_file)
    spec = f"text:{text_file}"
    full = _cfg(tmp_path, "full", spec, tokens=3000)
    train(full, corpus)
    part = _cfg(tmp_path, "part", spec, tokens=3000, stop_after_steps=5)
    s1 = train(part, corpus)
    assert not s1["finished"] and s1["steps"] == 5
    # another --checkpoint-every changes no number: a killed run resumes with any (it was
    # refused as "another configuration (ckpt_interval = 4 there, 2 here)")
    s2 = train(_cfg(tmp_path, "part", spec, tokens=3000, resume=True, ckpt_interval=2), corpus)
    assert s2["finished"]
    # the run's first batch, not the one the resumed part began with (nor None once finished)
    s_full = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert s2["rank_first_batch_sha256"] == s_full["rank_first_batch_sha256"] != [None]
    s3 = train(_cfg(tmp_path, "part", spec, tokens=3000, resume=True), corpus)
    assert s3["rank_first_batch_sha256"] == s_full["rank_first_batch_sha256"]
    # and a finished run is reused whatever its --checkpoint-every (reproduce, sweeps)
    from fastslow_sim.training import _finished_run, check_run_folder

    other = _cfg(tmp_path, "part", spec, tokens=3000, ckpt_interval=3)
    assert _finished_run(other, corpus) is not None
    check_run_folder(tmp_path / "part", same_as=lambda: (other, corpus))  # does not refuse
    # but not one that computed otherwise: compiled (other rounding), or on CUDA (bf16), which
    # a reproduce on the CPU paired with its float32 runs of the other arms
    # (and the folder is not trained over: the run there is refused as another configuration)
    compiled = _cfg(tmp_path, "part", spec, tokens=3000, compile=True)
    assert _finished_run(compiled, corpus) is None
    with pytest.raises(fs.InputError, match=r"another configuration \(compile = False there, "
                                            r"True here\)"):  # fmt: skip
        check_run_folder(tmp_path / "part", same_as=lambda: (compiled, corpus))
    path = tmp_path / "part" / "summary.json"
    held = json.loads(path.read_text())
    path.write_text(json.dumps({**held, "device": "cuda:0"}))
    assert _finished_run(other, corpus) is None
    with pytest.raises(fs.InputError, match=r"\(made on cuda, this run on cpu\)"):
        check_run_folder(tmp_path / "part", same_as=lambda: (other, corpus))
    # a sweep's client (here=False) leaves "auto" to the worker that trains the cell, which may
    # have the CUDA device the client lacks; an explicit device is compared, never looked for
    check_run_folder(tmp_path / "part", same_as=lambda: (other, corpus), here=False)
    path.write_text(json.dumps(held))
    assert _finished_run(other, corpus) is not None
    on_cuda = _cfg(tmp_path, "part", spec, tokens=3000, device="cuda")
    with pytest.raises(fs.InputError, match=r"\(made on cpu, this run on cuda\)"):
        check_run_folder(tmp_path / "part", same_as=lambda: (on_cuda, corpus), here=False)
    a = torch.load(tmp_path / "full" / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    la, lb = (fs.load_dataset(tmp_path / n / "train.nc") for n in ("full", "part"))
    assert np.array_equal(la["loss"].values, lb["loss"].values)


@pytest.mark.parametrize("fields, fragment", [
    ({"min_lr": 2e-3}, "min_lr must be at most lr (the schedule decays from lr to min_lr); got "
                       "0.002 > 0.001."),
    ({"stop_after_steps": 0}, "stop_after_steps must be None or a positive integer; got 0."),
    ({"stop_after_steps": -3}, "stop_after_steps must be None or a positive integer; got -3."),
    ({"stop_after_steps": 2.5}, "stop_after_steps must be None or a positive integer; got 2.5."),
    ({"out": ""}, "out must name a folder; got an empty string."),
])  # fmt: skip
def test_train_config_refuses_a_climbing_schedule_a_bad_stop_and_an_empty_out(fields, fragment,
                                                                              tmp_path, monkeypatch):
    # each had been taken: min_lr > lr climbed to min_lr, stop_after_steps=0 wrote a 0-step
    # summary (2.5: a TypeError), out="" trained into the current folder
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(corpus="random", tokens=2048, **{**TINY, "out": str(tmp_path / "r"), **fields})
    with pytest.raises(fs.InputError) as err:
        train(cfg)
    assert str(err.value) == fragment
    assert not list(tmp_path.iterdir())


def test_resume_errors(tmp_path, text_file):
    corpus = text_corpus(text_file)
    spec = f"text:{text_file}"
    with pytest.raises(fs.InputError, match="no checkpoint"):
        train(_cfg(tmp_path, "none", spec, tokens=1000, resume=True), corpus)
    train(_cfg(tmp_path, "r", spec, tokens=1000), corpus)
    with pytest.raises(fs.InputError, match=r"another configuration \(lr"):
        train(_cfg(tmp_path, "r", spec, tokens=1000, lr=5e-4, resume=True), corpus)
    (tmp_path / "r" / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(fs.InputError, match="corrupt or unreadable"):
        train(_cfg(tmp_path, "r", spec, tokens=1000, resume=True), corpus)


@pytest.mark.parametrize("arm, args", [("coupled", []), ("dense-matched", ["--variant", "dense"])])
def test_resume_of_a_reproduce_run_says_to_run_reproduce_again(tmp_path, text_file, arm, args):
    """train-network --resume on a run folder of reproduce named the internal `arm` (or
    n_layer, for dense-matched), which no option sets; it says whose run it is now."""
    from fastslow_sim.training import arm_config

    fields = arm_config(arm, {**TINY, "corpus": f"text:{text_file}", "tokens": 256}, 256)
    train(TrainConfig(**{**fields, "out": str(tmp_path / "r"), "stop_after_steps": 1}))
    res = CliRunner().invoke(main, ["train-network", *args, "--corpus", f"text:{text_file}",
                                    "--tokens", "256", "--context", "32", "--batch-size", "4",
                                    "--P", "4", "--out", str(tmp_path / "r"), "--resume"])  # fmt: skip
    assert res.exit_code == 2
    assert res.output == (f"Error: --resume: the run folder {str(tmp_path / 'r')!r} holds a run "
                          f"of reproduce's arm {arm!r}; expected reproduce again with the same "
                          f"settings, which finishes that run or reuses it.\n")  # fmt: skip


def test_resume_refuses_a_checkpoint_made_on_other_contents_of_its_text_file(tmp_path, text_file):
    """--resume compared the settings only (the corpus is a path): a run went on training on
    another file's bytes. Refused in one sentence; a checkpoint without a fingerprint (saved
    before they were recorded) is resumed as before."""
    spec = f"text:{text_file}"
    train(_cfg(tmp_path, "r", spec, tokens=3000, stop_after_steps=2), text_corpus(text_file))
    ckpt = torch.load(tmp_path / "r" / "ckpt.pt", weights_only=False)
    assert ckpt["corpus_sha256"] == hashlib.sha256(text_file.read_bytes()).hexdigest()
    text_file.write_bytes(text_file.read_bytes().replace(b"slow", b"fast"))
    msg = (f"--resume: the corpus file {str(text_file)!r} has changed since the run in "
           f"{str(tmp_path / 'r')!r} was made (its contents' sha256 differs); expected the file "
           f"as it was, or a new --out.")  # fmt: skip
    with pytest.raises(fs.InputError) as err:
        train(_cfg(tmp_path, "r", spec, tokens=3000, resume=True))  # the corpus loaded anew
    assert str(err.value) == msg
    del ckpt["corpus_sha256"]  # as an older fastslow-sim saved it: contents unknown, resumed
    torch.save(ckpt, tmp_path / "r" / "ckpt.pt")
    s = train(_cfg(tmp_path, "r", spec, tokens=3000, resume=True, stop_after_steps=3))
    assert s["steps"] == 3 and s["corpus_sha256"] == hashlib.sha256(text_file.read_bytes()).hexdigest()


def test_a_run_on_its_text_file_under_another_spelling_is_resumed_and_reused(tmp_path, text_file,
                                                                            monkeypatch):
    """`--resume` with `--corpus text:./corpus.txt` of a run made with `text:corpus.txt` was
    refused as "another configuration (--corpus = ...)", and `reproduce` and sweeps refused or
    retrained its folder: the same contents are the same corpus, whatever the spelling of the
    path. A checkpoint without a fingerprint (its file's contents unknown), or one made on
    other contents, is refused as before."""
    from fastslow_sim.training import _finished_run, check_run_folder

    monkeypatch.chdir(tmp_path)

    def cfg_of(spec, **kw):  # train-network's configuration of `tail`
        return TrainConfig(variant="dense", corpus=spec, tokens=3000, block_size=32, batch_size=4,
                           P=4, device="cpu", out="r", progress=False, **kw)  # fmt: skip

    (tmp_path / "other.txt").write_bytes(text_file.read_bytes().replace(b"slow", b"fast"))
    tail = ["--variant", "dense", "--tokens", "3000", "--context", "32", "--batch-size", "4",
            "--P", "4", "--device", "cpu", "--out", "r", "--json"]  # fmt: skip
    train(cfg_of("text:corpus.txt", stop_after_steps=2))
    ckpt = torch.load(tmp_path / "r" / "ckpt.pt", weights_only=False)
    other = CliRunner().invoke(main, ["train-network", "--corpus", "text:other.txt", *tail,
                                      "--resume"])  # fmt: skip
    assert other.exit_code == 2 and other.output == (
        "Error: --resume: the checkpoint in 'r' is from another configuration (--corpus = "
        "'text:corpus.txt' there, 'text:other.txt' here).\n"), other.output  # fmt: skip
    del ckpt["corpus_sha256"]  # saved before fingerprints: only its spelling is known
    torch.save(ckpt, tmp_path / "r" / "ckpt.pt")
    unknown = CliRunner().invoke(main, ["train-network", "--corpus", "text:./corpus.txt", *tail,
                                        "--resume"])  # fmt: skip
    assert unknown.exit_code == 2 and unknown.output == (
        "Error: --resume: the checkpoint in 'r' is from another configuration (--corpus = "
        "'text:corpus.txt' there, 'text:./corpus.txt' here).\n"), unknown.output  # fmt: skip
    train(cfg_of("text:corpus.txt", stop_after_steps=2))
    res = CliRunner().invoke(main, ["train-network", "--corpus", "text:./corpus.txt", *tail,
                                    "--resume"])  # fmt: skip
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["finished"] and s["steps"] == 3000 // (4 * 32) and s["train_config"]["corpus"] == \
        "text:./corpus.txt"  # fmt: skip
    # finished: reused by reproduce and sweeps under any spelling of the same contents
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    for spec in ("text:./corpus.txt", f"text:{text_file}", "text:corpus.txt"):
        cfg, corpus = cfg_of(spec), text_corpus(spec[5:])
        check_run_folder("r", same_as=lambda cfg=cfg, corpus=corpus: (cfg, corpus))
        assert _finished_run(cfg) == s and _finished_run(cfg, corpus) == s
    # unfinished (its checkpoint only: a killed run): trained again, as under its own spelling
    summary = (tmp_path / "r" / "summary.json").read_text()
    (tmp_path / "r" / "summary.json").unlink()
    cfg, corpus = cfg_of("text:corpus.txt"), text_corpus("corpus.txt")  # its ckpt: ./corpus.txt
    check_run_folder("r", same_as=lambda: (cfg, corpus))
    assert _finished_run(cfg, corpus) is None
    (tmp_path / "r" / "summary.json").write_text(summary)
    cfg = cfg_of("text:other.txt")
    with pytest.raises(fs.InputError) as err:
        check_run_folder("r", same_as=lambda: (cfg, text_corpus("other.txt")))
    assert str(err.value) == (
        "the run folder 'r' holds a run of another configuration (corpus = 'text:./corpus.txt' "
        "there, 'text:other.txt' here), which this run would replace; expected another output "
        "folder (--out of reproduce, --runs-dir of sweep), or that run's settings to reuse it.")
    assert _finished_run(cfg) is None
    text_file.write_bytes(text_file.read_bytes().replace(b"slow", b"fast"))  # now other's
    cfg = cfg_of("text:./corpus.txt")
    with pytest.raises(fs.InputError) as err:
        check_run_folder("r", same_as=lambda: (cfg, text_corpus("./corpus.txt")))
    assert str(err.value) == (
        "the corpus file 'corpus.txt' has changed since the run in 'r' was made (its contents' "
        "sha256 differs), which this run would replace; expected another output folder (--out "
        "of reproduce, --runs-dir of sweep), or the file as it was.")
    assert _finished_run(cfg, text_corpus("./corpus.txt")) is None


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, text_file, monkeypatch):
    corpus = text_corpus(text_file)
    original = FastSlowLM.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None):
        logits, loss = original(self, idx, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 6:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(FastSlowLM, "forward", poisoned)
    with pytest.raises(TrainingDivergedError,
                       match="non-finite .* at step 6.* holds the weights after 4 steps, whose loss was finite"):  # fmt: skip
        train(_cfg(tmp_path, "nan", f"text:{text_file}", tokens=4000), corpus)
    ckpt = torch.load(tmp_path / "nan" / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == 4 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert not (tmp_path / "nan" / "summary.json").exists()


def test_last_step_divergence_is_a_failure_not_a_nan_summary(tmp_path, text_file):
    # one step: its loss (at initialisation) is finite, its update makes the parameters NaN
    corpus = text_corpus(text_file)
    cfg = _cfg(tmp_path, "big-lr", f"text:{text_file}", tokens=128, lr=1e10, min_lr=1e10)
    with pytest.raises(TrainingDivergedError, match="non-finite after step 0; this run has "
                                                   "written no checkpoint"):  # fmt: skip
        train(cfg, corpus)
    assert not (tmp_path / "big-lr" / "summary.json").exists()
    assert not (tmp_path / "big-lr" / "ckpt.pt").exists()


def test_non_finite_full_validation_loss_is_a_failure_not_a_finished_run(tmp_path, text_file,
                                                                         monkeypatch):
    # the sampled validation loss is checked every eval_interval; the full one at the end was
    # stored as val_loss of a finished run, and `reproduce` printed a NaN table with exit 0
    import fastslow_sim.training as training

    corpus = text_corpus(text_file)
    monkeypatch.setattr(training, "evaluate_windows", lambda *a, **k: float("nan"))
    cfg = _cfg(tmp_path, "nan-val", f"text:{text_file}", tokens=1024)
    with pytest.raises(TrainingDivergedError, match="validation loss over every aligned window "
                       "is non-finite after 8 steps; its last checkpoint, .* holds those"):  # fmt: skip
        train(cfg, corpus)
    assert not (tmp_path / "nan-val" / "summary.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_kept_checkpoint_says_whose_weights_it_holds():
    from fastslow_sim.training import _kept_checkpoint

    assert "no checkpoint" in _kept_checkpoint("r/ckpt.pt", None, 3)
    assert "after 2 steps, whose loss was finite" in _kept_checkpoint("r/ckpt.pt", 2, 3)
    # saved after update 3, whose weights are the first non-finite ones: not a good checkpoint
    assert "holds those weights (after 3 steps)" in _kept_checkpoint("r/ckpt.pt", 3, 3)


def test_cuda_requested_where_none(tmp_path, text_file):
    with pytest.raises(fs.InputError, match="no CUDA device"):
        train(_cfg(tmp_path, "c", f"text:{text_file}", tokens=1000, device="cuda"))


@pytest.mark.slow
def test_phi_vs_pst(tmp_path):
    from fastslow_sim.probe import phi_vs_pst

    spec, P = "me:tokens=60000", 4
    corpus = load_corpus(spec, P=P, context=32)
    runs = {}
    for variant in ("coupled", "frozen-gate", "dense"):
        cfg = TrainConfig(corpus=spec, variant=variant, out=str(tmp_path / variant), tokens=4000,
                          **TINY)  # fmt: skip
        train(cfg, corpus)
        runs[variant] = phi_vs_pst(tmp_path / variant)
    tv = runs["coupled"]["tv"]
    assert set(tv) == {"model head", "slow-state probe", "slow-state probe, untrained network",
                       "probe on the past blocks' histograms", "Bayes filter, head readout",
                       "Bayes filter p_st",
                       "slow law over the last 3 blocks", "previous block's histogram",
                       "corpus frequencies", "uniform", "y known"}  # fmt: skip
    assert all(0 <= v["mean"] <= 1 and v["se"] >= 0 for v in tv.values())
    # the filter tracks y: far closer to p_st than any readout that does not; and read out like
    # the head it is aligned with the block it predicts (one block off, TV would be about 0.8)
    assert tv["Bayes filter p_st"]["mean"] < 0.5 * tv["corpus frequencies"]["mean"]
    assert tv["Bayes filter, head readout"]["mean"] < 0.5 * tv["corpus frequencies"]["mean"]
    assert tv["slow law over the last 3 blocks"]["mean"] < tv["corpus frequencies"]["mean"]
    # the baselines and the network-free probe control do not depend on the network
    assert runs["dense"]["tv"]["uniform"] == tv["uniform"]
    past = "probe on the past blocks' histograms"
    assert runs["dense"]["tv"][past] == runs["frozen-gate"]["tv"][past] == tv[past]
    assert tv[past]["mean"] < tv["corpus frequencies"]["mean"]  # the past carries y
    # a dense model has a head readout but no slow state to probe
    assert not any(k.startswith("slow-state probe") for k in runs["dense"]["tv"])
    assert "model head" in runs["dense"]["tv"]
    # a zero gate passes nothing: frozen-gate's probe would be one constant distribution (it was
    # printed as a readout, 0.45 TV); only its untrained control is reported
    assert "slow-state probe" not in runs["frozen-gate"]["tv"]
    assert "slow-state probe, untrained network" in runs["frozen-gate"]["tv"]
    assert np.ptp(np.array(runs["coupled"]["binned"]["slow-state probe"]), axis=0).max() > 1e-3
    # the control is the run's own initial network: frozen-gate never moves its slow path
    from fastslow_sim.probe import initial_network, load_run

    trained, tcfg = load_run(tmp_path / "frozen-gate")
    state = torch.get_rng_state()
    init = initial_network(trained.config, tcfg["seed"])
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state untouched
    for (name, a), (_, b) in zip(init.slow.named_parameters(), trained.slow.named_parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(init.lm_head.weight, trained.lm_head.weight)  # the rest trained
    # the same control in every arm of one seed (their initial slow paths are the same)
    control = "slow-state probe, untrained network"
    assert runs["frozen-gate"]["tv"][control] == tv[control]
    with pytest.raises(fs.InputError, match="needs an 'me' corpus"):
        txt = tmp_path / "t.txt"
        txt.write_text("abc " * 3000)
        train(TrainConfig(corpus=f"text:{txt}", out=str(tmp_path / "txt"), tokens=500, **TINY))
        phi_vs_pst(tmp_path / "txt")


def test_train_network_cli(tmp_path, text_file):
    res = CliRunner().invoke(main, ["train-network", "--corpus", f"text:{text_file}", "--tokens", "4k",
                                    "--context", "32", "--batch-size", "4", "--P", "4",
                                    "--out", str(tmp_path / "cli"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {"variant", "corpus", "vocab_size", "tokens", "train_loss", "val_loss", "gates",
            "tokens_per_s", "wall_time_s", "out"} <= set(data)  # fmt: skip
    assert data["vocab_size"] == 256 and len(data["gates"]) == 4


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["train-network", "--tokens", "0"], "--tokens must be a positive count"),
        (["train-network", "--tokens", "lots"], "--tokens must be a positive count"),
        (["train-network", "--corpus", "text:/nonexistent/file.txt"], "does not exist"),
        (["train-network", "--corpus", "wiki"], "unknown corpus"),
        (["train-network", "--P", "0"], "--P must be an integer from 1"),
        (["train-network", "--resume", "--out", "OUT/none"], "no checkpoint"),
        (["reproduce", "--arms", "dense,hybrid"], "--arms must name"),
        (["reproduce", "--arms", "dense,dense"], "--arms must name"),
        (["train-network", "--seed", "-1"], "--seed must be a non-negative"),
        (["corpus", "me:beta"], "NAME=VALUE"),
        (["reproduce", "--seeds", "0"], "--seeds must be an integer from 1 to 200,000"),
        (["corpus", "wiki"], "unknown corpus"),
        # ignored before: the random and text corpora have no blocks and no reference windows
        (["corpus", "random", "--P", "4"], "--P applies to the me corpus only; got it with the "
         "corpus 'random'."),
        (["corpus", "text:x.txt", "--context", "64"], "--context applies to the me corpus only"),
        (["corpus", "wiki", "--P", "4"], "unknown corpus 'wiki'"),  # not misnamed as --P's fault
        (["phi-vs-pst", "OUT/none"], "no checkpoint"),
    ],
)
def test_training_cli_bad_input(args, fragment, tmp_path):
    args = [a.replace("OUT", str(tmp_path)) for a in args]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert fragment in res.output and "Traceback" not in res.output


ONE_BATCH = "--tokens must be from 2,048 (one batch: --batch-size 8 x --context 256) to "


@pytest.mark.parametrize(
    "args, fragment",
    [
        # an OverflowError traceback in tqdm, after the run folder was made (empty)
        (["train-network", "--tokens", "1e300"],
         ONE_BATCH + "2,048,000,000 (1,000,000 steps of one batch); got 1e+300."),
        # trained one batch of 2,048 tokens, and said so only in the summary
        (["train-network", "--corpus", "random", "--tokens", "100"], ONE_BATCH),
        (["reproduce", "--tokens", "1e300"], ONE_BATCH),
        # read exactly since stop 38: an OverflowError traceback where the message made a float
        (["train-network", "--tokens", "1e999"],
         ONE_BATCH + "2,048,000,000 (1,000,000 steps of one batch); got 1e+999."),
        # the batch's sizes were printed ungrouped: "--batch-size 12000 x --context 1500"
        (["train-network", "--corpus", "random", "--batch-size", "12000", "--context", "1500",
          "--tokens", "1000"],
         "--tokens must be from 18,000,000 (one batch: --batch-size 12,000 x --context 1,500) to "
         "18,000,000,000,000 (1,000,000 steps of one batch); got 1,000."),
        # the library's names (batch_size, block_size, ckpt_interval) were printed
        (["train-network", "--batch-size", "0"], "--batch-size must be a positive integer; got 0."),
        # "P must be a positive integer (P = 1/eps); got P=0.", but "--P ..." for --P nan
        (["train-network", "--P", "0"],
         "--P must be an integer from 1 to the context length 256 (--context); got 0."),
        (["train-network", "--P", "nan"],
         "--P must be an integer from 1 to the context length 256 (--context); got 'nan'."),
        (["reproduce", "--P", "-3", "--context", "32"],
         "--P must be an integer from 1 to the context length 32 (--context); got -3."),
        (["train-network", "--context", "0"], "--context must be a positive integer; got 0."),
        (["train-network", "--checkpoint-every", "0"], "--checkpoint-every must be a positive integer"),
        (["reproduce", "--batch-size", "0"], "--batch-size must be a positive integer; got 0."),
        # torch's "Overflow when unpacking long long" traceback, after the run folder was made
        (["train-network", "--corpus", "random", "--tokens", "2048", "--seed", "100000000000000000"],
         "--seed must be an integer from 0 to 18,446,744,073,709,550 (the data order's generator "
         "takes seed x 1000 + rank); got 100000000000000000."),
        # a MemoryError traceback building the grid of seeds
        (["reproduce", "--seeds", "99999999999"],
         "--seeds must be an integer from 1 to 200,000 (a sweep holds at most 1,000,000 runs, here "
         "5 arms per seed); got 99,999,999,999."),
        (["reproduce", "--arms", "dense", "--seeds", "1000001"], "from 1 to 1,000,000 "),
        # an integer of 17 digits and more was echoed as 1e+20 and 1e+21, not as typed
        (["reproduce", "--seeds", "99999999999999999999"],
         "5 arms per seed); got 99999999999999999999."),
        (["train-network", "--batch-size", "1000000000000000000000"],
         "(one batch: --batch-size 1000000000000000000000 x --context 256)"),
        # --scheduler won and --workers was silently ignored
        (["reproduce", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"],
         "give --workers (a local cluster) or --scheduler (an existing one), not both."),
        (["reproduce", "--workers", "0", "--scheduler", "tcp://127.0.0.1:1"], "not both"),
        # the folders above --out were made silently; a file's folder must exist (check_writable)
        (["train-network", "--corpus", "random", "--tokens", "2048", "--out", "a/b/c"],
         "cannot write the run folder 'a/b/c': folder 'a/b' does not exist."),
        (["reproduce", "--corpus", "random", "--tokens", "2048", "--out", "a/b"],
         "cannot write the reproduce folder 'a/b': folder 'a' does not exist."),
    ],
)  # fmt: skip
def test_network_options_are_refused_in_one_sentence_before_any_work(args, fragment, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)  # the default run folders would be made here
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output.startswith("Error: ") and res.output.count("\n") == 1, res.output
    assert fragment in res.output
    assert not list(tmp_path.iterdir())  # nothing made on disk


def test_tokens_from_one_batch_to_the_step_cap():
    """The bounds in the library's own names (and a DDP run's batch on every process): one batch
    of 4 x 32 tokens and MAX_STEPS of them are accepted, one token less or more is refused."""
    from fastslow_sim.training import MAX_STEPS, _validate

    for tokens in (128, MAX_STEPS * 128):
        _validate(TrainConfig(tokens=tokens, **TINY))
    for tokens in (127, MAX_STEPS * 128 + 1):
        with pytest.raises(fs.InputError, match=r"^tokens must be from 128 \(one batch: "
                           r"batch_size 4 x block_size 32\) to 128,000,000 "):  # fmt: skip
            _validate(TrainConfig(tokens=tokens, **TINY))
    with pytest.raises(fs.InputError, match=r"^tokens must be from 256 \(one batch on each of "
                       r"2 processes: batch_size 4 x block_size 32\)"):  # fmt: skip
        _validate(TrainConfig(tokens=255, **TINY), world=2)


def test_train_refuses_a_run_folder_whose_folder_is_missing(tmp_path):
    cfg = _cfg(tmp_path, "a/b", "random", tokens=128)
    with pytest.raises(fs.InputError, match="folder '.*/a' does not exist.$"):
        train(cfg, parents=False)
    assert not (tmp_path / "a").exists()


def test_default_run_folder_is_made_with_runs(tmp_path, monkeypatch):
    """Without --out the run goes to runs/VARIANT-CORPUS-seedS, runs/ made as needed."""
    monkeypatch.chdir(tmp_path)
    # a 20k-token me corpus, not `random`: the run's closing evaluation reads every validation
    # window (3,125 of `random`'s 100k tokens, 62 here), which was nearly all of the test's time
    res = CliRunner().invoke(main, ["train-network", "--corpus", "me:tokens=20000", "--tokens",
                                    "128", "--context", "32", "--batch-size", "4", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["steps"] == 1
    # named by the whole spec, so that runs on other specs of one kind keep apart
    assert (tmp_path / "runs" / "coupled-me:tokens=20000-seed0" / "summary.json").is_file()


def test_default_run_folders_of_two_specs_of_one_kind_keep_apart():
    """Runs on `me` and `me:tokens=20k` went (for a while) to one folder, runs/coupled-me-seed0,
    and the second was refused; the whole spec names the folder, a text file's as `text`."""
    from fastslow_sim.cli.network import _default_run_folder

    assert _default_run_folder("coupled", "me", 0) == "runs/coupled-me-seed0"
    assert _default_run_folder("coupled", "me:tokens=20k", 0) == "runs/coupled-me:tokens=20k-seed0"
    assert _default_run_folder("dense", "text:/x/y.txt", 2) == "runs/dense-text-seed2"
    # a shifted-grid control keeps apart from the aligned run (it was refused as its folder)
    assert _default_run_folder("coupled", "me", 0, 4) == "runs/coupled-me-offset4-seed0"
    assert _default_run_folder("coupled", "me", 0, 0) == "runs/coupled-me-seed0"


def test_out_in_the_runs_folder_makes_it(tmp_path, monkeypatch):
    """`--out runs/NAME`, as the README and EXPERIMENTS type it, makes runs/ as the default does
    (it was refused on a fresh clone: "folder 'runs' does not exist"); another missing folder
    above --out is still refused, and nothing is made."""
    monkeypatch.chdir(tmp_path)
    # a small corpus, as in the test above (`random`'s closing evaluation took most of the time)
    tiny = ["train-network", "--corpus", "me:tokens=20000", "--tokens", "128", "--context", "32",
            "--batch-size", "4", "--json"]  # fmt: skip
    res = CliRunner().invoke(main, [*tiny, "--out", "runs/mine"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "runs" / "mine" / "summary.json").is_file()
    res = CliRunner().invoke(main, [*tiny, "--out", "elsewhere/mine"])
    assert res.exit_code == 2 and "folder 'elsewhere' does not exist" in res.output
    assert not (tmp_path / "elsewhere").exists()


def test_empty_corpus_file_cli(tmp_path):
    empty = tmp_path / "e.txt"
    empty.write_bytes(b"")
    res = CliRunner().invoke(
        main, ["train-network", "--corpus", f"text:{empty}", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and "is empty" in res.output
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("kw, fragment", [
    ({"beta2": 1.5}, "beta2 must be a number in [0, 1)"),
    ({"beta2": float("nan")}, "beta2 must be a number in [0, 1)"),
    ({"warmup_steps": -3}, "warmup_steps must be a non-negative integer"),
    ({"weight_decay": -0.1}, "weight_decay must be a non-negative number"),
    ({"lr": 1e38, "warmup_steps": 0}, "lr must be a positive number at most 3.40282e+37 (AdamW"),
    ({"min_lr": 3.5e37}, "min_lr must be a positive number at most 3.40282e+37"),
])  # fmt: skip
def test_bad_optimiser_settings_are_input_errors(tmp_path, kw, fragment):
    # beta2 >= 1 reached torch's AdamW (a bare ValueError); a negative warm-up silently
    # shifted the cosine schedule
    with pytest.raises(fs.InputError, match=re.escape(fragment)):
        train(_cfg(tmp_path, "o", "random", tokens=128, **kw))
    assert not (tmp_path / "o").exists()


def test_numpy_integers_in_a_train_config_are_plain_ints():
    """TrainConfig(P=np.int64(8)) reached BridgeConfig, which refused it, and tokens=np.int64
    was refused by the run's checks ("must be a positive integer; got np.int64(...)"); numpy
    integers are taken, as plain ints, so the config's JSON (summary, checkpoint) holds them."""
    from dataclasses import asdict

    from fastslow_sim.training import _validate

    cfg = TrainConfig(P=np.int64(8), tokens=np.int64(500_000), seed=np.int32(2),
                      warmup_steps=np.int64(0), threads=np.int64(1))  # fmt: skip
    assert cfg == TrainConfig(P=8, tokens=500_000, seed=2, warmup_steps=0, threads=1)
    assert all(type(getattr(cfg, k)) is int for k in ("P", "tokens", "seed", "warmup_steps", "threads"))
    _validate(cfg)
    assert cfg.model_config(vocab_size=16).P == 8
    json.dumps(asdict(cfg))
    with pytest.raises(fs.InputError, match="tokens must be a positive integer"):
        _validate(TrainConfig(tokens=np.bool_(True)))


def test_largest_learning_rate_is_the_one_float32_adamw_takes():
    """LR_MAX is the largest lr whose first AdamW step, lr / (1 - 0.9), torch converts to the
    float32 parameters; the next float above it is torch's overflow error, so it is refused."""
    from fastslow_sim.training import LR_MAX, _validate, make_optimizer

    def first_step(lr):
        model = torch.nn.Linear(2, 2)
        opt = make_optimizer(model, TrainConfig(lr=lr))
        model(torch.ones(1, 2)).sum().backward()
        opt.step()

    above = float(np.nextafter(LR_MAX, np.inf))
    first_step(LR_MAX)
    with pytest.raises(RuntimeError, match="overflow"):
        first_step(above)
    _validate(TrainConfig(lr=LR_MAX, min_lr=LR_MAX))
    for name in ("lr", "min_lr"):
        with pytest.raises(fs.InputError, match=f"^{name} must be a positive number at most "
                                                f"3.40282e\\+37 .*; got {re.escape(repr(above))}\\.$"):  # fmt: skip
            _validate(TrainConfig(**{name: above}))


def test_model_config_error_leaves_no_run_folder(tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["train-network", "--corpus", "random", "--context", "32",
                                    "--P", "64", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2 and "P must be an integer from 1 to the context length 32" in res.output
    assert not out.exists()


@pytest.mark.parametrize("name", ["ckpt.pt", "summary.json", "train.nc"])
def test_train_network_never_replaces_an_existing_run(tmp_path, name):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text("the user's own file")
    res = CliRunner().invoke(main, ["train-network", "--corpus", "random", "--tokens", "128",
                                    "--context", "32", "--batch-size", "4", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2 and name in res.output and "--resume" in res.output, res.output
    assert (out / name).read_text() == "the user's own file"
    assert sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_cli(tmp_path, text_file):
    res = CliRunner().invoke(main, ["train-network", "--corpus", f"text:{text_file}", "--device", "cuda",
                                    "--out", str(tmp_path / "o")])  # fmt: skip
    assert res.exit_code == 2 and "no CUDA device" in res.output


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_training_figures_from_saved_runs(tmp_path, text_file):
    base = {k: v for k, v in TINY.items()}
    reproduce(f"text:{text_file}", 800, 2, ["dense", "coupled"], str(tmp_path / "runs" / "reproduce-text"), base,
              log=lambda *a: None)  # fmt: skip
    res = CliRunner().invoke(main, ["training-figures", "--runs", str(tmp_path / "runs"), "--out-dir",
                                    str(tmp_path / "figs")])  # fmt: skip
    assert res.exit_code == 0, res.output
    for name in ("training-gates.png", "training-val-loss.png", "training-wall-clock.png"):
        assert (tmp_path / "figs" / name).stat().st_size > 1000
    missing = CliRunner().invoke(main, ["training-figures", "--runs", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no ablation results" in missing.output


@pytest.mark.slow
def test_torch_compile_gives_the_eager_losses(tmp_path, text_file):
    corpus = text_corpus(text_file)
    spec = f"text:{text_file}"
    eager = train(_cfg(tmp_path, "eager", spec, tokens=1000), corpus)
    compiled = train(_cfg(tmp_path, "compiled", spec, tokens=1000, compile=True), corpus)
    le = fs.load_dataset(tmp_path / "eager" / "train.nc")["loss"].values
    lc = fs.load_dataset(tmp_path / "compiled" / "train.nc")["loss"].values
    np.testing.assert_allclose(lc, le, rtol=1e-4)
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-4)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_corpus_command_json(text_file):
    res = CliRunner().invoke(main, ["corpus", "me", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {"vocab_size", "tokens", "P", "oracle_loss", "bayes_floor_loss", "ignore_y_loss"} <= set(
        data
    )
    assert data["oracle_loss"] < data["bayes_floor_loss"] < data["ignore_y_loss"]
    assert data["ignore_y_loss"] - data["bayes_floor_loss"] >= 0.1
    text = json.loads(CliRunner().invoke(main, ["corpus", f"text:{text_file}", "--json"]).output)
    assert text["vocab_size"] == 256 and text["utf8"] is True



def test_corpus_cli_counts_one_token_in_the_singular(tmp_path):
    one = tmp_path / "one.txt"
    one.write_bytes(b"x")
    res = CliRunner().invoke(main, ["corpus", f"text:{one}"])
    assert res.exit_code == 0 and res.output.startswith(
        f"corpus text:{one}: 1 token (train 0, validation 1), vocabulary 256\n"
    ), res.output


def test_the_training_loops_adamw_is_bit_for_bit_foreach_on_the_cpu():
    """make_optimizer leaves AdamW's kernel to torch: on the CPU that is its loop over the
    tensors, which must give foreach=True's bits (what the saved runs and the comments in
    training.py rely on); the fused kernel is the one that differs."""
    from fastslow_sim.training import make_optimizer

    cfg = TrainConfig(block_size=32, n_layer=2, n_embd=32, n_head=2, P=4)
    idx = torch.randint(0, 8, (4, 33), generator=torch.Generator().manual_seed(0))
    params = {}
    for kind in ("default", "foreach", "fused"):
        torch.manual_seed(0)
        model = FastSlowLM(cfg.model_config(8))
        opt = make_optimizer(model, cfg)
        if kind != "default":
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]}
                      for g in opt.param_groups]  # fmt: skip
            opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=opt.defaults["betas"], **{kind: True})
        for _ in range(5):
            _, loss = model(idx[:, :-1], idx[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        params[kind] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(params["default"], params["foreach"])
    assert not torch.equal(params["default"], params["fused"])  # the check can tell them apart


@pytest.mark.parametrize(
    "memory, sizes, text",
    [  # ":,.3g" of GiB printed these "0.00122 GiB", "0.000977 GiB", "4.88e+03 GiB", "at most 0"
        (2**20, dict(batch_size=32, block_size=32, n_embd=32, n_layer=1),
         "batch_size 32 x block_size 32 x n_embd 32 x n_layer 1 needs at least about 1.25 MiB for "
         "the activations of one training step (40 bytes each, a lower bound: 81-102 measured in "
         "float32), more than this machine's 1 MiB of memory; expected batch_size at most 10 here "
         "(the batch that fits at the 102 bytes measured), or a shorter context or a smaller "
         "model."),
        (2**16, dict(batch_size=4, block_size=32, n_embd=32, n_layer=1),
         "batch_size 4 x block_size 32 x n_embd 32 x n_layer 1 needs at least about 160 KiB for "
         "the activations of one training step (40 bytes each, a lower bound: 81-102 measured in "
         "float32), more than this machine's 64 KiB of memory; expected a shorter context or a "
         "smaller model (a batch_size of 1 needs about 102 KiB at the 102 bytes measured)."),
        (2**30, dict(batch_size=10**6),
         "batch_size 1,000,000 x block_size 256 x n_embd 128 x n_layer 4 needs at least about "
         "4,880 GiB for the activations of one training step (40 bytes each, a lower bound: "
         "81-102 measured in float32), more than this machine's 1 GiB of memory; expected "
         "batch_size at most 80 here"),
        (2**30, dict(batch_size=10**19),
         "batch_size 10000000000000000000 x block_size 256 x n_embd 128 x n_layer 4 needs at "
         "least about "
         "4.88e+16 GiB for the activations"),
        (2**30, dict(batch_size=1, block_size=2**20, n_embd=4096, n_layer=64),
         "batch_size 1 x block_size 1,048,576 x n_embd 4,096 x n_layer 64 needs at least about "
         "10,200 GiB for the activations of one training step (40 bytes each, a lower bound: "
         "81-102 measured in float32), more than this machine's 1 GiB of memory; expected a "
         "shorter context or a smaller model (a batch_size of 1 needs about 26,100 GiB at the "
         "102 bytes measured)."),
    ],
)  # fmt: skip
def test_memory_refusal_prints_small_and_huge_sizes_in_words(monkeypatch, memory, sizes, text):
    """The sizes of the activation-memory refusal read as amounts in KiB, MiB or GiB, grouped
    in thousands (exponent form only beyond 1e16; the sizes given, integers, as given), and a
    model that no batch fits is not offered "batch_size at most 0"."""
    import fastslow_sim.integrators as integrators
    import fastslow_sim.training as training

    monkeypatch.setattr(integrators, "physical_memory", lambda: float(memory))
    with pytest.raises(fs.InputError) as info:
        training.check_activation_memory(TrainConfig(device="cpu", **sizes))
    assert str(info.value).startswith(text), str(info.value)


def test_batches_whose_activations_cannot_fit_are_refused_before_any_work(tmp_path, monkeypatch):
    """--batch-size had no bound: with enough --tokens a run ended in torch's "DefaultCPUAllocator:
    can't allocate memory" part way in. One step keeps at least ACTIVATION_BYTES (40; 81-102
    measured in float32) per batch x context x n_embd x n_layer element; a batch whose estimate
    exceeds the memory (here made 1 GiB) is refused in one sentence naming both, and the largest
    batch the sentence offers passes."""
    import fastslow_sim.integrators as integrators
    import fastslow_sim.training as training

    monkeypatch.setattr(integrators, "physical_memory", lambda: float(2**30))
    # the defaults: context 256, n_embd 128, 4 layers
    per = training.ACTIVATION_BYTES * 256 * 128 * 4
    most = 2**30 // per
    fits = 2**30 // (training.ACTIVATION_BYTES_MEASURED * 256 * 128 * 4)  # the batch it offers
    corpus = random_corpus(tokens=20_000, vocab_size=8, seed=0)
    ok = TrainConfig(device="cpu", batch_size=most, tokens=most * 256)
    training.check_config(ok, corpus)  # the bound is the lower estimate's
    assert fits < most / 2
    bad = TrainConfig(device="cpu", batch_size=most + 1, tokens=(most + 1) * 256)
    assert (most + 1) * per / 2**30 == pytest.approx(1.001, abs=1e-3)  # 1 GiB to 3 digits
    text = (f"batch_size {most + 1:,} x block_size 256 x n_embd 128 x n_layer 4 needs at least "
            f"about 1 GiB for the activations of one training step "
            f"(40 bytes each, a lower bound: 81-102 measured in float32), more than this machine's "
            f"1 GiB of memory; expected batch_size at most {fits:,} here (the batch that fits at "
            f"the 102 bytes measured)")  # fmt: skip
    with pytest.raises(fs.InputError, match=re.escape(text)):
        training.check_config(bad, corpus)

    def never(*a, **k):
        raise AssertionError("trained before the check")

    monkeypatch.setattr(training, "_device", never)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train-network", "--device", "cpu", "--batch-size", "100000",
                                    "--tokens", "30M", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert res.output.startswith("Error: --batch-size 100,000 x --context 256 x n_embd 128")
    most_text = "more than this machine's 1 GiB of memory; expected --batch-size at most 80 here"
    assert most_text in res.output
    assert not out.exists()
    # on a DDP run on the CPU, the processes share the memory
    with pytest.raises(fs.InputError, match=r"on each of 2 processes .* at most 40 here"):
        training._validate(TrainConfig(device="cpu", batch_size=103, tokens=2 * 103 * 256), world=2)
    training._validate(TrainConfig(device="cpu", batch_size=102, tokens=2 * 102 * 256), world=2)
    # on CUDA, the GPU's memory, one process's activations on each (a simulated 2 GiB GPU)

    class Props:
        total_memory = 2 * 2**30

    for name, value in [("is_available", lambda: True), ("device_count", lambda: 1),
                        ("current_device", lambda: 0), ("get_device_properties", lambda i: Props)]:  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)
    on_gpu = 2 * 2**30 // per
    gpu_fits = 2 * 2**30 // (training.ACTIVATION_BYTES_MEASURED * 256 * 128 * 4)
    for device in ("auto", "cuda", "cuda:0"):
        big = TrainConfig(device=device, batch_size=on_gpu + 1, tokens=2 * (on_gpu + 1) * 256)
        with pytest.raises(fs.InputError, match=r"on each of 2 processes .* more than this GPU's 2 "
                                                 rf"GiB of memory; expected batch_size at most {gpu_fits} "):  # fmt: skip
            training._validate(big, world=2)
    training._validate(TrainConfig(device="cpu", batch_size=most, tokens=most * 256))  # 1 GiB here


def test_threads_run_the_training_on_that_many_torch_threads_and_restore_them(
        tmp_path, text_file, monkeypatch):  # fmt: skip
    """`threads=1` trains on one torch thread (seen inside the optimiser step), records it in
    the summary, restores the caller's setting, and may differ from the checkpoint it resumes;
    the default keeps torch's own setting."""
    corpus = text_corpus(text_file)
    spec = f"text:{text_file}"
    seen = []
    step = torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    before = torch.get_num_threads()
    s1 = train(_cfg(tmp_path, "one", spec, tokens=2000, threads=1, stop_after_steps=3), corpus)
    assert seen == [1, 1, 1] and s1["torch_threads"] == 1
    assert torch.get_num_threads() == before
    seen.clear()
    s2 = train(_cfg(tmp_path, "one", spec, tokens=2000, resume=True), corpus)  # default threads
    assert s2["finished"] and set(seen) == {before} and s2["torch_threads"] == before
    assert "threads" not in s2["train_config"]  # a setting of the run, not of its numbers


@pytest.mark.parametrize("threads", [0, True, 1.5, "x", 10**6])
def test_bad_threads_are_refused_before_any_folder_is_made(tmp_path, text_file, threads):
    with pytest.raises(fs.InputError, match=r"^threads must be an integer from 1 to \d+"):
        train(_cfg(tmp_path, "run", f"text:{text_file}", tokens=2000, threads=threads),
              text_corpus(text_file))  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_cli_threads_option_names_itself_and_is_recorded(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(main, ["train-network", "--tokens", "2048", "--batch-size", "2",
                               "--context", "64", "--out", str(tmp_path / "a"), "--threads", "0"])
    assert bad.exit_code == 2 and "--threads must be an integer from 1 to" in bad.output
    assert not (tmp_path / "a").exists()
    ok = runner.invoke(main, ["train-network", "--corpus", "me:tokens=20000", "--tokens", "2048",
                              "--batch-size", "2", "--context", "64", "--out", str(tmp_path / "b"),
                              "--threads", "1", "--json"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["torch_threads"] == 1


@pytest.mark.parametrize("command", [
    ["reproduce", "--corpus", "me", "--tokens", "2048", "--seeds", "2", "--arms", "dense",
     "--batch-size", "2", "--context", "64", "--threads", "0", "--out", "{tmp}/r"],
    # (the settings are checked before any corpus is made: see
    # test_sweep_refuses_a_bad_setting_before_making_any_corpus)
    ["sweep", "train-network", "--threads", "0", "--grid", "seed=0,1", "--store", "{tmp}/s.zarr",
     "--tokens", "2048", "--batch-size", "2", "--block-size", "64", "--corpus", "me:tokens=20000"],
    ["sweep", "train-network", "--threads", "x", "--grid", "seed=0,1", "--store", "{tmp}/s.zarr",
     "--tokens", "2048", "--batch-size", "2", "--block-size", "64"],
])  # fmt: skip
def test_reproduce_and_sweeps_refuse_bad_threads_before_any_work(tmp_path, command):
    """Checked with the other settings, before a folder or store exists (they were created,
    and every cell failed with exit status 1, when only the run checked it)."""
    res = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in command])
    assert res.exit_code == 2, res.output
    bad = command[command.index("--threads") + 1]
    assert re.search(rf"threads must be an integer.*got '?{bad}'?\.", res.output), res.output
    assert "Traceback" not in res.output and list(tmp_path.iterdir()) == []


def test_sweep_refuses_a_bad_setting_before_making_any_corpus(tmp_path, monkeypatch):
    """`sweep train-network --threads 0` on the default me corpus generated each cell's
    1.2M-token corpus (about 14 s) before refusing the setting: the settings are now checked
    first, and no corpus is made."""
    from fastslow_sim import corpora

    def made(*args, **kwargs):
        raise AssertionError("a corpus was made before the settings were checked")

    monkeypatch.setattr(corpora, "load_corpus", made)
    for option, value in (("--threads", "0"), ("--lr", "-1")):
        res = CliRunner().invoke(main, ["sweep", "train-network", option, value, "--grid",
                                        "seed=0,1", "--store", str(tmp_path / "s.zarr")])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert res.output.startswith(f"Error: {option}: {option[2:]} must be ")  # named
        assert res.output.count("\n") == 1 and "AssertionError" not in res.output
        assert list(tmp_path.iterdir()) == []


def test_runs_in_threads_of_one_process_train_their_own_seeds(tmp_path, text_file):
    """A dask worker with two threads (`reproduce --scheduler`) ran two cells at once in one
    process: both seeded torch's process-wide random state and drew the weights from it in turn,
    so a run's numbers were another seed's (dense seed 0: 2.0412 against 1.8911 alone). Runs in
    threads now take turns, and each gives what it gives alone."""
    import threading

    corpus = text_corpus(text_file)
    spec = f"text:{text_file}"
    quiet = dict(log=lambda *a, **k: None)
    alone = {s: train(_cfg(tmp_path, f"alone{s}", spec, tokens=1000, seed=s), corpus, **quiet)
             for s in (0, 1, 2)}  # fmt: skip
    together = {}

    def run(s):
        together[s] = train(_cfg(tmp_path, f"thread{s}", spec, tokens=1000, seed=s), corpus,
                            **quiet)  # fmt: skip

    threads = [threading.Thread(target=run, args=(s,)) for s in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {s: r["val_loss"] for s, r in together.items()} == \
        {s: r["val_loss"] for s, r in alone.items()}  # fmt: skip
    assert len({r["val_loss"] for r in alone.values()}) == 3  # the seeds differ


def test_phi_vs_pst_refuses_a_diverged_checkpoint(tmp_path):
    """A run that diverged left a checkpoint of NaN weights; phi-vs-pst printed `nan ± nan` for
    every network readout with exit status 0 and wrote bare NaN into its JSON. It now refuses
    the checkpoint in one sentence (exit 2), and writes nothing."""
    spec = "me:tokens=20000"
    out = tmp_path / "run"
    train(TrainConfig(corpus=spec, variant="coupled", out=str(out), tokens=1000, **TINY))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model"]["slow.0.phi.c_fc.weight"][0, 0] = float("nan")
    torch.save(ckpt, out / "ckpt.pt")
    res = CliRunner().invoke(main, ["phi-vs-pst", str(out)])
    assert res.exit_code == 2, res.output
    assert res.output == (f"Error: run {str(out)!r}: the checkpoint's weights are not finite "
                          "(slow.0.phi.c_fc.weight), so the run diverged; expected a network "
                          "with finite weights.\n")  # fmt: skip
    assert not (out / "phi_vs_pst.json").exists()


def test_save_json_writes_strict_json(tmp_path):
    """`save_json` wrote Python's bare NaN and Infinity (not JSON, RFC 8259); a non-finite
    number is now null, as in every --json output."""
    from fastslow_sim.io import save_json

    path = save_json({"a": float("nan"), "b": [1.5, float("inf")], "c": np.float64(2.0)},
                     tmp_path / "x.json")  # fmt: skip
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert {k: v for k, v in data.items() if k != "fastslow_sim_version"} == \
        {"a": None, "b": [1.5, None], "c": 2.0}  # fmt: skip


def test_train_network_prints_no_gates_for_the_dense_variant(tmp_path, text_file):
    """`train-network --variant dense` printed "gates tanh(alpha) per layer: +0.0000, ..." for
    a network that has no gate (its `gates()` are zeros per layer, kept for the tables); it
    says there is none now, and a gated variant still prints its gates."""
    args = ["train-network", "--corpus", f"text:{text_file}", "--tokens", "128", "--context", "32",
            "--batch-size", "4", "--P", "4", "--threads", "1"]  # fmt: skip
    dense = CliRunner().invoke(main, [*args, "--variant", "dense", "--out", str(tmp_path / "d")])
    assert dense.exit_code == 0, dense.output
    assert "gates: none (the dense variant has no slow path)\n" in dense.output
    assert "tanh(alpha)" not in dense.output
    run = tmp_path / "c"
    coupled = CliRunner().invoke(main, [*args, "--variant", "coupled", "--out", str(run)])
    assert coupled.exit_code == 0, coupled.output
    gates = json.loads((run / "summary.json").read_text())["gates"]
    assert len(gates) == TrainConfig().n_layer
    line = f"gates tanh(alpha) per layer: {', '.join(f'{g:+.4f}' for g in gates)}\n"
    assert line in coupled.output


def test_run_folder_refusal_states_the_rule_it_applies(tmp_path):
    """A folder of the user's other files takes a run (nothing of theirs is replaced); one
    holding a run's file name is refused. The message said "expected a new or empty folder",
    a rule the check does not apply."""
    from fastslow_sim.errors import InputError
    from fastslow_sim.training import RUN_FILES, check_run_folder

    (tmp_path / "notes.txt").write_text("mine")
    check_run_folder(tmp_path)  # not empty, takes a run
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(InputError) as err:
        check_run_folder(tmp_path)
    assert str(err.value) == (
        f"--out {str(tmp_path)!r} already holds summary.json (another run's, or a file of "
        f"yours); expected a folder without a run's files ({', '.join(RUN_FILES)}), or --resume "
        f"to continue the run there.")  # fmt: skip


def test_past_block_histograms_hold_earlier_blocks_only():
    """The network-free probe control of phi-vs-pst: block b's features are the histograms of
    blocks b-1, b-2, ... by lag, with a mask, and nothing of block b or later."""
    from fastslow_sim.probe import past_block_histograms

    rng = np.random.default_rng(0)
    P, V, nb = 4, 3, 5
    win = rng.integers(0, V, size=(2, nb * P + 1))
    X = past_block_histograms(win, P, V).reshape(2, nb - 1, nb - 1, V + 1)
    hist = np.stack([np.bincount(win[0, k * P:(k + 1) * P], minlength=V) / P for k in range(nb)])
    for b in range(1, nb):
        for lag in range(1, nb):
            want = np.append(hist[b - lag], 1.0) if lag <= b else np.zeros(V + 1)
            np.testing.assert_array_equal(X[0, b - 1, lag - 1], want)
    later = win.copy()
    later[:, 2 * P:] = (later[:, 2 * P:] + 1) % V  # blocks 2.. changed: blocks 1 and 2 read none
    Y = past_block_histograms(later, P, V).reshape(2, nb - 1, -1)
    np.testing.assert_array_equal(Y[:, :2], X.reshape(2, nb - 1, -1)[:, :2])
    assert not np.array_equal(Y[:, 2], X.reshape(2, nb - 1, -1)[:, 2])
    # capped look-back: the nearest `lags` blocks, the same numbers as uncapped
    Z = past_block_histograms(win, P, V, lags=2).reshape(2, nb - 1, 2, V + 1)
    np.testing.assert_array_equal(Z, X[:, :, :2])


def test_a_run_saved_before_pool_offset_is_the_offset_0_run(tmp_path):
    """A finished run whose saved configuration lacks pool_offset (written before it existed)
    is reused as the offset-0 run and refused, naming the option, as the run of another."""
    from fastslow_sim.training import _finished_run, check_run_folder

    cfg = _cfg(tmp_path, "r", "random", tokens=256)
    train(cfg)
    path = tmp_path / "r" / "summary.json"
    held = json.loads(path.read_text())
    assert held["train_config"].pop("pool_offset") == 0
    path.write_text(json.dumps(held))
    assert _finished_run(cfg) is not None
    shifted = _cfg(tmp_path, "r", "random", tokens=256, pool_offset=2)
    assert _finished_run(shifted) is None
    with pytest.raises(fs.InputError, match=r"another configuration \(pool_offset = 0 there, "
                                            r"2 here\)"):  # fmt: skip
        check_run_folder(tmp_path / "r", same_as=lambda: (shifted, None))


def test_a_dense_run_is_one_run_at_every_pool_offset(tmp_path):
    """dense pools nothing: its run at --pool-offset 2 is its run at 0 (reused, not refused as
    another configuration, which had retrained every dense arm of a shifted-grid reproduce);
    its saved configuration and model say 0. coupled at 2 is another run."""
    from fastslow_sim.training import _finished_run

    cfg = _cfg(tmp_path, "d", "random", tokens=256, variant="dense")
    train(cfg)
    shifted = _cfg(tmp_path, "d", "random", tokens=256, variant="dense", pool_offset=2)
    assert _finished_run(shifted) is not None
    assert shifted.model_config(256).pool_offset == 0
    assert shifted.comparable()["pool_offset"] == 0
    coupled = _cfg(tmp_path, "c", "random", tokens=256, variant="coupled", pool_offset=2)
    assert coupled.comparable()["pool_offset"] == 2 and coupled.model_config(256).pool_offset == 2
    with pytest.raises(fs.InputError, match="pool_offset must be an integer from 0 to P - 1 = 3"):
        train(_cfg(tmp_path, "e", "random", tokens=256, variant="dense", pool_offset=4))
