"""Benchmark: the fast-slow network's cost against the dense baseline, side by side.

Run: python scripts/bench_network.py [--rounds N] [--quick] [--only-training-loop]
       [--device cpu|cuda] [--autocast] [--compile] [--fused-adamw]

0. The training loop (forward, backward, gradient clipping, AdamW step, as in
   fastslow_sim.training) of the dense and coupled arms at the `reproduce` defaults
   (TrainConfig: batch 8, L=4, d=128, 4 heads, P=8; the me corpus's 8 symbols) at T = 256 and
   1024, interleaved (every round runs one iteration of each arm, in a rotating order), with
   the coupled arm also run with the plain slow path (`SlowPath.forward_reference`, the
   implementation before the fused upsampling) as a baseline row. The wall-clock ratio
   coupled/dense (median of the per-round ratios) beside the FLOP ratio of
   fastslow_sim.bridge.cost (and, informational only, the idealised causal FLOP ratio: the
   FLOPs of a kernel that skips every masked score of the fast path's causal attention, counted
   as half its square, with the slow path's attention at the full square; torch's CPU kernel
   skips masked scores only at its own block granularity, which this script does not measure);
   beside it the ratio of the process CPU time (all threads: torch's OpenMP workers too)
   and the ratio of each arm's fastest round (both disturbed less by other processes on a
   shared machine), the forward+backward ratio, and the clip+AdamW time per arm (the coupled
   arm has about twice the parameters). The per-round excess of the wall ratio over the FLOP
   ratio has its mean with a 95% t interval (df = rounds - 1; the arms of one round are
   paired) and that mean split exactly into its two parts: clip + AdamW, `(opt_coupled -
   opt_dense) / wall_dense` (work per parameter, which the FLOP model of
   fastslow_sim.bridge.cost does not count: the slow path has as many parameters as the
   dense blocks, and only its FLOPs are amortised over P tokens), and forward+backward, the
   rest. Target (issue 15): the wall ratio within 0.03 of the FLOP ratio, judged on the t
   interval (met inside +-0.03, NOT met outside, else inconclusive). Then (fp32) one layer's
   slow path at the smallest T taken apart, forward+backward of each part beside a dense
   block (`slow_path_breakdown`): pooling and upsampling, attention among pooled tokens,
   phi_theta, and the slow path's linear maps as bare matmuls, each with its FLOP share.

1. Forward plus backward time per step, dense and coupled interleaved in the same run (each
   round runs one step of each, in a rotating order), medians and their ratio, for L=4, d=128,
   4 heads, batch 8, P=8 at T = 256, 1024, 4096 (CPU, fp32). Targets (issue 5): coupled/dense
   <= 1.15 at T=1024 and <= 1.10 at T=4096.
2. The slow-path attention alone (pooled tokens) as T grows: it should scale as (T/P)^2 once
   the quadratic term dominates; the fitted log-log slope over the largest T is printed.
3. Dense-arm training throughput (forward, backward, AdamW step) at the configurations of the
   nanoGPT anchor measured on this machine kind (issue 5: 9,560 tokens/s at T=256, batch 8;
   6,780 tokens/s at T=1024, batch 2). The anchor was measured in another run on an idle
   machine, so this comparison is not interleaved: read it as indicative.
4. On CUDA (when available): bf16 autocast, the same table at T = 8192, and MFU against the
   device's peak.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

from fastslow_sim.bridge import BridgeConfig, FastSlowLM, flops_per_token, mfu
from fastslow_sim.bridge.cost import peak_flops
from fastslow_sim.bridge.model import Block, SlowPath, add_completed, block_mean_pool
from fastslow_sim.me_corpus import MECorpusConfig
from fastslow_sim.training import TrainConfig, make_optimizer, paired_comparison

NANOGPT_ANCHOR = {(256, 8): 9560.0, (1024, 2): 6780.0}
QUICK_TS = [256, 1024]  # --quick: every table at these T only


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def make(variant, T, device, **kw):
    torch.manual_seed(0)
    cfg = BridgeConfig(vocab_size=256, block_size=T, n_layer=4, n_head=4, n_embd=128, P=8,
                       variant=variant, **kw)  # fmt: skip
    return FastSlowLM(cfg).to(device), cfg


def fwd_bwd(model, idx, autocast):
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=autocast):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    model.zero_grad(set_to_none=True)


def time_interleaved(fns: dict, rounds: int, device, warmup: int = 1) -> dict:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotate the order: no function always first
            fn = fns[name]
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def table_dense_vs_coupled(Ts, batch, rounds, device, autocast=False):
    print(f"\n## forward+backward per step, dense vs coupled interleaved ({device.type}, "
          f"{'bf16 autocast' if autocast else 'fp32'}, batch {batch}, medians of {rounds} rounds)")  # fmt: skip
    print("| T | dense (ms) | coupled (ms) | coupled/dense | FLOP ratio | dense tokens/s |"
          + (" MFU dense | MFU coupled |" if device.type == "cuda" else ""))  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if device.type == "cuda" else ""))
    ratios = {}
    for T in Ts:
        (dense, cfg_d), (coupled, cfg_c) = make("dense", T, device), make("coupled", T, device)
        idx = torch.randint(0, 256, (batch, T + 1), device=device, generator=None)
        med = time_interleaved(
            {"dense": lambda: fwd_bwd(dense, idx, autocast), "coupled": lambda: fwd_bwd(coupled, idx, autocast)},
            rounds, device,
        )  # fmt: skip
        ratio = med["coupled"] / med["dense"]
        ratios[T] = ratio
        flop_ratio = flops_per_token(cfg_c, T)["train"] / flops_per_token(cfg_d, T)["train"]
        tps = batch * T / med["dense"]
        row = (f"| {T} | {1e3 * med['dense']:.1f} | {1e3 * med['coupled']:.1f} | {ratio:.3f} | "
               f"{flop_ratio:.3f} | {tps:,.0f} |")  # fmt: skip
        if device.type == "cuda":
            name = torch.cuda.get_device_name()
            m_d = mfu(cfg_d, tps, name, "bf16" if autocast else "fp32", T)
            m_c = mfu(cfg_c, batch * T / med["coupled"], name, "bf16" if autocast else "fp32", T)
            row += f" {m_d:.1%} | {m_c:.1%} |" if m_d is not None else " n/a | n/a |"
        print(row)
    return ratios


def causal_train_flops(cfg, T) -> float:
    """Training FLOPs per token under the idealised causal convention: `train - A_fast / 2`,
    the FLOPs of a kernel that skips every masked score of the fast path's causal attention
    `A_fast`, counted as half its square; the slow path's attention over `T/P` pooled tokens
    stays at the full square. How much of the masked square torch's CPU kernel skips (it works in blocks of
    keys) is not measured here."""
    f = flops_per_token(cfg, T)
    return f["train"] - f["modules"]["fast attention scores+values"]["train"] / 2


def training_loop_table(Ts, rounds, device, autocast=False, warmup=2, compile=False,
                        fused_adamw=False, batch=None):  # fmt: skip
    """The training loop's iteration, dense / coupled / coupled with the reference slow path,
    interleaved: wall (and process CPU time, all threads), split into forward+backward and
    clip+AdamW step;
    `compile`: every arm's model through `torch.compile`, as `train-network --compile` does
    (its compilation in the warm-up); `fused_adamw`: AdamW's fused kernel instead of the training
    loop's default one (faster, not bit for bit the same); `batch`: another batch size than the
    default's (a diagnostic: the target is judged at the defaults); returns {T: (wall ratio,
    FLOP ratio)}."""
    base = TrainConfig()
    default_batch = base.batch_size
    if batch is not None:
        base = TrainConfig(**{**base.__dict__, "batch_size": batch})
    vocab = MECorpusConfig().n_states
    dt = ("bf16 autocast" if autocast else "fp32") + (", torch.compile" if compile else "")
    dt += ", fused AdamW (not the training loop's)" if fused_adamw else ""
    where = "the reproduce defaults" + ("" if base.batch_size == default_batch else " but the batch")
    print(f"\n## training loop (forward, backward, clip, AdamW step) at {where} "
          f"({device.type}, {dt}, batch {base.batch_size}, L={base.n_layer}, d={base.n_embd}, "
          f"P={base.P}, vocabulary {vocab}; {rounds} interleaved rounds; ratios are medians of "
          f"the per-round ratios)")  # fmt: skip
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    peak = peak_flops(name, "bf16" if autocast else "fp32") if name else None
    if name and peak is None:
        print(f"(no peak known for {name!r} in fastslow_sim.bridge.cost.PEAK_FLOPS: no MFU)")
    cols = ["T", "dense ms", "coupled ms", "coupled/dense wall", "FLOP ratio", "wall - FLOP",
            "wall - FLOP: mean, 95% t interval (df)",
            f"the same over means of {BATCH_ROUNDS} rounds (df)", "lag-1 autocorrelation",
            "of which clip+AdamW", "of which fwd+bwd",
            "FLOP ratio, idealised causal (fast attention counted at half its square, slow at the full square; torch's CPU kernel skips masked scores only at its block granularity, not measured)", "coupled/dense process CPU time (all threads)",
            "ratio of fastest rounds",
            "fwd+bwd ratio", "clip+AdamW ms dense / coupled", "reference slow path: coupled ms",
            "reference coupled/dense wall"] + (["MFU dense", "MFU coupled"] if peak else [])  # fmt: skip
    print("| " + " | ".join(cols) + " |\n|" + "---:|" * len(cols))
    out = {}
    for T in Ts:
        arms, cfgs = {}, {}
        for arm in ("dense", "coupled", "coupled-reference"):
            cfg = TrainConfig(**{**base.__dict__, "variant": arm.split("-")[0], "block_size": T})
            torch.manual_seed(0)
            cfgs[arm] = cfg.model_config(vocab)
            model = FastSlowLM(cfgs[arm]).to(device).train()
            if arm == "coupled-reference":
                for sp in model.slow:
                    sp.forward = sp.forward_reference
            opt = make_optimizer(model, cfg)
            if fused_adamw:  # the same groups and hyper-parameters, the fused kernel
                groups = [{"params": g["params"], "weight_decay": g["weight_decay"]}
                          for g in opt.param_groups]  # fmt: skip
                opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)
            gen = torch.Generator().manual_seed(1)
            idx = torch.randint(0, vocab, (cfg.batch_size, T + 1), generator=gen).to(device)
            step_model = torch.compile(model) if compile else model

            def it(model=model, step_model=step_model, opt=opt, idx=idx, clip=cfg.grad_clip):
                """One iteration as in fastslow_sim.training.train; (wall, CPU, fwd+bwd, opt) s."""
                sync(device)
                c0, t0 = time.process_time(), time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    _, loss = step_model(idx[:, :-1], idx[:, 1:])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                sync(device)
                t1 = time.perf_counter()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                sync(device)
                t2 = time.perf_counter()
                return t2 - t0, time.process_time() - c0, t1 - t0, t2 - t1

            arms[arm] = it
        for fn in arms.values():
            for _ in range(warmup):
                fn()
        rec = {k: [] for k in arms}
        names = list(arms)
        for r in range(rounds):
            for k in names[r % 3 :] + names[: r % 3]:  # rotate the order: no arm always first
                rec[k].append(arms[k]())
        a = {k: np.array(v) for k, v in rec.items()}  # (rounds, 4): wall, cpu, fwd+bwd, opt
        med = {k: np.median(v, axis=0) for k, v in a.items()}
        ratios = np.median(a["coupled"] / a["dense"], axis=0)
        ratio, ratio_cpu, ratio_fb = (float(v) for v in ratios[:3])
        ratio_ref = float(np.median(a["coupled-reference"][:, 0] / a["dense"][:, 0]))
        ratio_min = float(a["coupled"][:, 0].min() / a["dense"][:, 0].min())  # least disturbed
        flop_d = flops_per_token(cfgs["dense"], T)["train"]
        flop_c = flops_per_token(cfgs["coupled"], T)["train"]
        flop = flop_c / flop_d
        # the per-round excess over the FLOP ratio, paired by round: its t interval decides
        per_round = a["coupled"][:, 0] / a["dense"][:, 0]
        cmp = paired_comparison(per_round, np.full_like(per_round, flop), margin=0.03)
        # drift correlates neighbouring rounds, which narrows that interval: the same interval
        # over means of blocks of rounds (fewer df, robust to the correlation) must agree
        bm = batch_means_comparison(per_round - flop, margin=0.03)
        r1 = lag1_autocorrelation(per_round)
        # the mean excess split exactly into its two parts, per round over the dense wall:
        # (opt_c - opt_d)/wall_d from clip+AdamW, (fb_c - fb_d)/wall_d - (FLOP - 1) from the rest
        c_, d_ = a["coupled"], a["dense"]
        part_opt = float(np.mean((c_[:, 3] - d_[:, 3]) / d_[:, 0]))
        part_fb = float(np.mean((c_[:, 2] - d_[:, 2]) / d_[:, 0])) - (flop - 1)
        causal = causal_train_flops(cfgs["coupled"], T) / causal_train_flops(cfgs["dense"], T)
        row = (f"| {T} | {1e3 * med['dense'][0]:.1f} | {1e3 * med['coupled'][0]:.1f} | {ratio:.3f} | "
               f"{flop:.3f} | {ratio - flop:+.3f} | {cmp['mean_diff']:+.3f} [{cmp['ci95'][0]:+.3f}, "
               f"{cmp['ci95'][1]:+.3f}] ({cmp['df']}) | {_interval(bm)} | {'n/a' if np.isnan(r1) else f'{r1:+.2f}'} | {part_opt:+.3f} | {part_fb:+.3f} | {causal:.3f} | {ratio_cpu:.3f} | {ratio_min:.3f} | {ratio_fb:.3f} | "
               f"{1e3 * med['dense'][3]:.1f} / {1e3 * med['coupled'][3]:.1f} | "
               f"{1e3 * med['coupled-reference'][0]:.1f} | {ratio_ref:.3f} |")  # fmt: skip
        if peak:
            tokens = base.batch_size * T
            row += (f" {flop_d * tokens / med['dense'][0] / peak:.1%} |"
                    f" {flop_c * tokens / med['coupled'][0] / peak:.1%} |")  # fmt: skip
        print(row, flush=True)
        # informational: the same excess against the idealised causal FLOP ratio (not the target)
        out[T] = (ratio, flop, cmp, bm, causal,
                  paired_comparison(per_round, np.full_like(per_round, causal), margin=0.03))  # fmt: skip
    if base.batch_size != default_batch:
        print(f"(batch {base.batch_size}, not the reproduce default {default_batch}: a diagnostic, "
              "not the target's setting)")  # fmt: skip
    print("target: coupled/dense training-loop wall ratio within 0.03 of the FLOP ratio (judged "
          "on the t intervals of the per-round excess and of its batch means, which need at least "
          f"{2 * BATCH_ROUNDS} rounds: met when both lie inside +-0.03, NOT met when both lie "
          "outside, else inconclusive): " + "; ".join(
              f"T={T} {_verdict(c, b)} (median {r:.3f} vs {f:.3f}, {r - f:+.3f}; mean excess "
              f"{c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}], df {c['df']}; "
              f"batch means {_interval(b)})"
              for T, (r, f, c, b, _, _) in out.items()))  # fmt: skip
    for T, (r, _, _, _, fx, cx) in out.items():
        print(f"informational, not a target: T={T} against the idealised causal FLOP ratio "
              f"{fx:.3f} (a kernel skipping every masked score of the fast path's causal "
              f"attention, counted as half its square; the slow path's attention over T/P "
              f"pooled tokens at the full square; torch's CPU kernel skips masked scores only at its own block "
              f"granularity, not measured here): median {r:.3f}, {r - fx:+.3f}; mean excess "
              f"{cx['mean_diff']:+.3f} [{cx['ci95'][0]:+.3f}, {cx['ci95'][1]:+.3f}], df {cx['df']}")  # fmt: skip
    return {T: (r, f) for T, (r, f, *_) in out.items()}


def slow_path_breakdown(T, rounds, device):
    """Where the slow path's time goes: forward+backward of one layer's parts at the `reproduce`
    defaults (batch 8, C = 128, P = 8), interleaved, medians: a dense block (the yardstick),
    the whole slow path, its plumbing (pooling, gate, upsampling add: full-length memory passes
    that the FLOP model does not count), the attention among pooled tokens and phi_theta (each
    with its LayerNorm and residual), and the slow path's four linear maps as bare matrix
    products (its counted FLOPs at the machine's matmul speed). Prints ms, the share of a dense
    block, and the FLOP share of the same parts."""
    base = TrainConfig()
    cfg = BridgeConfig(vocab_size=MECorpusConfig().n_states, block_size=T, n_layer=base.n_layer,
                       n_head=base.n_head, n_embd=base.n_embd, P=base.P, variant="coupled")  # fmt: skip
    torch.manual_seed(0)
    block, sp = Block(cfg).to(device), SlowPath(cfg).to(device)
    with torch.no_grad():
        sp.alpha.fill_(0.1)  # a live gate: the whole path gets gradients, as in training
    B, C, P, nb = base.batch_size, cfg.n_embd, cfg.P, T // cfg.P
    x = torch.randn(B, T, C, device=device, requires_grad=True)
    g = torch.randn(B, T, C, device=device)
    s = torch.randn(B, nb, C, device=device, requires_grad=True)
    gs = torch.randn(B, nb, C, device=device)
    w = [torch.randn(a, b, device=device, requires_grad=True)
         for a, b in ((C, 3 * C), (C, C), (C, cfg.phi_mult * C), (cfg.phi_mult * C, C))]  # fmt: skip
    rows = s.detach().reshape(B * nb, C).requires_grad_()
    hidden = torch.randn(B * nb, cfg.phi_mult * C, device=device, requires_grad=True)

    def plumbing():
        z = block_mean_pool(x, P)
        padded = sp.gate() * torch.cat([sp.null.expand(B, 1, C), z], dim=1)
        add_completed(x, padded, P).backward(g)

    def matmuls():  # y = a @ W forward, and the input and weight gradients of each
        for a, wi in ((rows, w[0]), (rows, w[1]), (rows, w[2]), (hidden, w[3])):
            y = a @ wi
            y.backward(torch.ones_like(y))

    leaves = [x, s, rows, hidden, *w, *block.parameters(), *sp.parameters()]

    def fresh(fn):  # as the training loop's zero_grad(set_to_none=True): no accumulation
        def run():
            for leaf in leaves:
                leaf.grad = None
            fn()

        return run

    parts = {
        "dense block": lambda: block(x).backward(g),
        "slow path, whole": lambda: sp(x)[0].backward(g),
        "plumbing: pool, gate, upsampling add": plumbing,
        "attention among pooled tokens (+LN)": lambda: (s + sp.attn(sp.ln_a(s))).backward(gs),
        "phi_theta (+LN)": lambda: (s + sp.phi(sp.ln_phi(s))).backward(gs),
        "its 4 linear maps as bare matmuls": matmuls,
    }
    med = time_interleaved({k: fresh(f) for k, f in parts.items()}, rounds, device, warmup=3)
    f = flops_per_token(cfg, T)["modules"]
    block_flops = sum(v["train"] for k, v in f.items() if not k.startswith(("slow", "phi", "lm")))
    slow_flops = {k: v["train"] for k, v in f.items() if k.startswith(("slow", "phi"))}
    flop_share = {
        "slow path, whole": sum(slow_flops.values()),
        "attention among pooled tokens (+LN)": slow_flops["slow attention qkv+proj"]
        + slow_flops["slow attention scores+values"],
        "phi_theta (+LN)": slow_flops["phi_theta"],
        "its 4 linear maps as bare matmuls": slow_flops["slow attention qkv+proj"]
        + slow_flops["phi_theta"],
    }
    print(f"\n## one layer's slow path, forward+backward, T={T} ({device.type}, fp32, batch {B}, "
          f"C={C}, P={P}; {rounds} interleaved rounds, medians)")  # fmt: skip
    print("| part | ms | share of a dense block | FLOP share of a dense block |\n|---|---:|---:|---:|")
    for name, t in med.items():
        share = flop_share.get(name)
        print(f"| {name} | {1e3 * t:.2f} | {t / med['dense block']:.1%} | "
              f"{'' if share is None else f'{share / block_flops:.1%}'} |")  # fmt: skip
    return med


def _verdict(cmp, bm) -> str:
    """met / NOT met / inconclusive from `paired_comparison(..., margin=0.03)` and its
    batch-means twin `bm`: both intervals must agree, and without a batch-means interval (under
    two blocks of rounds) nothing is decided."""
    if bm["df"] < 1:
        return "inconclusive"
    verdicts = set()
    for c in (cmp, bm):
        lo, hi = c["ci95"]
        verdicts.add("met" if c["verdict"] == "equivalent"
                     else "NOT met" if lo > 0.03 or hi < -0.03 else "inconclusive")  # fmt: skip
    return verdicts.pop() if len(verdicts) == 1 else "inconclusive"


BATCH_ROUNDS = 5  # rounds per batch mean


def batch_means_comparison(excess, margin: float, size: int = BATCH_ROUNDS) -> dict:
    """The t interval of the mean of `excess` (one value per round) from the means of
    consecutive blocks of `size` rounds (df = blocks - 1; a trailing partial block is dropped):
    correlation between neighbouring rounds (drift) narrows the per-round interval, much less
    this one. `paired_comparison`'s dict; df 0 (no interval) below two blocks."""
    x = np.asarray(excess, dtype=np.float64)
    blocks = len(x) // size
    # under one whole block, the mean of all rounds: one value, so df 0 and no interval
    means = x[: blocks * size].reshape(blocks, size).mean(axis=1) if blocks else x.mean(keepdims=True)
    return paired_comparison(means, np.zeros_like(means), margin=margin)


def lag1_autocorrelation(x) -> float:
    """Sample autocorrelation at lag 1, `sum (x_i - m)(x_{i+1} - m) / sum (x_i - m)^2`."""
    d = np.asarray(x, dtype=np.float64) - np.mean(x)
    den = float(d @ d)
    return float(d[:-1] @ d[1:]) / den if den > 0 and len(d) >= 3 else float("nan")


def _interval(c) -> str:
    if c["df"] < 1:
        return "n/a (under 2 blocks)"
    return f"{c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] ({c['df']})"


def slow_attention_scaling(Ts, batch, rounds, device):
    print(f"\n## slow-path attention alone (pooled tokens, forward+backward), batch {batch}")
    print("| T | pooled tokens T/P | time (ms) |")
    print("|---:|---:|---:|")
    torch.manual_seed(0)
    cfg = BridgeConfig(vocab_size=256, block_size=max(Ts), n_layer=4, n_head=4, n_embd=128, P=8)
    sp = SlowPath(cfg).to(device)
    times = []
    for T in Ts:
        x = torch.randn(batch, T, 128, device=device)
        s = block_mean_pool(x, 8).requires_grad_(True)

        def run():
            out = sp.attn(sp.ln_a(s))
            out.sum().backward()

        times.append(time_interleaved({"a": run}, rounds, device)["a"])
        print(f"| {T} | {T // 8} | {1e3 * times[-1]:.2f} |")
    slope = np.polyfit(np.log(Ts[-2:]), np.log(times[-2:]), 1)[0]
    print(f"fitted log-log slope of time against T over T = {Ts[-2]}..{Ts[-1]}: {slope:.2f} "
          f"(2 once the (T/P)^2 attention dominates; 1 where the linear projections do)")  # fmt: skip


def training_throughput(rounds, device):
    print("\n## dense-arm training iteration (forward, backward, AdamW step), tokens/s")
    print("| T | batch | median ms/iter | tokens/s | nanoGPT anchor tokens/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for (T, batch), anchor in NANOGPT_ANCHOR.items():
        model, _ = make("dense", T, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        idx = torch.randint(0, 256, (batch, T + 1), device=device)

        def it():
            _, loss = model(idx[:, :-1], idx[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        med = time_interleaved({"it": it}, rounds, device, warmup=2)["it"]
        tps = batch * T / med
        print(
            f"| {T} | {batch} | {1e3 * med:.0f} | {tps:,.0f} | {anchor:,.0f} | {tps / anchor:.2f} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true",
                        help="every table at T = 256 and 1024 only (unless --loop-Ts or --Ts), "
                        "3 rounds each, the slow-path breakdown's too (unless --loop-rounds)")  # fmt: skip
    parser.add_argument(
        "--only-training-loop", action="store_true", help="the training-loop table (0.) alone"
    )
    parser.add_argument(
        "--loop-rounds", type=int, default=None, help="rounds of the training-loop table [--rounds]"
    )
    parser.add_argument(
        "--loop-Ts",
        default="256,1024",
        help="comma-separated T of the training-loop table [256,1024]",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the tables run [cpu]; cuda adds MFU against the device's peak")  # fmt: skip
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast (on cuda)")
    parser.add_argument("--fused-adamw", action="store_true",
                        help="the training-loop table with AdamW's fused kernel (not bit for bit "
                        "the training loop's default AdamW)")  # fmt: skip
    parser.add_argument("--loop-batch", type=int, default=None,
                        help="batch size of the training-loop table [the reproduce default, 8]; "
                        "another value is a diagnostic (how the excess depends on tensor size)")  # fmt: skip
    parser.add_argument("--compile", action="store_true",
                        help="the training-loop table with every arm through torch.compile")  # fmt: skip
    parser.add_argument(
        "--Ts", default=None,
        help="comma-separated T of table 1 on cuda [1024,4096,8192; --quick: 256,1024]",
    )
    args = parser.parse_args()
    if args.rounds < 1 or (args.loop_rounds is not None and args.loop_rounds < 1):
        parser.error("--rounds and --loop-rounds must be positive integers")
    if args.loop_batch is not None and args.loop_batch < 1:
        parser.error("--loop-batch must be a positive integer")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here")
    try:
        loop_Ts = [int(t) for t in args.loop_Ts.split(",")]
        Ts_gpu = ([int(t) for t in args.Ts.split(",")] if args.Ts
                  else QUICK_TS if args.quick else [1024, 4096, 8192])  # fmt: skip
    except ValueError:
        parser.error("--loop-Ts and --Ts take comma-separated integers")
    if min(loop_Ts + Ts_gpu) < 8:
        parser.error("every T must be at least the pooling ratio P = 8")
    rounds = 3 if args.quick else args.rounds
    print(f"# bench_network: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"python {platform.python_version()}")  # fmt: skip
    device = torch.device(args.device)
    training_loop_table(loop_Ts, args.loop_rounds or rounds, device, autocast=args.autocast,
                        compile=args.compile, fused_adamw=args.fused_adamw,
                        batch=args.loop_batch)  # fmt: skip
    if not (args.autocast or args.compile or args.fused_adamw or args.loop_batch):  # the breakdown is fp32: where the excess at the smallest T goes
        loop_rounds = args.loop_rounds or rounds
        slow_path_breakdown(min(loop_Ts), loop_rounds if args.quick else 10 * loop_rounds, device)
    if args.only_training_loop:
        return
    if device.type == "cuda":
        print(f"\n# CUDA: {torch.cuda.get_device_name()}")
        table_dense_vs_coupled(Ts_gpu, 8, rounds, device, autocast=args.autocast)
        return
    cpu = torch.device("cpu")
    Ts = QUICK_TS if args.quick else [256, 1024, 4096]
    ratios = table_dense_vs_coupled(Ts, 8, rounds, cpu)
    slow_attention_scaling(QUICK_TS if args.quick else [1024, 2048, 4096, 8192, 16384, 32768], 8,
                           rounds, cpu)  # fmt: skip
    training_throughput(rounds, cpu)  # (the anchor's T = 256 and 1024)
    targets = {1024: 1.15, 4096: 1.10}
    print("\ntargets: " + "; ".join(
        f"coupled/dense at T={T} <= {lim}: {'met' if ratios[T] <= lim else 'NOT met'} ({ratios[T]:.3f})"
        for T, lim in targets.items() if T in ratios))  # fmt: skip
    if torch.cuda.is_available():
        gpu = torch.device("cuda")
        print(f"\n# CUDA: {torch.cuda.get_device_name()}")
        table_dense_vs_coupled(Ts_gpu, 8, rounds, gpu, autocast=True)
    else:
        print("\n(no CUDA device here: the GPU table is not measured)")


if __name__ == "__main__":
    main()
