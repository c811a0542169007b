"""``hf-tpu check --run`` for diffusers denoisers: a shrunk random copy of a transformer or UNet, feature by feature.

Same contract as :mod:`hf_tpu.commands.check.run` (each feature in its own process, its command line the repro), for the
denoisers whose inputs it knows how to build: SD3's and Flux's transformers and ``UNet2DConditionModel``
(SD 1.x/2.x and SDXL's, with its added text/time conditioning).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

FEATURES = ("load", "forward", "compiled", "tp2")
KNOWN = ("SD3Transformer2DModel", "FluxTransformer2DModel", "UNet2DConditionModel")
# Toy sizes by class; only keys the original config has are changed.
_SHRINK: dict[str, dict[str, Any]] = {
    "SD3Transformer2DModel": {
        "sample_size": 8, "patch_size": 1, "in_channels": 4, "out_channels": 4, "num_layers": 2,
        "attention_head_dim": 8, "num_attention_heads": 4, "joint_attention_dim": 32, "caption_projection_dim": 32,
        "pooled_projection_dim": 32, "pos_embed_max_size": 16,
    },
    "FluxTransformer2DModel": {
        "patch_size": 1, "in_channels": 4, "out_channels": None, "num_layers": 1, "num_single_layers": 1,
        "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 32,
        "axes_dims_rope": [4, 4, 8],
    },
    "UNet2DConditionModel": {
        "sample_size": 16, "layers_per_block": 1, "cross_attention_dim": 32, "norm_num_groups": 8,
        "addition_time_embed_dim": 8, "transformer_layers_per_block": 1,
    },
}  # fmt: skip


def is_diffusers_model(path: str) -> bool:
    """A directory holding one diffusers model (its config.json names the class)."""
    config = os.path.join(path, "config.json")
    return os.path.isfile(config) and "_class_name" in json.load(open(config))


def _class(name: str) -> Any:
    import diffusers

    if name not in KNOWN:
        raise ValueError(f"--run builds inputs for {', '.join(KNOWN)}; {name} gets the fit report only")
    return getattr(diffusers, name)


def shrink(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a denoiser's config at toy widths (one or two blocks), keeping its kind of blocks."""
    name = config["_class_name"]
    _class(name)
    small = {k: v for k, v in config.items() if not k.startswith("_")}
    small.update({k: v for k, v in _SHRINK[name].items() if k in config})
    if name == "SD3Transformer2DModel" and config.get("dual_attention_layers"):
        small["dual_attention_layers"] = (0,)  # SD3.5's dual-attention block kind, kept once
    if name == "UNet2DConditionModel":
        down, up = list(config["down_block_types"]), list(config["up_block_types"])
        small["down_block_types"], small["up_block_types"] = down[:1] + down[-1:], up[:1] + up[-1:]
        small["block_out_channels"] = [32, 64]
        heads = config.get("attention_head_dim")
        small["attention_head_dim"] = [8, 8] if isinstance(heads, (list, tuple)) else 8
        if config.get("num_attention_heads") is not None:
            small["num_attention_heads"] = [2, 2] if isinstance(config["num_attention_heads"], (list, tuple)) else 2
        if config.get("addition_embed_type") == "text_time":  # SDXL: 6 time ids and the pooled text embedding
            small["projection_class_embeddings_input_dim"] = 6 * small["addition_time_embed_dim"] + 32
    return small


def build(model_dir: str, directory: str | None = None) -> str:
    """Save a shrunk random copy of the denoiser in ``model_dir``; returns its directory."""
    import torch

    config = json.load(open(os.path.join(model_dir, "config.json")))
    cls = _class(config["_class_name"])
    path = directory or tempfile.mkdtemp(prefix="hf-tpu-check-")
    torch.manual_seed(0)
    cls.from_config(shrink(config)).save_pretrained(path)
    return path


