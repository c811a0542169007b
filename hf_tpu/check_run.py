"""``hf-tpu check MODEL --run``: does this architecture run on the (emulated) TPU? A shrunk random copy, feature by feature.

The copy keeps the model's classes and layout kinds (attention variant, sliding windows, experts, latent
caches) at toy widths and two or three layers, with random weights, saved to a directory. Each feature runs in a
process of its own with a timeout (an abort costs one feature), and its command line is the repro:

    python -m hf_tpu.check_run DIR FEATURE
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

FEATURES = ("load", "forward", "generate", "generate_compiled", "tp2")
# Toy sizes for the attributes configs use; only those a config already has are changed.
_SHRINK = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "vocab_size": 256,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 16, "sliding_window": 8, "d_model": 64, "d_ff": 128, "d_kv": 16,
    "num_heads": 4, "n_group": 1, "topk_group": 1,
}  # fmt: skip


@dataclass
class FeatureResult:
    feature: str
    ok: bool
    seconds: float
    detail: str
    repro: str


def shrink(config: Any) -> Any:
    """A copy of ``config`` at toy widths with 2-3 layers, keeping every layout kind it has."""
    small = copy.deepcopy(config)
    text = small.get_text_config() if hasattr(small, "get_text_config") else small
    for name, value in _SHRINK.items():
        if getattr(text, name, None) is not None:
            setattr(text, name, value)
    if getattr(text, "qk_rope_head_dim", None) is not None and getattr(text, "head_dim", None) is not None:
        text.head_dim = text.qk_rope_head_dim  # MLA configs define head_dim as the RoPE part
    original = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(original, "num_key_value_heads", None) is not None and getattr(original, "num_attention_heads", None):
        mha = original.num_key_value_heads == original.num_attention_heads
        text.num_key_value_heads = text.num_attention_heads if mha else 2  # keep MHA as MHA, GQA as GQA
    layers = 3 if getattr(text, "first_k_dense_replace", None) or getattr(text, "sliding_window", None) else 2
    if getattr(text, "first_k_dense_replace", None):
        text.first_k_dense_replace = 1
    for name in ("num_hidden_layers", "num_layers", "num_decoder_layers"):
        if getattr(text, name, None) is not None:
            setattr(text, name, layers)
    if getattr(text, "layer_types", None):
        kinds = list(dict.fromkeys(text.layer_types))  # every kind once, then the first again
        text.layer_types = (kinds * layers)[:layers]
    if getattr(small, "is_encoder_decoder", False) and getattr(small, "decoder_start_token_id", None) is None:
        small.decoder_start_token_id = small.pad_token_id or 0  # generate() needs one (T5's is its pad token)
    for name in ("mlp_only_layers",):
        if getattr(text, name, None):
            setattr(text, name, [i for i in getattr(text, name) if i < layers])
    return small


def _auto_class(config: Any) -> Any:
    from .check import _auto_class as auto

    return auto(config)


def build(config: Any, directory: str | None = None) -> str:
    """Save a shrunk random copy of ``config``'s architecture; returns its directory."""
    import torch

    path = directory or tempfile.mkdtemp(prefix="hf-tpu-check-")
    torch.manual_seed(0)
    model = _auto_class(config).from_config(shrink(config))
    model.save_pretrained(path)
    return path


def _inputs(config: Any, device: str) -> dict[str, Any]:
    import torch

    ids = torch.randint(1, 200, (1, 12), generator=torch.Generator().manual_seed(0)).to(device)
    inputs = {"input_ids": ids}
    if config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :4]
    return inputs


