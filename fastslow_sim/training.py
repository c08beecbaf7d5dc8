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

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .bridge import BridgeConfig, FastSlowLM
from .bridge.cost import flops_per_token, peak_flops
from .corpora import Corpus, load_corpus
from .errors import InputError

__all__ = ["TrainConfig", "train", "parse_tokens", "reproduce", "TrainingDivergedError"]

# fields that may differ between a checkpoint and the run that resumes it
_RESUME_FREE = {"out", "device", "compile", "resume", "stop_after_steps", "progress"}


class TrainingDivergedError(RuntimeError):
    """The loss became non-finite; the last good checkpoint is kept."""


def parse_tokens(text) -> int:
    """`500k`, `2M`, `1.5m`, `250000` -> a positive integer number of tokens."""
    s = str(text).strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
    try:
        value = float(s[:-1]) * mult[s[-1]] if s and s[-1] in mult else float(s)
    except ValueError:
        raise InputError(
            f"--tokens must be a positive count like 500k, 2M or 250000; got {text!r}."
        ) from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise InputError(
            f"--tokens must be a positive count like 500k, 2M or 250000; got {text!r}."
        )
    return int(value)


@dataclass
class TrainConfig:
    variant: str = "coupled"
    corpus: str = "me"
    tokens: int = 500_000
    P: int = 8
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

    def model_config(self, vocab_size: int) -> BridgeConfig:
        return BridgeConfig(vocab_size=vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                            n_head=self.n_head, n_embd=self.n_embd, P=self.P, dropout=self.dropout,
                            gate=self.gate, variant=self.variant)  # fmt: skip

    def comparable(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in _RESUME_FREE}


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise InputError(f"--device must be auto, cpu or cuda; got {name!r}.")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda was requested, but no CUDA device is available here.")
    return torch.device(name)


def _lr(cfg: TrainConfig, step: int, steps: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to `min_lr` at the last step."""
    warm = min(cfg.warmup_steps, max(steps - 1, 0))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(steps - warm, 1)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def _batch(data: np.ndarray, T: int, B: int, gen: torch.Generator, device) -> tuple:
    ix = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
    rows = np.stack([np.asarray(data[i : i + T + 1], dtype=np.int64) for i in ix.tolist()])
    t = torch.from_numpy(rows).to(device)
    return t[:, :-1], t[:, 1:]


def _save_atomic(obj, path: Path):
    tmp = path.with_name(f".{path.name}.part")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _dist():
    """`(rank, world_size, local_rank)` under torchrun, else `(0, 1, 0)`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0"))


def _validate(cfg: TrainConfig):
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
            raise InputError(f"{name} must be a positive integer; got {v!r}.")
    for name in ("lr", "min_lr", "grad_clip"):
        v = getattr(cfg, name)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise InputError(f"{name} must be a positive number; got {v!r}.")


@torch.no_grad()
def _evaluate(model, batches, autocast_on, device) -> float:
    model.eval()
    losses = []
    for xb, yb in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_on):
            losses.append(float(model(xb, yb)[1]))
    model.train()
    return float(np.mean(losses))


