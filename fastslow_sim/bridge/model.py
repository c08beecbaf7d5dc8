"""The fast-slow attention network (DESIGN 3.4), in one readable file in the spirit of nanoGPT.

A decoder-only language model over token ids `{0..V-1}^T` with pre-LayerNorm blocks. Each layer
has the usual fast path (causal self-attention over all `T` tokens, then an MLP) and a slow path:

    x (B, T, C) --causal block-mean pooling--> s (B, nb, C)        one pooled token per block,
                                                                   nb = T//P (offset 0)
    s --LayerNorm, causal attention among pooled tokens--> s
    s --LayerNorm, phi_theta (MLP)--> z (B, nb, C)                 the slow state
    z --upsampling by the completed-blocks rule--> u (B, T, C)     token t reads block
                                                                   floor((t+1)/P) - 1, or a
                                                                   learned null state
    x <- x + tanh(alpha) * u                                        zero-initialised gate

The rule for `u` is what keeps the model causal: token `t` only sees blocks that end at or
before `t` (a lag of 0..P-1 tokens, as in the Hourglass transformer's shift by P-1). Repeating
a pooled state over its own block would let every token see the rest of its block (the leak of
karpathy/nanochat issue 844). `pool_offset = o` moves the grid (a control of where the blocks
fall): blocks start at token `o`, and token `t` reads block `floor((t+1-o)/P) - 1` or null.

Gate: `alpha = 0` at initialisation, and nothing else on the slow path is zero-initialised, so
the gate's first gradient `<dL/dout, u>` is non-zero (no "double zero", DESIGN 4).

Variants, one switch (`BridgeConfig.variant`):
- `dense`: no slow path at all;
- `coupled`: slow path and gate trained;
- `frozen-gate`: slow path computed, gate pinned at 0 (so no gradient reaches the slow path,
  whose weights are therefore frozen too: the dense model plus wasted compute; the paper's
  frozen arm as we read it);
- `frozen-slow`: slow-path weights frozen at initialisation, gate trained.
The dense part is built and initialised first, from the same seed, so all four variants have
identical dense weights and identical logits at initialisation.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import InputError
from ..validation import plain_int
from .variants import VARIANTS

GATES = ("scalar", "channel")


@dataclass
class BridgeConfig:
    vocab_size: int = 256
    block_size: int = 256  # context length T_max
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    P: int = 8  # pooling ratio: eps = 1/P
    dropout: float = 0.0
    gate: str = "scalar"  # "scalar" (one alpha per layer) or "channel" (one per channel)
    variant: str = "coupled"
    bias: bool = False
    phi_mult: int = 4  # hidden width of phi_theta, in units of n_embd
    # first token of the pooling grid: blocks are tokens o+jP .. o+jP+P-1, tokens before o read
    # the null state; 0 (blocks at 0, P, 2P, ...) but for a control that moves the grid
    pool_offset: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "phi_mult", "P",
                     "pool_offset"):
            setattr(self, name, plain_int(getattr(self, name)))  # np.int64(8) -> 8
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "phi_mult"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a positive integer; got {value!r}.")
        if self.n_embd % self.n_head:
            raise InputError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; expected a "
                f"width that is a multiple of the number of heads."
            )
        if (
            isinstance(self.P, bool)
            or not isinstance(self.P, int)
            or not 1 <= self.P <= self.block_size
        ):
            raise InputError(
                f"P must be an integer from 1 to the context length {self.block_size}; got P={self.P!r}."
            )
        o = self.pool_offset
        if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < self.P:
            raise InputError(
                f"pool_offset must be an integer from 0 to P - 1 = {self.P - 1}; got {o!r}."
            )
        if self.variant not in VARIANTS:
            raise InputError(f"unknown variant {self.variant!r}; expected one of {list(VARIANTS)}.")
        if self.gate not in GATES:
            raise InputError(f"unknown gate form {self.gate!r}; expected one of {list(GATES)}.")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"dropout must be in [0, 1); got {self.dropout}.")

    @property
    def eps(self) -> float:
        return 1.0 / self.P

    @property
    def has_slow(self) -> bool:
        return self.variant != "dense"

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# pooling and upsampling: the two places where causality is decided


def block_mean_pool(x: torch.Tensor, P: int) -> torch.Tensor:
    """Causal block-mean pooling `(B, T, C) -> (B, T//P, C)`: block `j` is the mean of tokens
    `jP .. jP+P-1`; an incomplete final block is dropped (no token may read it yet)."""
    B, T, C = x.shape
    nb = T // P
    # sum / P is `mean` bit for bit, and its backward divides the small (B, nb, C) gradient
    # before broadcasting it (mean's divides the full-length one); no slice when P divides T
    return (x if nb * P == T else x[:, : nb * P]).reshape(B, nb, P, C).sum(dim=2) / P


def completed_block_index(T: int, P: int, device=None) -> torch.Tensor:
    """Index into `[null, z_0, z_1, ...]` for each token: `floor((t + 1)/P)`; 0 is the null state.

    Token `t` reads block `j = floor((t + 1)/P) - 1`, the last block that ends at or before `t`.
    """
    return torch.div(torch.arange(1, T + 1, device=device), P, rounding_mode="floor")


def upsample_completed(z: torch.Tensor, null: torch.Tensor, P: int, T: int) -> torch.Tensor:
    """`(B, nb, C)` slow states -> `(B, T, C)` by the completed-blocks rule, `null` before block 0.

    Token `t` gets `[null, z_0, z_1, ...][floor((t + 1)/P)]` (see `completed_block_index`).
    Done as "repeat every state P times, drop the first row": a broadcast whose backward is a
    sum over blocks, not the scatter-add that an index gather would need (cheaper on CPUs).
    """
    B, nb, C = z.shape
    padded = torch.cat([null.expand(B, 1, C), z], dim=1)  # (B, nb+1, C)
    repeated = padded[:, :, None, :].expand(B, nb + 1, P, C).reshape(B, (nb + 1) * P, C)
    return repeated[:, 1 : T + 1]  # row s of `repeated` is padded[floor(s/P)]; token t is s = t+1


def _completed_regions(T: int, P: int) -> tuple:
    """Token ranges of `add_completed`: `h` head tokens read index 0, then `K` groups of `P`
    tokens read indices `1..K`, then `r` tail tokens read index `K + 1`."""
    h = min(P - 1, T)
    K = (T - h) // P
    return h, K, T - h - K * P


class _AddCompleted(torch.autograd.Function):
    """`x + upsample_completed(...)` in one pass: the upsampled tensor is never built."""

    @staticmethod
    def forward(ctx, x, padded, P):
        B, T, C = x.shape
        h, K, r = _completed_regions(T, P)
        ctx.P = P
        x = x.contiguous()
        out = torch.empty(x.shape, dtype=torch.result_type(x, padded), device=x.device)
        torch.add(x[:, :h], padded[:, :1], out=out[:, :h])
        if K:
            e = h + K * P
            torch.add(x[:, h:e].view(B, K, P, C), padded[:, 1 : K + 1, None],
                      out=out[:, h:e].view(B, K, P, C))  # fmt: skip
        if r:
            torch.add(x[:, T - r :], padded[:, K + 1 : K + 2], out=out[:, T - r :])
        return out

    @staticmethod
    def backward(ctx, grad):
        B, T, C = grad.shape
        P = ctx.P
        h, K, r = _completed_regions(T, P)
        grad = grad.contiguous()
        parts = [grad[:, :h].sum(1, keepdim=True)]
        if K:
            parts.append(grad[:, h : h + K * P].view(B, K, P, C).sum(2))
        if r:
            parts.append(grad[:, T - r :].sum(1, keepdim=True))
        return grad, torch.cat(parts, 1), None


def add_completed(x: torch.Tensor, padded: torch.Tensor, P: int) -> torch.Tensor:
    """`x + u` with `u[:, t] = padded[:, floor((t + 1)/P)]`, `padded = [null, z_0, z_1, ...]`
    of shape `(B, T//P + 1, C)`: equal to `x + upsample_completed(z, null, P, T)`, in one pass
    over `x` (forward) and one reduction over blocks (backward)."""
    B, T, C = x.shape
    if padded.shape != (B, T // P + 1, C):
        raise ValueError(
            f"padded states of shape {tuple(padded.shape)}; expected {(B, T // P + 1, C)}."
        )
    return _AddCompleted.apply(x, padded, P)


# ----------------------------------------------------------------------------------------------
# modules


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention; `is_causal=True` only for square (query = key length) calls."""

    def __init__(self, config: BridgeConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def _heads(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        shape = (B, T, self.n_head, C // self.n_head)
        return [t.view(shape).transpose(1, 2) for t in (q, k, v)]  # (B, nh, T, hs)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self._heads(x)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def step(self, x, cache: dict, key: str):
        """One new token `x (B, 1, C)` against the cached keys and values (no mask needed: the
        new query may see every cached position)."""
        B, _, C = x.shape
        q, k, v = self._heads(x)
        if key in cache:
            k = torch.cat([cache[key][0], k], dim=2)
            v = torch.cat([cache[key][1], v], dim=2)
        cache[key] = (k, v)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, nh, 1, hs), attn_mask=None on purpose
        return self.c_proj(y.transpose(1, 2).reshape(B, 1, C))


class MLP(nn.Module):
    def __init__(self, config: BridgeConfig, mult: int = 4):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, mult * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(mult * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """The fast path of one layer: pre-LayerNorm attention and MLP."""

    def __init__(self, config: BridgeConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def step(self, x, cache, layer):
        x = x + self.attn.step(self.ln_1(x), cache, f"fast{layer}")
        return x + self.mlp(self.ln_2(x))


class SlowPath(nn.Module):
    """Pooled tokens -> causal attention among blocks -> phi_theta -> gated, upsampled output."""

    def __init__(self, config: BridgeConfig):
        super().__init__()
        self.P = config.P
        self.offset = config.pool_offset
        self.ln_a = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_phi = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.phi = MLP(config, mult=config.phi_mult)  # phi_theta: the learned slow manifold
        # state of the tokens before the first complete block (the initial layer)
        self.null = nn.Parameter(torch.randn(config.n_embd) * 0.02)
        gate_shape = (1,) if config.gate == "scalar" else (config.n_embd,)
        self.alpha = nn.Parameter(torch.zeros(gate_shape))  # tanh(alpha) = 0 at init

    def gate(self) -> torch.Tensor:
        return torch.tanh(self.alpha)

    def slow_states(self, x):
        """`(B, T, C) -> (B, (T - o)//P, C)`: the slow variable after attention and phi_theta,
        `o` the pooling grid's offset (0: `T//P` blocks)."""
        # no slice at offset 0: its backward would build a zero gradient of x's full size
        return self._slow(block_mean_pool(x[:, self.offset :] if self.offset else x, self.P))

    def _slow(self, s):
        if s.shape[1] == 0:
            return s
        s = s + self.attn(self.ln_a(s))  # square (pooled over pooled): is_causal is right here
        return s + self.phi(self.ln_phi(s))

    def forward(self, x):
        z = self.slow_states(x)
        B, _, C = z.shape
        # the gate on the small (B, nb + 1, C) states, then one fused pass over x
        padded = self.gate() * torch.cat([self.null.expand(B, 1, C), z], dim=1)
        o = self.offset
        if not o:
            return add_completed(x, padded, self.P), z
        # tokens before the grid read the null state, as those before its first block do
        return torch.cat([x[:, :o] + padded[:, :1], add_completed(x[:, o:], padded, self.P)], 1), z

    def forward_reference(self, x):
        """The straightforward form of `forward` (pooling as slice and mean, the upsampled tensor
        built, then added): the baseline of tests/test_bridge.py and scripts/bench_network.py."""
        B, T, C = x.shape
        o, P = min(self.offset, T), self.P
        nb = (T - o) // P
        z = self._slow(x[:, o : o + nb * P].reshape(B, nb, P, C).mean(dim=2))
        g = self.gate()
        u = upsample_completed(g * z, g * self.null, P, T - o)  # the tokens from the grid's start
        return x + torch.cat([(g * self.null).expand(B, o, C), u], dim=1), z

    def step(self, x, cache, layer, t):
        """Token `t` (B, 1, C): accumulate the open block; when it completes, make its slow
        state (attention over the cached pooled keys, phi_theta) and append it."""
        if t < self.offset:  # before the pooling grid: the null state, nothing to accumulate
            return x + self.gate() * self.null.expand(x.shape[0], 1, -1)
        t -= self.offset  # position on the grid
        acc_key, z_key = f"acc{layer}", f"z{layer}"
        cache[acc_key] = x if (t % self.P == 0 or acc_key not in cache) else cache[acc_key] + x
        if (t + 1) % self.P == 0:
            s = cache.pop(acc_key) / self.P  # (B, 1, C) the block mean
            s = s + self.attn.step(self.ln_a(s), cache, f"slow{layer}")
            cache[z_key] = s + self.phi(self.ln_phi(s))
        u = cache.get(z_key, self.null.expand(x.shape[0], 1, -1))
        return x + self.gate() * u


class FastSlowLM(nn.Module):
    """Decoder-only LM with tied embedding and head; `variant` switches the slow path."""

    def __init__(self, config: BridgeConfig):
        super().__init__()
        self.config = config
        # dense part first: the same seed gives the same dense weights in every variant
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self._init_dense()
        self.slow = None
        if config.has_slow:
            self.slow = nn.ModuleList([SlowPath(config) for _ in range(config.n_layer)])
            self._init_slow()
            if config.variant == "frozen-gate":
                # the zero gate passes no gradient to the slow path, so freezing its weights
                # changes nothing but this: optimiser and gradient clipping then see exactly
                # the dense model's parameters, and the arm stays bit-identical to dense
                for p in self.slow.parameters():
                    p.requires_grad_(False)
            elif config.variant == "frozen-slow":
                for sp in self.slow:
                    for name, p in sp.named_parameters():
                        if name != "alpha":
                            p.requires_grad_(False)
        self._last_slow_states = None

    def _init_linear_and_embeddings(self, modules, n_residual_proj):
        for m in modules:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
        # GPT-2: scaled init of the projections into the residual stream
        std = 0.02 / math.sqrt(2 * n_residual_proj)
        for m in modules:
            for name, p in m.named_parameters(recurse=False):
                if name == "weight" and getattr(m, "_is_residual_proj", False):
                    nn.init.normal_(p, mean=0.0, std=std)

    def _init_dense(self):
        for block in self.transformer.h:
            block.attn.c_proj._is_residual_proj = True
            block.mlp.c_proj._is_residual_proj = True
        self._init_linear_and_embeddings(list(self.transformer.modules()), self.config.n_layer)

    def _init_slow(self):
        self._init_linear_and_embeddings(list(self.slow.modules()), self.config.n_layer)

    # ------------------------------------------------------------------------------------------

    def _check_idx(self, idx):
        if not isinstance(idx, torch.Tensor):
            raise InputError(
                f"token ids must be a tensor of shape (batch, T); got {type(idx).__name__}."
            )
        if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise InputError(f"token ids must be integers; got dtype {idx.dtype}.")
        if idx.dim() != 2:
            raise InputError(
                f"token ids must have shape (batch, T); got shape {tuple(idx.shape)}"
                + (" (one sequence: pass idx[None])." if idx.dim() == 1 else ".")
            )
        B, T = idx.shape
        if torch.compiler.is_compiling():  # checked by the eager caller; keep the graph whole
            return
        if T > self.config.block_size:
            raise InputError(
                f"sequence length {T} exceeds the context length {self.config.block_size}."
            )
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            raise InputError(
                f"token ids must lie in [0, {self.config.vocab_size - 1}]; got values from "
                f"{int(idx.min())} to {int(idx.max())}."
            )

    def _check_targets(self, targets, idx):
        """`InputError` unless `targets` are token ids of `idx`'s shape in `[0, V-1]` (or -100,
        `F.cross_entropy`'s ignored position)."""
        if not isinstance(targets, torch.Tensor) or targets.dtype not in (
            torch.int64, torch.int32, torch.int16, torch.uint8
        ):  # fmt: skip
            what = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise InputError(f"targets must be a tensor of integer token ids; got {what}.")
        if targets.shape != idx.shape:
            raise InputError(
                f"targets must have the shape of the token ids {tuple(idx.shape)}; got "
                f"{tuple(targets.shape)}."
            )
        if torch.compiler.is_compiling() or not targets.numel():
            return
        V = self.config.vocab_size
        if bool((((targets < 0) & (targets != -100)) | (targets >= V)).any()):  # one sync
            kept = targets[targets != -100]
            raise InputError(
                f"targets must lie in [0, {V - 1}] (or be -100, ignored); "
                f"got values from {int(kept.min())} to {int(kept.max())}."
            )

    def embed(self, idx):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def forward_embeddings(self, x):
        """The network from input embeddings `(B, T, C)` to logits (for gradient-causality tests)."""
        slow_states = []
        for layer, block in enumerate(self.transformer.h):
            x = block(x)
            if self.slow is not None:
                x, z = self.slow[layer](x)
                slow_states.append(z)
        self._last_slow_states = slow_states
        return self.lm_head(self.transformer.ln_f(x))

    def forward(self, idx, targets=None):
        """Logits `(B, T, V)` and, with `targets`, the mean cross-entropy."""
        self._check_idx(idx)
        if targets is not None:
            self._check_targets(targets, idx)
        logits = self.forward_embeddings(self.embed(idx))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1).long())
        return logits, loss

    # accessors for analysis ------------------------------------------------------------------

    def gates(self) -> list:
        """`tanh(alpha)` of every layer (a float per layer, or a list per layer for channel gates)."""
        if self.slow is None:
            return [0.0] * self.config.n_layer
        out = []
        for sp in self.slow:
            g = sp.gate().detach().cpu()
            out.append(float(g) if g.numel() == 1 else g.tolist())
        return out

    def slow_states(self) -> list:
        """Slow states `(B, (T - pool_offset)//P, C)` of every layer from the last forward pass."""
        return self._last_slow_states or []

    # generation with a key-value cache -------------------------------------------------------

    @torch.no_grad()
    def step(self, token, cache: dict, t: int):
        """Logits `(B, V)` for one new token `(B,)` at position `t`, updating `cache` (fast and
        slow keys/values, the open block's running sum and the latest slow state per layer)."""
        x = self.transformer.wte(token[:, None]) + self.transformer.wpe.weight[t]
        for layer, block in enumerate(self.transformer.h):
            x = block.step(x, cache, layer)
            if self.slow is not None:
                x = self.slow[layer].step(x, cache, layer, t)
        return self.lm_head(self.transformer.ln_f(x))[:, 0]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature=1.0, top_k=None, use_cache=True,
                 generator=None):  # fmt: skip
        """Append `max_new_tokens` sampled tokens (greedy when `temperature == 0`)."""
        self._check_idx(idx)
        if idx.shape[1] < 1:
            raise InputError("the prompt must hold at least one token; got an empty prompt.")
        max_new_tokens, top_k = plain_int(max_new_tokens), plain_int(top_k)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:  # fmt: skip
            raise InputError(
                f"max_new_tokens must be a non-negative integer; got {max_new_tokens!r}."
            )
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
                math.isfinite(temperature) and temperature >= 0):  # fmt: skip
            raise InputError(
                f"temperature must be a finite number >= 0 (0: greedy); got {temperature!r}."
            )
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or top_k < 1):  # fmt: skip
            raise InputError(f"top_k must be None or a positive integer; got {top_k!r}.")
        if idx.shape[1] + max_new_tokens > self.config.block_size:
            raise InputError(
                f"prompt ({idx.shape[1]}) plus new tokens ({max_new_tokens}) exceed the context "
                f"length {self.config.block_size}."
            )
        cache: dict = {}
        logits = None
        if use_cache:
            for t in range(idx.shape[1]):
                logits = self.step(idx[:, t], cache, t)
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = self(idx)[0][:, -1]
            nxt = _sample(logits, temperature, top_k, generator)
            idx = torch.cat([idx, nxt[:, None]], dim=1)
            if use_cache and _ < max_new_tokens - 1:
                logits = self.step(nxt, cache, idx.shape[1] - 1)
        return idx


def _sample(logits, temperature, top_k, generator):
    if temperature == 0:
        return logits.argmax(-1)
    # max first: every entry <= 0, so a tiny temperature gives -inf (probability 0), never the
    # inf - inf = NaN of logits / 1e-45; in float64, where a temperature of 1e-300 is not 0
    logits = (logits - logits.max(-1, keepdim=True).values).double() / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], -float("inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)[:, 0]
