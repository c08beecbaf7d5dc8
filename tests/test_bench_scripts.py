"""The benchmark scripts' peer rows and GPU paths, checked on the CPU (no timings asserted)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_integrators")


def test_diffrax_rows_are_skipped_with_a_reason_without_jax(bench, monkeypatch):
    monkeypatch.setitem(sys.modules, "diffrax", None)  # makes `import diffrax` raise ImportError
    reason = bench.diffrax_missing()
    assert reason is not None and "diffrax" in reason and "[bench]" in reason


def test_diffrax_configs_parse_and_bad_ones_name_the_item(bench):
    assert bench.parse_diffrax_configs("Kvaerno3:0.3:0.3,Kvaerno5:0:1") == [
        ("Kvaerno3", 0.3, 0.3),
        ("Kvaerno5", 0.0, 1.0),
    ]
    for bad in ("Kvaerno3", "Kvaerno3:0.3:x", ":0.3:0.3"):
        with pytest.raises(ValueError, match="--diffrax-configs"):
            bench.parse_diffrax_configs(bad)


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_bad_arguments_exit_2_with_one_sentence(bench, monkeypatch, capsys):
    # refused in main()'s argument checks, before any work: checked in process (a subprocess
    # per case cost about 4 s of imports each); one subprocess below checks the script's own exit
    for args, words in ((["--diffrax-configs", "Kvaerno3:a:b"], "--diffrax-configs: 'Kvaerno3:a:b'"),
                        (["--gpu-batch", "0"], "--gpu-batch must be a positive integer"),
                        (["--accelerator-device", "tpu"], "--accelerator-device must be cuda")):  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["bench_integrators.py", *args])
        with pytest.raises(SystemExit) as exit_:
            bench.main()
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"error: {words}" in err and "Traceback" not in err, args
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_integrators.py"),
                        "--gpu-batch", "0"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "error: --gpu-batch must be" in r.stderr
    assert "Traceback" not in r.stderr


def test_jax_vector_field_is_the_systems_rhs(bench):
    """The JAX right-hand side that diffrax integrates is the benchmark system's, to rounding
    (the largest entries are about |Q x|/eps ~ 1e4, so 1e-10 relative is many ulps of slack)."""
    pytest.importorskip("diffrax")
    bench.jax_setup(1)
    import jax.numpy as jnp

    system, z0 = bench.problem(6, seed=3)
    vf = bench.jax_vector_field(system)
    for z in z0:
        want = system.rhs(0.0, z)
        got = np.asarray(vf(0.0, jnp.asarray(z), None))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10 * np.abs(want).max())


def test_judge_diffrax_uses_per_trajectory_walls_and_the_error(bench, capsys):
    # (name, warm s, first s, error, accepted, rejected, ok, trajectories, paired)
    rows = [("a", 10.0, 12.0, 1e-8, 1, 0, 4, 4, {}), ("b", 30.0, 31.0, 5e-8, 1, 0, 16, 16, {})]
    bench.judge_diffrax(rows, t_rodas=1.0, B=64, err_rodas=2e-8, label="r")  # a: 2.5 s/traj
    out = capsys.readouterr().out
    assert "(b)" in out and ": met (120.0x" in out  # b: faster per trajectory (1.9 s), looser
    bench.judge_diffrax(rows[:1], t_rodas=1.0, B=64, err_rodas=2e-8, label="r")
    assert "NOT met (160.0x" in capsys.readouterr().out  # faster, but a larger error than a's


def test_diffrax_rows_never_print_a_negative_compile_time(bench, capsys):
    # (name, warm s, first s, ...): Kvaerno5's warm call once took 107.2 s after a 103.9 s first
    rows = [("k3", 36.1, 40.2, 2e-8, 1, 0, 8, 8, {}), ("k5", 107.2, 103.9, 6e-9, 1, 0, 8, 8, {})]
    bench.print_diffrax_rows(rows, B=8, baseline=8.0)
    k3, k5 = capsys.readouterr().out.splitlines()
    assert "so compile about 4.1 s" in k3
    assert "compile time not resolved (the warm call took 107.2 s" in k5 and "-3.3" not in k5


@pytest.mark.slow
def test_device_check_runs_every_step_on_the_cpu(tmp_path):
    """scripts/device_check.sh with DEVICE_CHECK_CPU=1: the GPU rows' code (rodas4 and diffrax on
    the accelerator path, the bf16 network table) on the CPU at tiny sizes; every step exits 0."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "DEVICE_CHECK_CPU": "1"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh")], env=env,
                       capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count("exit 0") == 4, summary  # imports, device, bench_integrators, network
    assert "rodas4, 8 trajectories" in (tmp_path / "bench_integrators.log").read_text()
    assert "| 16 |" in (tmp_path / "bench_network.log").read_text()


