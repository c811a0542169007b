"""``hf-tpu check MODEL --run``: does this architecture run on the (emulated) TPU? A shrunk random copy, feature by feature.

The copy keeps the model's classes and layout kinds (attention variant, sliding windows, experts, latent
caches) at toy widths and two or three layers, with random weights, saved to a directory. Each feature runs in a
process of its own with a timeout (an abort costs one feature), and its command line is the repro:

    python -m hf_tpu.commands.check.run DIR FEATURE
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from hf_tpu.commands.check.toy import auto_class, launch_two, shrink

FEATURES = ("load", "forward", "generate", "generate_compiled", "tp2")


@dataclass
class FeatureResult:
    feature: str
    ok: bool
    seconds: float
    detail: str
    repro: str


def build(config: Any, directory: str | None = None) -> str:
    """Save a shrunk random copy of ``config``'s architecture; returns its directory."""
    import torch

    path = directory or tempfile.mkdtemp(prefix="hf-tpu-check-")
    torch.manual_seed(0)
    model = auto_class(config).from_config(shrink(config))
    model.save_pretrained(path)
    return path


def _inputs(config: Any, device: str) -> dict[str, Any]:
    import torch

    ids = torch.randint(1, 200, (1, 12), generator=torch.Generator().manual_seed(0)).to(device)
    inputs = {"input_ids": ids}
    if config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :4]
    return inputs


def run_feature(path: str, feature: str) -> str:
    """Run one feature here (in this process, on the emulated TPU); raises on failure, returns a detail line."""
    from hf_tpu.commands.check import run_diffusers as check_run_diffusers

    if check_run_diffusers.is_diffusers_model(path):
        return check_run_diffusers.run_feature(path, feature)
    import torch
    import transformers

    import hf_tpu

    config = transformers.AutoConfig.from_pretrained(path)
    auto = auto_class(config)
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
    from hf_tpu.commands.check import run_diffusers as check_run_diffusers
    from hf_tpu.plumbing.backend import needs_emulator

    features = check_run_diffusers.FEATURES if check_run_diffusers.is_diffusers_model(path) else FEATURES
    results = []
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATOR_HOST"}
    emulate = needs_emulator()
    if emulate:
        env["HF_TPU_EMULATE"] = "1"
    for feature in features:
        if feature == "tp2" and not with_tp:
            continue
        repro = f"{'HF_TPU_EMULATE=1 ' if emulate else ''}python -m hf_tpu.commands.check.run {path} {feature}"
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "hf_tpu.commands.check.run", path, feature], env=env,
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
        sys.stderr.write("usage: python -m hf_tpu.commands.check.run DIR FEATURE\n")
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
