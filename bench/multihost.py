"""Per-step collective bytes over ICI and DCN: the hybrid layout (TP inside a host, DP across) vs TP=4 over hosts.

2 emulated hosts x 2 chips (`hf-tpu launch --emulate-hosts 2 -n 2`, each host its own slice), a Qwen3 with
hidden 256, 4 layers, a global batch of 8 x 64 tokens, one SGD step counted with `hf_tpu.count_collectives()`
(what each rank sends with ring algorithms). The bytes do not depend on the machine; the wall time is the
emulator's and says nothing about a TPU.

    python bench/multihost.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def worker(tp: int, dp: int, model: str, out: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    import hf_tpu

    dist.init_process_group("tpu_dist")
    net = AutoModelForCausalLM.from_pretrained(
        model, distributed_config=DistributedConfig(tp_size=tp, dp_replicate_size=dp), dtype=torch.float32
    )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, foreach=False)
    ids = torch.randint(0, 512, (8, 64), generator=torch.Generator().manual_seed(0))
    ids = ids.chunk(dp)[dist.get_rank() // tp].to("tpu")
    for _step in range(2):  # the second step is counted (the first may set things up)
        with hf_tpu.count_collectives() as counts:
            net(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    if dist.get_rank() == 0:
        Path(out).write_text(
            json.dumps({"ici": counts.ici_bytes, "dcn": counts.dcn_bytes, "summary": counts.summary()})
        )
    dist.destroy_process_group()


def main() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tmp = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=128,
                         tie_word_embeddings=False)  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(tmp / "model")
    rows = []
    for name, tp, dp in (("hybrid: TP=2 in a host, DP=2 across", 2, 2), ("naive: TP=4 over both hosts", 4, 1)):
        out = tmp / f"{tp}x{dp}.json"
        env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATOR_HOST"}
        env["PYTHONPATH"] = str(ROOT)
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "hf_tpu", "launch", "--emulate-hosts", "2", "-n", "2", __file__,
               str(tp), str(dp), str(tmp / "model"), str(out)]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-4000:])
        got = json.loads(out.read_text())
        rows.append((name, got["ici"], got["dcn"], time.perf_counter() - start))
        print(got["summary"])
    print("\n| layout (2 hosts x 2 chips, one step, bytes sent per rank) | ICI | DCN | launch wall s |")
    print("|---|---|---|---|")
    for name, ici, dcn, wall in rows:
        print(f"| {name} | {ici / 2**20:.2f} MiB | {dcn / 2**20:.2f} MiB | {wall:.1f} |")
    print(f"\nDCN bytes, naive / hybrid: {rows[1][2] / max(rows[0][2], 1):.1f}x")


if __name__ == "__main__":
    if os.environ.get("LOCAL_RANK") is not None:
        worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
