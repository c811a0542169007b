"""Two emulated hosts x two chips on this machine (`hf-tpu launch --emulate-hosts 2 -n 2`): the multi-host path.

Each host is its own slice, so ranks of one host talk over ICI and hosts over DCN. References are computed here
on CPU at float32 (the ranks run at precision "highest", see worker.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("worker.py")
ROOT = WORKER.parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=64,
                         tie_word_embeddings=False)  # fmt: skip
    path = tmp_path_factory.mktemp("model")
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def launch(check: str, model: Path, out: Path, *flags: str, hosts: int = 2, chips: int = 2, timeout: float = 420):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    env["PYTHONPATH"] = str(ROOT)
    emulate = ["--emulate-hosts", str(hosts)] if hosts > 1 else []
    cmd = [sys.executable, "-m", "hf_tpu", "launch", *emulate, "-n", str(chips), *flags,
           str(WORKER), check, str(model), str(out)]  # fmt: skip
    # the timeout is the bound on a job that must end by itself (a dead host included): no hang
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def result(proc: subprocess.CompletedProcess, out: Path, check: str) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / f"{check}.json").read_text())


def reference_losses(model: Path) -> list[float]:
    """One process on CPU: the same 3 SGD steps on the whole batch."""
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT))
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(3):
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses


def test_hybrid_tp_in_host_dp_across_hosts_trains_like_one_process(model_dir, tmp_path):
    got = result(launch("hybrid", model_dir, tmp_path), tmp_path, "hybrid")
    torch.testing.assert_close(got["losses"], reference_losses(model_dir), rtol=1e-5, atol=1e-5)
    # TP's all-reduces stay inside a host (ICI); only the gradients' all-reduce between replicas crosses hosts
    assert got["ici"] > 0 and got["dcn"] > 0, got["summary"]
    assert "all_reduce               DCN  group of 2" in got["summary"], got["summary"]


def test_layout_puts_the_inner_axis_inside_a_host(model_dir, tmp_path):
    got = result(launch("layout", model_dir, tmp_path), tmp_path, "layout")
    hosts = got["hosts"]
    for row in got["mesh"]:  # the last axis (the most network-intensive) within one host
        assert len({hosts[r] for r in row}) == 1, got
    for column in zip(*got["mesh"], strict=True):  # the outer axis across hosts (DCN)
        assert len({hosts[r] for r in column}) == 2, got


def test_generate_with_tp_per_host_gives_one_chips_tokens(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    got = result(launch("generate", model_dir, tmp_path), tmp_path, "generate")
    net = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))[:1, :8]
    want = net.generate(ids, max_new_tokens=8, do_sample=False).tolist()
    assert got["tokens"] == [want] * 4


def test_a_host_killed_mid_run_ends_the_job_naming_it(model_dir, tmp_path):
    proc = launch("die", model_dir, tmp_path, "--host-timeout", "60")
    assert proc.returncode != 0
    host1 = "-host1'"
    assert "emulated host 1 (" in proc.stderr and "was killed by SIGKILL" in proc.stderr, proc.stderr[-4000:]
    # the ranks of the surviving host fail in their next collective, naming the host that is gone
    named = [line for line in proc.stderr.splitlines() if "tpu_dist:" in line and "are gone, on host(s)" in line]
    assert named and all(host1 in line and "-host0'" not in line for line in named), proc.stderr[-6000:]
    assert not (tmp_path / "die.json").exists()


@pytest.mark.parametrize(("hosts", "chips"), [(2, 1), (1, 2)], ids=["2-hosts", "1-host"])
def test_torchrun_restarts_every_rank_and_a_checkpointed_loop_resumes(model_dir, tmp_path, hosts, chips):
    proc = launch("restart", model_dir, tmp_path, "--max-restarts", "1", hosts=hosts, chips=chips)
    got = result(proc, tmp_path, "restart")
    # rank 1 failed once at step 3; every rank restarted (one store per attempt: see launch.host_env) and resumed
    assert got["restarts"] == 1 and got["resumed_at"] == 3, got
    # the uninterrupted loop, here on CPU: one Linear, each of the 2 ranks its own batch, gradients averaged
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))
    want = []
    for _ in range(6):
        loss = torch.stack([model(x[r]).pow(2).mean() for r in range(2)]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        want.append(float(loss))
    torch.testing.assert_close(got["losses"], want, rtol=1e-5, atol=1e-6)
