"""``hf-tpu check``: its byte counts against a real load on the emulated TPU, and its answers for six layouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

from hf_tpu.commands import check
from hf_tpu.commands.check import run as check_run

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4)
CONFIGS = {
    "dense": lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=4),
    "gqa": lambda: transformers.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16),
    "sliding": lambda: transformers.Gemma3TextConfig(
        **SMALL, num_key_value_heads=2, head_dim=16, sliding_window=32, sliding_window_pattern=2
    ),  # fmt: skip
    "moe": lambda: transformers.Qwen3MoeConfig(
        **SMALL, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    ),  # fmt: skip
    "mla": lambda: transformers.DeepseekV3Config(
        **SMALL,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),  # fmt: skip
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]()).to(torch.bfloat16)
    model.save_pretrained(path)
    return request.param, str(path)


def test_weight_bytes_match_a_real_load_on_the_emulator(checkpoint):
    name, path = checkpoint
    report = check.check(path, chip="v6e", dtype="bfloat16", batch=2, context=64)
    assert report.weight_source == "safetensors headers"
    before = torch.accelerator.memory_allocated()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
    loaded = torch.accelerator.memory_allocated() - before
    assert abs(report.weight_bytes - loaded) <= 0.02 * loaded, (name, report.weight_bytes, loaded)
    from_config = check.meta_parameters(check._config(path)) * 2  # the offline count without a checkpoint
    assert abs(from_config - loaded) <= 0.02 * loaded, (name, from_config, loaded)
    del model


def test_kv_cache_follows_the_layout(checkpoint):
    name, path = checkpoint
    config = check._config(path)
    kv, layout = check.kv_cache_bytes(config, batch=2, context=64, dtype_bytes=2)
    if name == "mla":
        assert kv == 4 * (16 + 8) * 2 * 64 * 2 and "MLA" in layout  # one latent + the RoPE key per token
    elif name == "sliding":
        full, sliding = config.layer_types.count("full_attention"), config.layer_types.count("sliding_attention")
        assert sliding and kv == 2 * 2 * 16 * 2 * 2 * (full * 64 + sliding * 32) and "sliding-window" in layout
    else:
        heads, head_dim = config.num_key_value_heads, getattr(config, "head_dim", None) or 16
        assert kv == 4 * 2 * heads * head_dim * 2 * 64 * 2, layout
    if name in ("dense", "gqa"):  # against the cache transformers allocates on the chip
        before = torch.accelerator.memory_allocated()
        cache = transformers.StaticCache(config=config, max_cache_len=64)
        cache.early_initialization(2, config.num_key_value_heads, getattr(config, "head_dim", 16), torch.bfloat16,
                                   torch.device("tpu"))  # fmt: skip
        allocated = torch.accelerator.memory_allocated() - before
        assert kv <= allocated <= kv * 1.01, (allocated, kv)  # transformers adds a few bytes of counters per layer
        del cache


def test_a_32b_model_from_its_config_needs_four_v6e_chips(tmp_path):
    """No checkpoint, just config.json: the weights are counted on the meta device."""
    transformers.Qwen3Config(vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                             num_attention_heads=64, num_key_value_heads=8, head_dim=128).save_pretrained(tmp_path)  # fmt: skip
    report = check.check(str(tmp_path), chip="v6e", dtype="bfloat16", batch=1, context=4096)
    assert report.weight_source.startswith("config on the meta device") and 32e9 < report.parameters < 34e9
    assert report.kv_cache_bytes == 64 * 2 * 8 * 128 * 4096 * 2  # 1 GiB at batch 1 x 4096
    assert [f.fits for f in report.fits] == [False, False, True, True]  # 66 GB of bf16 weights, 32 GB chips
    assert report.smallest_slice == "v6e-4" and report.tp_plan_source == "library"
    assert all(f.plan == "ok" for f in report.fits)  # 64 heads and 8 KV heads divide by 2, 4, 8
    four = report.fits[2]
    bound = check.CHIPS["v6e"]["bandwidth"] / (four.weights_per_chip + four.kv_cache_per_chip)
    assert report.decode_tokens_per_s_per_sequence["4"] == pytest.approx(bound)  # ~90 tokens/s per sequence
    assert "smallest slice that serves it: v6e-4" in check.format_text(report)


@pytest.mark.long
def test_cli_json_and_bad_input(tmp_path):
    path = tmp_path / "moe"
    transformers.AutoModelForCausalLM.from_config(CONFIGS["moe"]()).to(torch.bfloat16).save_pretrained(path)
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    proc = subprocess.run([sys.executable, "-m", "hf_tpu", "check", str(path), "--chip", "v5e", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["chip"] == "v5e" and report["smallest_slice"] == "v5e-1" and len(report["fits"]) == 4
    assert report["decode_tokens_per_s_per_sequence"]["1"] > 0 and report["risks"]
    assert report["weight_source"] == "safetensors headers" and any("MoE" in r for r in report["risks"])
    bad = subprocess.run([sys.executable, "-m", "hf_tpu", "check", str(tmp_path / "missing")], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "hf-tpu check:" in bad.stderr


def test_pipeline_components_match_a_real_load_on_the_emulator(tmp_path):
    from tests.diffusers.pipelines import BUILDERS, LOAD_KWARGS

    BUILDERS["sd3"](tmp_path)
    report = check.check_pipeline(str(tmp_path), chip="v5e")
    names = {c.name for c in report.components}
    assert {"transformer", "vae", "text_encoder"} <= names and report.denoiser == "transformer"
    import diffusers

    before = torch.accelerator.memory_allocated()
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(tmp_path), **LOAD_KWARGS["sd3"]).to("tpu")
    loaded = torch.accelerator.memory_allocated() - before
    assert abs(report.total_bytes - loaded) <= 0.02 * loaded, (report.total_bytes, loaded)
    assert report.fits_one_chip and all(report.denoiser_fits.values())
    del pipe


@pytest.mark.long
def test_run_a_shrunk_copy_feature_by_feature(tmp_path):
    """--run: the architecture's classes at toy size on the emulated TPU; every feature its own process."""
    transformers.Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128).save_pretrained(tmp_path)  # fmt: skip
    report = check.check(str(tmp_path), run=True)
    results = {r["feature"]: r for r in report.run}
    assert set(results) == set(check_run.FEATURES), results  # Qwen3 ships a TP plan: tp2 runs too
    assert all(r["ok"] for r in results.values()), results
    assert "0 compiles after warm-up" in results["generate_compiled"]["detail"]
    small = transformers.AutoConfig.from_pretrained(report.run_model)
    assert small.num_hidden_layers == 2 and small.num_key_value_heads < small.num_attention_heads  # still GQA
    bad = subprocess.run([sys.executable, "-m", "hf_tpu.commands.check.run", report.run_model, "nope"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "HF_TPU_EMULATE": "1"})  # fmt: skip
    assert bad.returncode == 1 and "FAIL ValueError: unknown feature 'nope'" in bad.stdout


