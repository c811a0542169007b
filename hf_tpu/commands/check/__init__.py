"""``hf-tpu check MODEL``: before renting a TPU, whether a model fits, on what slice, and how fast it can go.

Offline: weights are counted from the safetensors headers of a local checkpoint (no tensor is read), or, for a
config alone, from the model built on the meta device. The KV cache follows the config (layers, KV heads, head
size, sliding-window layers, DeepSeek-style latent caches). Speed figures are upper bounds from the chip table:
decoding reads every weight once per step (HBM bandwidth), prefill is bounded by bf16 FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from hf_tpu.commands.check.toy import auto_class
from hf_tpu.plumbing.chips import GENERATIONS, SOURCE

GB = 1000**3
# Per chip (TorchTPU shows a v7 chip as two devices of half each), from the one chip table.
CHIPS: dict[str, dict[str, float]] = {
    g.key: {
        "hbm": g.hbm_bytes * g.devices_per_chip,
        "bandwidth": g.hbm_bandwidth * g.devices_per_chip,
        "bf16_flops": g.bf16_flops * g.devices_per_chip,
    }
    for g in GENERATIONS.values()
}
CHIP_SOURCE = SOURCE
DEGREES = (1, 2, 4, 8)
# What the chip needs beyond weights and KV cache: activations, compiler workspace, runtime. Stated, not measured.
MARGIN_FRACTION, MARGIN_BYTES = 0.10, 1 * GB
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "int8": 1, "fp8": 1}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip


@dataclass
class Fit:
    tp: int
    weights_per_chip: int
    kv_cache_per_chip: int
    margin_per_chip: int
    needed_per_chip: int
    hbm_per_chip: int
    fits: bool
    plan: str  # "ok", or the validator's reason this degree does not work


@dataclass
class Report:
    model: str
    model_type: str
    chip: str
    dtype: str
    batch: int
    context: int
    parameters: int
    weight_bytes: int
    weight_source: str
    kv_cache_bytes: int
    kv_cache_layout: str
    tp_plan_source: str
    fits: list[Fit] = field(default_factory=list)
    smallest_slice: str | None = None
    decode_tokens_per_s_per_sequence: dict[str, float] = field(default_factory=dict)
    prefill_tokens_per_s: dict[str, float] = field(default_factory=dict)
    risks: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # gaps of ``hf-tpu gaps`` the architecture's ops meet
    expert_parallel: dict[str, str] = field(default_factory=dict)  # EP degree -> experts per chip, or why not
    chip_table: dict[str, Any] = field(default_factory=dict)
    run: list[dict[str, Any]] = field(default_factory=list)  # --run: one entry per feature
    run_model: str | None = None  # --run: the shrunk copy the features ran on

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _config(model: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model)


def _text(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def safetensors_bytes(directory: str) -> tuple[int, int] | None:
    """(bytes, parameters) from the headers of every ``*.safetensors`` file in ``directory``; None if none."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors")) if os.path.isdir(directory) else []
    if not files:
        return None
    total = count = 0
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            total += end - begin
            count += math.prod(entry["shape"]) if entry["shape"] else 1
    return total, count


def meta_parameters(config: Any) -> int:
    """Parameters of the model built from ``config`` on the meta device (no memory), tied weights once."""
    import torch

    with torch.device("meta"):
        model = auto_class(config).from_config(config)
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config: Any, batch: int, context: int, dtype_bytes: int) -> tuple[int, str]:
    """KV-cache bytes at ``batch`` x ``context`` and a one-line description of the layout."""
    text = _text(config)
    layers = text.num_hidden_layers
    if getattr(text, "kv_lora_rank", None):  # MLA (DeepSeek V2/V3): one latent + the RoPE key per token
        per_token = text.kv_lora_rank + text.qk_rope_head_dim
        return layers * per_token * batch * context * dtype_bytes, f"MLA latent cache {per_token} per token"
    layers = getattr(text, "num_decoder_layers", None) or layers  # encoder-decoder: the decoder's self-attention
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = (
        getattr(text, "head_dim", None) or getattr(text, "d_kv", None) or text.hidden_size // text.num_attention_heads
    )
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * layers
    total = 0
    sliding = 0
    for kind in layer_types[:layers]:
        length = min(context, window) if kind == "sliding_attention" and window else context
        sliding += kind == "sliding_attention"
        total += 2 * heads * head_dim * batch * length * dtype_bytes
    layout = f"{layers} layers x {heads} KV heads x {head_dim}"
    if sliding:
        layout += f", {sliding} of them sliding-window ({window})"
    return total, layout


