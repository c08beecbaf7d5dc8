import numpy as np
import pytest

import fastslow_sim

# bind the package's lazy names now, before any test patches a submodule: a name first read
# while `fastslow_sim.integrators.integrate` is patched would keep the stub for the session
for _name in fastslow_sim.__all__:
    getattr(fastslow_sim, _name)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def text_file(tmp_path):
    """A small text corpus of repeated words (about 100 kB)."""
    rng = np.random.default_rng(0)
    words = ["the ", "slow ", "fast ", "manifold ", "token ", "block ", "gate ", "\n"]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(rng.choice(words, 20000)))
    return path


@pytest.fixture
def failing_march(monkeypatch):
    """rodas4's compiled march fails as a march does: NaN from half-way on, status non_finite.
    (Real failures of this kind, atol 1e-300 or rates near 1e174, are now refused or solved.)"""
    import torch

    from fastslow_sim.rosenbrock import STATUS, compiled

    real = compiled.march_chain

    def failing(*args, **kwargs):
        z, status, stats = real(*args, **kwargs)
        z[z.shape[0] // 2 :] = float("nan")
        return z, torch.full_like(status, STATUS.index("non_finite")), stats

    monkeypatch.setattr(compiled, "march_chain", failing)
