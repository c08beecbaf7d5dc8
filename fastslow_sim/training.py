"""Training the fast-slow network: one run (`train`) and the ablation over variants and seeds
(`reproduce`).

One run: AdamW with linear warm-up and cosine decay, gradient clipping, bf16 autocast on CUDA,
optional `torch.compile`, a progress bar, periodic validation. Every step logs loss, learning
rate, tokens/s and the gate `tanh(alpha)` of every layer; every evaluation logs the validation
loss. Checkpoints are written atomically; `resume=True` continues from the last one and ends
with the same parameters as an uninterrupted run (the data sampler's state is saved with it).
The batch order depends on the seed only, so every variant with the same seed sees the same
batches. Multi-GPU (or multi-process CPU) through `torchrun`: DDP, gloo on CPU, nccl on CUDA;
rank `r` draws its batches from seed `(seed, r)`.
"""

from __future__ import annotations

import contextvars
import decimal
import json
import math
import numbers
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ._version import __version__
from .bridge import BridgeConfig, FastSlowLM
from .bridge.cost import flops_per_token, utilisation
from .bridge.variants import ARMS
from .corpora import Corpus, load_corpus, same_text_corpus
from .errors import InputError
from .io import atomic_path, check_writable, creation_error, save_json, watched_file
from .threads import check_threads, torch_threads
from .validation import count_text, no_underscore, plain_int
from .wording import bytes_text, int_text, plural

__all__ = ["TrainConfig", "train", "parse_tokens", "reproduce", "TrainingDivergedError",
           "check_config", "check_run_folder"]

# the files of a run folder, and what each is called in a message
RUN_FILES = {"ckpt.pt": "checkpoint", "summary.json": "summary", "train.nc": "training log"}
# how `check_run_folder` names the option that places a run folder (`reproduce`'s
# `names["run_folders"]` for its calls: `figures` has `--runs`)
_RUN_FOLDERS = contextvars.ContextVar(
    "run_folders", default="--out of reproduce, --runs-dir of sweep"
)
# AdamW's first beta. Its step t moves the float32 parameters by lr_t / (1 - BETA1**t) times the
# normalised moment, and torch converts that step size to the parameters' dtype (float32; bf16
# autocast on CUDA keeps float32 parameters), failing with "value cannot be converted to type
# float without overflow" above torch.finfo(torch.float32).max. The largest factor is the first
# step's 1 / (1 - BETA1) = 10, so a learning rate (lr, and min_lr, which the cosine schedule
# reaches) up to LR_MAX never overflows, and with warmup_steps = 0 one above it overflows at the
# first step: measured with torch 2.13, lr = LR_MAX = 3.4028234663852877e37 steps, the next float
# above it raises. Such a run diverges at once, but as a TrainingDivergedError, not torch's error.
BETA1 = 0.9
LR_MAX = torch.finfo(torch.float32).max * (1 - BETA1)
# optimizer steps of one run, at most: every step's loss, learning rate, throughput and gates are
# kept in memory and in every checkpoint (as integrate keeps at most 1,000,000 saved points)
MAX_STEPS = 1_000_000
# the largest seed: rank r draws its batches from a torch generator seeded with seed * 1000 + r,
# which takes at most 2^64 - 1 (above, "Overflow when unpacking long long")
MAX_SEED = (2**64 - 1000) // 1000

# bytes that one training step keeps for its backward pass per element of batch x context x
# n_embd x n_layer, at least: the peak resident memory of one forward, backward and AdamW step
# grew by 81-102 bytes per element on the CPU in float32 (torch 2.13; batch 8-64, context
# 256-1024, n_embd 128-256, n_layer 2-4, dense and coupled), about 22 float32 numbers, and by
# 52-61 under bf16 autocast (as on CUDA; measured on the CPU, no GPU at hand). Below both, so that
# a refusal is a run that clearly cannot fit (`check_activation_memory`)
ACTIVATION_BYTES = 40
# the largest of those measurements: the batch that a refusal offers is the one that fits at it
ACTIVATION_BYTES_MEASURED = 102

# settings that change no number of a run: how often checkpoints are written (a killed run
# resumes with another --checkpoint-every, and a finished run is reused whatever its value);
# they stay in the saved configuration
RESULT_FREE = ("ckpt_interval",)

# settings added after runs were saved, with the value that those runs had (they lack the key)
_ADDED_LATER = {"pool_offset": 0}

# what a run's wall-clock holds (ablation.nc and a sweep cell name it so)
LOOP_NOTE = "sampled evaluations and checkpoints included; the final full validation pass is not"
WALL_LONG_NAME = f"wall-clock of the training loop ({LOOP_NOTE})"
TOKENS_PER_S_LONG_NAME = f"tokens over the training loop's wall-clock ({LOOP_NOTE})"

# fields that may differ between a checkpoint and the run that resumes it
_RESUME_FREE = {"out", "device", "compile", "resume", "stop_after_steps", "progress",
                "threads"}  # fmt: skip


class TrainingDivergedError(RuntimeError):
    """The loss became non-finite; the run's last checkpoint is kept (the message says whose
    weights it holds)."""


def _kept_checkpoint(path, saved, bad) -> str:
    """The end of a divergence message: what `path` holds when the weights after `bad` updates
    are the first non-finite ones and this run last saved after `saved` updates (None: never).
    A checkpoint is written after an update, before that update's weights have a loss."""
    if saved is None:
        return f"; this run has written no checkpoint to {str(path)!r}."
    if saved >= bad:
        return (f"; its last checkpoint, {str(path)!r}, holds those weights (after "
                f"{plural(saved, 'step')}): resume from an earlier copy, if any, not from "
                f"it.")  # fmt: skip
    return (f"; its last checkpoint, {str(path)!r}, holds the weights after "
            f"{plural(saved, 'step')}, whose loss was finite.")  # fmt: skip


# a count as typed: digits (commas only between groups of three after a first group that does not
# begin with 0: "0,500m" is a decimal comma), a decimal part, an exponent
_COUNT = re.compile(r"\+?(?:(?:[1-9][0-9]{0,2}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?")


def parse_tokens(text) -> int:
    """`500k`, `2M`, `1.5m`, `250000`, `1,000,000` -> a positive integer number of tokens, read
    exactly (as a decimal, not through float). Commas only between groups of three digits
    (`1,5m` was read as 15 million), no underscores (`no_underscore`), ASCII digits only."""
    no_underscore("--tokens", text)
    s = str(text).strip().lower()
    mult = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
    body, scale = (s[:-1], mult[s[-1]]) if s and s[-1] in mult else (s, 1)
    expected = f"--tokens must be a positive count like 500k, 2M or 250000; got {text!r}."
    if "_" in body:  # "1_000k": no_underscore only sees text that reads as a number
        raise InputError(f"--tokens must be a number written without underscores; got {text!r}.")
    if not _COUNT.fullmatch(body):
        if "," in body and _COUNT.fullmatch(body.replace(",", "")):
            raise InputError(f"--tokens takes commas only between groups of three digits, as in "
                             f"1,000,000; got {text!r}.")  # fmt: skip
        raise InputError(expected)
    value = decimal.Decimal(body.replace(",", ""))
    if value and value.adjusted() > 999:  # 1e999999999 is not expanded into its digits
        raise InputError(f"--tokens must be a count below 1e1000; got {text!r}.")
    with decimal.localcontext() as ctx:
        ctx.prec = len(body) + 30  # exact: a product rounded to 28 digits could look whole
        value = value * scale
    if value < 1 or value != value.to_integral_value():
        raise InputError(expected)
    return int(value)


