"""Benchmark: many stiff trajectories, fastslow-sim's batched RODAS4 against scipy and diffrax, in one run.

Run: python scripts/bench_integrators.py [--batch 1024] [--reference 64] [--gpu-batch 65536]

Problem (issue 4): 16-state birth-death system (up rate exp(4(y - 1/2)), down rate 1,
g = c.x - y), eps = 1e-4, t in [0, 10], rtol = 1e-6, atol = 1e-9; x0 uniform on the simplex
(Dirichlet(1)), y0 uniform in [0, 1], seed 0. Methods:
  (a) a Python loop over scipy's LSODA with the analytic Jacobian;
  (b) scipy's BDF on the stacked system (batch x 17 unknowns) with `jac_sparsity`
      (block diagonal), so the Jacobian is estimated by grouped finite differences;
  (c) fastslow-sim's RODAS4, all trajectories in one call: the compiled march (the whole
      per-trajectory march in numba, `rosenbrock.compiled`; what `fastslow_sim.integrate` runs
      by default for a neighbour chain on the CPU, and the row the targets are judged on), then
      the torch march (`rosenbrock.solve`) with the Jacobian as an arrow-tridiagonal matrix and
      the step's hot loops (arrow solves, stage sums, error norm) as numba kernels, the same
      with those loops as torch vector operations (`linear_solver="arrow-torch"`), and with the
      Jacobian dense (batched LAPACK LU, `linear_solver="dense"`); on CUDA the torch march.
Largest error at t = 10 against a tight reference (scipy Radau, rtol 1e-10, atol 1e-13, analytic
Jacobian) on an evenly spaced subset of the batch (running it on all 1024 would take minutes).
The LSODA loop runs once (about 40 s); the RODAS4 variants and scipy BDF run back to back in
each of five rounds (`--rounds`): medians are shown, and the target is judged on the median of
the per-round ratios, which the shared machine's drifting speed disturbs least. Target: RODAS4
at least 10x faster than the faster of (a) and (b), largest error at most 1e-5.

(d) diffrax (JAX, the `bench` extra: pip install '.[bench]'; the rows are skipped with the
reason printed where it is absent): `jit(vmap(diffeqsolve))` over the same initial conditions,
float64, the same rtol/atol in a `PIDController` with the stiff settings of diffrax's
documentation, Kvaerno3 and Kvaerno5 (`--diffrax-configs`), on as many CPU threads as torch
uses. The first call (compile and solve) is shown apart from the warm wall; the error is
against the same reference; steps accepted/rejected are summed over trajectories. A diffrax
call takes about a minute, so it runs `--diffrax-rounds` (1) warm calls after the rodas4 rounds,
not interleaved with them; `--diffrax-trajectories N` solves an evenly spaced subset of N (plus
the reference subset) and scales its wall to the full batch (per-trajectory normalisation: a
vmapped solve costs about the same per trajectory at any batch, as its steps run in lockstep).
Target (issue 15): rodas4 at least 20x faster than diffrax's fastest row, at an equal or
smaller error; where rodas4's error at the common tolerances is larger than that row's, rodas4
is run again with rtol and atol halved until it is not (through `fastslow_sim.integrate`), and
the target is judged on that run too. On CUDA, rodas4 at `--gpu-batch` trajectories and, where JAX has CUDA, the diffrax
rows on the same GPU and the same initial conditions.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import scipy
import torch
from scipy.integrate import solve_ivp
from scipy.sparse import block_diag, csr_matrix

import fastslow_sim as fs
from fastslow_sim.integrators import step_elements
from fastslow_sim.rosenbrock import solve
from fastslow_sim.rosenbrock.compiled import march_chain
from fastslow_sim.systems import LinearSlowLaw, MasterEquationSystem
from fastslow_sim.threads import small_problem_threads, torch_threads

N_STATES, EPS, T_END, RTOL, ATOL = 16, 1e-4, 10.0, 1e-6, 1e-9


def problem(batch, seed=0):
    system = MasterEquationSystem(
        fs.BirthDeath(n=N_STATES), LinearSlowLaw(np.arange(N_STATES) / (N_STATES - 1)), EPS
    )
    return system, np.concatenate(fs.random_initial_conditions(system, batch, seed), axis=1)


def run_lsoda(system, z0):
    out, nfev = np.empty_like(z0), 0
    for b in range(len(z0)):
        sol = solve_ivp(
            system.rhs, (0, T_END), z0[b], method="LSODA", jac=system.jacobian, rtol=RTOL, atol=ATOL
        )
        out[b], nfev = sol.y[:, -1], nfev + sol.nfev
    return out, {"nfev": nfev}


def run_bdf_stacked(system, z0):
    B, d = z0.shape

    def rhs(t, flat):
        return system.rhs(t, flat.reshape(B, d)).reshape(-1)

    sparsity = block_diag([csr_matrix(np.ones((d, d)))] * B, format="csr")
    sol = solve_ivp(
        rhs, (0, T_END), z0.reshape(-1), method="BDF", jac_sparsity=sparsity, rtol=RTOL, atol=ATOL
    )
    return sol.y[:, -1].reshape(B, d), {"nfev": sol.nfev, "njev": sol.njev, "nlu": sol.nlu}


def run_rodas4(system, z0, device, linear_solver="auto", march="torch"):
    """rodas4 on `z0 (B, 17)`: the torch march (`rosenbrock.solve`, any device) or the compiled
    CPU march (`rosenbrock.compiled.march_chain`, what `fastslow_sim.integrate` runs by default
    for a neighbour chain on the CPU); the same tableau and step control either way. The torch
    march runs on the threads `integrate` chooses (`small_problem_threads`: one on the CPU for
    1,024 trajectories of 17 unknowns, torch's own setting from 3,856)."""
    z = torch.as_tensor(z0, dtype=torch.float64, device=device)
    t = torch.tensor([0.0, T_END])
    if march == "compiled":
        out, status, stats = march_chain(system.chain_arrays(), z, t, rtol=RTOL, atol=ATOL)
    else:  # on the torch threads `fastslow_sim.integrate` would use for this batch
        field = system.torch_functions(torch.float64, device)
        threads = small_problem_threads("torch", step_elements(system, z.shape[0]), device)
        with torch_threads(threads):
            out, status, stats = solve(field, z, t, rtol=RTOL, atol=ATOL,
                                       linear_solver=linear_solver)  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (
        out[-1].cpu().numpy(),
        status.cpu().numpy(),
        {k: (v.cpu().numpy() if hasattr(v, "cpu") else v) for k, v in stats.items()},
    )


def reference(system, z0, idx):
    out = np.empty((len(idx), z0.shape[1]))
    for i, b in enumerate(idx):
        sol = solve_ivp(
            system.rhs,
            (0, T_END),
            z0[b],
            method="Radau",
            jac=system.jacobian,
            rtol=1e-10,
            atol=1e-13,
        )
        out[i] = sol.y[:, -1]
    return out


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


# ------------------------------------------------------------------------------------------
# diffrax (JAX) as a peer: separate functions, so the rows above stay as they are


def diffrax_missing() -> str | None:
    """Why the diffrax rows cannot run here (None when JAX and diffrax import)."""
    try:
        import diffrax  # noqa: F401
        import jax  # noqa: F401
    except ImportError as err:
        return f"{err.name} is not installed (pip install '.[bench]' adds jax and diffrax)"
    return None


def jax_setup(threads: int):
    """Import JAX with float64 enabled; with `threads == 1`, XLA on the CPU limited to one thread
    as torch is (XLA_FLAGS only takes effect before the first import of jax); otherwise XLA's
    own default, all cores (the two of the build machine, torch's count there too)."""
    if threads == 1 and "jax" not in sys.modules:
        os.environ.setdefault(
            "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def jax_vector_field(system):
    """The benchmark system's `dz/dt` in JAX for one trajectory `z = [x, y]` (17 unknowns):
    `eps dx_i/dt = u x_{i-1} + d x_{i+1} - (u [i < n-1] + d [i > 0]) x_i`, `u = up e^{beta (y -
    y_mid)}`, `dy/dt = c . x + b - a y` (the birth-death chain and linear slow law of `problem`)."""
    import jax.numpy as jnp

    gen, law, eps = system.generator, system.slow_law, system.eps
    n = gen.n_states
    c = jnp.asarray(law.c, dtype=jnp.float64)
    zero = jnp.zeros(1, dtype=jnp.float64)

    def vf(t, z, args):
        x, y = z[:n], z[n]
        u = gen.up * jnp.exp(gen.beta * (y - gen.y_mid))
        up_flux, down_flux = u * x[:-1], gen.down * x[1:]  # i -> i+1 and i+1 -> i
        dx = (
            jnp.concatenate([zero, up_flux]) + jnp.concatenate([down_flux, zero])
            - jnp.concatenate([up_flux, zero]) - jnp.concatenate([zero, down_flux])
        ) / eps  # fmt: skip
        dy = c @ x + law.b - law.a * y
        return jnp.concatenate([dx, dy[None]])

    return vf


def diffrax_solver(system, solver: str, pcoeff: float, icoeff: float, max_steps: int = 65536):
    """`jit(vmap(diffeqsolve))` over initial conditions `(B, 17)`: the final state, steps
    accepted and rejected, and success, per trajectory. Stiff settings as diffrax's documentation
    advises: an implicit ESDIRK (`Kvaerno3`/`Kvaerno5`, whose Newton iterations take the
    controller's tolerances), float64, `PIDController(rtol, atol, pcoeff, icoeff)` (its docstring
    suggests `pcoeff=0.3, icoeff=0.3` among the settings for mildly stiff problems; `pcoeff=0,
    icoeff=1` is its default) and the automatic initial step (`dt0=None`)."""
    import diffrax
    import jax

    term = diffrax.ODETerm(jax_vector_field(system))
    method = getattr(diffrax, solver)()
    controller = diffrax.PIDController(rtol=RTOL, atol=ATOL, pcoeff=pcoeff, icoeff=icoeff)

    def one(z0):
        sol = diffrax.diffeqsolve(
            term, method, 0.0, T_END, None, z0, saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=controller, max_steps=max_steps, throw=False,
        )  # fmt: skip
        return (
            sol.ys[-1],
            sol.stats["num_accepted_steps"],
            sol.stats["num_rejected_steps"],
            sol.result == diffrax.RESULTS.successful,
        )

    return jax.jit(jax.vmap(one))


def run_diffrax(fn, z0):
    """One call of a `diffrax_solver` function, waited for; numpy results."""
    import jax

    out = jax.block_until_ready(fn(jax.numpy.asarray(z0)))
    return tuple(np.asarray(o) for o in out)


def diffrax_subset(B, idx, n_traj):
    """The trajectories a diffrax row solves: all `B`, or an evenly spaced `n_traj` of them plus
    the reference subset `idx`."""
    if n_traj >= B:
        return np.arange(B)
    return np.unique(np.concatenate([idx, np.linspace(0, B - 1, n_traj).astype(int)]))


def diffrax_rows(system, z0, idx, ref, configs, rounds, n_traj, companions=None):
    """Time every diffrax configuration on `n_traj` of the trajectories (all of them by default;
    an evenly spaced subset that contains the reference subset otherwise): the first call
    (compile and solve) apart from the warm calls (median of `rounds`), and the error on the
    reference subset. `companions(error)` may return `{name: (fn, error)}` of rodas4 runs on all
    `B` trajectories: each is timed right before and right after every warm diffrax call, so the
    ratio diffrax/rodas4 per trajectory is taken from calls that shared the machine's speed of
    the moment. Returns rows `(name, warm s, first s, error, accepted, rejected, ok, n, paired)`
    with `paired = {companion: (median ratio, its error)}`."""
    B = len(z0)
    sub = diffrax_subset(B, idx, n_traj)
    pos = np.searchsorted(sub, idx)  # where the reference trajectories sit in the subset
    rows = []
    for solver, pcoeff, icoeff in configs:
        fn = diffrax_solver(system, solver, pcoeff, icoeff)
        t_first, (z, acc, rej, ok) = timed(lambda: run_diffrax(fn, z0[sub]))
        err = float(np.max(np.abs(z[pos] - ref)))
        comps = companions(err) if companions else {}
        times, ratios = [], {k: [] for k in comps}
        for _ in range(rounds):
            before = {k: timed(f)[0] for k, (f, _) in comps.items()}
            t, (z, acc, rej, ok) = timed(lambda: run_diffrax(fn, z0[sub]))
            times.append(t)
            for k, (f, _) in comps.items():
                t_c = (before[k] + timed(f)[0]) / 2
                ratios[k].append((t / len(sub)) / (t_c / B))
        name = f"diffrax {solver}, PIDController(pcoeff={pcoeff:g}, icoeff={icoeff:g})"
        paired = {k: (float(np.median(v)), comps[k][1]) for k, v in ratios.items()}
        rows.append((name, float(np.median(times)), t_first, err, int(acc.sum()), int(rej.sum()),
                     int(ok.sum()), len(sub), paired))  # fmt: skip
        print(f"  ({name}: first call {t_first:.1f} s, warm {float(np.median(times)):.1f} s on "
              f"{len(sub)} trajectories)", flush=True)  # fmt: skip
    return rows


def parse_diffrax_configs(text: str) -> list:
    """`"Kvaerno3:0.3:0.3,Kvaerno5:0.3:0.3"` -> `[("Kvaerno3", 0.3, 0.3), ...]`."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not parts[0]:
            raise ValueError(f"--diffrax-configs: {item!r} is not SOLVER:PCOEFF:ICOEFF")
        try:
            pcoeff, icoeff = float(parts[1]), float(parts[2])
        except ValueError:
            raise ValueError(
                f"--diffrax-configs: {item!r} has a coefficient that is not a number"
            ) from None
        out.append((parts[0], pcoeff, icoeff))
    return out


def compile_text(first: float, warm: float) -> str:
    """The compile time as `first call - warm call`, where that difference resolves it: a warm
    call may take longer than the first (one round, the machine's speed drifting: Kvaerno5's
    first call 103.9 s and its warm one 107.2 s on one run), and a negative time is no estimate."""
    if first > warm:
        return f"so compile about {first - warm:.1f} s"
    return (f"compile time not resolved (the warm call took {warm:.1f} s, no less: the run's "
            f"spread is larger than the compile time)")


def print_diffrax_rows(dfx_rows, B, baseline):
    """Rows in the main table's format; walls scaled to `B` trajectories where a subset ran."""
    for name, warm, first, err, acc, rej, ok, n, _ in dfx_rows:
        wall = warm * B / n
        label = name if n == B else f"{name} (wall scaled from {n} trajectories)"
        print(f"| {label} | {wall:.2f} | {baseline / wall:.2f}x | {err:.2e} | first call (compile "
              f"+ solve) {first:.1f} s, {compile_text(first, warm)}; steps {acc:,} "
              f"accepted, {rej:,} rejected on {n}; {ok}/{n} success |")  # fmt: skip


def judge_diffrax(dfx_rows, t_rodas, B, err_rodas, label):
    """Target (issue 15): rodas4 >= 20x faster than diffrax's fastest row, at equal or better error
    (walls per trajectory, so a diffrax subset compares fairly)."""
    name, warm, _, err, *_, n, _ = min(dfx_rows, key=lambda r: r[1] / r[7])
    speed = (warm / n) / (t_rodas / B)
    met = speed >= 20 and err_rodas <= err
    print(f"target: {label} >= 20x faster than diffrax's fastest row ({name}) at equal or better "
          f"error: {'met' if met else 'NOT met'} ({speed:.1f}x per trajectory; error "
          f"{err_rodas:.1e} against {err:.1e})")  # fmt: skip


def rodas4_at_error(system, z0, idx, ref, target_err, rounds):
    """rodas4 through the public `fastslow_sim.integrate` (default options) with rtol and atol
    halved together until its largest error on the reference subset is at most `target_err`:
    `(rtol, atol, median wall of rounds, error, accepted, rejected, the solve)`, or None after 8
    halvings.
    The wall includes building the result dataset, so it is if anything against rodas4."""
    n = system.n_fast

    def solve(rtol, atol):
        ds = fs.integrate(system, (0.0, T_END), z0[:, :n], z0[:, n:], method="rodas4",
                          rtol=rtol, atol=atol, t_eval=[0.0, T_END])  # fmt: skip
        z = np.concatenate([ds["x"].values[:, -1], ds["y"].values[:, -1]], axis=1)
        return z, int(ds["stat_naccept"].sum()), int(ds["stat_nreject"].sum())

    for k in range(1, 9):
        rtol, atol = RTOL / 2**k, ATOL / 2**k
        z, acc, rej = solve(rtol, atol)
        err = float(np.max(np.abs(z[idx] - ref)))
        if err <= target_err:
            walls = [timed(lambda: solve(rtol, atol))[0] for _ in range(rounds)]
            return rtol, atol, float(np.median(walls)), err, acc, rej, lambda: solve(rtol, atol)
    return None


def judge_paired(dfx_rows):
    """The 20x target on the paired ratios of diffrax's fastest row (see `diffrax_rows`); the
    other rows' paired ratios are printed beside it, not judged."""
    fastest = min(dfx_rows, key=lambda r: r[1] / r[7])
    for row in dfx_rows:
        name, _, _, err, *_, paired = row
        for comp, (speed, err_c) in paired.items():
            if row is not fastest:
                print(f"(paired rounds, not a target) {comp} against {name}: {speed:.1f}x per "
                      f"trajectory; error {err_c:.1e} against {err:.1e}")  # fmt: skip
                continue
            met = speed >= 20 and err_c <= err
            print(f"target (paired rounds): {comp} >= 20x faster than diffrax's fastest row "
                  f"({name}) at equal or better error: {'met' if met else 'NOT met'} ({speed:.1f}x "
                  f"per trajectory, median of the paired ratios; error {err_c:.1e} against "
                  f"{err:.1e})")  # fmt: skip


def gpu_diffrax(sys_g, z0_g, idx_g, ref_g, t_g, err_g, configs, args, dfx_skip):
    """The diffrax rows on the GPU (JAX with CUDA) on the CUDA row's initial conditions."""
    if dfx_skip is not None:
        print(f"(diffrax on the GPU skipped: {dfx_skip})")
        return
    jax = jax_setup(torch.get_num_threads())
    platform = "cpu" if args.accelerator_device == "cpu" else "gpu"
    try:
        dev = jax.devices(platform)
    except RuntimeError as err:
        print(f"(diffrax on the GPU skipped: JAX has no {platform} backend here: "
              f"{str(err).splitlines()[0]}; install jax[cuda12])")  # fmt: skip
        return
    print(f"diffrax rows on {dev[0]}:", flush=True)
    with jax.default_device(dev[0]):
        rows_g = diffrax_rows(sys_g, z0_g, idx_g, ref_g, configs, args.diffrax_rounds,
                              args.gpu_diffrax_trajectories or len(z0_g))  # fmt: skip
    B = len(z0_g)
    n = rows_g[0][7]
    print("| method | trajectories | wall (s) | max error (subset) | statistics |\n"
          "|---|---:|---:|---:|---|")  # fmt: skip
    print(f"| rodas4 (torch, {args.accelerator_device}) | {B} | {t_g:.2f} | {err_g:.2e} | |")
    t_cmp, label = t_g, f"rodas4 ({args.accelerator_device})"
    if n < B:  # a GPU is far from full at a small batch: compare on the same trajectories
        sub = diffrax_subset(B, idx_g, args.gpu_diffrax_trajectories)
        dev_t = torch.device(args.accelerator_device)
        t_cmp = float(np.median([timed(lambda: run_rodas4(sys_g, z0_g[sub], dev_t))[0]
                                 for _ in range(args.gpu_rounds)]))  # fmt: skip
        label = f"rodas4 ({args.accelerator_device}) on the same {n} trajectories"
        print(f"| {label} | {n} | {t_cmp:.2f} | | |")
    for name, warm, first, err, acc_, rej, ok, n_, _ in rows_g:
        print(f"| {name} | {n_} | {warm:.2f} | {err:.2e} | first call {first:.1f} s; steps "
              f"{acc_:,} accepted, {rej:,} rejected; {ok}/{n_} success |")  # fmt: skip
    judge_diffrax(rows_g, t_cmp, n, err_g, label)


def gpu_section(args, configs, dfx_skip):
    """rodas4 at `--gpu-batch` trajectories on CUDA (median of `--gpu-rounds` calls), then the
    diffrax rows on the same GPU and initial conditions where JAX has CUDA."""
    acc = torch.device(args.accelerator_device)
    if acc.type == "cuda" and not torch.cuda.is_available():
        print("\n(no CUDA device here: the GPU rows are not measured)")
        return
    where = (
        f"CUDA {torch.cuda.get_device_name(acc)}"
        if acc.type == "cuda"
        else f"{acc} (a test of the GPU path)"
    )
    sys_g, z0_g = problem(args.gpu_batch, seed=1)
    run_rodas4(sys_g, z0_g[: min(64, args.gpu_batch)], acc)  # warm-up
    times_g = []
    for _ in range(args.gpu_rounds):
        t, (z_g, status_g, st_g) = timed(lambda: run_rodas4(sys_g, z0_g, acc))
        times_g.append(t)
    t_g = float(np.median(times_g))
    print(
        f"\n{where}: rodas4, {args.gpu_batch} trajectories in {t_g:.2f} s (median of "
        f"{args.gpu_rounds}; {args.gpu_batch / t_g:,.0f} trajectories/s), "
        f"{int((status_g == 0).sum())}/{args.gpu_batch} success; steps "
        f"{int(st_g['naccept'].sum()):,} accepted, {int(st_g['nreject'].sum()):,} rejected",
        flush=True,
    )
    idx_g = np.linspace(0, args.gpu_batch - 1, min(args.reference, args.gpu_batch)).astype(int)
    ref_g = reference(sys_g, z0_g, idx_g)
    err_g = np.max(np.abs(z_g[idx_g] - ref_g))
    print(f"max error of rodas4 on {len(idx_g)} of them (scipy Radau reference): {err_g:.1e}")
    gpu_diffrax(sys_g, z0_g, idx_g, ref_g, t_g, err_g, configs, args, dfx_skip)


def main():
    global ATOL  # --atol changes it for every method
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument(
        "--reference", type=int, default=32, help="trajectories in the reference subset"
    )
    parser.add_argument("--gpu-batch", type=int, default=65536)
    parser.add_argument("--skip-lsoda", action="store_true", help="skip the slow LSODA loop")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of the default solver and BDF"
    )
    parser.add_argument(
        "--atol", type=float, default=ATOL, help="absolute tolerance of every method (default 1e-9)"
    )
    parser.add_argument("--skip-diffrax", action="store_true", help="skip the diffrax rows")
    parser.add_argument(
        "--diffrax-configs",
        default="Kvaerno3:0.3:0.3,Kvaerno5:0.3:0.3",
        help="comma-separated SOLVER:PCOEFF:ICOEFF (PIDController coefficients) of the diffrax "
        "rows [Kvaerno3:0.3:0.3,Kvaerno5:0.3:0.3]; SOLVER:0:1 is diffrax's default controller",
    )
    parser.add_argument("--diffrax-rounds", type=int, default=1, help="warm diffrax calls [1]")
    parser.add_argument(
        "--diffrax-trajectories",
        type=int,
        default=None,
        help="solve only an evenly spaced subset of this many with diffrax (default: all)",
    )
    parser.add_argument(
        "--gpu-diffrax-trajectories",
        type=int,
        default=None,
        help="as --diffrax-trajectories, for the diffrax rows on CUDA (default: all of --gpu-batch)",
    )
    parser.add_argument(
        "--gpu-only", action="store_true", help="only the GPU rows (rodas4 and diffrax on CUDA)"
    )
    parser.add_argument("--gpu-rounds", type=int, default=3, help="timed rodas4 calls on CUDA [3]")
    parser.add_argument(
        "--accelerator-device",
        default="cuda",
        help="torch device of the GPU rows [cuda]; 'cpu' runs the same code on the CPU (a test)",
    )
    args = parser.parse_args()
    ATOL = args.atol
    if args.accelerator_device not in ("cuda", "cpu") and not args.accelerator_device.startswith(
        "cuda:"
    ):
        parser.error(
            f"--accelerator-device must be cuda, cuda:N or cpu; got {args.accelerator_device!r}"
        )
    try:
        configs = parse_diffrax_configs(args.diffrax_configs)
    except ValueError as err:
        parser.error(str(err))
    for name in ("batch", "reference", "gpu_batch", "rounds", "diffrax_rounds", "gpu_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")
    for name in ("diffrax_trajectories", "gpu_diffrax_trajectories"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")
    dfx_skip = "--skip-diffrax was given" if args.skip_diffrax else diffrax_missing()
    if args.gpu_only:
        return gpu_section(args, configs, dfx_skip)
    system, z0 = problem(args.batch)
    idx = np.linspace(0, args.batch - 1, min(args.reference, args.batch)).astype(int)
    print(
        f"# bench_integrators: {args.batch} trajectories, 16-state birth-death, eps={EPS:g}, t in [0, {T_END:g}], "
        f"rtol={RTOL:g}, atol={ATOL:g}; torch {torch.__version__} ({torch.get_num_threads()} threads), scipy {scipy.__version__}"
    )
    march_threads = small_problem_threads("torch", step_elements(system, args.batch), "cpu")
    print(f"torch march rows on {march_threads or torch.get_num_threads()} torch thread(s), as "
          f"fastslow_sim.integrate chooses for this batch")  # fmt: skip
    t_ref, ref = timed(lambda: reference(system, z0, idx))
    rows = []
    cpu = torch.device("cpu")

    def rodas_row(name, t, res):
        z_r, status, st = res
        info = (
            f"nfev {int(st['nfev'].sum()):,}; steps {int(st['naccept'].sum()):,} accepted, "
            f"{int(st['nreject'].sum()):,} rejected; {int((status == 0).sum())}/{len(status)} success"
        )
        rows.append((name, t, z_r, info))

    run_rodas4(system, z0[:8], cpu)  # warm-up (and the numba compilation of both marches)
    run_rodas4(system, z0[:8], cpu, march="compiled")
    variants = {  # the first is the default solver, on which the targets are judged
        "rodas4 (compiled march, numba; the default of fastslow_sim.integrate on the CPU)": {
            "march": "compiled"
        },
        "rodas4 (torch, cpu, arrow-tridiagonal Jacobian, numba kernels)": {
            "linear_solver": "arrow-numba"
        },
        "rodas4 (torch, cpu, arrow-tridiagonal Jacobian, torch vector operations)": {
            "linear_solver": "arrow-torch"
        },
        "rodas4 (torch, cpu, dense Jacobian, LAPACK LU)": {"linear_solver": "dense"},
    }
    # every torch variant and the faster baseline back to back in each round; medians, and the
    # per-round ratios (a pair run back to back shares the machine's speed of the moment)
    times = {name: [] for name in variants}
    results, times_bdf = {}, []
    for _ in range(args.rounds):
        for name, kw in variants.items():
            t, results[name] = timed(lambda kw=kw: run_rodas4(system, z0, cpu, **kw))
            times[name].append(t)
        t_b, res_b = timed(lambda: run_bdf_stacked(system, z0))
        times_bdf.append(t_b)
    round_ratios = {name: np.array(times_bdf) / np.array(ts) for name, ts in times.items()}
    for name in variants:
        rodas_row(name, float(np.median(times[name])), results[name])
    z_b, st_b = res_b
    rows.append(
        (
            "scipy BDF, stacked, jac_sparsity",
            float(np.median(times_bdf)),
            z_b,
            f"nfev {st_b['nfev']:,}, njev {st_b['njev']}, nlu {st_b['nlu']}",
        )
    )
    if not args.skip_lsoda:
        t_ls, (z_l, st_l) = timed(lambda: run_lsoda(system, z0))
        rows.append(("scipy LSODA loop, analytic Jacobian", t_ls, z_l, f"nfev {st_l['nfev']:,}"))
    dfx_rows = []
    if dfx_skip is None:
        jax = jax_setup(torch.get_num_threads())
        print(f"diffrax rows (jax {jax.__version__}, CPU):", flush=True)
        first = next(iter(variants))
        err_first = float(np.max(np.abs(results[first][0][idx] - ref)))

        def companions(err):
            comps = {"rodas4 (default solver)": (
                lambda: run_rodas4(system, z0, cpu, **variants[first]), err_first)}
            if err_first > err:  # and rodas4 tightened until it is as accurate
                m = rodas4_at_error(system, z0, idx, ref, err, 1)
                if m is not None:
                    comps[f"rodas4 at rtol {m[0]:.3g}, atol {m[1]:.3g}"] = (m[6], m[3])
            return comps

        with jax.default_device(jax.devices("cpu")[0]):
            dfx_rows = diffrax_rows(system, z0, idx, ref, configs, args.diffrax_rounds,
                                    args.diffrax_trajectories or args.batch, companions)  # fmt: skip
    baseline = min(t for name, t, *_ in rows if name.startswith("scipy"))
    print(
        f"reference: scipy Radau (rtol 1e-10, atol 1e-13) on {len(idx)} trajectories, {t_ref:.1f} s\n"
    )
    print(
        "| method | wall (s) | speed-up vs faster scipy | max error at t=10 (subset) | statistics |"
    )
    print("|---|---:|---:|---:|---|")
    for name, t, z, info in rows:
        err = np.max(np.abs(z[idx] - ref))
        print(f"| {name} | {t:.2f} | {baseline / t:.2f}x | {err:.2e} | {info} |")
    print_diffrax_rows(dfx_rows, args.batch, baseline)
    err_r = np.max(np.abs(rows[0][2][idx] - ref))
    print()
    for name, rr in round_ratios.items():
        print(
            f"per-round speed-up over BDF, {name}: "
            + ", ".join(f"{r:.2f}x" for r in rr)
            + f"; median {np.median(rr):.2f}x"
        )
    ratio = float(np.median(round_ratios[next(iter(variants))]))
    print(
        f"target: rodas4 >= 10x faster than the faster scipy method: {'met' if ratio >= 10 else 'NOT met'} "
        f"({ratio:.2f}x, default solver, median per-round ratio); max error <= 1e-5: "
        f"{'met' if err_r <= 1e-5 else 'NOT met'} ({err_r:.1e})"
    )
    if dfx_rows:
        judge_diffrax(dfx_rows, rows[0][1], args.batch, err_r, "rodas4 (default solver, cpu)")
        best = min(dfx_rows, key=lambda r: r[1] / r[7])
        if err_r > best[3]:  # compare at matched accuracy: tighten rodas4 until it is as accurate
            m = rodas4_at_error(system, z0, idx, ref, best[3], args.rounds)
            if m is None:
                print("rodas4 did not reach diffrax's error within 8 halvings of rtol and atol")
            else:
                rtol_m, atol_m, t_m, err_m, acc_m, rej_m, _ = m
                print(f"rodas4 at matched error (fastslow_sim.integrate, rtol {rtol_m:.3g}, atol "
                      f"{atol_m:.3g}): {t_m:.2f} s (median of {args.rounds}), error {err_m:.2e}, "
                      f"steps {acc_m:,} accepted, {rej_m:,} rejected")  # fmt: skip
                judge_diffrax(dfx_rows, t_m, args.batch, err_m,
                              f"rodas4 at rtol {rtol_m:.3g}, atol {atol_m:.3g}")  # fmt: skip
        judge_paired(dfx_rows)
    else:
        print(f"(diffrax rows skipped: {dfx_skip})")
    gpu_section(args, configs, dfx_skip)


if __name__ == "__main__":
    main()
