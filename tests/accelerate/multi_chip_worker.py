"""Trains a tiny model with Trainer or a bare accelerate loop, on however many chips it was launched on.

Run by tests/accelerate/test_multi_chip.py: alone (one process, global batch on one chip) and under
``hf-tpu launch -n 2`` / ``accelerate launch`` (each rank half the batch). Each rank writes its result to OUT/result-<rank>.json (two ranks printing
to one pipe can interleave their lines).
"""

from __future__ import annotations

import json
import os
import sys

import torch

GLOBAL_BATCH, STEPS, SAMPLES = 8, 4, 32


def dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (SAMPLES, 12), generator=g)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": ids[i], "labels": ids[i], "sample": torch.tensor(i)}

    return Tokens()


def tiny_model() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config)


def report(result: dict, out: str) -> None:
    """One file per rank, written whole and then renamed into place."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"result-{result['process_index']}.json")
    with open(path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(path + ".part", path)


def save_weights(model: torch.nn.Module, out: str) -> None:
    """The final weights, written once (by the main process), for the test to compare run against run."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "weights.safetensors"))


def trainer(out: str) -> dict:
    import transformers

    seen: list[int] = []

    def collate(rows: list[dict]) -> dict:
        seen.extend(int(r["sample"]) for r in rows)
        return {k: torch.stack([r[k] for r in rows]) for k in ("input_ids", "labels")}

    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = transformers.TrainingArguments(
        out, per_device_train_batch_size=GLOBAL_BATCH // world, max_steps=STEPS, learning_rate=1e-2,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, data_seed=0,
        bf16=os.environ.get("MIXED_PRECISION") == "bf16", dataloader_num_workers=0, remove_unused_columns=False,
    )  # fmt: skip
    t = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(), data_collator=collate)
    t.train()
    model = t.accelerator.unwrap_model(t.model)
    if t.is_world_process_zero():
        save_weights(model, out)
    return {
        "world_size": args.world_size,
        "parallel_mode": str(args.parallel_mode),
        "process_index": args.process_index,
        "device": str(args.device),
        "losses": [h["loss"] for h in t.state.log_history if "loss" in h],
        "seen": sorted(seen),
    }


def loop(out: str) -> dict:
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision=os.environ.get("MIXED_PRECISION", "no"))
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # (Adam turns bf16 noise in tiny gradients into +-lr steps)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=GLOBAL_BATCH // acc.num_processes)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses, seen = [], []
    for batch in loader:
        seen += batch["sample"].cpu().tolist()
        loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.gather(loss.detach()).mean()))
    everyone = acc.gather(torch.tensor(seen, device=acc.device)).cpu().tolist()
    acc.wait_for_everyone()
    model = acc.unwrap_model(model)
    if acc.is_main_process:
        save_weights(model, out)
    return {
        "world_size": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "process_index": acc.process_index,
        "device": str(acc.device),
        "losses": losses,
        "seen": sorted(seen),
        "gathered": sorted(everyone),
    }


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    report({"trainer": trainer, "loop": loop}[kind](out), out)
