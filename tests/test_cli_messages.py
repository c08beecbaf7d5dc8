"""CLI messages that state a rule: the rule stated is the one the code applies."""

import re

from click.testing import CliRunner

from fastslow_sim.cli import main
from fastslow_sim.multirate import block_tokens
from fastslow_sim.systems import P_EXACT


def test_eps_below_the_ode_floor_names_the_P_multirate_accepts(tmp_path, monkeypatch):
    """The refusal of eps = 1e-20 offered multirate "for any integer P up to 2**63 - 1", which
    multirate then refused (P = 2**63 - 1 does not come back from eps = 1/P in float64)."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["integrate", "--no-plot", "--out", "a.nc",
                                    "--P", "9" * 20, "--t-end", "0.01"])  # fmt: skip
    assert res.exit_code == 2, res.output
    m = re.search(r"P at most 2\*\*51 = ([\d,]+)", res.output)
    assert m and int(m.group(1).replace(",", "")) == P_EXACT == 2**51, res.output
    assert "up to 2**63 - 1" not in res.output
    # multirate's own check takes the P stated (and 2**62, a power of two below 2**63)
    assert block_tokens(1.0 / P_EXACT) == P_EXACT and block_tokens(2.0**-62) == 2**62