def _tp_plan(config: Any) -> tuple[str, Any]:
    """Where a TP plan would come from, and the meta model (for validation)."""
    import torch

    from hf_tpu import tp_plans

    with torch.device("meta"):
        model = auto_class(config).from_config(config)
    library = getattr(model, "_tp_plan", None) or getattr(_text(config), "base_model_tp_plan", None)
    if library:
        return "library", (model, dict(getattr(model, "_tp_plan", None) or {}))
    registered = tp_plans.get(type(model))
    if registered is not None:
        return "hf-tpu registry", (model, dict(registered))
    derived = tp_plans.derive_plan(model)
    if derived.plan:
        return "derived", (model, derived.plan)
    return "none", (model, {})


def _inactive_expert_bytes(model: Any, config: Any, weight_bytes: int, params: int) -> int:
    """Bytes of the experts a token does not use (an MoE decode step reads only the routed top-k experts)."""
    text = _text(config)
    experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None) or getattr(
        text, "n_routed_experts", None)  # fmt: skip
    top_k = getattr(text, "num_experts_per_tok", None)
    if not experts or not top_k or not params:
        return 0
    expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return int(expert_params * (1 - top_k / experts) * weight_bytes / params)


def _plan_status(model: Any, plan: dict[str, Any], tp: int) -> str:
    from hf_tpu import tp_plans
    from hf_tpu.tp_plans._core import _keys

    if tp == 1:
        return "ok"
    if not plan:
        return "no plan"
    # A library plan covers a family's variants (dense and MoE layers alike); rules that match no module of
    # this model are ignored when loading, so they are left out here too.
    names = {k for n, _ in (*model.named_modules(), *model.named_parameters()) for k in _keys(n)}
    plan = {rule: style for rule, style in plan.items() if rule in names}
    try:
        tp_plans.validate_plan(model, plan, tp)
    except Exception as err:  # noqa: BLE001  (the validator's own message is the answer)
        return str(err).splitlines()[0]
    return "ok"


def _risks(config: Any) -> tuple[list[str], list[str]]:
    """Known risks: the TorchTPU gaps the architecture's own ops meet (traced on a shrunk copy, matched with the
    gap table), then what its config says (experts, sliding windows, latent caches, tied embeddings)."""
    from hf_tpu.commands.check import ops as check_ops

    text = _text(config)
    risks, gaps = [], []
    try:
        met = check_ops.gaps_met(check_ops.ops_used(config))
    except Exception as err:  # noqa: BLE001  (an architecture the tracer cannot build: say so, keep the rest)
        risks.append(f"ops not traced ({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''})")
        met = []
    for gap in met:
        gaps.append(gap.name)
        fix = (
            f"closed by hf-tpu's {gap.workaround}"
            if gap.workaround
            else f"no workaround: {gap.advice or 'see hf-tpu gaps'}"
        )
        risks.append(f"gap {gap.name}: {gap.breaks} ({fix}; hf-tpu gaps --show {gap.name})")
    if _experts(config):
        risks.append('MoE: load with experts_implementation="tokamax_ragged_dot" (the shipped ragged-dot kernel)')
    if getattr(text, "sliding_window", None):
        risks.append("sliding-window attention: a growing cache recompiles per length; use a static cache")
    if getattr(text, "kv_lora_rank", None):
        risks.append("MLA attention: the cache holds one latent per token; check --run before relying on TP")
    if getattr(config, "tie_word_embeddings", False):
        risks.append("tied embeddings: keep embedding and lm_head on one device (TorchTPU gap weight_tying)")
    risks.append("generate(): use cache_implementation='static' and pad prompts to a few lengths to avoid recompiles")
    return risks, gaps


def _experts(config: Any) -> int:
    text = _text(config)
    return int(
        getattr(text, "num_local_experts", None)
        or getattr(text, "num_experts", None)
        or getattr(text, "n_routed_experts", None)
        or 0
    )


