"""Every case of the bad-input catalogue (``cases.py``), each in a fresh process with a timeout.

The cases run side by side (one per core) when the module starts; each test waits for its own. A case
fails on a hang (timeout), a crash (signal or abort), an error that does not name what was wrong, or
device memory left allocated after the error.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

import pytest

from tests.conftest import child_env

from .cases import CASES, Case

pytestmark = pytest.mark.emulator_only(
    "the catalogue's expected errors are the emulator's and hf-tpu's; TorchTPU answers several of them later, at "
    "first use (it is lazy)"
)

HARNESS = """\
import os, sys, tempfile
if os.environ.get("PREPARE_TPU_CHECKPOINT"):  # a checkpoint of tpu tensors, written by an emulating process
    import subprocess
    CHECKPOINT = os.path.join(tempfile.mkdtemp(), "tpu.pt")
    subprocess.run([sys.executable, "-c", f"import torch; torch.save(torch.ones(2, device='tpu'), {{CHECKPOINT!r}})"],
                   env={{**os.environ, "HF_TPU_EMULATE": "1"}}, check=True, capture_output=True, timeout=120)
import torch
if os.environ.get("PREPARE_MODEL_DIR"):
    from transformers import LlamaConfig, LlamaForCausalLM
    MODEL_DIR = tempfile.mkdtemp()
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(MODEL_DIR)

def allocated():
    try:
        return torch.accelerator.memory_allocated() if torch.accelerator.is_available() else 0
    except Exception:
        return 0

baseline = allocated()
try:
{body}
except BaseException as err:
    print("RAISED", type(err).__name__, " ".join(str(err).split())[:3000], flush=True)
else:
    print("RETURNED", flush=True)
import gc
err = None
gc.collect()
print("LEFT", allocated() - baseline, flush=True)
"""


@dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str


# A package named torch_tpu (what `pip install torch-tpu` provides, minus its entry point and libtpu).
FAKE_TORCH_TPU = tempfile.mkdtemp(prefix="fake-torch-tpu-")
os.makedirs(os.path.join(FAKE_TORCH_TPU, "torch_tpu"))
open(os.path.join(FAKE_TORCH_TPU, "torch_tpu", "__init__.py"), "w").close()


def _env(case: Case) -> dict[str, str]:
    env = child_env()  # each case its own emulated host (or, on the real wheel's run, TorchTPU on XLA:CPU)
    env["PYTHONWARNINGS"] = "default"
    for key, value in case.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value.replace("{fake_torch_tpu}", FAKE_TORCH_TPU)
    return env


def _run(case: Case) -> Outcome:
    if case.argv is not None:
        cmd = [sys.executable, *case.argv]
    else:
        body = textwrap.indent(textwrap.dedent(case.code or ""), "    ")
        cmd = [sys.executable, "-c", HARNESS.format(body=body)]
    try:
        proc = subprocess.run(cmd, env=_env(case), capture_output=True, text=True, timeout=case.timeout)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return Outcome(None, out, "")
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def outcomes():
    """Start every case at once (one worker per core); tests collect their own."""
    pool = concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 1))
    futures = {case.id: pool.submit(_run, case) for case in CASES}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_the_catalogue_is_broad():
    assert len(CASES) >= 60  # the floor
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_gets_a_clear_error(case: Case, outcomes):
    outcome = outcomes[case.id].result()
    where = f"stdout:\n{outcome.stdout[-2000:]}\nstderr:\n{outcome.stderr[-2000:]}"
    assert outcome.returncode is not None, f"{case.id}: no answer within {case.timeout} s (a hang)\n{where}"
    assert outcome.returncode >= 0, f"{case.id}: killed by signal {-outcome.returncode} (a crash)\n{where}"
    if case.kind == "prints":
        assert outcome.returncode == 0, f"{case.id}: exit {outcome.returncode}\n{where}"
        assert re.search(case.expect, outcome.stdout, re.S), f"{case.id}: not said\n{where}"
        return
    if case.kind == "exits":
        assert outcome.returncode != 0, f"{case.id}: the command succeeded\n{where}"
        if not case.traceback_ok:
            assert "Traceback" not in outcome.stderr, f"{case.id}: a traceback instead of a message\n{where}"
        last = (outcome.stderr.strip().splitlines() or [""])[-1]
        assert re.search(case.expect, last), f"{case.id}: the last line does not say what was wrong\n{where}"
        return
    assert outcome.returncode == 0, f"{case.id}: the process itself failed (exit {outcome.returncode})\n{where}"
    lines = outcome.stdout.splitlines()
    result = next((line for line in lines if line.startswith(("RAISED", "RETURNED"))), "")
    if case.kind == "raises":
        assert result.startswith("RAISED"), f"{case.id}: accepted silently\n{where}"
        assert re.search(case.expect, result, re.S), f"{case.id}: the error does not say what was wrong\n{where}"
    else:  # warns
        assert re.search(case.expect, outcome.stderr, re.S), f"{case.id}: no warning\n{where}"
    left = next((int(line.split()[1]) for line in lines if line.startswith("LEFT")), None)
    assert left in (None, 0), f"{case.id}: {left} bytes of device memory left behind\n{where}"
