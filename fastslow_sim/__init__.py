"""fastslow-sim: fast-slow dynamics, master equations and the fast-slow attention network.

The ODE core: `generators` (master-equation generators `Q(y)`), `stationary` (`p_st(Q)` by GTH,
`dp/dy`), `systems` (`eps dx/dt = f(x, y)`, `dy/dt = g(x, y)` with `eps = 1/P`), `integrators`
(`integrate(system, t_span, ...)`), `io` (NetCDF). Plotting lives in `fastslow_sim.analysis`.

The names below, the version and the submodules (`fastslow_sim.io`, ...) are imported on first
use (PEP 562), not with the package: `import fastslow_sim` and the `fastslow-sim` command's start
stay light (numba, xarray and torch load when a name that needs them is first read), and a
Ctrl-C during that loading reaches the command's handler.
"""

from .errors import InputError, ReducibleGeneratorError

# public name -> the submodule that defines it
_LAZY = {
    "__version__": "_version",
    **dict.fromkeys(("BirthDeath", "Cycle", "MichaelisMenten", "RandomIrreducible", "TwoState",
                     "random_generators", "validate_generator"), "generators"),
    **dict.fromkeys(("METHODS", "IgnoredOptionWarning", "MassDriftWarning", "StiffnessWarning",
                     "integrate", "integrate_batch", "random_initial_conditions"), "integrators"),
    **dict.fromkeys(("load_dataset", "save_dataset"), "io"),
    **dict.fromkeys(("chain_stationary", "fundamental_matrix", "stationary_derivative",
                     "stationary_distribution"), "stationary"),
    **dict.fromkeys(("SYSTEMS", "FastSlowSystem", "MasterEquationSystem", "make_system",
                     "resolve_eps"), "systems"),
}  # fmt: skip


def __getattr__(name: str):
    from importlib import import_module
    from importlib.util import find_spec

    module = _LAZY.get(name)
    if module is None:  # a submodule, as `fs.io` was once the package had imported it
        if name.startswith("_") or find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return import_module(f".{name}", __name__)  # the import binds it on the package
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # read once: later reads are plain attribute lookups
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


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