def _expert_parallel(config: Any) -> dict[str, str]:
    """transformers' expert parallel (``DistributedConfig(enable_expert_parallel=True, ep_size=N)``): each chip
    holds num_experts / N experts; N must divide the experts."""
    experts = _experts(config)
    if not experts:
        return {}
    return {
        str(n): f"{experts // n} expert{'s' if experts // n > 1 else ''} per chip"
        if experts % n == 0
        else f"{experts} experts do not split {n} ways"
        for n in DEGREES[1:]
    }


@dataclass
class Component:
    name: str
    library_class: str
    weight_bytes: int
    parameters: int


@dataclass
class PipelineReport:
    """A diffusers pipeline: every component's weights, and whether the whole pipeline fits one chip."""

    model: str
    pipeline_class: str
    chip: str
    components: list[Component]
    total_bytes: int
    needed_one_chip: int
    hbm_per_chip: int
    fits_one_chip: bool
    denoiser: str | None
    denoiser_fits: dict[str, bool] = field(default_factory=dict)  # TP degree -> the denoiser's share fits
    chip_table: dict[str, Any] = field(default_factory=dict)
    run: list[dict[str, Any]] = field(default_factory=list)  # --run: the denoiser's features
    run_model: str | None = None  # --run: the shrunk copy of the denoiser

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def check_pipeline(model: str, *, chip: str = "v6e", run: bool = False) -> PipelineReport:
    """Per-component weights of a saved diffusers pipeline (``model_index.json``) or of one diffusers model
    (``config.json`` naming its class), from the safetensors headers; ``run=True`` also runs a shrunk random copy
    of the denoiser (transformer or UNet) on the (emulated) TPU, feature by feature."""
    if chip not in CHIPS:
        raise ValueError(f"chip={chip!r} is not one of {', '.join(CHIPS)}.")
    spec = CHIPS[chip]
    components = []
    if os.path.isfile(os.path.join(model, "model_index.json")):
        index = json.load(open(os.path.join(model, "model_index.json")))
        for name, value in index.items():
            if name.startswith("_") or not isinstance(value, list) or value[0] is None:
                continue
            counted = safetensors_bytes(os.path.join(model, name))
            if counted is not None:
                components.append(Component(name, f"{value[0]}.{value[1]}", counted[0], counted[1]))
    else:  # one model: it is its own denoiser when it is a transformer or a UNet
        index = {"_class_name": json.load(open(os.path.join(model, "config.json")))["_class_name"]}
        counted = safetensors_bytes(model)
        if counted is None:
            raise ValueError(f"{model}: no safetensors weights to count")
        kind = "unet" if "UNet" in index["_class_name"] else "transformer"
        components.append(Component(kind, f"diffusers.{index['_class_name']}", counted[0], counted[1]))
    total = sum(c.weight_bytes for c in components)
    needed = int(total * (1 + MARGIN_FRACTION)) + MARGIN_BYTES
    denoiser = next((c for c in components if c.name in ("transformer", "unet")), None)
    report = PipelineReport(model, index.get("_class_name", "?"), chip, components, total, needed, int(spec["hbm"]),
                            needed <= spec["hbm"], denoiser.name if denoiser else None,
                            chip_table={**spec, "source": CHIP_SOURCE})  # fmt: skip
    if denoiser is not None:
        rest = total - denoiser.weight_bytes  # text encoders and VAE stay whole on every chip
        for tp in DEGREES:
            share = int((denoiser.weight_bytes / tp + rest) * (1 + MARGIN_FRACTION)) + MARGIN_BYTES
            report.denoiser_fits[str(tp)] = share <= spec["hbm"]
    if run:
        from hf_tpu.commands.check import run as check_run
        from hf_tpu.commands.check import run_diffusers as check_run_diffusers

        if denoiser is None:
            raise ValueError(f"{model}: --run needs a transformer or UNet component")
        source = (
            model if not os.path.isfile(os.path.join(model, "model_index.json")) else os.path.join(model, denoiser.name)
        )
        report.run_model = check_run_diffusers.build(source)
        with_tp = check_run_diffusers.has_tp_plan(report.run_model)
        report.run = [asdict(r) for r in check_run.run_all(report.run_model, with_tp=with_tp)]
    return report


