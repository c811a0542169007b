""" "tokamax_ragged_dot" is registered with no user code (ragged_dot_experts_not_registered), the kernel loads offline in kernels' layout (kernels_cannot_see_the_tpu,
hub_kernels_need_the_network), and the blog's explicit registration still works. Fresh processes: registration order is the point."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
from pathlib import Path

import pytest

import hf_tpu.kernels
from tests.conftest import run_python

REPO = Path(__file__).parents[2]
# where kernels decides which build variant a device gets: kernels.backends (< 0.19), kernels._internals.backends
BACKENDS = "kernels._internals.backends" if importlib.util.find_spec("kernels._internals") else "kernels.backends"


def check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_from_pretrained_just_works_with_autoload(qwen3_moe_dir):
    # HF_TPU_EMULATE=1: the emulator comes up inside `import torch`; the user writes no registration code.
    out = check(
        run_python(
            f"""
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(
                {str(qwen3_moe_dir)!r}, device_map="tpu", experts_implementation="tokamax_ragged_dot")
            ids = torch.tensor([[1, 2, 3]], device="tpu")
            print(model.get_experts_implementation(), model(ids).logits.shape)
            """,
            env={"HF_TPU_EMULATE": "1"},
        )
    )
    assert "{'': 'tokamax_ragged_dot'} torch.Size([1, 3, 128])" in out


@pytest.mark.emulator_only("a device set up after the library was imported: an explicit hf_tpu.emulator.enable()")
def test_registered_when_transformers_was_imported_before_the_device():
    out = check(
        run_python(
            """
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
            before = "tokamax_ragged_dot" in ALL_EXPERTS_FUNCTIONS
            import hf_tpu.emulator
            hf_tpu.emulator.enable(quiet=True)
            print(before, "tokamax_ragged_dot" in ALL_EXPERTS_FUNCTIONS)
            """
        )
    )
    assert out.split() == ["False", "True"]


def test_no_tpu_means_upstream_behaviour():
    out = check(
        run_python(
            f"""
            import importlib, torch
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
            backends = importlib.import_module({BACKENDS!r})
            print("tokamax_ragged_dot" in ALL_EXPERTS_FUNCTIONS, hasattr(torch.backends, "tpu"), backends._backend().name)
            """,
            env={"HF_TPU_XLA_CPU": None},  # no TPU of any kind
        )
    )
    assert out.split() == ["False", "False", "cpu"]


def test_kernels_picks_tpu_builds_on_the_emulated_tpu():
    # kernels_cannot_see_the_tpu: without torch.backends.tpu, kernels would refuse the build/torch-tpu variant ("system backend cpu").
    assert importlib.import_module(BACKENDS)._backend().name == "tpu"


def test_shipped_kernel_loads_offline_with_get_local_kernel():
    from kernels import get_local_kernel

    build = hf_tpu.kernels.KERNEL_DIR / "build" / "torch-tpu"
    assert (build / "metadata.json").is_file() and (build / "_ops.py").is_file()
    module = get_local_kernel(hf_tpu.kernels.KERNEL_DIR)
    assert module is hf_tpu.kernels.load_ragged_dot_kernel()  # one copy per variant path, one op namespace
    assert callable(module.experts_forward) and callable(module.ragged_dot)
    for name in ("__init__.py", "_ops.py", "metadata.json", "ragged_dot_tpu/__init__.py"):  # not git-ignored
        ignored = subprocess.run(["git", "check-ignore", "-q", str(build / name)], cwd=REPO, timeout=60)
        assert ignored.returncode == 1, f"{name} is git-ignored"


def test_ragged_dot_op_matches_per_group_matmuls():
    import torch

    k = hf_tpu.kernels.load_ragged_dot_kernel()
    g = torch.Generator().manual_seed(0)
    lhs, rhs = torch.randn(40, 32, generator=g), torch.randn(5, 24, 32, generator=g)
    sizes = torch.tensor([7, 0, 13, 9, 6])
    out = k.ragged_dot(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu")).cpu()
    start = 0
    for group, size in enumerate(sizes.tolist()):
        torch.testing.assert_close(out[start : start + size], lhs[start : start + size] @ rhs[group].T)
        start += size
    assert (out[start:] == 0).all()  # rows past sum(group_sizes)


@pytest.mark.long
def test_blog_snippet_offline_registers_again(qwen3_moe_dir):
    # The blog: get_kernel(repo, version=1, trust_remote_code=...) then ALL_EXPERTS_FUNCTIONS.register(...).
    # Offline with no Hub cache, hf-tpu serves the shipped copy (hub_kernels_need_the_network; kernels.load, or kernels._internals.load from
    # kernels 0.19); re-registering the name is harmless; the logits are the eager experts'.
    out = check(
        run_python(
            f"""
            import warnings, torch
            from kernels import get_kernel
            from transformers import AutoModelForCausalLM
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
            torch.set_float32_matmul_precision("highest")  # the two implementations agree to float32 rounding
            ids = torch.tensor([[1, 2, 3]], device="tpu")
            eager = AutoModelForCausalLM.from_pretrained(
                {str(qwen3_moe_dir)!r}, device_map="tpu", experts_implementation="eager")(ids).logits
            for repo_id in {hf_tpu.kernels.HUB_REPOS!r}:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    kernel = get_kernel(repo_id, version=1, trust_remote_code=[repo_id])
                ALL_EXPERTS_FUNCTIONS.register("tokamax_ragged_dot", kernel.experts_forward)
                model = AutoModelForCausalLM.from_pretrained(
                    {str(qwen3_moe_dir)!r}, device_map="tpu", experts_implementation="tokamax_ragged_dot")
                same = torch.allclose(model(ids).logits.cpu(), eager.cpu(), rtol=1e-4, atol=1e-5)
                print(kernel.__name__, any("shipped ragged-dot-tpu" in str(w.message) for w in caught), same)
            """,
            env={"HF_TPU_EMULATE": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "/nonexistent-hf-tpu-cache"},
        )
    )
    assert out.split() == ["_ragged_dot_tpu_tpu_hf_tpu_1", "True", "True"] * 2  # the shipped copy, eager's logits
