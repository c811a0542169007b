"""One run of a workload on "tpu", printed as a digest of everything it computed (test_determinism.py runs it twice,
in fresh processes, and compares): ``python tests/determinism_worker.py {train_compiled,train_eager,generate,denoise}``.
"""

from __future__ import annotations

import hashlib
import sys

import torch


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)  # fmt: skip
    return Qwen3ForCausalLM(config).to("tpu")


def train(compiled: bool, steps: int = 4) -> str:
    """The demo's loop (AdamW, token embeddings whose backward scatters into one table), at toy size."""
    model = tiny_qwen3()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = torch.compile(model, backend="tpu", fullgraph=True, dynamic=False) if compiled else model
    batches = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 258, (4, 32), generator=batches).to("tpu")
        loss = step(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return digest(torch.stack(losses), *model.parameters())


def generate() -> str:
    model = tiny_qwen3()
    ids = torch.tensor([[5, 17, 42, 9, 77]], device="tpu")
    out = model.generate(ids, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    static = model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation="static")
    return digest(out.sequences, torch.stack(out.logits), static)


def denoise() -> str:
    """An SD3 transformer compiled as the blog compiles it, over three denoising steps."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
                                        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                                        pooled_projection_dim=8, out_channels=4).to("tpu")  # fmt: skip
    transformer.compile(backend="tpu", fullgraph=True, dynamic=False)
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, 8, 8, generator=generator).to("tpu")
    text = torch.randn(1, 6, 16, generator=generator).to("tpu")
    pooled = torch.randn(1, 8, generator=generator).to("tpu")
    with torch.no_grad():
        for t in (900.0, 500.0, 100.0):
            noise = transformer(latents, text, pooled, torch.tensor([t], device="tpu")).sample
            latents = latents - 0.3 * noise
    return digest(latents)


if __name__ == "__main__":
    import hf_tpu.emulator  # noqa: F401  (HF_TPU_EMULATE / HF_TPU_XLA_CPU set the device up during `import torch`)

    work = {"train_compiled": lambda: train(True), "train_eager": lambda: train(False), "generate": generate,
            "denoise": denoise}[sys.argv[1]]  # fmt: skip
    print("DIGEST", work())