def format_pipeline(r: PipelineReport) -> str:
    gb = lambda n: f"{n / GB:.2f} GB"  # noqa: E731
    lines = [f"{r.model} ({r.pipeline_class}): {gb(r.total_bytes)} of weights in {len(r.components)} components"]
    lines += [f"  {c.name:<16} {c.library_class:<44} {gb(c.weight_bytes):>10}" for c in r.components]
    lines.append(f"whole pipeline on one {r.chip} chip: needs {gb(r.needed_one_chip)} of {gb(r.hbm_per_chip)}: "
                 f"{'fits' if r.fits_one_chip else 'does not fit'}")  # fmt: skip
    if r.denoiser:
        fits = ", ".join(f"TP{tp}: {'yes' if ok else 'no'}" for tp, ok in r.denoiser_fits.items())
        lines.append(f"{r.denoiser} sharded (TensorParallelConfig), the rest whole on every chip: {fits}")
    lines += _format_run(r.run, r.run_model)
    return "\n".join(lines)


def _format_run(run: list[dict[str, Any]], run_model: str | None) -> list[str]:
    if not run:
        return []
    lines = [f"run on the (emulated) TPU, a shrunk random copy in {run_model}:"]
    for f in run:
        lines.append(f"  {f['feature']:<18} {'pass' if f['ok'] else 'FAIL'}  {f['detail']}  ({f['seconds']:.0f} s)")
        if not f["ok"]:
            lines.append(f"  {'':<18} repro: {f['repro']}")
    return lines


def check(
    model: str, *, chip: str = "v6e", dtype: str = "bfloat16", batch: int = 1, context: int = 4096, run: bool = False
) -> Report:
    """Fit, parallelism, speed bounds and known risks of ``model`` (a local directory or a config) on ``chip``;
    ``run=True`` also runs a shrunk random copy on the (emulated) TPU, feature by feature (``hf_tpu.commands.check.run``)."""
    if chip not in CHIPS:
        raise ValueError(f"chip={chip!r} is not one of {', '.join(CHIPS)}.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}.")
    if batch < 1 or context < 1:
        raise ValueError(f"batch={batch} and context={context} must be positive.")
    config = _config(model)
    width = DTYPE_BYTES[dtype]
    counted = safetensors_bytes(model)
    if counted is not None and counted[0] == counted[1] * width:
        weight_bytes, params, source = counted[0], counted[1], "safetensors headers"
    elif counted is not None:
        params = counted[1]
        weight_bytes, source = params * width, f"safetensors headers ({params} parameters) at {dtype}"
    else:
        params = meta_parameters(config)
        weight_bytes, source = params * width, f"config on the meta device at {dtype}"
    kv, layout = kv_cache_bytes(config, batch, context, width)
    plan_source, (meta_model, plan) = _tp_plan(config)
    read_per_token = weight_bytes - _inactive_expert_bytes(meta_model, config, weight_bytes, params)
    spec = CHIPS[chip]
    report = Report(model, _text(config).model_type, chip, dtype, batch, context, params, weight_bytes, source, kv,
                    layout, plan_source, chip_table={**CHIPS[chip], "source": CHIP_SOURCE})  # fmt: skip
    for tp in DEGREES:
        weights, cache = math.ceil(weight_bytes / tp), math.ceil(kv / tp)
        margin = int(MARGIN_FRACTION * (weights + cache)) + MARGIN_BYTES
        needed = weights + cache + margin
        status = _plan_status(meta_model, plan, tp)
        fits = needed <= spec["hbm"] and status == "ok"
        report.fits.append(Fit(tp, weights, cache, margin, needed, int(spec["hbm"]), fits, status))
        # Upper bounds: each decode step reads this chip's weights and KV cache once; prefill at peak FLOP/s.
        report.decode_tokens_per_s_per_sequence[str(tp)] = spec["bandwidth"] / (read_per_token / tp + cache)
        report.prefill_tokens_per_s[str(tp)] = spec["bf16_flops"] * tp / (2 * params)
    report.smallest_slice = next((f"{chip}-{f.tp}" for f in report.fits if f.fits), None)
    report.risks, report.gaps = _risks(config)
    report.expert_parallel = _expert_parallel(config)
    for fit in report.fits[1:]:  # expert parallel runs with the rest of the model at TP=N: its plan must hold too
        if report.expert_parallel.get(str(fit.tp), "").endswith("per chip") and fit.plan != "ok":
            report.expert_parallel[str(fit.tp)] += f" (but the rest of the model at TP={fit.tp} does not split)"
    if run:
        from hf_tpu.commands.check import run as check_run

        report.run_model = check_run.build(config)
        with_tp = plan_source != "none" and report.fits[1].plan == "ok"
        report.run = [asdict(r) for r in check_run.run_all(report.run_model, with_tp=with_tp)]
    return report


