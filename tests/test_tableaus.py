"""Every Rosenbrock tableau against the theory it claims: its order and its embedded order
from the stability function, L-stability, and a run through `integrate` (a new table is a new
method: issue 14)."""

import numpy as np
import pytest

import fastslow_sim as fs
from fastslow_sim.rosenbrock import TABLEAUS

# (method order p, embedded order) of each table: Hairer and Wanner IV.7 (RODAS4), Sandu et
# al. 1997 (RODAS3)
ORDERS = {"rodas4": (4, 3), "rodas3": (3, 2)}


@pytest.mark.parametrize("name", list(TABLEAUS))
def test_order_from_the_stability_function(name):
    tab = TABLEAUS[name]
    p, p_hat = ORDERS[name]
    z = np.array([1e-2, 2e-2, 4e-2, 8e-2])
    for sign in (1, -1):  # R(z) - e^z = O(z^(p+1)) on both sides of 0
        err = np.abs(tab.stability_function(sign * z) - np.exp(sign * z))
        slope = np.polyfit(np.log(z), np.log(err), 1)[0]
        assert abs(slope - (p + 1)) < 0.1, (name, sign, slope)
    err_hat = np.abs(tab.stability_function(z, embedded=True) - np.exp(z))
    assert abs(np.polyfit(np.log(z), np.log(err_hat), 1)[0] - (p_hat + 1)) < 0.1
    assert tab.order == p_hat + 1  # the step-size exponent is -1/(embedded order + 1)


@pytest.mark.parametrize("name", list(TABLEAUS))
def test_l_stability(name):
    tab = TABLEAUS[name]
    assert tab.stiffly_accurate  # y_new is the last stage: R(-inf) = 0
    assert abs(tab.stability_function(-1e12)) < 1e-9
    # |R| <= 1 on the closed left half-plane (sampled; A-stability)
    r = np.logspace(-3, 6, 200)
    theta = np.linspace(np.pi / 2, 3 * np.pi / 2, 61)
    z = (r[:, None] * np.exp(1j * theta[None, :])).ravel()
    assert np.max(np.abs(tab.stability_function(z))) <= 1 + 1e-12


@pytest.mark.parametrize("name", list(TABLEAUS))
@pytest.mark.slow
def test_each_tableau_is_a_method_of_integrate(name):
    system = fs.make_system("birth-death", eps=1e-3)
    ref = fs.integrate(system, (0, 1), method="radau", rtol=1e-12, atol=1e-14, n_eval=5)
    ds = fs.integrate(system, (0, 1), method=name, rtol=1e-8, atol=1e-11, n_eval=5)
    assert ds.attrs["method"] == name and ds.attrs["status"] == "success"
    assert np.abs(ds["y"].values - ref["y"].values).max() < 1e-6


def test_a_table_without_dense_output_lands_on_the_output_times():
    system = fs.make_system("two-state", eps=1e-2)
    with pytest.raises(fs.InputError, match="'rodas3' has no continuous extension"):
        fs.integrate(system, (0, 1), method="rodas3", dense_output=True)
