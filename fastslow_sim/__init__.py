"""fastslow-sim: fast-slow dynamics, master equations and the fast-slow attention network.

The ODE core: `generators` (master-equation generators `Q(y)`), `stationary` (`p_st(Q)` by GTH,
`dp/dy`), `systems` (`eps dx/dt = f(x, y)`, `dy/dt = g(x, y)` with `eps = 1/P`), `integrators`
(`integrate(system, t_span, ...)`), `io` (NetCDF). Plotting lives in `fastslow_sim.analysis`.
"""

from ._version import __version__
from .errors import InputError, ReducibleGeneratorError
from .generators import (
    BirthDeath,
    Cycle,
    MichaelisMenten,
    RandomIrreducible,
    TwoState,
    random_generators,
    validate_generator,
)
from .integrators import (
    METHODS,
    IgnoredOptionWarning,
    MassDriftWarning,
    StiffnessWarning,
    integrate,
    integrate_batch,
    random_initial_conditions,
)
from .io import load_dataset, save_dataset
from .stationary import (
    chain_stationary,
    fundamental_matrix,
    stationary_derivative,
    stationary_distribution,
)
from .systems import (
    SYSTEMS,
    FastSlowSystem,
    MasterEquationSystem,
    make_system,
    resolve_eps,
)

__all__ = [
    "__version__",
    "InputError",
    "ReducibleGeneratorError",
    "BirthDeath",
    "Cycle",
    "MichaelisMenten",
    "RandomIrreducible",
    "TwoState",
    "random_generators",
    "validate_generator",
    "stationary_distribution",
    "chain_stationary",
    "stationary_derivative",
    "fundamental_matrix",
    "SYSTEMS",
    "FastSlowSystem",
    "MasterEquationSystem",
    "make_system",
    "resolve_eps",
    "METHODS",
    "IgnoredOptionWarning",
    "MassDriftWarning",
    "StiffnessWarning",
    "integrate",
    "integrate_batch",
    "random_initial_conditions",
    "load_dataset",
    "save_dataset",
]
