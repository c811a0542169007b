"""Accelerator identity and the torch.tpu surface, as TorchTPU 0.2.0 presents them."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from hf_tpu.gaps.status import present
from tests.conftest import XLA_CPU, run_python


def test_accelerator_answers_like_torchtpu():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch._C._get_accelerator().type == "tpu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(0)
    torch.accelerator.set_device_index(torch.device("tpu:0"))
    torch.accelerator.synchronize()
    assert torch.get_device_module() is torch.tpu
    assert torch.get_device_module("tpu").__name__ == "torch.tpu"


def test_one_chip_per_process():
    with pytest.raises(RuntimeError, match="Device index 1 is out of bounds of the number of addressable devices 1"):
        torch.accelerator.set_device_index(1)
    if present("device_index_out_of_range")[0]:  # TorchTPU 0.2.0 puts it on tpu:0
        assert torch.ones(2, device="tpu:1").device == torch.device("tpu:0")
    else:
        with pytest.raises(RuntimeError, match="Device index 1 is out of bounds of the number of addressable devices"):
            torch.empty(2, device="tpu:1")


def test_tensor_and_module_methods():
    t = torch.ones(2).tpu()
    assert t.is_tpu and t.device == torch.device("tpu:0")
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.device.type == "tpu"


# TorchTPU 0.2.0's 30 public names (the torch-tpu 0.2.0 wheel's ``torch_tpu.device`` module, ``__all__``), written out here so the
# test does not take them from the code it checks.
TORCH_TPU_PUBLIC_NAMES = {
    "is_available", "device_count", "current_device", "set_device", "synchronize", "set_stream",
    "current_stream", "device", "initial_seed", "get_rng_state", "set_rng_state", "manual_seed",
    "manual_seed_all", "default_generators", "is_initialized", "get_amp_supported_dtype", "get_device_name",
    "get_device_properties", "Stream", "Event", "stream", "default_stream", "device_of", "EagerMode",
    "eager_mode", "set_eager_mode", "Precision", "precision", "allow_excess_precision", "topology_aware_mesh",
}  # fmt: skip


def test_public_names_exactly():
    assert len(TORCH_TPU_PUBLIC_NAMES) == 30
    submodules = {"compiler", "distributed", "ops", "optimizers", "pallas", "profiler"}
    assert set(dir(torch.tpu)) == TORCH_TPU_PUBLIC_NAMES | submodules
    for name in TORCH_TPU_PUBLIC_NAMES:
        assert hasattr(torch.tpu, name), name
    for name in ("PUBLIC_NAMES", "TpuStream", "TpuEvent"):  # the emulator's own helpers: not TorchTPU names
        assert not hasattr(torch.tpu, name), name


@pytest.mark.parametrize(
    "name",
    [
        "empty_cache",
        "mem_get_info",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "memory_stats",
        "reset_peak_memory_stats",
        "is_bf16_supported",
        "get_device_capability",
        "MemPool",
        "amp",
        "random",
    ],
)
def test_names_torchtpu_lacks_stay_absent(name):
    # transformers and diffusers branch on hasattr(torch.tpu, ...): adding them changes their code paths.
    assert not hasattr(torch.tpu, name)


@pytest.mark.parametrize(
    ("call", "replacement"),
    [
        (lambda: torch.tpu.is_available(), "is_available"),
        (lambda: torch.tpu.device_count(), "device_count"),
        (lambda: torch.tpu.current_device(), "current_device_index"),
        (lambda: torch.tpu.set_device(0), "set_device_index"),
        (lambda: torch.tpu.synchronize(), "synchronize"),
        (lambda: torch.tpu.current_stream(), "current_stream"),
        (lambda: torch.tpu.initial_seed(), "random.initial_seed"),
        (lambda: torch.tpu.get_rng_state(), "random.get_rng_state"),
    ],
)
def test_legacy_api_guard(call, replacement, monkeypatch):
    monkeypatch.delenv("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS", raising=False)
    with pytest.raises(RuntimeError, match=rf"internal to TorchTPU.*torch\.accelerator\.{replacement}"):
        call()


@pytest.mark.parametrize("value", ["yes", "bogus"])
def test_legacy_api_guard_reads_an_absl_boolean_once(value):
    """TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS is read once per process as an absl boolean (1/true/t/yes/y), as on
    TorchTPU: "yes" turns the RuntimeError into one warning per API, anything else keeps the guard."""
    proc = run_python(
        """
        import os, warnings
        import pytest, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                print("count", torch.tpu.device_count(), torch.tpu.device_count())
                torch.tpu.synchronize()
                torch.tpu.set_device("tpu")
                with pytest.raises(ValueError, match="Cannot set TPU device to index 1"):
                    torch.tpu.set_device(1)
                with pytest.raises(TypeError):
                    torch.tpu.set_device(1.5)
            except RuntimeError as err:
                print("guard", err)
            os.environ.pop("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS")  # read once: changing it now changes nothing
            try:
                torch.tpu.device_count()
                print("still allowed")
            except RuntimeError:
                print("now refused")
        for w in caught:
            print("warning", w.message)
        """,
        env={"HF_TPU_EMULATE": "1", "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": value},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # TorchTPU logs this one from C++ (stderr); the emulator warns from Python
    said = out + proc.stderr
    assert "the TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS environment variable is an experimental feature" in said
    if value == "yes":
        assert "count 1 1" in out and "still allowed" in out
        assert out.count("device_count is internal to TorchTPU and may change or be removed without notice. Use "
                         "torch.accelerator.device_count instead.") == 1, out  # fmt: skip
    else:
        assert "guard device_count is internal to TorchTPU and can only be called" in out and "now refused" in out


def test_framework_code_may_call_internal_apis():
    # torch itself calls these (e.g. torch.manual_seed -> torch.tpu.manual_seed_all); no error there.
    torch.manual_seed(3)
    assert torch.tpu.default_generators[0].initial_seed() == 3


def test_device_name_and_properties():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.tpu.get_device_name().startswith("TPU")
        if not XLA_CPU:
            assert "emulated" in torch.tpu.get_device_name()
            assert torch.tpu.get_device_name().startswith("TPU v6e")
        props = torch.tpu.get_device_properties()
    assert props.total_memory == torch.accelerator.get_memory_info()[1]
    assert props.multi_processor_count == 1


def test_experimental_api_warns_once():
    import hf_tpu.emulator.api_stage as stage

    stage._warned.discard("get_amp_supported_dtype")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.tpu.get_amp_supported_dtype()
        torch.tpu.get_amp_supported_dtype()
    messages = [str(w.message) for w in caught if "ExperimentalApi" in str(w.message)]
    assert len(messages) == 1


def test_streams_and_events():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = torch.tpu.Stream()
        assert isinstance(s, torch.Stream) and s.device.type == "tpu"
        with pytest.raises(NotImplementedError):
            s.query()
        e1 = torch.tpu.Event(enable_timing=True)
        e2 = torch.tpu.Event(enable_timing=True)
        assert isinstance(e1, torch.Event)
        e1.record()
        time.sleep(0.05)  # events record host time: at least the 50 ms slept lie between them
        e2.record()
        e2.synchronize()
        assert e1.elapsed_time(e2) >= 50.0
        with torch.tpu.stream(s):
            assert torch.accelerator.current_stream().stream_id == s.stream_id
        assert torch.accelerator.current_stream().stream_id == 0
    assert torch.accelerator.current_stream().device.type == "tpu"


def test_matmul_precision_default_is_medium():
    assert torch.get_float32_matmul_precision() == "medium"
    torch.set_float32_matmul_precision("highest")
    try:
        assert torch.get_float32_matmul_precision() == "highest"
        with pytest.raises(ValueError):
            torch.set_float32_matmul_precision("fast")
    finally:
        torch.set_float32_matmul_precision("medium")


def test_eager_mode():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.tpu.eager_mode == torch.tpu.EagerMode.DEFER_NEVER
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            assert torch.tpu.eager_mode == torch.tpu.EagerMode.DEFER_AND_FUSE
        assert torch.tpu.eager_mode == torch.tpu.EagerMode.DEFER_NEVER
        assert torch.tpu.allow_excess_precision is False


@pytest.mark.emulator_only("TPU numerics: the emulator rounds as a chip does; XLA:CPU computes float32 exactly")
def test_precision_context():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = torch.tensor([[1.0 + 2**-10]], device="tpu")  # not a bfloat16 value: rounding shows
        with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
            exact = (a @ a).item()
        assert exact == (1.0 + 2**-10) ** 2  # float32 exact (the product fits in float32)
        assert (a @ a).item() == 1.0  # outside: the default precision rounds the operands to bfloat16
        assert torch.tpu.allow_excess_precision is False
