"""How the ODE objects map onto the network, and what holds exactly versus by analogy.

`MAPPING` is data (rendered by `fastslow-sim mapping` and in the README). Each row names the
ODE object, its network counterpart, whether the correspondence is exact or an analogy, and
the gap between them. The row "generator <-> attention weights" is checked by a test: each row
of causal softmax weights `S` sums to one, so `Q = S - I` is a generator (DESIGN 2), and with
identity value and output maps the bare attention sublayer's update `x <- S x = x + Q x` is one
unit Euler step of the backward master equation; a distribution over tokens moves by
`p <- S^T p = p + Q^T p`, the forward one, conserving total probability. The network's block
adds the residual connection, `x <- x + S x = 2x + Q x`, after LayerNorm.
"""

from __future__ import annotations

MAPPING = [
    {
        "ode": "fast variable x (probability vector, token rate)",
        "network": "residual stream at every token, updated by causal attention over T tokens",
        "holds": "analogy",
        "gap": "the residual stream is an unconstrained vector, not a probability vector; only "
        "the update rate (every token) matches exactly",
    },
    {
        "ode": "slow variable y (moves once per P tokens)",
        "network": "pooled states: causal block means of the residual stream, one per P tokens, "
        "then attention among them",
        "holds": "exact (rate)",
        "gap": "the slow path updates exactly once per completed block, as the multirate map "
        "of DESIGN 3.3; what it computes is learned, not g(x, y)",
    },
    {
        "ode": "eps = 1/P",
        "network": "pooling ratio P (block length in tokens)",
        "holds": "exact",
        "gap": "none: the ratio of update rates is P by construction",
    },
    {
        "ode": "critical manifold phi(y) = p_st(y) (the theorem, linear generator)",
        "network": "phi_theta: the MLP applied to the slow states",
        "holds": "analogy (variational)",
        "gap": "phi_theta approximates p_st only on the master-equation corpus and only as well "
        "as training gets it (issue 6 measures the distance); the trained block is not a "
        "generator, so the identity is a structured limit, not a property of the network",
    },
    {
        "ode": "coupling term (slow variable feeding the fast dynamics)",
        "network": "gated, upsampled slow output: x <- x + tanh(alpha) * u",
        "holds": "exact (structure)",
        "gap": "alpha = 0 at initialisation, so the coupling starts switched off",
    },
    {
        "ode": "initial layer (x relaxes to the manifold in time ~ eps log(1/eps))",
        "network": "the first incomplete block: tokens 0..P-2 read a learned null slow state "
                   "(0..O+P-2 with --pool-offset O)",
        "holds": "analogy",
        "gap": "the network has no relaxation: the null state stands in for 'no slow "
        "information yet', lasting exactly P-1 tokens",
    },
    {
        "ode": "generator Q (rows sum to zero, rates >= 0)",
        "network": "attention weights S (rows of softmax weights sum to one): Q = S - I",
        "holds": "exact (with identity value and output maps)",
        "gap": "with identity W_V and W_O, the bare attention sublayer's update x <- S x = "
        "x + Q x is one unit Euler step of the backward master equation dx/dt = Q x (tested); "
        "a distribution over tokens moves by the forward one, p <- S^T p = p + Q^T p "
        "(eps dx/dt = Q^T x), conserving its total; the block adds the residual connection, "
        "so its update is x <- x + S x = 2x + Q x (tested), and applies LayerNorm first; with "
        "the residual, LayerNorm, learned W_V, W_O and MLPs the trained block is not a "
        "generator",
    },
]


def render_mapping(fmt: str = "text") -> str:
    """The mapping as a Markdown table (`fmt="markdown"`) or aligned text."""
    cols = ("ode", "network", "holds", "gap")
    if fmt == "markdown":
        lines = ["| ODE object | network counterpart | holds | gap |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row[c] for c in cols) + " |" for row in MAPPING]
        return "\n".join(lines)
    out = []
    for row in MAPPING:
        out.append(f"* {row['ode']}\n    network: {row['network']}\n    holds:   {row['holds']}\n"
                   f"    gap:     {row['gap']}")  # fmt: skip
    return "\n".join(out)
