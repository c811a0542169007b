"""Gap ``autograd_exit_abort``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="autograd_exit_abort",
    breaks="a process that ran a backward on the device aborts as it exits (std::terminate, exit status 134) in about "
    "half the runs: every training script's exit status is a coin toss",
    evidence="torch 2.13 [reading: torch/autograd/graph.py stashes a contextvars.Context in autograd's thread-local "
    "state; a device worker thread that drops the last GraphTask and is still waiting for the GIL when "
    "finalization starts is ended by pthread_exit inside a noexcept destructor (a core dump shows it); left "
    "alone, seen in 10 of 20 runs on one machine and 0 of 40 on another; the probe forces the interleaving "
    "and sees it every run]",
    emulator="nothing to emulate: it is torch's own engine, on every profile",
    workaround="autograd_drained_at_exit",
    component="torch",
    intermittent=True,
    emulation="every profile",
)

# torch's exit race, made to happen: a process whose last backward ran on the device exits while autograd's
# worker thread still holds that backward's task (and in it a Python object). Pinned to one CPU, the main thread
# outranks the worker (SCHED_FIFO where the process may, else the worker runs SCHED_IDLE), so the worker is
# still inside that window when the main thread returns; the last exit handler then holds the GIL for 2 ms
# (a ctypes.PyDLL call keeps it) while the worker runs: the worker drops the task, waits for the GIL, and is
# still waiting when the interpreter starts finalizing, which ends the thread inside a noexcept destructor
# (std::terminate, status 134). Without the main thread's priority, the same happens in a fraction of runs
# that depends on the machine's scheduler. `python -c EXIT_RACE_CHILD N` pins it to the N-th allowed CPU.
EXIT_RACE_CHILD = """\
import atexit, ctypes, os, sys

atexit.register(ctypes.PyDLL(None).usleep, 2000)  # registered first, so it runs last
cpus = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpus[int(sys.argv[1]) % len(cpus)] if len(sys.argv) > 1 else cpus[0]})
import torch

x = torch.ones(8, device="tpu", requires_grad=True)
(x * 2).sum().backward()  # starts autograd's device worker
workers = [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith("pt_autograd_")]
assert workers, "no autograd device worker thread (pt_autograd_*) found"
for tid in workers:
    os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except PermissionError:
    pass
(x * 2).sum().backward()
"""

# the smallest script that shows it (``hf-tpu gaps --show autograd_exit_abort``): raises while the gap is present
PROBE = f"""
# The abort is a race between the main thread's exit and autograd's device worker. The child makes it
# happen on purpose (see EXIT_RACE_CHILD), so a few runs show it: on one core its main thread outranks the
# worker, and its last exit handler holds the GIL while the worker runs.
child = {EXIT_RACE_CHILD!r}
for attempt in range(5):
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(
            f"run {{attempt + 1}}: a process that ran a backward exited with {{proc.returncode}} "
            f"(-6 or 134: aborted): {{proc.stderr.strip()[-200:]}}"
        )
"""
