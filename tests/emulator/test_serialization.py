"""Saving from the device: safetensors, torch.save, and tied-weight detection need real storage."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file, save_model


def test_safetensors_round_trip_from_device(tmp_path):
    tensors = {"a": torch.randn(3, 4).to("tpu"), "b": torch.arange(10).to("tpu")[2:7]}
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "x.safetensors")
    # safetensors' loader accepts no "tpu" device (as with TorchTPU): load on CPU, then move.
    loaded = {k: v.to("tpu") for k, v in load_file(tmp_path / "x.safetensors").items()}
    for key, value in tensors.items():
        assert loaded[key].device.type == "tpu"
        assert torch.equal(loaded[key].cpu(), value.cpu())


def test_safetensors_files_identical_to_cpu(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    save_model(model, tmp_path / "cpu.safetensors")
    save_model(model.to("tpu"), tmp_path / "tpu.safetensors")
    assert (tmp_path / "cpu.safetensors").read_bytes() == (tmp_path / "tpu.safetensors").read_bytes()


def test_tied_weights_stay_tied_through_to_and_are_detected_by_storage():
    # The emulator declares dense tpu and CPU tensors shallow-copy compatible (as CUDA is with
    # CPU), so Module.to() moves parameters in place and ties survive; `.data =` swaps work.
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(10, 4), "head": torch.nn.Linear(4, 10, bias=False)})
    model["head"].weight = model["emb"].weight
    weight = model["emb"].weight
    model = model.to("tpu")
    assert model["emb"].weight is weight and model["head"].weight is weight and weight.device.type == "tpu"
    from safetensors.torch import _find_shared_tensors

    shared = _find_shared_tensors(model.state_dict())
    assert any(len(group) == 2 for group in shared)
    weight.data = torch.zeros(10, 4)
    assert weight.device.type == "cpu" and model["head"].weight.device.type == "cpu"


def test_torch_save_and_load(tmp_path):
    x = torch.randn(5).to("tpu")
    torch.save({"x": x}, tmp_path / "x.pt")
    back = torch.load(tmp_path / "x.pt")
    assert back["x"].device.type == "tpu" and torch.equal(back["x"].cpu(), x.cpu())
    on_cpu = torch.load(tmp_path / "x.pt", map_location="cpu")
    assert on_cpu["x"].device.type == "cpu"
