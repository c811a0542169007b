"""The documented switches, every way they meet: each combination finishes, with the expected backend or a clear
error naming the conflict; never a hang (each cell is a fresh process under a timeout) and never an abort.

Switches: ``HF_TPU_EMULATE`` (unset, 1, 0) x an explicit ``hf_tpu.emulator.enable()`` (none, before ``import
torch``, after it) x the library imported first (torch, transformers, diffusers, accelerate); and each ``hf-tpu``
command that touches the device, under each value of the variable. On the real wheel's run (``make xla-cpu``) the
same cells run with ``HF_TPU_XLA_CPU=1`` as well: mixing it with emulation is an error naming both switches.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import XLA_CPU

VARIABLE = (None, "1", "0")  # HF_TPU_EMULATE
CALL = ("none", "before", "after")  # hf_tpu.emulator.enable() before or after `import torch`
FIRST = ("torch", "transformers", "diffusers", "accelerate")
TIMEOUT = 240  # seconds a cell gets: the slowest (import diffusers, then the device) takes ~10 on 2 cores
CONFLICT = "ask for two different 'tpu' devices"
EXAMPLE = Path(__file__).parent / "switch_script.py"

CELL = """
import {first}
import hf_tpu
{before}
import torch
{after}
print("BACKEND", hf_tpu.backend(), torch.ones(2, device="tpu").sum().item() if hf_tpu.backend() != "none" else "-")
"""
ENABLE = "import hf_tpu.emulator; hf_tpu.emulator.enable(quiet=True)"


def _env(variable: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    if variable is not None:
        env["HF_TPU_EMULATE"] = variable
    return env


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None  # a hang


def _expected(variable: str | None, call: str) -> str:
    """The backend a cell must end with (or "conflict": the error naming both switches)."""
    if XLA_CPU:
        return "conflict" if variable == "1" or call != "none" else "xla_cpu"
    return "emulated" if variable == "1" or call != "none" else "none"


PYTHON_CELLS = list(itertools.product(VARIABLE, CALL, FIRST))


@pytest.fixture(scope="module")
def python_cells():
    """Every cell at once, one per core: each test reads its own."""
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 1)) as pool:
        futures = {}
        for variable, call, first in PYTHON_CELLS:
            code = CELL.format(
                first=first, before=ENABLE if call == "before" else "", after=ENABLE if call == "after" else ""
            )
            futures[(variable, call, first)] = pool.submit(_run, [sys.executable, "-c", code], _env(variable))
        yield {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize(
    ("variable", "call", "first"), PYTHON_CELLS, ids=[f"EMULATE={v}-enable_{c}-{f}_first" for v, c, f in PYTHON_CELLS]
)
def test_switches_meet_without_a_hang(python_cells, variable, call, first):
    proc = python_cells[(variable, call, first)]
    assert proc is not None, f"no answer within {TIMEOUT} s: a hang"
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    expected = _expected(variable, call)
    if expected == "conflict":
        assert CONFLICT in proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("BACKEND"))
    assert line.split()[1] == expected, (line, proc.stderr[-2000:])
    assert line.split()[2] == ("-" if expected == "none" else "2.0")


COMMANDS = {
    "gaps": ["gaps", "--only", "cholesky", "--no-save"],
    "gaps-fixes": ["gaps", "--fixes"],
    "env": ["env"],
    "info": ["info"],
    "launch": ["launch", "-n", "2", str(EXAMPLE)],
}
CLI_CELLS = list(itertools.product(VARIABLE, COMMANDS))


@pytest.fixture(scope="module")
def cli_cells():
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 1)) as pool:
        futures = {
            (variable, name): pool.submit(_run, [sys.executable, "-m", "hf_tpu", *COMMANDS[name]], _env(variable))
            for variable, name in CLI_CELLS
        }
        yield {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize(("variable", "command"), CLI_CELLS, ids=[f"EMULATE={v}-{c}" for v, c in CLI_CELLS])
def test_every_command_under_every_value_finishes(cli_cells, variable, command):
    proc = cli_cells[(variable, command)]
    assert proc is not None, f"hf-tpu {command}: no answer within {TIMEOUT} s: a hang"
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    if XLA_CPU and variable == "1":
        assert CONFLICT in proc.stderr + proc.stdout, proc.stderr[-3000:]
        return
    out = proc.stdout
    if command == "gaps":
        assert proc.returncode == 1 and "cholesky" in out and "worked around (cholesky_on_cpu)" in out, out
    elif command == "gaps-fixes":
        assert proc.returncode == 0 and "cholesky_on_cpu" in out, proc.stderr[-2000:]
    elif command == "env":
        assert proc.returncode == 0 and "backend: " in out, proc.stderr[-2000:]
    elif command == "info":
        assert proc.returncode == 0, proc.stderr[-2000:]
        backend = "xla_cpu" if XLA_CPU else "emulated" if variable == "1" else "none"
        assert out.splitlines()[0].endswith(f"backend {backend}"), out
    elif XLA_CPU:  # launch: TorchTPU's launch environment needs a TPU topology, which XLA:CPU has not
        assert proc.returncode != 0 and "could not set the launch environment" in proc.stderr, proc.stderr[-3000:]
    elif variable == "0":  # no TPU, and emulation switched off: the ranks would have no device
        assert proc.returncode == 2 and "HF_TPU_EMULATE=0 turns the emulated TPU off" in proc.stderr, proc.stderr
    else:  # launch: two ranks, each on its chip
        assert proc.returncode == 0 and out.count("RANK OK") == 2, out + proc.stderr[-3000:]


@pytest.mark.emulator_only("the emulator's own switches (on the real wheel's run the matrix checks the conflict)")
def test_the_reported_lines_now_finish():
    """The two lines that hung: HF_TPU_EMULATE=1 with an explicit enable(), and `hf-tpu gaps` with the variable set."""
    proc = _run([sys.executable, "-c", "import hf_tpu.emulator as e; print(e.enable())"], _env("1"))
    assert proc is not None and proc.returncode == 0 and proc.stdout.strip() == "True", proc
    proc = _run([sys.executable, "-m", "hf_tpu", "gaps", "--only", "cholesky", "--no-save"], _env("1"))
    assert proc is not None and "cholesky" in proc.stdout, proc


@pytest.mark.long
@pytest.mark.parametrize("variable", VARIABLE, ids=[f"EMULATE={v}" for v in VARIABLE])
def test_check_run_under_every_value_finishes(tmp_path, variable):
    import transformers

    transformers.Qwen3Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16).save_pretrained(tmp_path)  # fmt: skip
    proc = _run([sys.executable, "-m", "hf_tpu", "check", str(tmp_path), "--run"], _env(variable))
    assert proc is not None, f"hf-tpu check --run: no answer within {TIMEOUT} s: a hang"
    assert proc.returncode >= 0, proc.stderr[-2000:]
    if XLA_CPU and variable == "1":
        assert CONFLICT in proc.stderr + proc.stdout, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0 and "a shrunk random copy" in proc.stdout, proc.stdout[-2000:]
