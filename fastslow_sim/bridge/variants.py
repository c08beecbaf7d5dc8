"""The network's variants and the ablation's arms, named once (torch-free, so the CLI can list
them without importing torch).

- `dense`: the fast path only (causal attention over all `T` tokens);
- `coupled`: fast path plus the pooled slow path, joined by a zero-initialised gate `tanh(alpha)`;
- `frozen-gate`: coupled with the gate frozen at 0: the dense model plus the slow path's compute
  (DESIGN 4: no gradient reaches the slow path);
- `frozen-slow`: coupled with the slow path's weights frozen at their initialisation, the gate
  trained: what a random slow coupling buys.

The arms of `reproduce` add `dense-matched`: a dense model deepened to the coupled model's
parameter count (`training.matched_depth`).
"""

VARIANTS = ("dense", "coupled", "frozen-gate", "frozen-slow")
ARMS = ("dense", "dense-matched", "coupled", "frozen-gate", "frozen-slow")
