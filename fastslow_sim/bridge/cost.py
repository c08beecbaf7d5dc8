"""FLOPs per token of the fast-slow network, per module and variant (DESIGN 3.4), and MFU.

Conventions (those of `torch.utils.flop_counter`, so the model can be checked against it):
a matrix product of `(m, k) x (k, n)` costs `2 m k n`; attention costs `2 T^2 d` for scores and
`2 T^2 d` for values per sequence (the full square, although a causal kernel can skip half);
backward costs twice the forward for trained weights (input and weight gradients) and once
for frozen ones (input gradients only). The flop counter does not see PyTorch's fused CPU
attention kernels, so `measured_flops_per_token` runs attention through the math backend
(`torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`), whose matrix products it counts.
Element-wise work (LayerNorm, GELU, pooling, upsampling, gate) is not counted: it costs memory
traffic, not matmul FLOPs, which is why wall-clock is measured separately
(scripts/bench_network.py).

Per token, forward, dense part (`C = n_embd`, `V = vocab`, `L` layers, context `T`):
    qkv 6 C^2, attention 4 T C, out-projection 2 C^2, MLP 16 C^2 per layer; head 2 C V.
Slow path per layer, amortised over the `P` tokens of a block (pooled length `T/P`):
    qkv + projection 8 C^2 / P, attention 4 (T/P) C / P, phi_theta 4 m C^2 / P (`m` = phi_mult).
So the dense model costs `6 N + 12 L C T` per token for forward and backward, and the slow path
adds about `6 N_slow / P + 12 L C T / P^2`.
"""

from __future__ import annotations

from ..validation import positive_int
from .model import BridgeConfig

__all__ = ["flops_per_token", "measured_flops_per_token", "mfu", "peak_flops", "PEAK_FLOPS"]

# Dense (no 2:4 sparsity) peaks in FLOP/s from the vendors' data sheets, keyed by the exact
# name `torch.cuda.get_device_name()` reports: bf16 on the tensor cores, fp32 without them.
# A name not in the table has no peak, and no MFU is reported for it (DESIGN 4: never assume an
# A100). One name covers two boards: an H200 NVL (600 W, about 836e12 bf16) reports itself as
# "NVIDIA H200" too, so the SXM figure below overstates its peak by about 18%; scripts/
# device_check.sh logs `nvidia-smi`'s power limit so a reader can tell them apart.
PEAK_FLOPS = {
    ("NVIDIA H200", "bf16"): 989e12,  # H200 SXM: 1,979 TFLOPS with sparsity
    ("NVIDIA H200", "fp32"): 67e12,
    ("NVIDIA H200 NVL", "bf16"): 836e12,
    ("NVIDIA H200 NVL", "fp32"): 60e12,
    ("NVIDIA H100 80GB HBM3", "bf16"): 989e12,  # H100 SXM5
    ("NVIDIA H100 80GB HBM3", "fp32"): 67e12,
    ("NVIDIA H100 PCIe", "bf16"): 756e12,
    ("NVIDIA H100 PCIe", "fp32"): 51e12,
    ("NVIDIA H100 NVL", "bf16"): 835e12,
    ("NVIDIA H100 NVL", "fp32"): 60e12,
    **{(name, "bf16"): 312e12 for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB",
                                            "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe")},
    **{(name, "fp32"): 19.5e12 for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB",
                                             "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe")},
}  # fmt: skip


def peak_flops(device_name: str, dtype: str = "bf16") -> float | None:
    """The dense peak of the device named exactly `device_name` (as `torch.cuda.get_device_name()`
    reports it) for `dtype`, or `None` where it is not in `PEAK_FLOPS` (CPUs, other GPUs)."""
    return PEAK_FLOPS.get((device_name.strip(), dtype))


def flops_per_token(config: BridgeConfig, T: int | None = None) -> dict:
    """FLOPs per token per module, forward and forward+backward, for `config.variant`.

    Returns `{"modules": {name: {"fwd": f, "train": f}}, "fwd": total, "train": total}`.
    `T` (tokens per sequence, a positive integer) defaults to the context length.
    """
    T = config.block_size if T is None else positive_int("T (tokens per sequence)", T)
    C, V, L, P = config.n_embd, config.vocab_size, config.n_layer, config.P
    nb = max(T - config.pool_offset, 0) // P  # complete blocks: the pooled sequence length
    frac = nb / T  # pooled tokens per token (1/P when P divides T)
    modules = {
        "fast attention qkv+proj": L * 8 * C * C,
        "fast attention scores+values": L * 4 * T * C,
        "mlp": L * 16 * C * C,
        "lm_head": 2 * C * V,
    }
    train_factor = {k: 3.0 for k in modules}
    if config.has_slow:
        slow = {
            "slow attention qkv+proj": L * 8 * C * C * frac,
            "slow attention scores+values": L * 4 * nb * C * frac,
            "phi_theta": L * 4 * config.phi_mult * C * C * frac,
        }
        modules.update(slow)
        # frozen slow weights (frozen-slow, and frozen-gate whose zero gate passes no gradient):
        # their matmuls need input gradients only (x2, not x3); the
        # attention products have no weights, both operands still need gradients (x3)
        factor = 2.0 if config.variant in ("frozen-slow", "frozen-gate") else 3.0
        train_factor.update({k: factor for k in slow})
        train_factor["slow attention scores+values"] = 3.0
    out = {k: {"fwd": float(v), "train": float(v * train_factor[k])} for k, v in modules.items()}
    return {
        "modules": out,
        "fwd": sum(m["fwd"] for m in out.values()),
        "train": sum(m["train"] for m in out.values()),
        "T": T,
        "variant": config.variant,
    }


def measured_flops_per_token(model, idx, targets=None, backward: bool = True) -> float:
    """FLOPs per token counted by `torch.utils.flop_counter.FlopCounterMode` for one step.

    Attention runs through the math backend (`SDPBackend.MATH`), whose matrix products the
    counter sees (it misses the fused CPU kernels); the count is flops / `idx.numel()`.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        logits, loss = model(idx, targets if targets is not None else idx)
        if backward:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / idx.numel()


def mfu(config: BridgeConfig, tokens_per_s: float, device_name: str, dtype: str = "bf16",
        T: int | None = None) -> float | None:  # fmt: skip
    """Model FLOPs utilisation: training FLOPs per token times tokens/s over the device's peak."""
    return utilisation(flops_per_token(config, T)["train"], tokens_per_s, device_name, dtype)


def utilisation(flops_per_tok: float, tokens_per_s: float | None, device_name: str,
                dtype: str = "bf16") -> float | None:  # fmt: skip
    """`flops_per_tok * tokens_per_s / peak`, or None where the device has no peak in
    `PEAK_FLOPS` or no throughput was measured."""
    peak = peak_flops(device_name, dtype)
    if peak is None or tokens_per_s is None:
        return None
    return flops_per_tok * tokens_per_s / peak
