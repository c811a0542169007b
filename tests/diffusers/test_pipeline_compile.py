"""The Diffusers TPU recipe: compile the denoiser with backend="tpu", reuse one graph per size (denoiser_inputs_recompile).

Compiled images must equal eager ones within 1e-4 (Inductor reorders float32 sums); graph
counts come from hf_tpu's recompile report, which reads Dynamo's own events.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_tpu
from hf_tpu.diffusers import compile_pipeline, warm_up
from tests.diffusers.pipelines import call_kwargs, load
from tests.gaps.test_workarounds import without

pytestmark = pytest.mark.usefixtures(
    "float32_matmuls"
)  # compiled equals eager to float32 rounding at precision "highest"

ATOL = 1e-4


def images(pipe, name: str, **overrides) -> np.ndarray:
    return pipe(**call_kwargs(name, **overrides), generator=torch.Generator("tpu").manual_seed(0)).images


@pytest.mark.long
def test_sd3_compile_pipeline_warm_up_then_no_recompiles(pipeline_dir):
    torch._dynamo.reset()  # diffusers' forward wrapper is one code object for every model: start afresh
    pipe = load("sd3", pipeline_dir("sd3")).to("tpu")
    eager = images(pipe, "sd3", num_inference_steps=3)
    assert compile_pipeline(pipe) == ["transformer", "vae.decoder"]

    report = warm_up(pipe, height=32, width=32)
    assert [c.reason for c in report.compiles] == [None, None]  # denoiser + VAE decoder, first compiles

    with hf_tpu.watch_compiles() as steady:
        compiled = images(pipe, "sd3", num_inference_steps=3)
        images(pipe, "sd3", num_inference_steps=5)  # more steps: same graphs
    assert steady.compiles == []
    np.testing.assert_allclose(compiled, eager, rtol=0, atol=ATOL)

    with hf_tpu.watch_compiles() as resized:
        images(pipe, "sd3", height=48)
        images(pipe, "sd3", height=48)
    assert len(resized.compiles) == 2  # once per compiled module, on the first call only
    assert "'hidden_states' dim 2 changed 16 → 24" in resized.compiles[0].reason
    assert "'sample' dim 2 changed 16 → 24" in resized.compiles[1].reason


@pytest.mark.parametrize("name", ["flux", "qwenimage", pytest.param("sdxl", marks=pytest.mark.long)])
def test_blog_recipe_one_graph_for_every_step(pipeline_dir, name):
    # The blog's line, on the denoiser only. SDXL passes `t` from `for t in timesteps` (a view whose
    # storage offset moves each step; TorchTPU guards offsets): denoiser_inputs_recompile clones it, else 1 graph per step.
    pipe = load(name, pipeline_dir(name)).to("tpu")
    denoiser = pipe.unet if name == "sdxl" else pipe.transformer
    eager = images(pipe, name, num_inference_steps=3)
    denoiser.compile(backend="tpu", fullgraph=True, dynamic=False)
    with hf_tpu.watch_compiles() as report:
        compiled = images(pipe, name, num_inference_steps=3)
    assert len(report.compiles) == 1, report
    np.testing.assert_allclose(compiled, eager, rtol=0, atol=ATOL)


def test_qwenimage_recipe_needs_its_cpu_buffer_moved(pipeline_dir):
    # QwenImage's rotary table (pos_freqs) is a CPU tensor the transformer moves to the chip inside its forward: the
    # compiled graph gets a CPU input, which TorchTPU refuses (gap cpu_tensor_into_compiled_graph) and hf-tpu's
    # compiled_graphs_take_cpu_inputs moves to the chip. The recipe's images are the eager ones either way.
    pipe = load("qwenimage", pipeline_dir("qwenimage")).to("tpu")
    eager = images(pipe, "qwenimage", num_inference_steps=2)
    with without("compiled_graphs_take_cpu_inputs", "cpu_tensor_into_compiled_graph") as gap:
        if gap:
            torch._dynamo.reset()
            pipe.transformer.compile(backend="tpu", fullgraph=True, dynamic=False)
            with pytest.raises(RuntimeError, match="expected tensor to be on tpu, got cpu"):
                images(pipe, "qwenimage", num_inference_steps=2)
    torch._dynamo.reset()
    pipe.transformer.compile(backend="tpu", fullgraph=True, dynamic=False)
    np.testing.assert_allclose(images(pipe, "qwenimage", num_inference_steps=2), eager, rtol=0, atol=ATOL)


def test_compile_pipeline_names_the_missing_denoiser():
    class NoDenoiser:
        components = {"text_encoder": torch.nn.Linear(1, 1)}

    with pytest.raises(ValueError, match="no denoiser named transformer / unet.*its modules: text_encoder"):
        compile_pipeline(NoDenoiser())
