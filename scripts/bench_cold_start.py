"""Cold start of `fastslow-sim integrate --eps 0.125`: wall and CPU time, median of 5 runs.

    python scripts/bench_cold_start.py                      # the installed fastslow_sim
    python scripts/bench_cold_start.py before=DIR after=DIR  # source trees, interleaved

Each NAME=DIR puts DIR first on PYTHONPATH (DIR holds the fastslow_sim folder); the trees are run
in turn, round after round, so that a machine's changing load falls on all of them alike. The
first round only warms the file cache.
"""

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROUNDS = 5
CODE = "import sys; from fastslow_sim.cli import main; sys.argv[0] = 'fastslow-sim'; main()"
ARGS = ["integrate", "--eps", "0.125"]


def main(argv):
    trees = dict(a.split("=", 1) for a in argv) or {"installed": None}
    wall = {k: [] for k in trees}
    cpu = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as work:
        for rnd in range(ROUNDS + 1):
            for name, tree in trees.items():
                env = dict(os.environ)
                if tree is not None:
                    env["PYTHONPATH"] = os.path.abspath(tree)
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-c", CODE, *ARGS], cwd=work, env=env,
                                     capture_output=True, text=True)  # fmt: skip
                dt = time.perf_counter() - t0
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if res.returncode != 0:
                    sys.exit(f"{name}: exit status {res.returncode}\n{res.stderr}")
                if rnd:
                    wall[name].append(dt)
                    cpu[name].append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    print(f"# fastslow-sim {' '.join(ARGS)}: median of {ROUNDS}, load {os.getloadavg()[0]:.1f}")
    for name in trees:
        runs = " ".join(f"{t:.2f}" for t in wall[name])
        print(f"{name:10s} wall {statistics.median(wall[name]):.2f} s ({runs}), "
              f"cpu {statistics.median(cpu[name]):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