@pytest.mark.slow  # 2.5-7 s; kept out of the 10-minute default run
def test_device_check_stops_within_its_budget(tmp_path):
    """A budget too small for every step: the steps after it are skipped and say so, and the
    script ends long before the steps' own limits would allow (the device time is scarce)."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "DEVICE_CHECK_CPU": "1",
           "DEVICE_CHECK_BUDGET_S": "15"}  # fmt: skip
    t0 = time.perf_counter()
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh")], env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    wall = time.perf_counter() - t0
    summary = (tmp_path / "summary.txt").read_text()
    assert "bench_network: skipped (budget)" in summary, summary
    assert wall < 60, wall  # the budget (15 s) plus the time of the step it cut short
    assert "of the 15-s budget" in r.stdout


def test_batch_means_interval_keeps_its_coverage_under_drift():
    """bench_network judges the training-loop target on two t intervals: per round, and over
    means of 5 rounds. On AR(1) series (phi = 0.7, 40 rounds, true mean 0) the per-round interval
    is too narrow (its nominal 95% coverage is far from kept), the batch-means one much less so;
    on independent rounds both keep about 95%."""
    net = load_script("bench_network")
    rng = np.random.default_rng(0)

    def coverage(phi, trials=400, n=40):
        naive = bm = 0
        for _ in range(trials):
            e = rng.standard_normal(n)
            x = np.empty(n)
            x[0] = e[0] / np.sqrt(1 - phi**2)  # stationary start
            for i in range(1, n):
                x[i] = phi * x[i - 1] + e[i]
            lo, hi = net.paired_comparison(x, np.zeros(n), margin=0.03)["ci95"]
            naive += lo <= 0 <= hi
            lo, hi = net.batch_means_comparison(x, margin=0.03)["ci95"]
            bm += lo <= 0 <= hi
        return naive / trials, bm / trials

    naive, bm = coverage(0.7)
    # theory: the naive standard error is low by about sqrt((1 + phi)/(1 - phi)) = 2.4
    assert naive < 0.75 and bm > naive + 0.1, (naive, bm)
    naive, bm = coverage(0.0)
    assert 0.90 <= naive <= 0.99 and 0.90 <= bm <= 0.99, (naive, bm)  # binomial sd 0.011
    assert abs(net.lag1_autocorrelation(np.arange(40.0)) - (1 - 3 / 40)) < 1e-12  # a ramp: 1 - 3/n
    # the verdict needs both intervals to agree
    inside = {"verdict": "equivalent", "ci95": [-0.01, 0.01], "df": 39}
    outside = {"verdict": "differs", "ci95": [0.05, 0.09], "df": 39}
    wide = {"verdict": "inconclusive", "ci95": [0.01, 0.05], "df": 7}
    assert net._verdict(inside, inside) == "met" and net._verdict(outside, outside) == "NOT met"
    assert net._verdict(inside, wide) == "inconclusive" and net._verdict(outside, wide) == "inconclusive"
    none = net.batch_means_comparison(np.zeros(9), margin=0.03)  # 9 rounds: one block of 5
    assert none["df"] == 0 and net._verdict(inside, none) == "inconclusive"
    assert np.isnan(net.lag1_autocorrelation([1.0, 2.0]))  # under 3 rounds: no estimate


def test_network_training_loop_and_slow_path_breakdown_print_their_tables(capsys):
    """bench_network's training-loop table (with its t interval) and the slow-path breakdown at
    a tiny T: every part is printed, and the FLOP shares are the cost model's (the whole slow
    path's share is that of its attention plus phi_theta's)."""
    import torch

    net = load_script("bench_network")
    net.training_loop_table([16], rounds=3, device=torch.device("cpu"))
    net.slow_path_breakdown(16, rounds=2, device=torch.device("cpu"))
    out = capsys.readouterr().out
    assert "| 16 |" in out and "(2) |" in out  # 3 paired rounds: df 2
    assert "n/a (under 2 blocks)" in out  # 3 rounds make no batch of 5
    # after the target line, one informational line per T against the idealised causal ratio,
    # with its own mean excess and t interval (3 paired rounds: df 2)
    target = out.index("target: coupled/dense training-loop wall ratio")
    info = [line for line in out.splitlines()
            if line.startswith("informational, not a target: T=16 against the idealised causal "
                               "FLOP ratio")]  # fmt: skip
    assert len(info) == 1 and out.index(info[0]) > target, info
    assert "block granularity, not measured here" in info[0]
    assert re.search(r"; mean excess [+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\], df 2$",
                     info[0]), info[0]  # fmt: skip
    breakdown = out[out.index("## one layer's slow path"):]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in breakdown.splitlines()
            if line.startswith("| ") and "%" in line}  # fmt: skip
    assert len(rows) == 6, rows
    share = {k: float(v[2].strip().rstrip("%") or "nan") for k, v in rows.items()}
    whole = share["slow path, whole"]
    parts = share["attention among pooled tokens (+LN)"] + share["phi_theta (+LN)"]
    assert abs(whole - parts) <= 0.15, (whole, parts)  # three shares rounded to 0.1%
    # another batch than the default's is labelled a diagnostic, not the target's setting
    net.training_loop_table([16], rounds=2, device=torch.device("cpu"), batch=3)
    out = capsys.readouterr().out
    assert "but the batch (cpu, fp32, batch 3," in out
    assert "(batch 3, not the reproduce default 8: a diagnostic" in out


def test_idealised_causal_flops_halve_only_the_fast_attention():
    """The idealised causal convention, train - A_fast / 2: the fast path's causal attention
    counted at half its square; the slow path's attention over T/P pooled tokens keeps its full
    square (the old column halved it too)."""
    from fastslow_sim.bridge import BridgeConfig, flops_per_token

    net = load_script("bench_network")
    cfg = BridgeConfig(variant="coupled", block_size=1024)
    m = flops_per_token(cfg, 256)["modules"]
    fast = m["fast attention scores+values"]["train"]
    slow = m["slow attention scores+values"]["train"]
    # 12 L (T/P) C / P = 12 * 4 * 32 * 128 / 8 = 24,576 (L=4, C=128, P=8, T=256): the old
    # convention took half of it away
    assert slow == 24_576
    assert net.causal_train_flops(cfg, 256) == flops_per_token(cfg, 256)["train"] - fast / 2


def test_chain_table_prints_the_o_n_path_beside_the_dense_one(capsys):
    load_script("bench_stationary").chain_table([16, 40], rounds=1)
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 16 |")
            or r.startswith("| 40 |")]  # fmt: skip
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[1]) == 401  # small chains: every point of a default dataset
        assert float(cells[7]) < 1e-12 and float(cells[8]) < 1e-12  # the two paths agree


def _bench_threads_rows(stdout, steps):
    """The two cases' rows of bench_threads' table: both loads, the same numbers on 1 and on
    `--threads` threads, and `steps` training steps in both settings."""
    rows = [ln for ln in stdout.splitlines() if ln.startswith("| birth-death 8")]
    assert [row.split(" | ")[1] for row in rows] == ["idle", "1 busy process"]
    assert all("bit for bit (success)" in row for row in rows), rows
    rows = [ln for ln in stdout.splitlines() if ln.startswith("| network, tiny-gate")]
    assert [row.split(" | ")[1] for row in rows] == ["idle", "1 busy process"]
    assert all(f"({steps} steps) |" in row for row in rows), rows  # both settings trained them


def test_bench_threads_refuses_bad_arguments(monkeypatch, capsys):
    """bench_threads refuses bad arguments in one sentence (its runs: the slow tests below)."""
    bench = load_script("bench_threads")
    n_cases = len(bench.CASES)
    for args in (["--cases", "0"], ["--cases", str(n_cases + 1)], ["--cases", "x"],
                 ["--rounds", "0"], ["--threads", "1"]):  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["bench_threads.py", *args])
        with pytest.raises(SystemExit) as exit_:
            bench.main()
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "error:" in err and "Traceback" not in err, args


@pytest.mark.slow  # 8 s
def test_bench_threads_runs_a_shortened_case(monkeypatch, capsys):
    """bench_threads runs an integrate case and a training case under both loads: in this
    process, on shortened copies of cases 2 and 8 (t_end 10 -> 1, 16 -> 2 training steps on a
    20k-token corpus: an eighth of the steps); the script run as a command on the cases as they
    are: the slow test below."""
    import torch

    bench = load_script("bench_threads")
    keys = list(bench.CASES)
    train_case = next(i for i, v in enumerate(bench.CASES.values(), 1) if v[0] == "train")
    integrate_case, train_key = bench.CASES[keys[1]], keys[train_case - 1]
    assert integrate_case[:3] == ("birth-death", {}, "rodas4") and integrate_case[-1] == 10.0
    assert bench.CASES[train_key][-1] == 16
    cases = dict(bench.CASES)
    cases[keys[1]] = (*integrate_case[:-1], 1.0)
    cases[train_key] = (*bench.CASES[train_key][:-1], 2)
    monkeypatch.setattr(bench, "CASES", cases)
    monkeypatch.setattr(bench, "TRAIN_CORPUS", "me:tokens=20000")
    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", ["bench_threads.py", "--cases", f"2,{train_case}",
                                      "--rounds", "1"])  # fmt: skip
    bench.main()
    _bench_threads_rows(capsys.readouterr().out, 2)
    assert torch.get_num_threads() == threads  # the script's settings do not outlive its runs


@pytest.mark.slow  # 15-50 s: the script as a command, on cases 2 and 8 as they are
def test_bench_threads_runs_its_cases_as_a_command():
    bench = load_script("bench_threads")
    train_case = next(i for i, v in enumerate(bench.CASES.values(), 1) if v[0] == "train")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_threads.py"), "--cases",
                        f"2,{train_case}", "--rounds", "1"], capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    _bench_threads_rows(r.stdout, 16)


def test_march_target_needs_the_speed_and_the_error_against_radau():
    """bench_march's issue-15 verdict: met only when bdf/c2 reaches its target and c2's error
    against the Radau reference is <= 1e-5; otherwise it names what failed."""
    march = load_script("bench_march")
    assert march.target_verdict(51.6, 30.0, 2e-8) == "met"
    slow, wrong = march.target_verdict(12.0, 30.0, 2e-8), march.target_verdict(51.6, 30.0, 3e-4)
    assert slow.startswith("NOT met") and "bdf/c2 12.0x < 30x" in slow and "error" not in slow
    assert wrong.startswith("NOT met") and "error 3.0e-04 > 1e-05" in wrong and "bdf" not in wrong
    both = march.target_verdict(float("nan"), 10.0, float("nan"))
    assert "bdf/c2" in both and "error" in both


class _Counted:
    """A float that counts the +, -, *, /, ** and exp done with it (`OPS[0]`), not the sign
    flips, abs or comparisons: a kernel's `py_func` on arrays of these executes, and so counts,
    what the compiled kernel executes."""

    OPS = [0]

    def __init__(self, v):
        self.v = float(v)

    def _op(self, other, f):
        _Counted.OPS[0] += 1
        return _Counted(f(self.v, other.v if isinstance(other, _Counted) else float(other)))

    def __add__(self, o): return self._op(o, lambda a, b: a + b)  # noqa: E704
    def __radd__(self, o): return self._op(o, lambda a, b: b + a)  # noqa: E704
    def __sub__(self, o): return self._op(o, lambda a, b: a - b)  # noqa: E704
    def __rsub__(self, o): return self._op(o, lambda a, b: b - a)  # noqa: E704
    def __mul__(self, o): return self._op(o, lambda a, b: a * b)  # noqa: E704
    def __rmul__(self, o): return self._op(o, lambda a, b: b * a)  # noqa: E704
    def __truediv__(self, o): return self._op(o, lambda a, b: a / b)  # noqa: E704
    def __rtruediv__(self, o): return self._op(o, lambda a, b: b / a)  # noqa: E704
    def __pow__(self, o): return self._op(o, lambda a, b: a**b)  # noqa: E704
    def exp(self): return self._op(0.0, lambda a, _: float(np.exp(a)))  # noqa: E704
    def __neg__(self): return _Counted(-self.v)  # noqa: E704
    def __abs__(self): return _Counted(abs(self.v))  # noqa: E704
    def __gt__(self, o): return self.v > float(o)  # noqa: E704
    def __ge__(self, o): return self.v >= float(o)  # noqa: E704
    def __lt__(self, o): return self.v < float(o)  # noqa: E704
    def __le__(self, o): return self.v <= float(o)  # noqa: E704
    def __float__(self): return self.v  # noqa: E704


def test_march_flops_per_step_is_what_the_kernels_execute(monkeypatch):
    """bench_march's `flops_per_step` against the operations that the compiled march's kernels
    (`_factor`, `_rhs`, `chain_solve`, `error_norm`, run as Python on counting floats) execute on
    an n-state chain (linear slow law, the heaviest state inside the chain), plus the stage sums
    of `_march_block` (RODAS4: N for the new state, stiffly accurate; the plain error estimate)."""
    import fastslow_sim.cpu_kernels as ck
    import fastslow_sim.rosenbrock.compiled as cm
    from fastslow_sim.rosenbrock import RODAS4

    march = load_script("bench_march")
    for mod in (ck, cm):  # the Python bodies, calling each other's Python bodies
        for name in ("heaviest", "chain_factor", "chain_border", "chain_sigma", "chain_solve",
                     "error_norm", "_error_scale", "_rates", "_rhs", "_factor"):  # fmt: skip
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, getattr(mod, name).py_func)
    rng = np.random.default_rng(0)

    def arr(*shape):
        a = np.empty(shape, dtype=object)
        for i in np.ndindex(shape):
            a[i] = _Counted(rng.uniform(0.1, 1.0))
        return a

    def count(fn, *args):
        _Counted.OPS[0] = 0
        fn(*args)
        return _Counted.OPS[0]

    S = RODAS4.stages
    assert RODAS4.stiffly_accurate and RODAS4.plain_error
    for n in (4, 8):
        N, m1 = n + 1, n - 1
        z = arr(N, 1)
        z[2, 0] = _Counted(5.0)  # the heaviest state, inside the chain
        kr, lr, dr, up, dup = (arr(m1, 1) for _ in range(5))
        inv, pm, g, wv, vv = (arr(n, 1) for _ in range(5))
        w, c, tmp, s, inv_sigma = arr(n), arr(n), arr(4, 1), arr(1), arr(1)
        piv = np.zeros(1, dtype=np.int64)
        beta, a, b, kappa = _Counted(2.0), _Counted(1.0), _Counted(0.5), 0.0
        factor = count(cm._factor, z, n, s, kr, beta, lr, dr, w, c, a, kappa, up, dup, tmp, inv,
                       pm, g, wv, vv, inv_sigma, piv)  # fmt: skip
        assert piv[0] == 2
        rhs = count(cm._rhs, z, n, kr, beta, lr, dr, w, c, b, a, kappa, up, dup, tmp, arr(N, 1))
        solve = count(ck.chain_solve, n, inv, pm, g, wv, vv, inv_sigma, piv, tmp, arr(N, 1))
        norm = count(ck.error_norm, arr(N, 1), arr(N, 1), arr(N, 1), _Counted(1e-6),
                     _Counted(1e-9), arr(1))  # fmt: skip
        stages = sum((N if RODAS4.from_previous[i] else 2 * i * N) + 2 * i * N + 2 * N
                     for i in range(1, S))  # fmt: skip
        assert march.flops_per_step(n) == factor + S * (rhs + solve) + N + norm + stages, n


def test_stationary_tables_call_every_timed_function_before_the_clock(monkeypatch, capsys):
    """bench_stationary's chain and panel tables: one untimed call of every timed function before
    the first clock reading (a compiled kernel's first call would otherwise land in round 1),
    the panel table's at its own size (at BLOCK_MIN states: the blocked kernel's path)."""
    import types

    import fastslow_sim as fs

    stat = load_script("bench_stationary")
    events = []

    def clock():
        events.append("clock")
        return time.perf_counter()

    def spy(name, fn):
        def wrapped(*a, **k):
            events.append((name, a[0].shape[-1] if hasattr(a[0], "shape") else None))
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(stat, "time", types.SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(fs, "stationary_distribution", spy("dense", fs.stationary_distribution))
    monkeypatch.setattr(fs.MasterEquationSystem, "critical_manifold",
                        spy("chain", fs.MasterEquationSystem.critical_manifold))  # fmt: skip
    stat.chain_table([16], rounds=1)
    first = events[: events.index("clock")]
    # the O(n) path, the compiled dense GTH, the vectorised one (through stationary_distribution)
    assert [e[0] for e in first] == ["chain", "dense", "dense"], first
    events.clear()
    for name in ("_censor", "_censor_blocked"):
        monkeypatch.setattr(stat, name, spy(name, getattr(stat, name)))
    stat.panel_table([stat.BLOCK_MIN], rounds=1)
    first = events[: events.index("clock")]
    assert sorted(first) == sorted([("_censor", stat.BLOCK_MIN), ("_censor_blocked", stat.BLOCK_MIN),
                                    ("dense", stat.BLOCK_MIN)]), first  # fmt: skip
    assert f"| {stat.BLOCK_MIN} |" in capsys.readouterr().out


def test_network_quick_keeps_every_table_at_t_256_and_1024_and_3_rounds(monkeypatch, capsys):
    """bench_network --quick: every table (the breakdown and the slow-attention scaling too) at
    T = 256 and 1024 only, 3 rounds."""
    net = load_script("bench_network")
    calls = []

    def record(name, ret=None):
        def table(*args, **kw):
            calls.append((name, args))
            return ret(args) if ret else None

        return table

    monkeypatch.setattr(net, "training_loop_table", record("loop"))
    monkeypatch.setattr(net, "slow_path_breakdown", record("breakdown"))
    monkeypatch.setattr(net, "table_dense_vs_coupled",
                        record("fwd+bwd", lambda a: {T: 1.0 for T in a[0]}))  # fmt: skip
    monkeypatch.setattr(net, "slow_attention_scaling", record("scaling"))
    monkeypatch.setattr(net, "training_throughput", record("throughput"))
    monkeypatch.setattr(sys, "argv", ["bench_network.py", "--quick"])
    net.main()
    capsys.readouterr()
    got = {name: args for name, args in calls}
    assert set(got) == {"loop", "breakdown", "fwd+bwd", "scaling", "throughput"}, calls
    for name in ("loop", "fwd+bwd", "scaling"):
        assert set(got[name][0]) <= {256, 1024}, (name, got[name])
    assert got["breakdown"][0] in (256, 1024)
    rounds = {"loop": got["loop"][1], "breakdown": got["breakdown"][1],
              "fwd+bwd": got["fwd+bwd"][2], "scaling": got["scaling"][2],
              "throughput": got["throughput"][0]}  # fmt: skip
    assert all(r == 3 for r in rounds.values()), rounds
    assert {T for T, _ in net.NANOGPT_ANCHOR} <= {256, 1024}  # the throughput table's T


def test_network_rotates_the_order_and_reads_the_process_cpu_time(monkeypatch, capsys):
    """bench_network: `time_interleaved` (the dense-vs-coupled table, the breakdown) rotates the
    order of its functions per round, as the training-loop table does; the training-loop table's
    CPU column is the process CPU time (all threads: torch's OpenMP workers), not the thread's."""
    import types

    import torch

    net = load_script("bench_network")
    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in ("dense", "coupled")}
    net.time_interleaved(fns, rounds=4, device=torch.device("cpu"), warmup=0)
    assert order == ["dense", "coupled", "coupled", "dense"] * 2, order
    # no thread_time here: the table must read process_time
    monkeypatch.setattr(net, "time", types.SimpleNamespace(perf_counter=time.perf_counter,
                                                           process_time=time.process_time))  # fmt: skip
    net.training_loop_table([16], rounds=1, device=torch.device("cpu"), warmup=0)
    assert "| coupled/dense process CPU time (all threads) |" in capsys.readouterr().out


def test_auto_times_each_row_after_an_identical_untimed_call(monkeypatch, capsys):
    """bench_auto: each timed integrate call (between two clock readings) follows an untimed,
    identical one, so the first row is not charged the first call of the method auto picks."""
    import types

    import fastslow_sim as fs

    auto = load_script("bench_auto")
    events = []

    def clock():
        events.append("clock")
        return time.perf_counter()

    def integrate(system, span, **kw):
        events.append((system.eps, kw["method"], kw["rtol"]))
        return real(system, span, **kw)

    real = fs.integrate
    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(fs, "integrate", integrate)
    monkeypatch.setattr(auto, "EPS", (0.5,))
    monkeypatch.setattr(sys, "argv", ["bench_auto.py", "--t-end", "0.05", "--compare", "rodas4"])
    auto.main()
    assert "| 0.5 | auto |" in capsys.readouterr().out
    clocks = [i for i, e in enumerate(events) if e == "clock"]
    starts = clocks[::2]  # start, stop, start, stop, ...
    timed = [events[i + 1] for i in starts]
    for i, call in zip(starts, timed):
        assert call in events[:i], (call, events)  # the same call, before the clock
    assert [c[1] for c in timed] == ["auto", "rodas4"]


def _ablation(folder, arms, val, tokens, fpt, corpus="text:x.txt", P=None, pool_offset=None):
    import xarray as xr

    import fastslow_sim as fs

    val = np.asarray(val, dtype=float)
    attrs = {"corpus": corpus}
    if P is not None:  # as reproduce records it (pool_offset since it has one)
        attrs["base_config"] = json.dumps({"P": P, "block_size": 256, "batch_size": 8}
                                          | ({} if pool_offset is None else {"pool_offset": pool_offset}))  # fmt: skip
    ds = xr.Dataset(
        {"val_loss": (("arm", "seed"), val),
         "tokens": (("arm", "seed"), np.full(val.shape, tokens)),
         "flops_per_token": ("arm", np.asarray(fpt, dtype=float))},
        coords={"arm": arms, "seed": np.arange(val.shape[1])}, attrs=attrs,
    )  # fmt: skip
    folder.mkdir()
    fs.save_dataset(ds, folder / "ablation.nc")


def test_paired_runs_pairs_by_seed_with_the_t_interval(tmp_path, capsys):
    from scipy import stats

    paired = load_script("paired_runs")
    a = [[2.48, 2.47, 2.49, 2.478, 2.482]]
    b = [[2.50, 2.485, 2.492, 2.49, 2.51, 9.9]]  # a sixth seed that A lacks is left out
    _ablation(tmp_path / "a", ["coupled"], a, 499_712, [7.1e6])
    _ablation(tmp_path / "b", ["dense"], b, 546_816, [6.49e6])
    assert paired.main([str(tmp_path / "a"), "coupled", str(tmp_path / "b"), "dense"]) == 0
    out = capsys.readouterr().out
    d = np.array(a[0]) - np.array(b[0][:5])
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert (f"coupled - dense: {d.mean():+.4f}, 95% t interval [{d.mean() - half:+.4f}, "
            f"{d.mean() + half:+.4f}] (df 4)") in out  # fmt: skip
    assert "| dense | " in out and "| 546,816 | 6.49 M | 3.549e+12 |" in out
    _ablation(tmp_path / "c", ["dense"], b, 546_816, [6.49e6], corpus="me")
    assert paired.main([str(tmp_path / "a"), "coupled", str(tmp_path / "c"), "dense"]) == 2
    assert "different corpora" in capsys.readouterr().err
    assert paired.main([str(tmp_path / "a"), "dense", str(tmp_path / "b"), "dense"]) == 2
    assert "arm 'dense' is not in" in capsys.readouterr().err
    _ablation(tmp_path / "d", ["dense"], [[2.5]], 546_816, [6.49e6])
    import shutil

    import fastslow_sim as fs

    ds = fs.load_dataset(tmp_path / "d" / "ablation.nc").assign_coords(seed=[7])
    shutil.rmtree(tmp_path / "d")
    (tmp_path / "d").mkdir()
    fs.save_dataset(ds, tmp_path / "d" / "ablation.nc")
    assert paired.main([str(tmp_path / "a"), "coupled", str(tmp_path / "d"), "dense"]) == 2
    assert "share no seed" in capsys.readouterr().err


def test_paired_runs_across_P_on_one_corpus(tmp_path, capsys):
    """A grid control: coupled at P=7 on `me:block=8` against coupled at P=8 on `me` (the same
    tokens) pairs with --across-P only; `me:block=4` is another corpus either way."""
    paired = load_script("paired_runs")
    _ablation(tmp_path / "p7", ["coupled"], [[1.41, 1.42, 1.40]], 499_712, [6.99e6],
              corpus="me:block=8", P=7)  # fmt: skip
    _ablation(tmp_path / "p8", ["coupled"], [[1.36, 1.37, 1.365]], 499_712, [6.91e6],
              corpus="me", P=8)  # fmt: skip
    _ablation(tmp_path / "b4", ["coupled"], [[1.36, 1.37, 1.365]], 499_712, [6.91e6],
              corpus="me:block=4", P=8)  # fmt: skip
    args = [str(tmp_path / "p7"), "coupled", str(tmp_path / "p8"), "coupled"]
    assert paired.main(args) == 2
    assert "trained with different P (7 and 8)" in capsys.readouterr().err
    assert paired.main(args + ["--across-P"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("corpus me:block=8 (and me, the same tokens); seeds [0, 1, 2]")
    assert f"| {tmp_path / 'p7'} | 7 | 499,712 | 6.99 M |" in out
    assert f"| {tmp_path / 'p8'} | 8 | 499,712 | 6.91 M |" in out
    assert "coupled - coupled: +0.0450" in out
    assert paired.main([str(tmp_path / "p7"), "coupled", str(tmp_path / "b4"), "coupled",
                        "--across-P"]) == 2  # fmt: skip
    assert "different corpora (me:block=8 and me:block=4)" in capsys.readouterr().err
    # `me` at two P is two corpora, said so (it had read "different corpora (me and me)")
    _ablation(tmp_path / "m4", ["coupled"], [[1.36, 1.37, 1.365]], 499_712, [6.91e6],
              corpus="me", P=4)  # fmt: skip
    assert paired.main([str(tmp_path / "m4"), "coupled", str(tmp_path / "p8"), "coupled"]) == 2
    assert capsys.readouterr().err == (
        "the folders hold different corpora (me and me at P=4 and P=8: an me corpus's blocks are "
        "the model's P unless its spec sets block=N); expected one.\n")  # fmt: skip
    # a spec this version refuses: one sentence, not a traceback
    _ablation(tmp_path / "zz", ["coupled"], [[1.36]], 499_712, [6.91e6], corpus="me:tokens=zz", P=8)
    assert paired.main([str(tmp_path / "zz"), "coupled", str(tmp_path / "p8"), "coupled"]) == 2
    assert capsys.readouterr().err.startswith("a folder's corpus cannot be read: corpus option "
                                              "tokens='zz' is not a positive count")  # fmt: skip


def test_paired_runs_pairs_a_shifted_grid_with_its_offset_shown(tmp_path, capsys):
    """coupled at P=8 with the grid half a block late against coupled at P=8 (a folder written
    before pool_offset existed: offset 0): one P, one corpus, paired as they are."""
    paired = load_script("paired_runs")
    _ablation(tmp_path / "s", ["coupled"], [[1.40, 1.41, 1.405]], 499_712, [6.91e6],
              corpus="me", P=8, pool_offset=4)  # fmt: skip
    _ablation(tmp_path / "p", ["coupled"], [[1.36, 1.37, 1.365]], 499_712, [6.91e6], corpus="me", P=8)
    assert paired.main([str(tmp_path / "s"), "coupled", str(tmp_path / "p"), "coupled"]) == 0
    out = capsys.readouterr().out
    assert f"| coupled | {tmp_path / 's'} | 8 (offset 4) | 499,712 |" in out
    assert f"| coupled | {tmp_path / 'p'} | 8 | 499,712 |" in out
    assert "coupled - coupled: +0.0400" in out
