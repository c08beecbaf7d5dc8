"""DDP with 2 gloo processes under torch.distributed.run: identical parameters on every rank,
different batches per rank, a run killed after its first checkpoint resumes bit for bit, and a
non-finite loss on one rank stops both ranks without a hang."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TRAIN = ["train-network", "--tokens", "10k", "--context", "32", "--batch-size", "4", "--P", "4",
         "--device", "cpu", "--checkpoint-every", "2", "--json"]  # fmt: skip


def _torchrun(*args, script=None):
    target = [script] if script else ["-m", "fastslow_sim"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            *target, *args]  # fmt: skip


def _run(cmd, timeout=300):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    return res


@pytest.fixture
def corpus_args(text_file):
    return ["--corpus", f"text:{text_file}"]


@pytest.mark.slow
def test_ranks_agree_and_draw_different_batches(tmp_path):
    # the me corpus: block-aligned batches on every rank. 2,048 tokens are 8 steps (4 checkpoints)
    # of 2 x 4 x 32 tokens: 1.7 s of training against 8.5 s for TRAIN's 10k (39 steps)
    args = [*TRAIN[: TRAIN.index("--tokens")], "--tokens", "2048", *TRAIN[TRAIN.index("--tokens") + 2 :]]
    res = _run(_torchrun(*args, "--corpus", "me:tokens=60000", "--out", str(tmp_path / "a")))
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["world_size"] == 2 and s["finished"] and s["steps"] == 8
    assert s["tokens"] == s["steps"] * 2 * 4 * 32  # 2 processes x batch 4 x context 32 per step
    assert len(set(s["rank_param_sha256"])) == 1  # bit-identical parameters on both ranks
    assert len(set(s["rank_first_batch_sha256"])) == 2  # rank r draws from seed (seed, r)


@pytest.mark.slow  # 43 s, two ranks killed and resumed; one-process resume: test_training.py
def test_killed_run_resumes_bit_for_bit(tmp_path, corpus_args):
    full = _run(_torchrun(*TRAIN, *corpus_args, "--out", str(tmp_path / "full")))
    assert full.returncode == 0, full.stderr[-3000:]
    steps = json.loads((tmp_path / "full" / "summary.json").read_text())["steps"]
    ckpt = tmp_path / "part" / "ckpt.pt"
    proc = subprocess.Popen(_torchrun(*TRAIN, *corpus_args, "--out", str(tmp_path / "part")),
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 240
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks, no clean-up
    proc.wait()
    saved = torch.load(ckpt, weights_only=False)
    assert saved["step"] < steps, "the run finished before it could be killed"
    assert not (tmp_path / "part" / "summary.json").exists()
    res = _run(_torchrun(*TRAIN, *corpus_args, "--out", str(tmp_path / "part"), "--resume"))
    assert res.returncode == 0, res.stderr[-3000:]
    a = torch.load(tmp_path / "full" / "ckpt.pt", weights_only=False)
    b = torch.load(ckpt, weights_only=False)
    assert a["step"] == b["step"] == steps
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    sa = json.loads((tmp_path / "full" / "summary.json").read_text())
    sb = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert sa["rank_param_sha256"] == sb["rank_param_sha256"]


POISON = """
import sys, torch
from fastslow_sim.bridge import FastSlowLM
from fastslow_sim.cli import main
original = FastSlowLM.forward
calls = {"n": 0}
def poisoned(self, idx, targets=None):
    logits, loss = original(self, idx, targets)
    if self.training and torch.distributed.get_rank() == 1:
        calls["n"] += 1
        if calls["n"] > 3:
            loss = loss * float("nan")
    return logits, loss
FastSlowLM.forward = poisoned
main(sys.argv[1:])
"""


@pytest.mark.slow  # 11 s of torchrun; the ranks' agreement stays in the default run
def test_non_finite_loss_on_one_rank_stops_both(tmp_path, corpus_args):
    script = tmp_path / "poison.py"
    script.write_text(POISON)
    t0 = time.time()
    res = _run(_torchrun(*TRAIN, *corpus_args, "--out", str(tmp_path / "nan"), script=str(script)),
               timeout=240)  # fmt: skip
    assert res.returncode != 0
    assert "non-finite" in res.stderr and "at step 3" in res.stderr
    # rank 0's own loss was finite: it stopped on rank 1's flag instead of waiting for it
    assert "non-finite on another rank at step 3 (rank 0 of 2 stops)" in res.stderr
    assert "non-finite here at step 3 (rank 1 of 2 stops)" in res.stderr
    assert not (tmp_path / "nan" / "summary.json").exists()
    assert time.time() - t0 < 200
