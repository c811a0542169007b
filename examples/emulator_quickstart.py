"""The main demo: a causal LM on "tpu" with generate(), plus what the emulator lets you see.

With a real TPU (TorchTPU installed) this runs there. Without one, run it with
``HF_TPU_EMULATE=1`` (scripts/demo.sh does) and it runs on the emulated TPU.

    HF_TPU_EMULATE=1 python examples/emulator_quickstart.py [MODEL_ID_OR_DIR]

Without an argument it builds a small Qwen3 locally (no Hub access needed).
"""

from __future__ import annotations

import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM


def small_local_model() -> str:
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )
    torch.manual_seed(0)
    path = tempfile.mkdtemp(prefix="hf-tpu-demo-")
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def main() -> None:
    if not torch.accelerator.is_available() or torch.accelerator.current_accelerator().type != "tpu":
        sys.exit("No TPU here. Run with HF_TPU_EMULATE=1 to use the emulated TPU.")
    model_id = sys.argv[1] if len(sys.argv) > 1 else small_local_model()

    model = AutoModelForCausalLM.from_pretrained(model_id, device_map="tpu")
    input_ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device="tpu")

    import hf_tpu

    emulated = hf_tpu.backend() == "emulated"
    if emulated:
        import hf_tpu.emulator

        with hf_tpu.emulator.track() as transfers:
            out = model.generate(input_ids, max_new_tokens=64, do_sample=False)
    else:
        out = model.generate(input_ids, max_new_tokens=64, do_sample=False)

    print(f"device: {model.device} ({'emulated TPU' if emulated else 'TPU'})")
    print(f"generated {out.shape[1] - input_ids.shape[1]} tokens: {out[0, input_ids.shape[1] :].tolist()}")
    free, total = torch.accelerator.get_memory_info()
    print(
        f"HBM: {torch.accelerator.memory_allocated() / 2**20:.1f} MiB allocated, {free / 2**30:.1f} of {total / 2**30:.0f} GiB free"
    )
    if emulated:
        print("\nHost<->device traffic during generate():")
        print(transfers.report())


if __name__ == "__main__":
    main()