def launch_two(script: str, detail: str) -> str:
    """Run ``script`` on 2 chips under ``hf-tpu launch``; ``detail`` when it exits 0, else raise its last line."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        proc = subprocess.run([sys.executable, "-m", "hf_tpu.cli", "launch", "-n", "2", f.name], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        errors = [
            line.strip() for line in lines if re.match(r"\s*[\w.]*(Error|Exception): ", line)
        ]  # a rank's own error
        raise RuntimeError(errors[0] if errors else (lines or ["TP=2 launch failed"])[-1])
    return detail


def run_feature(path: str, feature: str) -> str:
    """Run one feature here (in this process, on the emulated TPU); raises on failure, returns a detail line."""
    from . import check_run_diffusers

    if check_run_diffusers.is_diffusers_model(path):
        return check_run_diffusers.run_feature(path, feature)
    import torch
    import transformers

    import hf_tpu

    config = transformers.AutoConfig.from_pretrained(path)
    auto = _auto_class(config)
    if feature == "tp2":
        return launch_two(
            "import sys, torch, transformers\n"
            f"m = transformers.{auto.__name__}.from_pretrained({path!r}, tp_plan='auto')\n"
            "ids = torch.arange(1, 9).reshape(1, 8).to('tpu')\n"
            "extra = {'decoder_input_ids': ids[:, :4]} if m.config.is_encoder_decoder else {}\n"
            "print('logits', tuple(m(input_ids=ids, **extra).logits.shape))\n",
            "loaded with tp_plan='auto' on 2 chips, forward ran",
        )
    model = auto.from_pretrained(path, device_map="tpu")
    if feature == "load":
        return f"{sum(p.numel() for p in model.parameters()):,} parameters on {model.device}"
    inputs = _inputs(config, "tpu")
    if feature == "forward":
        cpu = auto.from_pretrained(path)
        with torch.no_grad():
            got = model(**inputs).logits.float().cpu()
            want = cpu(**{k: v.cpu() for k, v in inputs.items()}).logits.float()
        error = float((got - want).norm() / want.norm())
        if error > 0.05:  # TPU precision (bf16 matmuls) keeps a toy model's logits within ~1e-2
            raise AssertionError(f"logits differ from CPU by {error:.3g} (relative), beyond TPU precision (0.05)")
        return f"logits within {error:.2g} of CPU (relative)"
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    if feature == "generate":
        out = model.generate(**{k: v for k, v in inputs.items() if k != "decoder_input_ids"}, **kwargs)
        return f"{out.shape[-1]} tokens"
    if feature == "generate_compiled":
        prompt = {k: v for k, v in inputs.items() if k != "decoder_input_ids"}
        model.generate(**prompt, cache_implementation="static", **kwargs)  # warm-up: compiles
        with hf_tpu.watch_compiles() as report:
            model.generate(**prompt, cache_implementation="static", **kwargs)
        if report.count():
            raise AssertionError(f"{report.count()} compile(s) after warm-up: {report}")
        return "static cache, 0 compiles after warm-up"
    raise ValueError(f"unknown feature {feature!r}; one of {', '.join(FEATURES)}")


def run_all(path: str, *, with_tp: bool, timeout: float = 600) -> list[FeatureResult]:
    """Every feature of the copy in ``path`` (a transformers or diffusers model), each in its own process."""
    from . import check_run_diffusers
    from ._backend import needs_emulator

    features = check_run_diffusers.FEATURES if check_run_diffusers.is_diffusers_model(path) else FEATURES
    results = []
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATOR_HOST"}
    emulate = needs_emulator()
    if emulate:
        env["HF_TPU_EMULATE"] = "1"
    for feature in features:
        if feature == "tp2" and not with_tp:
            continue
        repro = f"{'HF_TPU_EMULATE=1 ' if emulate else ''}python -m hf_tpu.check_run {path} {feature}"
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "hf_tpu.check_run", path, feature], env=env,
                                  capture_output=True, text=True, timeout=timeout)  # fmt: skip
            lines = (proc.stdout.strip() or proc.stderr.strip() or "no output").splitlines()
            ok, detail = proc.returncode == 0, lines[-1]
            if proc.returncode < 0 or proc.returncode > 128:
                detail = f"the process died (signal {abs(proc.returncode) % 128}): {detail}"
        except subprocess.TimeoutExpired:
            ok, detail = False, f"timed out after {timeout:.0f} s"
        results.append(FeatureResult(feature, ok, time.perf_counter() - start, detail, repro))
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m hf_tpu.check_run DIR FEATURE\n")
        return 2
    try:
        detail = run_feature(argv[0], argv[1])
    except Exception as err:  # noqa: BLE001  (the last line is the feature's verdict)
        sys.stdout.write(f"FAIL {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}\n")
        return 1
    sys.stdout.write(f"ok {detail}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