def train(cfg: TrainConfig, corpus: Corpus | None = None, log=print) -> dict:
    """Train one network; returns the summary (also written to `out/summary.json`)."""
    from tqdm import tqdm

    from .io import save_dataset

    _validate(cfg)
    rank, world, local_rank = _dist()
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
    if cfg.resume and not ckpt_path.is_file():
        raise InputError(f"--resume: no checkpoint at {str(ckpt_path)!r}.")
    checkpoint = None
    if cfg.resume:
        try:
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            saved_cfg = checkpoint["train_config"]
        except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
            raise InputError(
                f"the checkpoint {str(ckpt_path)!r} is corrupt or unreadable ({type(err).__name__})."
            ) from None
        ours = cfg.comparable()
        diff = {k: (saved_cfg.get(k), v) for k, v in ours.items() if saved_cfg.get(k) != v}
        if diff:
            k, (a, b) = next(iter(diff.items()))
            raise InputError(
                f"--resume: the checkpoint in {str(out)!r} is from another configuration "
                f"({k} = {a!r} there, {b!r} here)."
            )
    # the corpus is checked before anything is written, so bad input leaves no folder behind
    corpus = corpus or load_corpus(cfg.corpus, P=cfg.P)
    corpus.check_fits(cfg.block_size, cfg.batch_size)
    if rank == 0:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError(
                f"cannot create the output folder {str(out)!r}: {err.strerror}."
            ) from None
        if not os.access(out, os.W_OK):
            raise InputError(f"the output folder {str(out)!r} is not writable.")

    mcfg = cfg.model_config(corpus.vocab_size)
    torch.manual_seed(cfg.seed)
    model = FastSlowLM(mcfg).to(device)
    raw_model = model
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, cfg.beta2),
    )  # fmt: skip
    data_gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    steps = max(1, cfg.tokens // (cfg.batch_size * cfg.block_size * world))
    logs = {"loss": [], "lr": [], "tokens_per_s": [], "gates": [], "eval_step": [], "val_loss": []}
    start_step, wall_before = 0, 0.0
    if checkpoint is not None:
        raw_model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        data_gen.set_state(checkpoint["data_rng"])
        torch.set_rng_state(checkpoint["torch_rng"])
        logs = checkpoint["logs"]
        start_step = checkpoint["step"]
        wall_before = checkpoint["wall_time_s"]
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    step_model = torch.compile(model) if cfg.compile else model
    autocast_on = device.type == "cuda"
    val_gen = torch.Generator().manual_seed(12345)
    val_batches = [_batch(corpus.val, cfg.block_size, cfg.batch_size, val_gen, device)
                   for _ in range(cfg.eval_batches)]  # fmt: skip

    def save_checkpoint(step, wall):
        if rank != 0:
            return
        _save_atomic({
            "model": raw_model.state_dict(), "optimizer": opt.state_dict(),
            "data_rng": data_gen.get_state(), "torch_rng": torch.get_rng_state(),
            "logs": logs, "step": step, "wall_time_s": wall,
            "train_config": asdict(cfg), "model_config": mcfg.to_dict(),
            "fastslow_sim_version": __version__,
        }, ckpt_path)  # fmt: skip

    end = steps if cfg.stop_after_steps is None else min(steps, cfg.stop_after_steps)
    bar = tqdm(range(start_step, end), desc=f"{cfg.variant} on {cfg.corpus}", unit="step",
               disable=True if (not cfg.progress or rank != 0) else None, leave=False)  # fmt: skip
    t_start = time.perf_counter()
    model.train()
    for step in bar:
        t0 = time.perf_counter()
        lr = _lr(cfg, step, steps)
        for group in opt.param_groups:
            group["lr"] = lr
        xb, yb = _batch(corpus.train, cfg.block_size, cfg.batch_size, data_gen, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_on):
            _, loss = step_model(xb, yb)
        if not torch.isfinite(loss):
            raise TrainingDivergedError(
                f"the loss became non-finite ({float(loss.detach())}) at step {step}; the last good "
                f"checkpoint is kept at {str(ckpt_path)!r}"
                + ("" if ckpt_path.exists() else " (none yet)")
                + "."
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        logs["loss"].append(float(loss.detach()))
        logs["lr"].append(lr)
        logs["tokens_per_s"].append(cfg.batch_size * cfg.block_size * world / dt)
        logs["gates"].append([float(np.mean(np.abs(g))) for g in raw_model.gates()])
        if (step + 1) % cfg.eval_interval == 0 or step + 1 == steps:
            logs["eval_step"].append(step + 1)
            logs["val_loss"].append(_evaluate(model, val_batches, autocast_on, device))
            bar.set_postfix(loss=f"{logs['loss'][-1]:.3f}", val=f"{logs['val_loss'][-1]:.3f}")
        if (step + 1) % cfg.ckpt_interval == 0 or step + 1 == end:
            save_checkpoint(step + 1, wall_before + time.perf_counter() - t_start)
    wall = wall_before + time.perf_counter() - t_start
    done = len(logs["loss"])
    summary = {
        "variant": cfg.variant,
        "corpus": cfg.corpus,
        "vocab_size": corpus.vocab_size,
        "tokens": done * cfg.batch_size * cfg.block_size * world,
        "steps": done,
        "steps_planned": steps,
        "finished": done == steps,
        "train_loss": float(np.mean(logs["loss"][-10:])) if logs["loss"] else None,
        "val_loss": logs["val_loss"][-1] if logs["val_loss"] else None,
        "gates": raw_model.gates(),
        "tokens_per_s": done * cfg.batch_size * cfg.block_size * world / wall if wall > 0 else None,
        "wall_time_s": wall,
        "seed": cfg.seed,
        "P": cfg.P,
        "device": str(device),
        "world_size": world,
        "flops_per_token_train": flops_per_token(mcfg, cfg.block_size)["train"],
        "out": str(out),
    }
    if device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(device), "bf16")
        summary["mfu"] = (
            None
            if peak is None
            else summary["flops_per_token_train"] * summary["tokens_per_s"] / peak
        )
    if rank == 0:
        save_dataset(_logs_dataset(logs, cfg, mcfg, corpus, summary), out / "train.nc")
        tmp = out / ".summary.json.part"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, out / "summary.json")
    return summary


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
                {"long_name": "validation loss (nats/token)"},
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


