"""The bridge: the fast-slow ODE instantiated as an attention network (DESIGN 3.3-3.4).

- `model`: `BridgeConfig`, `FastSlowLM` (fast path, pooled slow path, phi_theta, gate), the
  pooling and upsampling functions that decide causality, generation with a key-value cache;
- `mapping`: the table of ODE objects, their network counterparts and the gap between them;
- `cost`: FLOPs per token per module and variant, checked against torch's flop counter; MFU.

`model` and `cost` need torch; they are imported on first use of one of their names, so that
`fastslow_sim.bridge.mapping` (the `mapping` command) starts without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .mapping import MAPPING, render_mapping

if TYPE_CHECKING:
    from .cost import flops_per_token, measured_flops_per_token, mfu, peak_flops
    from .model import (
        GATES,
        VARIANTS,
        BridgeConfig,
        FastSlowLM,
        block_mean_pool,
        completed_block_index,
        upsample_completed,
    )

# name -> the submodule that defines it (imported lazily by __getattr__)
_LAZY = {
    **dict.fromkeys(["flops_per_token", "measured_flops_per_token", "mfu", "peak_flops"], "cost"),
    **dict.fromkeys(
        ["GATES", "VARIANTS", "BridgeConfig", "FastSlowLM", "block_mean_pool",
         "completed_block_index", "upsample_completed"],
        "model",
    ),
}  # fmt: skip

__all__ = [
    "BridgeConfig",
    "FastSlowLM",
    "VARIANTS",
    "GATES",
    "block_mean_pool",
    "completed_block_index",
    "upsample_completed",
    "MAPPING",
    "render_mapping",
    "flops_per_token",
    "measured_flops_per_token",
    "mfu",
    "peak_flops",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
