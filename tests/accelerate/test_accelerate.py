"""accelerate (and Trainer through it) on the emulated TPU: checkpoints keep the device RNG (patch checkpoint_rng_misses_the_tpu), the
compile switches select the "tpu" backend (compile_backend_tpu_refused)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from accelerate import Accelerator

import hf_tpu


def test_save_and_load_state_restore_the_tpu_rng(tmp_path):
    accelerator = Accelerator()
    assert accelerator.device.type == "tpu"
    model, optimizer = accelerator.prepare(torch.nn.Linear(4, 2), torch.optim.SGD(torch.nn.Linear(4, 2).parameters()))
    torch.manual_seed(1)
    accelerator.save_state(tmp_path)  # accelerate called torch.tpu.get_rng_state, internal to TorchTPU: it raised
    drawn = torch.rand(8, device="tpu")
    weights = model.weight.detach().cpu().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    accelerator.load_state(tmp_path)
    assert torch.equal(torch.rand(8, device="tpu").cpu(), drawn.cpu())  # the same draws after the restore
    assert torch.equal(model.weight.detach().cpu(), weights)  # and the weights (through safetensors' load_file)


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def _train(tmp_path, **args) -> tuple[list[float], object, transformers.TrainingArguments]:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    training_args = transformers.TrainingArguments(
        str(tmp_path), per_device_train_batch_size=2, max_steps=4, report_to=[], logging_steps=1,
        save_strategy="no", learning_rate=1e-3, **args,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=transformers.Qwen3ForCausalLM(config), args=training_args, train_dataset=_Tokens()
    )
    with hf_tpu.watch_compiles() as report:
        trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], report, training_args


@pytest.mark.long
@pytest.mark.usefixtures("float32_matmuls")
def test_trainer_torch_compile_uses_the_tpu_backend_with_no_recompiles(tmp_path):
    eager, _, _ = _train(tmp_path / "eager")
    compiled, report, args = _train(tmp_path / "compiled", torch_compile=True)
    assert args.torch_compile_backend == "tpu"  # transformers' default, "inductor", is refused on TPU (gap)
    assert report.count() >= 1 and not report.recompiles, report
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)  # the same 4 steps as eager


def test_accelerate_dynamo_backend_tpu_is_valid_and_static():
    from accelerate.utils import DynamoBackend, TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="tpu")
    assert plugin.backend == DynamoBackend("TPU") and plugin.to_kwargs()["backend"] == "tpu"
    assert plugin.dynamic is False  # TorchTPU refuses dynamic=True; automatic dynamic would recompile
    assert transformers.TrainingArguments("out", torch_compile_backend="tpu", report_to=[]).torch_compile