def reproduce(corpus_spec: str, tokens: int, seeds: int, variants, out: str, base: dict | None = None,
              log=print) -> dict:  # fmt: skip
    """Train every variant for every seed (identical data order per seed); returns the table."""
    import xarray as xr

    from .io import save_dataset

    if seeds < 1:
        raise InputError(f"--seeds must be a positive integer; got {seeds}.")
    base = dict(base or {})
    corpus = load_corpus(corpus_spec, P=base.get("P", 8))
    runs = []
    for seed in range(seeds):
        for variant in variants:  # interleaved, so slow drifts of the machine hit every arm
            cfg = TrainConfig(variant=variant, corpus=corpus_spec, tokens=tokens, seed=seed,
                              out=str(Path(out) / f"{variant}-seed{seed}"), **base)  # fmt: skip
            s = train(cfg, corpus)
            log(f"  {variant:<12} seed {seed}: val {s['val_loss']:.4f}, gates "
                f"{[round(abs(g), 4) if isinstance(g, float) else 'ch' for g in s['gates']]}, "
                f"{s['wall_time_s']:.1f} s, {s['tokens_per_s']:,.0f} tok/s")  # fmt: skip
            runs.append(s)
    table = _ablation_table(runs, variants)
    ds = xr.Dataset(
        {
            "val_loss": (("variant", "seed"), np.array([[r["val_loss"] for r in runs if r["variant"] == v] for v in variants])),
            "wall_time_s": (("variant", "seed"), np.array([[r["wall_time_s"] for r in runs if r["variant"] == v] for v in variants])),
            "tokens_per_s": (("variant", "seed"), np.array([[r["tokens_per_s"] for r in runs if r["variant"] == v] for v in variants])),
            "gate_abs": (("variant", "seed", "layer"), np.array([[[abs(float(np.mean(g))) for g in r["gates"]] for r in runs if r["variant"] == v] for v in variants])),
        },
        coords={"variant": list(variants), "seed": np.arange(seeds), "layer": np.arange(base.get("n_layer", 4))},
        attrs={"corpus": corpus_spec, "tokens": tokens, "corpus_summary": json.dumps(corpus.summary(), default=float),
               "table": json.dumps(table, default=float), "fastslow_sim_version": __version__},
    )  # fmt: skip
    save_dataset(ds, Path(out) / "ablation.nc")
    return table


def _ablation_table(runs, variants) -> dict:
    rows = {}
    dense_wall = (
        np.mean([r["wall_time_s"] for r in runs if r["variant"] == "dense"])
        if "dense" in variants
        else None
    )
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        vl = np.array([r["val_loss"] for r in rs])
        wall = np.mean([r["wall_time_s"] for r in rs])
        gates = np.mean([[abs(float(np.mean(g))) for g in r["gates"]] for r in rs], axis=0)
        rows[v] = {
            "val_loss_mean": float(vl.mean()),
            "val_loss_std": float(vl.std(ddof=1)) if len(vl) > 1 else 0.0,
            "gate_abs_per_layer": gates.tolist(),
            "wall_time_s": float(wall),
            "wall_ratio_to_dense": float(wall / dense_wall) if dense_wall else None,
            "tokens_per_s": float(np.mean([r["tokens_per_s"] for r in rs])),
            "seeds": len(rs),
        }
    # verdict: a difference exceeds run-to-run noise when it is larger than twice the standard
    # error of the difference of the two means (about a 95% two-sided test for normal noise)
    verdict = []
    ref = "dense" if "dense" in rows else variants[0]
    for v in variants:
        if v == ref:
            continue
        a, b = rows[v], rows[ref]
        n = a["seeds"]
        se = (
            math.sqrt((a["val_loss_std"] ** 2 + b["val_loss_std"] ** 2) / n)
            if n > 1
            else float("nan")
        )
        d = a["val_loss_mean"] - b["val_loss_mean"]
        if not math.isfinite(se) or se == 0:
            verdict.append(f"{v} - {ref} = {d:+.4f} nats (one seed: noise not measured)")
        elif abs(d) > 2 * se:
            better = "lower" if d < 0 else "higher"
            verdict.append(
                f"{v} is {better} than {ref} by {abs(d):.4f} nats, beyond run-to-run noise (2 s.e. = {2 * se:.4f})"
            )
        else:
            verdict.append(
                f"{v} - {ref} = {d:+.4f} nats, within run-to-run noise (2 s.e. = {2 * se:.4f})"
            )
    return {"rows": rows, "verdict": verdict, "reference": ref}