def test_risks_come_from_the_ops_the_architecture_calls():
    """The gaps a model meets are found by tracing a shrunk copy's forward and backward, not guessed from its type."""
    gqa = CONFIGS["gqa"]()
    assert set(check._risks(gqa)[1]) == {"fully_masked_attention_row", "attention_precision"}  # SDPA, boolean mask
    eager = CONFIGS["gqa"]()
    eager._attn_implementation = "eager"
    assert check._risks(eager)[1] == []  # no SDPA call, so none of its gaps
    t5 = transformers.T5Config(vocab_size=128, d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16)
    risks, gaps = check._risks(t5)
    assert "differentiable_attention_mask" in gaps  # T5's learned position bias is an attention mask with a gradient
    assert any(r.startswith("gap differentiable_attention_mask:") and "closed by hf-tpu's" in r for r in risks)


def test_expert_parallel_degrees(tmp_path):
    CONFIGS["moe"]().save_pretrained(tmp_path)
    report = check.check(str(tmp_path))
    # 4 experts, 2 KV heads: EP4 splits the experts but the attention at TP=4 cannot split 2 KV heads
    assert report.expert_parallel == {
        "2": "2 experts per chip",
        "4": "1 expert per chip (but the rest of the model at TP=4 does not split)",
        "8": "4 experts do not split 8 ways",
    }
    assert "EP2: 2 experts per chip" in check.format_text(report)
    assert check._expert_parallel(CONFIGS["dense"]()) == {}  # a dense model gets no expert-parallel line


@pytest.mark.long
def test_run_a_diffusers_pipeline_denoiser(tmp_path):
    """--run on a saved SD3 pipeline: its transformer shrunk, loaded, against CPU, compiled with 0 recompiles, TP=2."""
    from tests.diffusers.pipelines import BUILDERS

    BUILDERS["sd3"](tmp_path)
    report = check.check_pipeline(str(tmp_path), run=True)
    results = {r["feature"]: r for r in report.run}
    assert set(results) == {"load", "forward", "compiled", "tp2"}, results  # hf-tpu's registry gives SD3 a plan
    assert all(r["ok"] for r in results.values()), results
    assert "0 compiles after warm-up" in results["compiled"]["detail"]
    assert "tp2" in check.format_pipeline(report)


def test_shrunk_sdxl_unet_runs_against_cpu(tmp_path):
    """The UNet path (SDXL's added text/time conditioning), in this process: shrink, build, forward vs CPU."""
    import diffusers

    from hf_tpu.commands.check import run_diffusers as check_run_diffusers

    unet = tmp_path / "unet"
    diffusers.UNet2DConditionModel(
        sample_size=32, block_out_channels=(32, 64, 128), layers_per_block=2, cross_attention_dim=64,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4, 8),
        addition_embed_type="text_time", addition_time_embed_dim=16, projection_class_embeddings_input_dim=16 * 6 + 64,
        transformer_layers_per_block=(1, 2, 2), norm_num_groups=32,
    ).save_pretrained(unet)  # fmt: skip
    copy = check_run_diffusers.build(str(unet), str(tmp_path / "small"))
    small = diffusers.UNet2DConditionModel.from_pretrained(copy)
    assert list(small.config.down_block_types) == ["DownBlock2D", "CrossAttnDownBlock2D"]
    assert small.config.layers_per_block == 1
    assert "within" in check_run_diffusers.run_feature(copy, "forward")
