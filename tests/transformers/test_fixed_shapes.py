"""hf-tpu's TPU defaults that stop compiling once warm: generate() at bucketed shapes, Trainer batches at bucketed
shapes, and the warm-up ahead of time. Each gives upstream's tokens / losses (checked with the default on and
off, on the same device), and each is listed in the fixes registry with its off switch.

XLA compilations are what TorchTPU counts (``hf_tpu.count_compilations``): one per eager op and shape and one per
compiled graph and shape, on the real wheel (``make xla-cpu``) and in the emulator's model of TorchTPU's cache.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers

import hf_tpu
from hf_tpu import fixes
from hf_tpu.transformers import generate_shapes, train_shapes
from hf_tpu.warmup import prompt_buckets

pytestmark = pytest.mark.usefixtures("float32_matmuls")


def tiny_qwen3() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def cpu_model():
    return tiny_qwen3()


def left_padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as a tokenizer gives it: rows of their own lengths, left-padded with token 0."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, 128, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : width - n] = 0
        mask[row, width - n :] = 1
    return ids, mask


def test_buckets():
    assert [generate_shapes.bucket(n) for n in (1, 15, 16, 17, 31, 32, 300)] == [16, 16, 32, 32, 32, 64, 512]
    assert generate_shapes.cache_length(32, 8) == 64 and generate_shapes.cache_length(32, 33) == 128
    assert prompt_buckets(40) == [16, 32, 64] and prompt_buckets(15) == [16]
    assert [train_shapes.bucket(n) for n in (1, 16, 17, 100, 128)] == [16, 16, 32, 128, 128]


@pytest.mark.parametrize(
    "lengths, kwargs",
    [
        ([5], dict(max_new_tokens=9)),
        ([30], dict(max_new_tokens=3)),  # 30 -> bucket 32: two pad columns
        ([16], dict(max_new_tokens=4)),  # a bucket's own length pads to the next one (one masked path)
        ([7, 19], dict(max_new_tokens=6)),  # a left-padded batch
        ([11], dict(max_length=20)),  # max_length counts the prompt the caller gave
        ([9], dict(max_new_tokens=5, return_dict_in_generate=True, output_scores=True)),
    ],
)
def test_generate_default_gives_upstreams_tokens(cpu_model, monkeypatch, lengths, kwargs):
    tpu = tiny_qwen3().to("tpu")
    ids, mask = left_padded(lengths, seed=sum(lengths))
    expected = cpu_model.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    out = tpu.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), do_sample=False, **kwargs)
    monkeypatch.setenv("HF_TPU_GENERATE_BUCKETS", "0")
    upstream = tpu.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), do_sample=False, **kwargs)
    if kwargs.get("return_dict_in_generate"):
        assert len(out.scores) == len(expected.scores) == kwargs["max_new_tokens"]
        torch.testing.assert_close(torch.stack(out.scores).cpu(), torch.stack(expected.scores), atol=1e-4, rtol=1e-4)
        out, expected, upstream = out.sequences, expected.sequences, upstream.sequences
    assert out.device.type == "tpu" and out.shape == expected.shape
    assert out.cpu().tolist() == expected.tolist() == upstream.cpu().tolist()


def test_generate_default_applies_only_where_it_keeps_the_result():
    tpu = tiny_qwen3().to("tpu")
    ids = torch.ones((1, 10), dtype=torch.long, device="tpu")
    plan = generate_shapes.plan(tpu, {"inputs": ids}, {"max_new_tokens": 4})
    assert plan is not None and plan.pad == 6 and plan.kwargs["cache_implementation"] == "static"
    assert plan.kwargs["max_cache_len"] == 32
    # the caller chose a cache: upstream's behaviour
    assert generate_shapes.plan(tpu, {"inputs": ids}, {"cache_implementation": "dynamic"}) is None
    # processors that read the prompt's tokens: static cache, no padding
    kept = generate_shapes.plan(tpu, {"inputs": ids}, {"repetition_penalty": 1.3, "max_new_tokens": 4})
    assert kept is not None and kept.pad == 0
    assert generate_shapes.plan(tiny_qwen3(), {"inputs": ids.cpu()}, {}) is None  # not on tpu


def test_after_warm_up_new_prompt_lengths_compile_nothing(monkeypatch):
    tpu = tiny_qwen3().to("tpu")
    torch._dynamo.reset()
    rng = random.Random(0)
    requests = [([rng.randint(3, 40) for _ in range(rows)], rng.randint(1, 8)) for rows in (1, 2) for _ in range(4)]
    warm = hf_tpu.warm_up_generate(tpu, max_prompt_length=40, max_new_tokens=8, batch_sizes=(1, 2), progress=False)
    assert warm.runs == 6 and warm.graphs >= 1 and "warm-up: 6 run(s)" in str(warm)
    with hf_tpu.watch_compiles() as graphs, hf_tpu.count_compilations() as paid:
        for lengths, new in requests:
            ids, mask = left_padded(lengths, seed=new)
            tpu.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=new, do_sample=False).cpu()
    assert graphs.count() == 0 and paid.compilations == 0, (str(graphs), str(paid))
    # upstream's static cache follows each prompt's length: new lengths, new graphs (and on TorchTPU, new executables)
    monkeypatch.setenv("HF_TPU_GENERATE_BUCKETS", "0")
    fresh = tiny_qwen3().to("tpu")
    with hf_tpu.watch_compiles() as upstream, hf_tpu.count_compilations() as upstream_paid:
        for lengths, new in requests[:3]:
            ids, mask = left_padded(lengths, seed=new)
            fresh.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=new,
                           cache_implementation="static").cpu()  # fmt: skip
    assert upstream.count() >= 2 and upstream_paid.compilations > 0


def test_warm_up_errors_name_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="not on the TPU: move it first"):
        hf_tpu.warm_up_generate(tiny_qwen3(), max_prompt_length=8, max_new_tokens=2)
    tpu = tiny_qwen3().to("tpu")
    with pytest.raises(ValueError, match="max_new_tokens=0 must be a positive int"):
        hf_tpu.warm_up_generate(tpu, max_prompt_length=8, max_new_tokens=0)
    with pytest.raises(ValueError, match="input_ids= is chosen per bucket"):
        hf_tpu.warm_up_generate(tpu, max_prompt_length=8, max_new_tokens=2, input_ids=torch.ones(1, 2))
    monkeypatch.setenv("HF_TPU_GENERATE_BUCKETS", "0")
    with pytest.raises(ValueError, match="HF_TPU_GENERATE_BUCKETS is off"):
        hf_tpu.warm_up_generate(tpu, max_prompt_length=8, max_new_tokens=2)


def test_defaults_are_listed_with_their_off_switch():
    assert transformers.Trainer is not None  # imports transformers.trainer: its default applies then
    rows = {row["name"]: row for row in fixes.report()}
    for name, off in (("generate_at_fixed_shapes", "HF_TPU_GENERATE_BUCKETS=0"),
                      ("trainer_batches_at_fixed_shapes", "HF_TPU_TRAIN_BUCKETS=0")):  # fmt: skip
        assert rows[name]["kind"] == "default" and rows[name]["off"] == off and rows[name]["state"] == "applied"


# ---- Trainer -----------------------------------------------------------------------------------------------
def collate(rows: list[dict]) -> dict:
    """A user's collator: right-pads to the batch's longest row."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def test_pad_batch_pads_columns_and_rows_inertly():
    batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])
    out = train_shapes.pad_batch(batch, rows=3, pad_token_id=9)
    assert out["input_ids"].shape == (3, 16)
    assert out["input_ids"][0].tolist() == [5, 6, 7] + [9] * 13 and out["input_ids"][2].tolist() == [9] * 16
    assert out["attention_mask"][0].tolist() == [1, 1, 1] + [0] * 13 and out["attention_mask"][2].tolist() == [1] * 16
    assert out["labels"][1].tolist() == [8] + [-100] * 15 and out["labels"][2].tolist() == [-100] * 16
    # a per-token input hf-tpu does not know: the batch is left as it is
    odd = dict(batch, pixel_weights=torch.ones(2, 3))
    assert train_shapes.pad_batch(odd, rows=3, pad_token_id=0)["input_ids"].shape == (2, 3)