@dataclass
class TrainConfig:
    variant: str = "coupled"
    arm: str = ""  # the ablation arm's name, a label only (e.g. "dense-matched")
    corpus: str = "me"
    tokens: int = 500_000
    P: int = 8
    pool_offset: int = 0  # the pooling grid's first token (a control; `BridgeConfig`)
    seed: int = 0
    device: str = "auto"
    out: str = "runs/run"
    batch_size: int = 8
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    gate: str = "scalar"
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 50
    eval_batches: int = 8
    ckpt_interval: int = 50
    compile: bool = False
    resume: bool = False
    stop_after_steps: int | None = None  # for tests and for splitting a run: stop early
    progress: bool = True
    threads: int | None = None  # torch's intra-op threads; None: torch's own setting

    def __post_init__(self):
        # numpy integers (np.int64(8)) as plain ints, so the config stays JSON-serialisable;
        # the values themselves are checked by `_validate` before a run
        for f in fields(self):
            if f.type in ("int", "int | None", int):
                setattr(self, f.name, plain_int(getattr(self, f.name)))

    def model_config(self, vocab_size: int) -> BridgeConfig:
        return BridgeConfig(vocab_size=vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                            n_head=self.n_head, n_embd=self.n_embd, P=self.P, dropout=self.dropout,
                            gate=self.gate, variant=self.variant,
                            pool_offset=self.grid_offset())  # fmt: skip

    def grid_offset(self) -> int:
        """The pooling grid's offset as the model has it: 0 for dense, which pools nothing (its
        runs at every --pool-offset are one run, saved, resumed and reused as one)."""
        return 0 if self.variant == "dense" else self.pool_offset

    def comparable(self) -> dict:
        held = {k: v for k, v in asdict(self).items() if k not in _RESUME_FREE}
        return {**held, "pool_offset": self.grid_offset()}


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """The training loop's AdamW: weight decay on matrices and embeddings only, betas (BETA1, beta2)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]  # fmt: skip
    # torch's default kernel (on the CPU a loop over the tensors, bit for bit foreach=True's), not
    # the fused one: fused AdamW is about twice as fast on the CPU (scripts/bench_network.py
    # --fused-adamw) but not bit for bit the default (parameters up to 1.2e-7 apart after 10
    # steps), and the saved runs that the README quotes were made with the default
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(BETA1, cfg.beta2))


def check_device(name, here: bool = True) -> None:
    """`InputError` unless `name` is a device `train` takes (auto, cpu, cuda, cuda:N) and, with
    `here`, one this process has (a dask worker elsewhere may have a CUDA device it lacks)."""
    if not isinstance(name, str) or not (name in ("auto", "cpu", "cuda")
                                         or re.fullmatch(r"cuda:[0-9]+", name)):  # fmt: skip
        raise InputError(f"--device must be auto, cpu or cuda; got {name!r}.")
    if here and name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {name} was requested, but no CUDA device is available here.")


def _device(name: str) -> torch.device:
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _lr(cfg: TrainConfig, step: int, steps: int) -> float:
    """Learning rate of step `step` (0-based) of `steps`: a linear warm-up over the first `warm`
    steps, `lr (s + 1) / warm`, reaching `lr` at step `warm - 1`; then the cosine
    `min_lr + (lr - min_lr) (1 + cos(pi (s - warm) / (steps - warm))) / 2`, which starts at `lr`
    again (step `warm`) and would reach `min_lr` one step after the last: the last step's rate
    is a little above `min_lr` (1.02e-4 for 32 steps from 1e-3 to 1e-4 without warm-up, 1.15e-4
    with the default 20 steps of it). Kept as it is: every saved run and published number used
    it."""
    warm = min(cfg.warmup_steps, max(steps - 1, 0))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(steps - warm, 1)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def _batch(data: np.ndarray, T: int, B: int, gen: torch.Generator, device, align: int = 1) -> tuple:
    """`B` windows of `T + 1` tokens at random starts that are multiples of `align` (the me
    corpus's block length, so the network's pooling grid is the corpus's block grid)."""
    ix = torch.randint(0, (len(data) - T - 1) // align + 1, (B,), generator=gen) * align
    rows = np.stack([np.asarray(data[i : i + T + 1], dtype=np.int64) for i in ix.tolist()])
    t = torch.from_numpy(rows).to(device)
    return t[:, :-1], t[:, 1:]


def _save_atomic(obj, path: Path):
    with atomic_path(path, "checkpoint") as tmp, watched_file(tmp, path) as f:
        torch.save(obj, f)  # on a full disk, one OSError naming the path (torch's RuntimeError)


def _gather(obj, world: int) -> list:
    """`[obj of rank 0, obj of rank 1, ...]` on every rank (a one-element list without DDP)."""
    if world == 1:
        return [obj]
    out = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def _sha256(*tensors) -> str:
    """Digest of the tensors' bytes: equal digests mean bit-identical values."""
    import hashlib

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _references(corpus: Corpus, T: int) -> dict | None:
    """The me corpus's oracle, Bayes floor and ignore-y losses on the validation windows of
    length `T` (None for other corpora)."""
    keys = ("oracle_loss", "bayes_floor_loss", "ignore_y_loss")
    if corpus.stats.get("reference_context") == T:
        return {k: corpus.stats[k] for k in keys}
    if corpus.blocks is None:
        return None
    from .me_corpus import MECorpusConfig, me_reference_losses

    cfg = MECorpusConfig(**corpus.stats["config"])
    ref = me_reference_losses(corpus, cfg, T)
    return {k: ref[k] for k in keys}


def _dist():
    """`(rank, world_size, local_rank)` under torchrun, else `(0, 1, 0)`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0"))


def _validate(cfg: TrainConfig, names: dict | None = None, world: int = 1):
    """`InputError` unless `cfg`'s settings are valid. `names` says how a message calls a
    field (the command line's option, e.g. `{"block_size": "--context"}`; else its own name);
    `world` is the number of processes, each of which trains on one batch per step."""

    def called(field):
        return (names or {}).get(field, field)

    for name in (
        "tokens",
        "batch_size",
        "block_size",
        "eval_interval",
        "eval_batches",
        "ckpt_interval",
    ):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{called(name)} must be a positive integer; got {v!r}.")
    batch = cfg.batch_size * cfg.block_size * world
    if not batch <= cfg.tokens <= MAX_STEPS * batch:
        each = f" on each of {world} processes" if world > 1 else ""
        raise InputError(
            f"{called('tokens')} must be from {count_text(batch)} (one batch{each}: "
            f"{called('batch_size')} {int_text(cfg.batch_size)} x {called('block_size')} "
            f"{int_text(cfg.block_size)}) "
            f"to {count_text(MAX_STEPS * batch)} ({MAX_STEPS:,} steps of one batch); "
            f"got {count_text(cfg.tokens)}."
        )
    v = cfg.P  # the model's own check names P, not the option (`BridgeConfig`)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= cfg.block_size:
        raise InputError(f"{called('P')} must be an integer from 1 to the context length "
                         f"{int_text(cfg.block_size)} ({called('block_size')}); got {v!r}.")  # fmt: skip
    v = cfg.pool_offset
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < cfg.P:
        raise InputError(f"{called('pool_offset')} must be an integer from 0 to P - 1 = "
                         f"{cfg.P - 1} ({called('P')} {cfg.P}); got {v!r}.")  # fmt: skip
    check_device(cfg.device, here=False)  # its name; whether this process has it: `_device`
    for name in ("lr", "min_lr", "grad_clip"):
        v = getattr(cfg, name)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise InputError(f"{called(name)} must be a positive number; got {v!r}.")
    v = cfg.stop_after_steps
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise InputError(f"{called('stop_after_steps')} must be None or a positive integer; "
                         f"got {v!r}.")  # fmt: skip
    if str(cfg.out) == "":  # Path("") is the current folder
        raise InputError(f"{called('out')} must name a folder; got an empty string.")
    for name in ("lr", "min_lr"):  # the schedule passes through both
        v = getattr(cfg, name)
        if v > LR_MAX:
            raise InputError(
                f"{called(name)} must be a positive number at most {LR_MAX:.6g} (AdamW steps by "
                f"up to the learning rate / (1 - {BETA1}), which must fit in the model's float32); "
                f"got {v!r}."
            )
    if cfg.min_lr > cfg.lr:  # the cosine would climb from lr to min_lr
        raise InputError(f"{called('min_lr')} must be at most {called('lr')} (the schedule "
                         f"decays from lr to min_lr); got {cfg.min_lr!r} > {cfg.lr!r}.")  # fmt: skip
    v = cfg.warmup_steps
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"warmup_steps must be a non-negative integer; got {v!r}.")
    if not (isinstance(cfg.beta2, (int, float)) and 0 <= cfg.beta2 < 1):
        raise InputError(f"beta2 must be a number in [0, 1) (AdamW's second beta); got {cfg.beta2!r}.")
    v = cfg.weight_decay
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise InputError(f"weight_decay must be a non-negative number; got {v!r}.")
    if cfg.threads is not None:  # (here too so that reproduce and sweeps refuse it before work)
        check_threads(cfg.threads, called("threads"))
    check_activation_memory(cfg, names, world)


def _device_memory(name: str) -> tuple[float, bool]:
    """`(bytes, on a GPU)`: the memory of the CUDA device that `name` ("auto", "cuda",
    "cuda:N") picks where this process has one, else this machine's (`physical_memory`)."""
    from .integrators import physical_memory

    name = str(name)
    if torch.cuda.is_available() and (name in ("auto", "cuda") or name.startswith("cuda:")):
        tail = name.partition(":")[2]  # not a number: `_device` refuses the name
        index = int(tail) if tail.isdigit() else torch.cuda.current_device()
        if index < torch.cuda.device_count():
            return float(torch.cuda.get_device_properties(index).total_memory), True
    return physical_memory(), False


def check_activation_memory(cfg: TrainConfig, names: dict | None = None, world: int = 1) -> None:
    """`InputError` before any work when one training step's activations, at least
    `ACTIVATION_BYTES` per element of batch x context x n_embd x n_layer, exceed the memory of
    the device it runs on (each GPU holds one process's; on the CPU the `world` processes share
    this machine's memory), instead of torch's out-of-memory error part way into the run."""
    sizes = (cfg.batch_size, cfg.block_size, cfg.n_embd, cfg.n_layer)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return  # refused by their own checks
    have, gpu = _device_memory(cfg.device)
    share = 1 if gpu else world
    per_sample = ACTIVATION_BYTES * cfg.block_size * cfg.n_embd * cfg.n_layer * share
    need = per_sample * cfg.batch_size
    if need > have:
        called = (names or {}).get
        where = "this GPU's" if gpu else "this machine's"
        each = f" on each of {world} processes" if world > 1 else ""
        fits = int(have // (per_sample * ACTIVATION_BYTES_MEASURED / ACTIVATION_BYTES))
        batch = called("batch_size", "batch_size")
        expected = (f"expected {batch} at most {count_text(fits)} here (the batch that fits at "
                    f"the {ACTIVATION_BYTES_MEASURED} bytes measured), or a shorter context or a "
                    f"smaller model.")  # fmt: skip
        if fits < 1:  # not even a batch of 1: "at most 0" is no batch
            one = per_sample * ACTIVATION_BYTES_MEASURED / ACTIVATION_BYTES
            expected = (f"expected a shorter context or a smaller model (a {batch} of 1 needs "
                        f"about {bytes_text(one)} at the {ACTIVATION_BYTES_MEASURED} bytes "
                        f"measured).")  # fmt: skip
        raise InputError(
            f"{batch} {int_text(cfg.batch_size)}{each} x "
            f"{called('block_size', 'block_size')} {int_text(cfg.block_size)} x n_embd "
            f"{int_text(cfg.n_embd)} x n_layer {int_text(cfg.n_layer)} needs at least about "
            f"{bytes_text(need)} for the activations of one training step ({ACTIVATION_BYTES} "
            f"bytes each, a lower bound: 81-102 measured in float32), more than {where} "
            f"{bytes_text(have)} of memory; {expected}"
        )


def _check_corpus_and_model(cfg: TrainConfig, corpus: Corpus | None = None):
    """`(corpus, model config)` of `cfg` (the corpus loaded unless given), or `InputError`
    unless the corpus holds the windows and the model configuration (P, widths) is valid."""
    corpus = corpus or load_corpus(cfg.corpus, P=cfg.P, context=cfg.block_size)
    corpus.check_fits(cfg.block_size, cfg.batch_size)
    if corpus.block_len and cfg.block_size % corpus.block_len:
        raise InputError(
            f"the context {int_text(cfg.block_size)} is not a multiple of the {corpus.name!r} corpus's block "
            f"length P={corpus.block_len}; expected whole blocks per window."
        )
    return corpus, cfg.model_config(corpus.vocab_size)


def check_config(cfg: TrainConfig, corpus: Corpus | None = None):
    """The checks `train` makes of `cfg` before it trains (its settings, the corpus, the model
    configuration), without training: `InputError` on bad input. The run folder and the
    device are `train`'s to check (`check_run_folder`; a sweep's workers may have a CUDA
    device that the process checking its cells lacks)."""
    _validate(cfg)
    _check_corpus_and_model(cfg, corpus)


# what a run folder holds (`train`); `train-network`, `reproduce` and sweeps never replace them


def _difference(saved: dict, ours: dict, names: dict | None = None, free=()) -> str | None:
    """`"k = a there, b here"` for the first setting of `ours` that `saved` has otherwise (not
    counting those in `free`), `k` as `names` calls it (the command line's option names)."""
    for k, v in ours.items():
        there = saved.get(k, _ADDED_LATER.get(k))
        if k not in free and there != v:
            return f"{(names or {}).get(k, k)} = {there!r} there, {v!r} here"
    return None


# A text corpus's contents are part of a run: the sha256 of its bytes (`Corpus.stats`) is
# saved as "corpus_sha256" in the summary and the checkpoint, and a run made on other contents
# of the same file is neither resumed nor reused. The me and random corpora are determined by
# their spec, which the settings compare: they have none. A run saved before fastslow-sim
# recorded it has none either: its file's contents are unknown, and such a run is resumed and
# reused as before (nothing says that its file changed; refusing would strand every such run).


def _corpus_changed(held: str | None, corpus: Corpus | None) -> bool:
    """Whether the run whose corpus fingerprint is `held` was made on other contents than
    `corpus` has now (False where either is unknown)."""
    now = None if corpus is None else corpus.stats.get("sha256")
    return held is not None and now is not None and held != now


def _corpus_free(held: dict, cfg: TrainConfig, corpus: Corpus | None = None) -> tuple:
    """`("corpus",)` where the run whose configuration is `held` (with its "corpus_sha256")
    names its text corpus otherwise than `cfg` does but was made on the contents that `cfg`'s
    file has now (`corpus`'s, else read now): another spelling of the same file's path is no
    other configuration (`same_text_corpus`); else `()`. The run's files keep the spelling
    they recorded."""
    if held.get("corpus") == cfg.corpus:
        return ()
    now = None if corpus is None else corpus.stats.get("sha256")
    same = same_text_corpus(held.get("corpus"), held.get("corpus_sha256"), cfg.corpus, now)
    return ("corpus",) if same else ()


def _changed_text(corpus: Corpus, where: str) -> str:
    return (f"the corpus file {corpus.stats.get('path')!r} has changed since the run in "
            f"{where!r} was made (its contents' sha256 differs)")  # fmt: skip


def recorded_device_kind(device) -> str:
    """`"cuda"` of a run's recorded device `"cuda:0"`; "" where none is recorded, or not one
    torch knows."""
    try:
        return torch.device(str(device)).type
    except (RuntimeError, ValueError):
        return ""


def _computed_otherwise(summary: dict, cfg: TrainConfig, here: bool = True) -> str | None:
    """How the finished run of `summary` computed otherwise than `cfg` would, or None: on
    another kind of device (CUDA trains in bf16 autocast, the CPU in float32) or with another
    `compile` (fused kernels round otherwise). A resume may change either; a result reused
    beside the other arms' runs may not. `here=False`: `cfg` runs in another process (a
    sweep's worker, which may have a CUDA device this one lacks), so `device="auto"` is not
    resolved here and an explicit device is not checked for availability."""
    kind = recorded_device_kind(summary.get("device")) or None
    if here:
        want = _device(cfg.device).type
    elif cfg.device == "auto":  # the worker decides: `train` there judges it (`_finished_run`)
        want = kind
    else:
        want = torch.device(cfg.device).type
    if kind != want:
        return f"made on {kind or 'an unrecorded device'}, this run on {want}"
    held = bool((summary.get("train_config") or {}).get("compile"))
    if held != bool(cfg.compile):
        return f"compile = {held} there, {bool(cfg.compile)} here"
    return None


def _held_config(out: Path) -> dict | None:
    """The configuration of the run in `out` (its summary's, else its checkpoint's), with its
    corpus fingerprint as "corpus_sha256" where it has one, or None."""
    try:
        s = json.loads((out / "summary.json").read_text())
        return {**s["train_config"], "corpus_sha256": s.get("corpus_sha256")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    try:
        c = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
        return {**c["train_config"], "corpus_sha256": c.get("corpus_sha256")}
    except Exception:  # noqa: BLE001 - any unreadable checkpoint is a file of unknown origin
        return None


def check_run_folder(out, resume: bool = False, same_as=None, here: bool = True) -> None:
    """`InputError` unless the run folder `out` can take a run without replacing one: it holds
    none of `RUN_FILES`, or `resume` (`train` then checks the checkpoint's configuration), or
    `same_as` is given (a function returning the run's `(TrainConfig, Corpus)`) and the run in
    `out` has that configuration and was made on that corpus's contents (a rerun reuses it, or
    trains it again if unfinished) and, finished, computed as this run would
    (`_computed_otherwise`; `here=False` where another process trains it)."""
    out = Path(out)
    existing = [n for n in RUN_FILES if (out / n).exists()]
    if not existing or resume:
        return
    if same_as is None:
        raise InputError(
            f"--out {str(out)!r} already holds {existing[0]} (another run's, or a file of yours); "
            f"expected a folder without a run's files ({', '.join(RUN_FILES)}), or --resume to "
            f"continue the run there."
        )
    held = _held_config(out)
    cfg, corpus = (None, None) if held is None else same_as()
    diff = "no readable configuration" if held is None else \
        _difference(held, cfg.comparable(), free=RESULT_FREE + _corpus_free(held, cfg, corpus))  # fmt: skip
    if diff is None and _corpus_changed(held.get("corpus_sha256"), corpus):
        raise InputError(
            f"{_changed_text(corpus, str(out))}, which this run would replace; expected another "
            f"output folder ({_RUN_FOLDERS.get()}), or the file as it was."
        )
    if diff is None:
        try:
            summary = json.loads((out / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None
        if isinstance(summary, dict) and summary.get("finished"):
            diff = _computed_otherwise(summary, cfg, here)
    if diff is not None:
        raise InputError(
            f"the run folder {str(out)!r} holds a run of another configuration ({diff}), which "
            f"this run would replace; expected another output folder ({_RUN_FOLDERS.get()}), or "
            f"that run's settings to reuse it."
        )


@torch.no_grad()
def evaluate_windows(model, corpus: Corpus, T: int, device="cpu", batch_size: int = 32,
                     autocast_on: bool = False) -> float:  # fmt: skip
    """Mean loss (nats/token) over every aligned, non-overlapping window of the validation split
    (`corpus.window_starts`): the targets of the me corpus's reference losses."""
    win, _ = corpus.windows("val", T)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(win), batch_size):
        rows = torch.from_numpy(win[i : i + batch_size]).to(device)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast_on):
            _, loss = model(rows[:, :-1], rows[:, 1:])
        total += float(loss) * rows.shape[0]
    model.train(was_training)
    return total / len(win)


@torch.no_grad()
def _evaluate(model, batches, autocast_on, device) -> float:
    model.eval()
    losses = []
    for xb, yb in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_on):
            losses.append(float(model(xb, yb)[1]))
    model.train()
    return float(np.mean(losses))


def _check_parent(out: Path, what: str) -> None:
    """`InputError` unless the folder that is to hold the new folder `out` exists: the folders
    above an output are the user's to make (as `check_writable` asks of a file's folder)."""
    from .io import check_parent
    from .validation import folder

    folder(out, what)
    if not out.exists():
        check_parent(out, what)


# One run at a time per process: a run seeds torch's process-wide random state
# (`torch.manual_seed`, the weights' initialisation and dropout draw from it) and sets its
# thread count, so two runs in threads of one process (a dask worker with --nthreads 2 under
# `reproduce --scheduler`) interleaved their draws and trained seeds other than their own.
_ONE_RUN_AT_A_TIME = threading.RLock()


def train(cfg: TrainConfig, corpus: Corpus | None = None, log=print, *,
          names: dict | None = None, parents: bool = True) -> dict:  # fmt: skip
    """Train one network; returns the summary (also written to `out/summary.json`).

    `names`: how an error message calls a setting (`_validate`; the command line passes its
    option names). `parents=False`: the folder that holds `cfg.out` must exist (the command
    line's `--out`), else the run folder is made with the folders above it. A run that fails
    (a full disk at its first checkpoint) removes the folders it made while they are empty."""
    made = _missing_folders(Path(cfg.out)) if _dist()[0] == 0 else []
    try:
        with _ONE_RUN_AT_A_TIME, torch_threads(_threads(cfg, names)):
            return _train(cfg, corpus, log, names=names, parents=parents)
    except BaseException:
        for folder in made:  # the run folder first, then those made above it
            try:
                folder.rmdir()  # only an empty one: whatever was written there is kept
            except OSError:
                break
        raise


def _threads(cfg: TrainConfig, names: dict | None) -> int | None:
    """torch's intra-op threads for the run: `cfg.threads`, checked, or `None` (torch's own
    setting). Unlike the ODE solvers' small problems, a small network gains from a second
    thread on an idle machine (one thread took 1.04-1.54x as long on two cores, batch 2-8 x
    context 64-256), so the choice is the user's: on a machine shared with other work one
    thread ran them 2.0-3.0x faster (`scripts/bench_threads.py`, cases 8-11)."""
    if cfg.threads is None:
        return None
    return check_threads(cfg.threads, (names or {}).get("threads", "threads"))


def _missing_folders(out: Path) -> list[Path]:
    """`out` and the folders above it that do not exist (yet), the deepest first."""
    missing, p = [], Path(os.path.abspath(out))
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing


def _train(cfg: TrainConfig, corpus: Corpus | None, log, *, names: dict | None,
           parents: bool) -> dict:  # fmt: skip
    from tqdm import tqdm

    from .io import save_dataset

    rank, world, local_rank = _dist()
    _validate(cfg, names, world)
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= MAX_SEED:
        raise InputError(
            f"{(names or {}).get('seed', 'seed')} must be an integer from 0 to {MAX_SEED:,} (the "
            f"data order's generator takes seed x 1000 + rank); got {cfg.seed!r}."
        )
    device = _device(cfg.device)
    if world > 1:
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device(f"cuda:{local_rank}")
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    out = Path(cfg.out)
    ckpt_path = out / "ckpt.pt"
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} exists and is not a folder.")
    if not parents:
        _check_parent(out, "run folder")
    if cfg.resume and not ckpt_path.is_file():
        raise InputError(f"--resume: no checkpoint at {str(ckpt_path)!r}.")
    checkpoint = None
    if cfg.resume:
        try:
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
            saved_cfg = checkpoint["train_config"]
        except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
            raise InputError(
                f"the checkpoint {str(ckpt_path)!r} is corrupt or unreadable ({type(err).__name__})."
            ) from None
        free = RESULT_FREE + _corpus_free({**saved_cfg, "corpus_sha256":
                                           checkpoint.get("corpus_sha256")}, cfg, corpus)  # fmt: skip
        diff = _difference(saved_cfg, cfg.comparable(), names, free=free)
        held_arm = saved_cfg.get("arm")
        if diff and held_arm and held_arm != cfg.arm:  # no option of train-network sets `arm`
            raise InputError(
                f"--resume: the run folder {str(out)!r} holds a run of reproduce's arm "
                f"{held_arm!r}; expected reproduce again with the same settings, which finishes "
                f"that run or reuses it."
            )
        if diff:
            raise InputError(
                f"--resume: the checkpoint in {str(out)!r} is from another configuration ({diff})."
            )
    if checkpoint is not None and not isinstance(checkpoint.get("data_rng"), list):
        raise InputError(
            f"--resume: the checkpoint in {str(out)!r} was written by an older fastslow-sim that "
            f"saved one rank's random state only; expected a checkpoint of this version."
        )
    if checkpoint is not None and checkpoint.get("world_size", 1) != world:
        raise InputError(
            f"--resume: the checkpoint in {str(out)!r} was written by {checkpoint.get('world_size', 1)} "
            f"processes, this run has {world}; expected the same number."
        )
    if out.is_dir():  # a file there that fastslow-sim did not write stops the run now
        for name, what in RUN_FILES.items():
            check_writable(out / name, what)
    # the corpus is checked before anything is written, so bad input leaves no folder behind
    corpus, mcfg = _check_corpus_and_model(cfg, corpus)
    if checkpoint is not None and _corpus_changed(checkpoint.get("corpus_sha256"), corpus):
        raise InputError(f"--resume: {_changed_text(corpus, str(out))}; expected the file as it "
                         f"was, or a new --out.")  # fmt: skip
    if rank == 0:
        try:
            out.mkdir(parents=parents, exist_ok=True)
        except OSError as err:  # a full disk is no bad input: an OSError naming the folder
            raise creation_error(err, out, "output folder") from None
        if not os.access(out, os.W_OK):
            raise InputError(f"the output folder {str(out)!r} is not writable.")

    torch.manual_seed(cfg.seed)
    model = FastSlowLM(mcfg).to(device)
    raw_model = model
    opt = make_optimizer(model, cfg)
    data_gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    steps = max(1, cfg.tokens // (cfg.batch_size * cfg.block_size * world))
    logs = {"loss": [], "lr": [], "tokens_per_s": [], "gates": [], "eval_step": [], "val_loss": []}
    start_step, wall_before, step_time = 0, 0.0, 0.0  # step_time: sum of the steps' own dt
    if checkpoint is not None:
        raw_model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        # every rank restores its own generators (rank r draws from seed (seed, r))
        data_gen.set_state(checkpoint["data_rng"][rank])
        torch.set_rng_state(checkpoint["torch_rng"][rank])
        logs = checkpoint["logs"]
        start_step = checkpoint["step"]
        wall_before = checkpoint["wall_time_s"]
        # a checkpoint written before it kept step_time_s: each step's dt from its tokens/s
        step_time = checkpoint.get("step_time_s")
        if step_time is None:
            step_time = sum(
                cfg.batch_size * cfg.block_size * world / r for r in logs["tokens_per_s"]
            )
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    step_model = torch.compile(model) if cfg.compile else model
    autocast_on = device.type == "cuda"
    val_gen = torch.Generator().manual_seed(12345)
    align = corpus.block_len or 1
    val_batches = [_batch(corpus.val, cfg.block_size, cfg.batch_size, val_gen, device, align)
                   for _ in range(cfg.eval_batches)]  # fmt: skip

    # the run's first batch (step 0), kept in the checkpoint so that a resumed run reports the
    # same one as an uninterrupted run (None: a checkpoint written before it was kept)
    first_batch = None if checkpoint is None else \
        (checkpoint.get("first_batch_sha256") or [None] * world)[rank]  # fmt: skip

    def save_checkpoint(step, wall, step_time):
        states = _gather((data_gen.get_state(), torch.get_rng_state(), first_batch), world)
        if rank == 0:
            _save_atomic({
                "model": raw_model.state_dict(), "optimizer": opt.state_dict(),
                "data_rng": [d for d, _, _ in states], "torch_rng": [t for _, t, _ in states],
                "first_batch_sha256": [f for _, _, f in states],
                "logs": logs, "step": step, "wall_time_s": wall, "step_time_s": step_time,
                "world_size": world,
                "train_config": asdict(cfg), "model_config": mcfg.to_dict(),
                "corpus_sha256": corpus.stats.get("sha256"),
                "fastslow_sim_version": __version__,
            }, ckpt_path)  # fmt: skip
        if world > 1:  # no rank runs ahead of a checkpoint that is not yet on disk
            torch.distributed.barrier()

    end = steps if cfg.stop_after_steps is None else min(steps, cfg.stop_after_steps)
    saved_step = start_step if checkpoint is not None else None  # this run's last checkpoint
    bar = tqdm(range(start_step, end), desc=f"{cfg.variant} on {cfg.corpus}", unit="step",
               disable=True if (not cfg.progress or rank != 0) else None, leave=False)  # fmt: skip
    t_start = time.perf_counter()
    model.train()
    for step in bar:
        t0 = time.perf_counter()
        lr = _lr(cfg, step, steps)
        for group in opt.param_groups:
            group["lr"] = lr
        xb, yb = _batch(corpus.train, cfg.block_size, cfg.batch_size, data_gen, device, align)
        if step == 0:
            first_batch = _sha256(xb)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_on):
            _, loss = step_model(xb, yb)
        finite = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
        if world > 1:  # one rank's non-finite loss stops every rank, none waits in backward
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        if float(finite) == 0.0:
            where = "here" if not torch.isfinite(loss.detach()) else "on another rank"
            raise TrainingDivergedError(
                f"the loss became non-finite {where} at step {step}"
                + (f" (rank {rank} of {world} stops)" if world > 1 else "")
                + _kept_checkpoint(ckpt_path, saved_step, step)
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_time += dt
        logs["loss"].append(float(loss.detach()))
        logs["lr"].append(lr)
        logs["tokens_per_s"].append(cfg.batch_size * cfg.block_size * world / dt)
        logs["gates"].append([float(np.mean(np.abs(g))) for g in raw_model.gates()])
        if (step + 1) % cfg.eval_interval == 0 or step + 1 == steps:
            logs["eval_step"].append(step + 1)
            logs["val_loss"].append(_evaluate(model, val_batches, autocast_on, device))
            if not math.isfinite(logs["val_loss"][-1]):  # the loss check never sees the last update
                raise TrainingDivergedError(
                    f"the validation loss became non-finite after step {step}"
                    + _kept_checkpoint(ckpt_path, saved_step, step + 1)
                )
            bar.set_postfix(loss=f"{logs['loss'][-1]:.3f}", val=f"{logs['val_loss'][-1]:.3f}")
        if (step + 1) % cfg.ckpt_interval == 0 or step + 1 == end:
            save_checkpoint(step + 1, wall_before + time.perf_counter() - t_start, step_time)
            saved_step = step + 1
    wall = wall_before + time.perf_counter() - t_start
    done = len(logs["loss"])
    rank_params = _gather(_sha256(*raw_model.state_dict().values()), world)
    rank_batches = _gather(first_batch, world)
    finished = done == steps
    # in float32 even on CUDA: the gap to the me corpus's floor is a few thousandths of a nat
    val_full = evaluate_windows(raw_model, corpus, cfg.block_size, device) \
        if finished and rank == 0 else None  # fmt: skip
    if val_full is not None and not math.isfinite(val_full):  # the sampled check passed
        raise TrainingDivergedError(
            f"the validation loss over every aligned window is non-finite after "
            f"{plural(done, 'step')}" + _kept_checkpoint(ckpt_path, saved_step, done)
        )
    summary = {
        "variant": cfg.variant,
        "arm": cfg.arm or cfg.variant,
        "corpus": cfg.corpus,
        "vocab_size": corpus.vocab_size,
        "tokens": done * cfg.batch_size * cfg.block_size * world,
        "steps": done,
        "steps_planned": steps,
        "finished": finished,
        "params": sum(p.numel() for p in raw_model.parameters()),
        "trainable_params": sum(p.numel() for p in raw_model.parameters() if p.requires_grad),
        "train_loss": float(np.mean(logs["loss"][-10:])) if logs["loss"] else None,
        "val_loss": val_full,  # every aligned validation window (the reference losses' targets)
        "val_loss_sampled": logs["val_loss"][-1] if logs["val_loss"] else None,
        "gates": raw_model.gates(),
        # over the training loop's wall-clock (ablation compares it): sampled evaluations and
        # checkpoints included; the final full validation pass (`val_full`) is not
        "tokens_per_s": done * cfg.batch_size * cfg.block_size * world / wall if wall > 0 else None,
        "wall_time_s": wall,
        # over the training steps' own times alone (the per-step dt of train.nc's tokens_per_s)
        "step_time_s": step_time,
        "step_tokens_per_s": (
            done * cfg.batch_size * cfg.block_size * world / step_time if step_time > 0 else None
        ),
        "seed": cfg.seed,
        "P": cfg.P,
        "device": str(device),
        "torch_threads": torch.get_num_threads(),  # the CPU's, also set on a CUDA run
        "world_size": world,
        "flops_per_token_train": flops_per_token(mcfg, cfg.block_size)["train"],
        "n_layer": cfg.n_layer,
        "rank_param_sha256": rank_params,
        "rank_first_batch_sha256": rank_batches,
        "reference_losses": _references(corpus, cfg.block_size),
        "out": str(out),
        "train_config": cfg.comparable(),
        "corpus_sha256": corpus.stats.get("sha256"),  # a text corpus's contents, else None
    }
    if device.type == "cuda":
        summary["mfu"] = _step_mfu(summary, torch.cuda.get_device_name(device))
    if rank == 0:
        save_dataset(_logs_dataset(logs, cfg, mcfg, corpus, summary), out / "train.nc")
        save_json(summary, out / "summary.json", "summary")
    return summary


def _step_mfu(summary: dict, device_name: str) -> float | None:
    """MFU over the training steps (not the training loop's wall-clock, which adds sampled
    evaluations and checkpoints): `flops_per_token_train * step_tokens_per_s / peak` at the
    bf16 peak of `device_name`, or None where it has no peak (`bridge.cost.PEAK_FLOPS`) or no
    step time."""
    return utilisation(summary["flops_per_token_train"], summary["step_tokens_per_s"], device_name)


def _logs_dataset(logs, cfg, mcfg, corpus, summary):
    import xarray as xr

    steps = np.arange(1, len(logs["loss"]) + 1)
    gates = np.array(logs["gates"]).reshape(len(steps), mcfg.n_layer)
    return xr.Dataset(
        {
            "loss": ("step", np.array(logs["loss"]), {"long_name": "training loss (nats/token)"}),
            "lr": ("step", np.array(logs["lr"]), {"long_name": "learning rate"}),
            "tokens_per_s": (
                "step",
                np.array(logs["tokens_per_s"]),
                {"long_name": "tokens per second, this step"},
            ),
            "gate": (
                ("step", "layer"),
                gates,
                {"long_name": "|tanh(alpha)| per layer (mean over channels)"},
            ),
            "val_loss": (
                "eval_step",
                np.array(logs["val_loss"]),
                {"long_name": f"validation loss on {cfg.eval_batches} sampled batches "
                              f"(nats/token)"},  # (the summary's val_loss: every window)
            ),
        },
        coords={
            "step": steps,
            "layer": np.arange(mcfg.n_layer),
            "eval_step": np.array(logs["eval_step"]),
        },
        attrs={
            "title": f"training of the {cfg.variant} network on {cfg.corpus}",
            "train_config": json.dumps(asdict(cfg)),
            "model_config": json.dumps(mcfg.to_dict()),
            "corpus_summary": json.dumps(corpus.summary(), default=float),
            "summary": json.dumps(summary, default=float),
            "fastslow_sim_version": __version__,
        },
    )


# the arms of the ablation (`bridge.variants`): "dense-matched" is a dense model deepened to the
# coupled model's parameter count (see `matched_depth`).


def matched_depth(base: dict, vocab_size: int) -> int:
    """Layers of a dense model whose parameter count is the coupled model's within 1%.

    Each slow path (pooled attention `4 C^2` + `phi_theta` `2 m C^2` + LayerNorms) costs about
    one dense layer (`12 C^2`) at `phi_mult = 4`, so this is about twice the depth. Deeper, not
    wider: width changes the embeddings and the head, depth changes nothing else.
    """
    base = {**TrainConfig().__dict__, **base}
    cfg = TrainConfig(**{k: base[k] for k in TrainConfig().__dict__})

    def count(variant, n_layer):
        c = TrainConfig(**{**cfg.__dict__, "variant": variant, "n_layer": n_layer})
        return sum(p.numel() for p in FastSlowLM(c.model_config(vocab_size)).parameters())

    target = count("coupled", cfg.n_layer)
    best = min(
        range(cfg.n_layer, 4 * cfg.n_layer + 1), key=lambda L: abs(count("dense", L) - target)
    )
    if abs(count("dense", best) - target) > 0.01 * target:
        raise InputError(
            f"no dense depth matches the coupled model's {target:,} parameters within 1% "
            f"(closest: {plural(best, 'layer')}, {count('dense', best):,}); expected phi_mult "
            f"near 4."
        )
    return best


def arm_config(arm: str, base: dict, vocab_size: int) -> dict:
    """TrainConfig fields of one arm on top of `base`."""
    if arm not in ARMS:
        raise InputError(f"unknown arm {arm!r}; expected some of {list(ARMS)}.")
    if arm == "dense-matched":
        return {**base, "variant": "dense", "arm": arm, "n_layer": matched_depth(base, vocab_size)}
    return {**base, "variant": arm, "arm": arm}


def paired_comparison(a, b, margin: float = 0.01, level: float = 0.95) -> dict:
    """Paired per-seed differences `a - b` with a t interval (df = seeds - 1) and a verdict:
    "equivalent" when the interval lies inside `+-margin`, "differs" when it excludes 0 (and
    does not lie inside the margin), else "inconclusive"."""
    from scipy import stats

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = len(d)
    mean = float(d.mean())
    if n < 2:
        return {"mean_diff": mean, "ci95": [float("nan"), float("nan")], "df": 0,
                "verdict": "inconclusive", "excludes_zero": False}  # fmt: skip
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
    lo, hi = mean - half, mean + half
    excludes_zero = lo > 0 or hi < 0
    if -margin <= lo and hi <= margin:
        verdict = "equivalent"
    elif excludes_zero:
        verdict = "differs"
    else:
        verdict = "inconclusive"
    return {"mean_diff": mean, "ci95": [lo, hi], "df": n - 1, "verdict": verdict,
            "excludes_zero": excludes_zero}  # fmt: skip


def _comparison_pairs(arms) -> list:
    pairs = [(a, "dense") for a in arms if a != "dense" and "dense" in arms]
    for a, b in (("coupled", "dense-matched"), ("coupled", "frozen-slow")):
        if a in arms and b in arms:
            pairs.append((a, b))
    return pairs


def reproduce(corpus_spec: str, tokens: int, seeds: int, arms, out: str, base: dict | None = None,
              margin: float = 0.01, log=print, workers: int = 0, scheduler: str | None = None,
              client=None, names: dict | None = None, parents: bool = True,
              retry_failed: bool = False, on_chunk=None) -> dict:  # fmt: skip
    """Train every arm for every seed (arms of one seed share the data order, and the arms that
    share the dense architecture share its initialisation); returns the ablation table.

    The arms x seeds grid runs as a sweep (`fastslow_sim.sweep`) into `out/sweep.zarr`, with one
    run folder `out/ARM-seedS` per cell: `workers=0` in this process, `workers=N` on a local
    dask cluster, `scheduler` (or `client`) on an existing one. The table is computed from the
    store; re-running skips the cells (and reuses the run folders) it already has, failed ones
    too unless `retry_failed`. `names` and `parents`: as `train`'s (`parents=False`: the folder
    that holds `out` must exist); `names["run_folders"]`: how a refused run folder's message
    names the option that places it (default `--out of reproduce, --runs-dir of sweep`).
    `on_chunk(results, chunk)`: `run_sweep`'s, called as each run finishes (a cell reused from
    the store is not run, so not reported); `log` has the per-run lines only once the whole grid
    is done."""
    import xarray as xr

    from .io import save_dataset
    from .sweep import MAX_CELLS, CellInputError, SweepError, run_sweep

    most = MAX_CELLS // max(len(arms), 1)  # the grid is arms x seeds cells of one sweep
    integer = isinstance(seeds, numbers.Integral) and not isinstance(seeds, bool)
    if not integer or not 1 <= seeds <= most:
        raise InputError(f"--seeds must be an integer from 1 to {most:,} (a sweep holds at most "
                         f"{MAX_CELLS:,} runs, here {len(arms)} arm{'s' * (len(arms) != 1)} per seed); "
                         f"got {int_text(int(seeds)) if integer else repr(seeds)}.")  # fmt: skip
    if not (math.isfinite(margin) and margin > 0):
        raise InputError(f"--margin must be a positive number of nats; got {margin}.")
    base = dict(base or {})
    fields = TrainConfig.__dataclass_fields__
    _validate(TrainConfig(**{k: v for k, v in base.items() if k in fields}, tokens=tokens), names)
    if scheduler is None and client is None:  # the runs train on this machine
        check_device(base.get("device", "auto"))
    if not parents:
        _check_parent(Path(out), "reproduce folder")
    if Path(out).is_dir():  # refused before hours of training, not after
        check_writable(Path(out) / "ablation.nc", "ablation")
        _check_held_ablation(Path(out) / "ablation.nc", arms, seeds,
                             (names or {}).get("run_folders", "--out"))  # fmt: skip
    corpus = load_corpus(corpus_spec, P=base.get("P", 8), context=base.get("block_size", 256))
    options = {k: v for k, v in base.items() if k not in ("progress", "out")}
    options.update(corpus=corpus_spec, tokens=str(tokens))
    wording = _RUN_FOLDERS.set((names or {}).get("run_folders", _RUN_FOLDERS.get()))
    try:
        res = run_sweep("train-network", {"arm": list(arms), "seed": list(range(seeds))}, options,
                        Path(out) / "sweep.zarr", workers=workers, scheduler=scheduler,
                        client=client, runs_dir=out, parents=True, log=log, same_sweep=False,
                        retry_failed=retry_failed, on_chunk=on_chunk,
                        progress=base.get("progress", True),
                        attrs={"reproduce": json.dumps({"corpus": corpus_spec, "tokens_requested": tokens,
                                                        "seeds": seeds, "margin": margin})})  # fmt: skip
    except CellInputError as err:  # the grid is reproduce's own, not the user's --grid
        raise InputError(f"{err.values['arm']} seed {err.values['seed']}: {err.reason}") from None
    finally:
        _RUN_FOLDERS.reset(wording)
    sw = res["dataset"]
    bad = [(a, s, str(sw["message"].values[i, j])) for i, a in enumerate(arms) for j, s in
           enumerate(range(seeds)) if sw["status"].values[i, j] != "done"]  # fmt: skip
    if bad:
        a, s, msg = bad[0]
        earlier = int(np.sum((sw["status"].values == "failed")
                             & (sw["run_id"].values != sw.attrs["run_id"]))) \
            if "run_id" in sw else 0  # fmt: skip
        again = (f"; {plural(earlier, 'run')} failed in an earlier call, which this one kept "
                 f"({(names or {}).get('retry_failed', 'retry_failed=True')} trains "
                 f"{'it' if earlier == 1 else 'them'} again)") if earlier else ""  # fmt: skip
        raise SweepError(f"{len(bad)} of {plural(len(arms) * seeds, 'run')} did not finish; "
                         f"{a} seed {s}: {msg or 'pending'} (store {res['store']}){again}.")  # fmt: skip
    runs = _runs_from_sweep(sw, arms, seeds)
    fresh = set(map(tuple, np.argwhere(sw["run_id"].values == sw.attrs["run_id"]).tolist())) \
        if "run_id" in sw else set()
    for j in range(seeds):
        for i, arm in enumerate(arms):
            s = runs[arm][j]
            reused = (i, j) not in fresh or bool(sw["reused"].values[i, j])
            log(f"  {arm:<13} seed {j}: {'(reused) ' if reused else ''}val {s['val_loss']:.4f}, gates "
                f"{[round(abs(g), 4) for g in s['gates']]}, "
                f"{s['wall_time_s']:.1f} s, {s['tokens_per_s']:,.0f} tok/s")  # fmt: skip
    table = ablation_table(runs, margin)
    table["references"] = _references(corpus, base.get("block_size", 256))
    L = max(len(r[0]["gates"]) for r in runs.values())
    gate = np.full((len(arms), seeds, L), np.nan)
    for i, arm in enumerate(arms):
        for j, r in enumerate(runs[arm]):
            gate[i, j, : len(r["gates"])] = [gate_size(g) for g in r["gates"]]
    ds = xr.Dataset(
        {
            "val_loss": (("arm", "seed"), np.array([[r["val_loss"] for r in runs[a]] for a in arms]),
                         {"long_name": "validation loss, every aligned window", "units": "nats/token"}),
            "wall_time_s": (("arm", "seed"), np.array([[r["wall_time_s"] for r in runs[a]] for a in arms]),
                            {"long_name": WALL_LONG_NAME, "units": "s"}),
            "tokens_per_s": (("arm", "seed"), np.array([[r["tokens_per_s"] for r in runs[a]] for a in arms]),
                             {"long_name": TOKENS_PER_S_LONG_NAME,
                              "units": "tokens/s"}),
            "tokens": (("arm", "seed"), np.array([[r["tokens"] for r in runs[a]] for a in arms]),
                       {"long_name": "tokens trained (whole steps)", "units": "tokens"}),
            "gate_abs": (("arm", "seed", "layer"), gate,
                         {"long_name": "final |tanh(alpha)| per layer, mean over channels for "
                                       "channel gates (NaN: no such layer)"}),
            "params": ("arm", np.array([table["arms"][a]["params"] for a in arms]),
                       {"long_name": "parameters"}),
            "flops_per_token": ("arm", np.array([table["arms"][a]["flops_per_token"] for a in arms]),
                                {"long_name": "training FLOPs per token (forward + backward)"}),
        },
        coords={"arm": list(arms), "seed": np.arange(seeds), "layer": np.arange(L)},
        attrs={"title": f"ablation on {corpus_spec}", "corpus": corpus_spec,
               "tokens": trained_tokens(table), "tokens_requested": tokens, "margin": margin,
               "corpus_summary": json.dumps(corpus.summary(), default=float),
               "table": json.dumps(table, default=float), "base_config": json.dumps(base),
               "sweep_store": str(res["store"]), "fastslow_sim_version": __version__},
    )  # fmt: skip
    save_dataset(ds, Path(out) / "ablation.nc")
    return table


def _check_held_ablation(path: Path, arms, seeds: int, where: str = "--out") -> None:
    """`InputError` where the ablation table in `path` holds arms or seeds that this call's
    (`arms` x `seeds`) lacks: writing it would replace a larger grid's table. `where`: the
    option that places the folder."""
    from .io import load_dataset

    try:
        ds = load_dataset(path)
        held, n = [str(a) for a in ds["arm"].values], int(ds.sizes["seed"])
    except Exception:  # noqa: BLE001 - none or unreadable: no table to keep (`check_writable`)
        return
    if set(held) <= set(arms) and n <= seeds:
        return
    raise InputError(
        f"{str(path)!r} holds the ablation of {', '.join(held)} x {plural(n, 'seed')}, which "
        f"this call's {', '.join(arms)} x {plural(seeds, 'seed')} would replace; expected "
        f"those arms and seeds or more (finished runs are reused), another folder ({where}), "
        f"or that file moved away."
    )


def _runs_from_sweep(sw, arms, seeds) -> dict:
    """`{arm: [summary per seed]}` with the fields `ablation_table` reads, from the sweep store
    (gates as their size per layer, `gate_size`; padding beyond `n_layer` dropped). A
    run's `tokens` are those its summary reported (a cell written before cells kept them has
    them from its steps and params: `sweep._train_recorded`, as the store is built)."""
    runs = {}
    for i, arm in enumerate(arms):
        runs[arm] = []
        for j in range(seeds):
            v = {k: sw[k].values[i, j] for k in ("val_loss", "train_wall_time_s", "tokens_per_s",
                                                  "params", "flops_per_token_train", "n_layer",
                                                  "steps", "tokens")}  # fmt: skip
            runs[arm].append({
                "tokens": int(v["tokens"]), "steps": int(v["steps"]),
                "val_loss": float(v["val_loss"]), "wall_time_s": float(v["train_wall_time_s"]),
                "tokens_per_s": float(v["tokens_per_s"]), "params": int(v["params"]),
                "flops_per_token_train": float(v["flops_per_token_train"]),
                "n_layer": int(v["n_layer"]),
                "gates": [float(g) for g in sw["gate_abs"].values[i, j, : int(v["n_layer"])]],
            })  # fmt: skip
    return runs


def _finished_run(cfg: TrainConfig, corpus: Corpus | None = None) -> dict | None:
    """The summary of a finished run of exactly this configuration in `cfg.out`, made on the
    contents `corpus` has now, else None: re-running `reproduce` skips the runs it already has
    (and can be split over processes). The run must also have computed as this one would
    (`_computed_otherwise`)."""
    path = Path(cfg.out) / "summary.json"
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    held = s.get("train_config")
    same = s.get("finished") and isinstance(held, dict) and \
        _difference(held, cfg.comparable(), free=RESULT_FREE + _corpus_free(
            {**held, "corpus_sha256": s.get("corpus_sha256")}, cfg, corpus)) is None  # fmt: skip
    same = same and _computed_otherwise(s, cfg) is None
    return s if same and not _corpus_changed(s.get("corpus_sha256"), corpus) else None


def gate_size(gate) -> float:
    """`|tanh(alpha)|` of one layer's gate: its value for a scalar gate, the mean over channels
    of a channel gate (not the size of the mean, which gates of both signs would cancel)."""
    return float(np.mean(np.abs(gate)))


def ablation_table(runs: dict, margin: float = 0.01) -> dict:
    """`{"arms": {name: {...}}, "comparisons": [...]}` from `{arm: [summary per seed]}`."""
    arms = {}
    dense_wall = np.mean([r["wall_time_s"] for r in runs["dense"]]) if "dense" in runs else None
    for arm, rs in runs.items():
        wall = float(np.mean([r["wall_time_s"] for r in rs]))
        arms[arm] = {
            "params": int(rs[0]["params"]),
            "flops_per_token": float(rs[0]["flops_per_token_train"]),
            "n_layer": int(rs[0]["n_layer"]),
            "val_loss": [float(r["val_loss"]) for r in rs],
            "tokens_per_s": float(np.mean([r["tokens_per_s"] for r in rs])),
            "wall_time_s": wall,
            "wall_ratio_to_dense": float(wall / dense_wall) if dense_wall else None,
            **_tokens_and_steps(rs),
            "gate_abs_per_layer": np.mean([[gate_size(g) for g in r["gates"]] for r in rs],
                                          axis=0).tolist(),  # fmt: skip
        }
    comparisons = []
    for a, b in _comparison_pairs(list(runs)):
        c = paired_comparison(arms[a]["val_loss"], arms[b]["val_loss"], margin)
        comparisons.append({"a": a, "b": b, **c})
    return {"arms": arms, "comparisons": comparisons, "margin": margin}


def _tokens_and_steps(rs) -> dict:
    """`{"tokens": [...], "steps": [...]}` of an arm's runs, one per seed; {} where they lack them."""
    if not all("tokens" in r and "steps" in r for r in rs):
        return {}
    return {"tokens": [int(r["tokens"]) for r in rs], "steps": [int(r["steps"]) for r in rs]}


def trained_tokens(table: dict) -> int | list[int] | None:
    """The tokens each run of an ablation `table` trained (whole steps, so less than one step
    short of those requested): one number where every run agrees, else their distinct values, ascending;
    None where the table does not say."""
    per_arm = [a.get("tokens") for a in table["arms"].values()]
    if not per_arm or any(t is None for t in per_arm):
        return None
    distinct = sorted({int(t) for ts in per_arm for t in ts})
    return distinct[0] if len(distinct) == 1 else distinct
