"""torch's intra-op threads: one for small solver problems, where a second one gains nothing.

Under OpenMP each parallel torch operation waits for all its threads. On a machine where another
process holds a core, the scheduler puts one of them behind it and the operation waits up to a
time slice (milliseconds) however small its tensor. The ODE solvers' torch methods therefore run
small problems (`integrators.step_elements`, the largest tensor of one step) on one thread,
which costs nothing on an idle machine. The training loop keeps torch's setting unless told
(`TrainConfig.threads`, `--threads`): a small network does gain from a second thread when the
machine is idle. Measurements: `scripts/bench_threads.py`, scripts/BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import os

from .errors import InputError
from .validation import number

SMALL_PROBLEM_ELEMENTS = 2**16  # a step's largest tensor up to which torch runs on one thread


def small_problem_threads(backend: str, elements: int, device=None) -> int | None:
    """1 for torch work on the CPU whose steps' largest tensor has at most 2^16 elements, else
    `None` (torch's own setting). ODE solvers on two cores, idle: such problems ran as fast on one
    thread as on two (0.98-1.03x); with one busy process on the other core two threads were
    1.06-5.7x slower. Above it two threads gained up to 1.47x idle, and lost 2.3-2.5x busy.
    `backend`: the method's (`"scipy"` and the numba march run no torch operations: `None`)."""
    if backend not in ("torch", "torchdiffeq"):
        return None
    if device is not None:
        import torch

        if torch.device(device).type != "cpu":  # (a valid device, checked by the caller)
            return None
    return 1 if elements <= SMALL_PROBLEM_ELEMENTS else None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the platform has one (a
    container or `taskset` may allow fewer than the machine's `os.cpu_count()`), else
    `os.cpu_count()`; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        with contextlib.suppress(OSError):
            return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def check_threads(threads, name: str = "threads") -> int:
    """`threads` as an int from 1 to the CPUs this process may use (`usable_cpus`), or
    `InputError` naming it `name`."""
    cpus = usable_cpus()
    if not isinstance(threads, bool):
        with contextlib.suppress(InputError):
            return int(number(name, threads, 1, cpus, integer=True))
    raise InputError(f"{name} must be an integer from 1 to {cpus} (the CPUs this process may use); got "
                     f"{threads!r}.")  # fmt: skip


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads set to `threads` inside the block (`None`: unchanged), restored
    after. With OpenMP torch keeps the setting per OS thread, so this is the calling thread's;
    a thread that first uses torch while the block runs elsewhere may start with `threads`
    (torch's default for new threads is the last value set), which changes its speed, never
    its numbers."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