def train_losses(tmp_path, steps: int, compile_backend: str | None = None) -> tuple[list[float], int]:
    rng = random.Random(1)
    data = [{"input_ids": [rng.randint(1, 127) for _ in range(rng.randint(4, 60))]} for _ in range(steps * 2 + 1)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=steps, report_to=[], save_strategy="no",
        logging_steps=1, learning_rate=1e-3, disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=False,  # XLA:CPU's plugin has no pinned host memory; a chip has, and it is not the point
        torch_compile=compile_backend is not None, torch_compile_backend=compile_backend,
    )  # fmt: skip
    model = tiny_qwen3().train()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=collate)
    with hf_tpu.watch_compiles() as graphs:
        trainer.train()
    assert model.device.type == "tpu"
    return [row["loss"] for row in trainer.state.log_history if "loss" in row], graphs.count()


def test_trainer_gives_upstreams_losses_at_bucketed_shapes(tmp_path, monkeypatch):
    losses, _ = train_losses(tmp_path, steps=6)
    monkeypatch.setenv("HF_TPU_TRAIN_BUCKETS", "0")
    upstream, _ = train_losses(tmp_path, steps=6)
    assert len(losses) == len(upstream) == 6
    # the same math: only inert positions (mask 0, label -100) were added; reductions may run in another order
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(upstream), rtol=2e-3, atol=2e-3)


@pytest.mark.long  # compiles a training graph per shape: about 4 minutes on 2 cores
def test_compiled_training_builds_one_graph_per_bucket(tmp_path, monkeypatch):
    torch._dynamo.reset()
    _, bucketed = train_losses(tmp_path, steps=6, compile_backend="tpu")
    torch._dynamo.reset()
    monkeypatch.setenv("HF_TPU_TRAIN_BUCKETS", "0")
    _, upstream = train_losses(tmp_path, steps=6, compile_backend="tpu")
    # lengths 4..60 fall in buckets 16/32/64; upstream meets a new length (a new graph) at nearly every step
    assert bucketed <= 3 < upstream, (bucketed, upstream)
