import numpy as np
import pytest


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