def format_text(r: Report) -> str:
    gb = lambda n: f"{n / GB:.1f} GB"  # noqa: E731
    lines = [
        f"{r.model} ({r.model_type}): {r.parameters / 1e9:.2f} B parameters, {gb(r.weight_bytes)} of weights "
        f"({r.weight_source})",
        f"KV cache at batch {r.batch} x context {r.context}: {gb(r.kv_cache_bytes)} ({r.kv_cache_layout})",
        f"tensor-parallel plan: {r.tp_plan_source}",
        f"{'TP':>3} {'weights':>10} {'KV cache':>10} {'margin':>9} {'needed':>10} {'HBM':>8}  fits  plan",
    ]
    for f in r.fits:
        lines.append(
            f"{f.tp:>3} {gb(f.weights_per_chip):>10} {gb(f.kv_cache_per_chip):>10} {gb(f.margin_per_chip):>9} "
            f"{gb(f.needed_per_chip):>10} {gb(f.hbm_per_chip):>8}  {'yes' if f.fits else 'no ':<4}  {f.plan}"
        )
    lines.append(f"smallest slice that serves it: {r.smallest_slice or f'none up to {r.chip}-8'}")
    bounds = ", ".join(f"TP{tp}: {v:,.0f}" for tp, v in r.decode_tokens_per_s_per_sequence.items())
    lines.append(f"decode upper bound, tokens/s per sequence (HBM bandwidth): {bounds}")
    bounds = ", ".join(f"TP{tp}: {v:,.0f}" for tp, v in r.prefill_tokens_per_s.items())
    lines.append(f"prefill upper bound, tokens/s (bf16 FLOP/s): {bounds}")
    lines.append(f"chip {r.chip}: {gb(r.chip_table['hbm'])} HBM, {r.chip_table['bandwidth'] / GB:,.0f} GB/s, "
                 f"{r.chip_table['bf16_flops'] / 1e12:,.0f} bf16 TFLOP/s ({CHIP_SOURCE})")  # fmt: skip
    lines.append(f"margin per chip: {MARGIN_FRACTION:.0%} of weights + KV cache, plus {gb(MARGIN_BYTES)}")
    if r.expert_parallel:
        ep = ", ".join(f"EP{n}: {text}" for n, text in r.expert_parallel.items())
        lines.append(f"expert parallel (DistributedConfig(enable_expert_parallel=True, ep_size=N), with TP=N): {ep}")
    lines += [f"risk: {risk}" for risk in r.risks]
    lines += _format_run(r.run, r.run_model)
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    chk = sub.add_parser("check", help="whether a model fits a TPU slice, its plan, speed bounds and risks (offline)")
    chk.add_argument("model", help="a local checkpoint directory, or a Hub id whose config is cached")
    chk.add_argument("--chip", default="v6e", choices=sorted(CHIPS))
    chk.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    chk.add_argument("--batch", type=int, default=1)
    chk.add_argument("--context", type=int, default=4096)
    chk.add_argument(
        "--json", action="store_true", help="print the report as JSON (one schema: hf_tpu.commands.check.Report)"
    )
    chk.add_argument("--run", action="store_true", help="also run a shrunk random copy on the (emulated) TPU")
    chk.set_defaults(command_function=command)


def command(args: argparse.Namespace) -> int:
    """``hf-tpu check``: a model's report (a diffusers pipeline or model: one per component)."""
    from hf_tpu.commands.check.run_diffusers import is_diffusers_model

    try:
        if os.path.isfile(os.path.join(args.model, "model_index.json")) or is_diffusers_model(args.model):
            pipe = check_pipeline(args.model, chip=args.chip, run=args.run)
            sys.stdout.write((pipe.to_json() if args.json else format_pipeline(pipe)) + "\n")
            return 0
        report = check(args.model, chip=args.chip, dtype=args.dtype, batch=args.batch, context=args.context,
                       run=args.run)  # fmt: skip
    except (OSError, ValueError) as err:
        sys.stderr.write(f"hf-tpu check: {err}\n")
        return 2
    sys.stdout.write((report.to_json() if args.json else format_text(report)) + "\n")
    return 0
