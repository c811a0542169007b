"""Compiled == eager on the emulated TPU for a tiny Qwen3 forward and a tiny diffusers transformer."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_tpu
from tests.conftest import TPU_NUMERICS

pytestmark = pytest.mark.usefixtures(
    "float32_matmuls"
)  # compiled equals eager to float32 rounding; TPU numerics: test_numerics.py

import diffusers  # noqa: E402  (hard dependencies: imported, never skipped)
import transformers  # noqa: E402


def _tiny_qwen3_config() -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16,
    )  # fmt: skip


def test_qwen3_forward_compiled_matches_eager_with_no_recompiles():
    config = _tiny_qwen3_config()
    torch.manual_seed(0)
    cpu_model = transformers.Qwen3ForCausalLM(config).eval()
    model = copy.deepcopy(cpu_model).to("tpu")
    ids = torch.randint(0, 256, (2, 24)).to("tpu")
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    with torch.no_grad(), hf_tpu.watch_compiles() as report:
        eager = model(ids).logits
        for _ in range(3):
            out = compiled(ids).logits
    assert report.count() == 1 and not report.recompiles
    # fp32 with Inductor's fusions: agreement within 1e-4 (observed ~1e-6).
    torch.testing.assert_close(out.cpu(), eager.cpu(), rtol=1e-4, atol=1e-4)
    # Against CPU, the independent reference (this module runs at precision "highest": float32 up to the
    # summation order; SDPA takes the math path there, as hf-tpu's attention_precision workaround does).
    with torch.no_grad():
        expected = cpu_model(ids.cpu()).logits
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_sd3_transformer_compiled_matches_eager():
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        out_channels=4,
        pos_embed_max_size=16,
    ).eval()
    inputs = {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 5, 16),
        "pooled_projections": torch.randn(1, 8),
        "timestep": torch.tensor([10.0]),
    }
    with torch.no_grad():
        cpu = model(**inputs).sample
        model.to("tpu")
        tpu_inputs = {k: v.to("tpu") for k, v in inputs.items()}
        eager = model(**tpu_inputs).sample
        model.compile(backend="tpu", fullgraph=True, dynamic=False)
        compiled = model(**tpu_inputs).sample
    torch.testing.assert_close(eager.cpu(), cpu, rtol=1.3e-6, atol=1e-5)  # float32 (attention: the math path)
    torch.testing.assert_close(compiled.cpu(), eager.cpu(), rtol=1e-4, atol=1e-4)


# precision -> (attention implementation -> bounds on ||tpu - cpu|| / ||cpu|| of float32 logits)
QWEN3_ERROR = {
    "medium": {"sdpa": (1e-4, 3e-2), "eager": (1e-4, 3e-2)},  # bf16 operands everywhere
    "high": {"sdpa": (1e-4, 3e-2), "eager": (0.0, 1e-4)},  # 3 bf16 passes; SDPA stays bf16 (attention_precision)
    "highest": {"sdpa": (0.0, 1e-5), "eager": (0.0, 1e-5)},  # float32 (SDPA through hf-tpu's math path)
}


@pytest.mark.parametrize("precision", sorted(QWEN3_ERROR))
def test_qwen3_forward_error_is_what_tpu_precision_predicts(precision):
    """Float32 Qwen3 logits on the emulated TPU vs CPU, eager and compiled, at each matmul precision."""
    config = _tiny_qwen3_config()
    torch.manual_seed(0)
    cpu = transformers.Qwen3ForCausalLM(config).eval()
    ids = torch.randint(0, 256, (2, 24))
    errors = {}
    torch.set_float32_matmul_precision(precision)
    torch._dynamo.reset()  # a graph keeps the precision it was compiled at
    for attention in ("sdpa", "eager"):
        cpu.config._attn_implementation = attention
        tpu = transformers.Qwen3ForCausalLM(config).eval()
        tpu.load_state_dict(cpu.state_dict())
        tpu.config._attn_implementation = attention
        tpu.to("tpu")
        with torch.no_grad():
            expected = cpu(ids).logits.double()
            runs = {"eager": tpu(ids.to("tpu")).logits}
            if attention == "sdpa":
                runs["compiled"] = torch.compile(tpu, backend="tpu", fullgraph=True)(ids.to("tpu")).logits
        for mode, logits in runs.items():
            errors[attention, mode] = ((logits.cpu().double() - expected).norm() / expected.norm()).item()
    print(
        f"\nQwen3 float32 logits vs CPU at {precision!r}: "
        + ", ".join(f"{k[0]}/{k[1]} {v:.1e}" for k, v in errors.items())
    )
    for (attention, _), error in errors.items():
        low, high = QWEN3_ERROR[precision][attention]
        low = low if TPU_NUMERICS else 0.0  # XLA:CPU computes float32 exactly: only the chip's rounding has a floor
        assert low <= error <= high, (precision, attention, error)
