"""The bridge: the fast-slow ODE instantiated as an attention network (DESIGN 3.3-3.4).

- `model`: `BridgeConfig`, `FastSlowLM` (fast path, pooled slow path, phi_theta, gate), the
  pooling and upsampling functions that decide causality, generation with a key-value cache;
- `mapping`: the table of ODE objects, their network counterparts and the gap between them;
- `cost`: FLOPs per token per module and variant, checked against torch's flop counter; MFU.
"""

from .cost import flops_per_token, measured_flops_per_token, mfu, peak_flops
from .mapping import MAPPING, render_mapping
from .model import (
    GATES,
    VARIANTS,
    BridgeConfig,
    FastSlowLM,
    block_mean_pool,
    completed_block_index,
    upsample_completed,
)

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