def inputs(model: Any, device: str) -> dict[str, Any]:
    """Inputs of the right shapes for the denoiser ``model`` (seeded, made on CPU, then moved)."""
    import torch

    g = torch.Generator().manual_seed(0)
    c = model.config
    name = type(model).__name__
    if name == "SD3Transformer2DModel":
        size = c.sample_size
        made = {
            "hidden_states": torch.randn(1, c.in_channels, size, size, generator=g),
            "encoder_hidden_states": torch.randn(1, 6, c.joint_attention_dim, generator=g),
            "pooled_projections": torch.randn(1, c.pooled_projection_dim, generator=g),
            "timestep": torch.tensor([500]),
        }
    elif name == "FluxTransformer2DModel":
        made = {
            "hidden_states": torch.randn(1, 16, c.in_channels, generator=g),
            "encoder_hidden_states": torch.randn(1, 6, c.joint_attention_dim, generator=g),
            "pooled_projections": torch.randn(1, c.pooled_projection_dim, generator=g),
            "img_ids": torch.randn(16, 3, generator=g),
            "txt_ids": torch.randn(6, 3, generator=g),
            "timestep": torch.tensor([0.5]),
        }
        if c.guidance_embeds:
            made["guidance"] = torch.tensor([3.5])
    else:
        made = {
            "sample": torch.randn(1, c.in_channels, c.sample_size, c.sample_size, generator=g),
            "timestep": torch.tensor([10]),
            "encoder_hidden_states": torch.randn(1, 6, c.cross_attention_dim, generator=g),
        }
        if c.addition_embed_type == "text_time":
            text = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
            made["added_cond_kwargs"] = {
                "text_embeds": torch.randn(1, text, generator=g),
                "time_ids": torch.randn(1, 6, generator=g),
            }
    move = lambda v: {k: t.to(device) for k, t in v.items()} if isinstance(v, dict) else v.to(device)  # noqa: E731
    return {k: move(v) for k, v in made.items()}


def has_tp_plan(path: str) -> bool:
    """Whether the class ships a ``_tp_plan`` or hf-tpu's registry has one for it."""
    from hf_tpu.tp_plans import get
    from hf_tpu.tp_plans._builtin import register_builtin

    register_builtin()  # the registry is filled at TPU set-up; this process may not have set one up
    cls = _class(json.load(open(os.path.join(path, "config.json")))["_class_name"])
    return bool(cls.__dict__.get("_tp_plan")) or get(cls) is not None


def run_feature(path: str, feature: str) -> str:
    """Run one feature here, on the (emulated) TPU; raises on failure, returns a detail line."""
    import torch

    import hf_tpu

    cls = _class(json.load(open(os.path.join(path, "config.json")))["_class_name"])
    if feature == "tp2":
        from hf_tpu.commands.check.toy import launch_two

        return launch_two(
            "import torch, torch.distributed as dist, diffusers\n"
            "from hf_tpu.commands.check.run_diffusers import inputs\n"
            "dist.init_process_group('tpu_dist')  # diffusers applies a parallel_config only inside a process group\n"
            "config = diffusers.ParallelConfig(tensor_parallel_config=diffusers.TensorParallelConfig(tp_degree=2))\n"
            f"m = diffusers.{cls.__name__}.from_pretrained({path!r}, parallel_config=config)\n"
            "with torch.no_grad():\n"
            "    print('sample', tuple(m(**inputs(m, 'tpu')).sample.shape))\n",
            "loaded with TensorParallelConfig(tp_degree=2) on 2 chips, forward ran",
        )
    model = cls.from_pretrained(path).to("tpu").eval()
    if feature == "load":
        return f"{sum(p.numel() for p in model.parameters()):,} parameters on {model.device}"
    with torch.no_grad():
        if feature == "forward":
            got = model(**inputs(model, "tpu")).sample.float().cpu()
            cpu = cls.from_pretrained(path).eval()
            want = cpu(**inputs(cpu, "cpu")).sample.float()
            error = float((got - want).norm() / want.norm())
            if error > 0.05:  # TPU precision (bf16 matmuls) keeps a toy denoiser within ~1e-2
                raise AssertionError(f"output differs from CPU by {error:.3g} (relative), beyond TPU precision (0.05)")
            return f"output within {error:.2g} of CPU (relative)"
        if feature == "compiled":
            model.compile(backend="tpu", fullgraph=True, dynamic=False)
            model(**inputs(model, "tpu"))  # warm-up: compiles
            with hf_tpu.watch_compiles() as report:
                model(**inputs(model, "tpu"))
            if report.count():
                raise AssertionError(f"{report.count()} compile(s) after warm-up: {report}")
            return "compile(backend='tpu', fullgraph=True, dynamic=False): 0 compiles after warm-up"
    raise ValueError(f"unknown feature {feature!r}; one of {', '.join(FEATURES)}")
