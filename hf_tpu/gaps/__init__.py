"""TorchTPU's known gaps: one table with what breaks, the evidence, how the emulator reproduces each,
and which hf-tpu workaround closes it.

Evidence: [ci] Hugging Face's TPU CI on 8x v6e with torch_tpu 0.1.2.dev20261005 (transformers'
``utils/tpu_ci/``: failure counts and standalone probes); [wheel] the torch-tpu 0.2.0 wheel (its
Python sources and the kernel names in its ``libpywrap_2_13_0_common.so``); [run] the 0.2.0 wheel
itself, run on XLA:CPU (``HF_TPU_XLA_CPU=1``); [reading] inferred, not seen on a chip. ``fixed_in`` is the first TorchTPU release known to fix a gap (None: no fix known,
so the gap is assumed present in every release); the emulator's ``torch_tpu`` profile is TorchTPU 0.2.0, so it
reproduces only the gaps 0.2.0 has.

``hf-tpu gaps`` runs :data:`PROBES`' scripts (``probes.py``), one subprocess each, and records what
it measured; workarounds are installed from that measurement when there is one for this backend,
else from this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    """One known gap of the TPU backend (or of a library's TPU support)."""

    name: str
    breaks: str  # what a user meets
    evidence: str  # versions known to have it, and how we know
    emulator: str  # how the emulated TPU reproduces it
    workaround: str | None  # the hf-tpu workaround (a name in `hf-tpu env`), or None
    advice: str = ""  # what to do when no workaround can close it
    fixed_in: str | None = None
    needs_chips: int = 1  # chips the probe needs to show the gap
    component: str = "torch_tpu"
    # a regex a failing test's error matches when this gap is the cause (``python -m ci`` triage);
    # the emulator's own gap errors name the gap ("known gap 'NAME'") and need none
    signature: str = ""
    # what a model's forward calls when it meets this gap (``hf-tpu check`` risks): torch functions by name,
    # aten ops as "aten.<op>" ("aten.index.bool_mask": aten.index with a boolean mask)
    ops: tuple[str, ...] = ()
    # a race: a probe that does not see it has not shown it fixed ("not seen"), so no measurement turns its
    # workaround off
    intermittent: bool = False
    # why the real wheel on XLA:CPU cannot show the gap (a Pallas kernel, one device, ...); "" when it can
    hidden_on_xla_cpu: str = ""
    # False for a gap the emulator does not reproduce (its ``emulator`` field says what it does instead)
    emulated: bool = True


GAPS: tuple[Gap, ...] = (
    Gap(
        "cholesky",
        "torch.linalg.cholesky / cholesky_ex are missing, so resize_token_embeddings fails (its new rows are drawn "
        "from a MultivariateNormal, which factorises the covariance)",
        "0.1.2.dev [ci: 69 failures]; 0.2.0 [wheel: no kernel, only autocast entries]",
        "RuntimeError \"operator 'aten::linalg_cholesky_ex' is not implemented for TPU\", as TorchTPU's fallback says",
        "cholesky_on_cpu",
        signature=r"linalg_cholesky|cholesky_ex",
        ops=("aten.linalg_cholesky_ex", "aten.cholesky", "aten.cholesky_inverse"),
    ),
    Gap(
        "ctc_loss",
        "F.ctc_loss aborts the process (a CTC model takes the whole test run down)",
        "0.1.2.dev [ci]; 0.2.0 [wheel: a _ctc_loss kernel is registered]",
        "RuntimeError 'TorchTPU aborts the process here' (HF_TPU_EMULATOR_GAPS=abort: a real abort)",
        "ctc_loss_on_cpu",
        signature=r"ctc_loss",
        ops=("ctc_loss", "aten._ctc_loss"),
    ),
    Gap(
        "compile_inductor",
        "torch.compile(backend='inductor') with TPU inputs is refused (anything that compiles without asking the "
        "device for its backend fails)",
        "0.1.2.dev [ci]; 0.2.0 [wheel: _TorchCompileInductorWrapper raises for TPU inputs]",
        "the same RuntimeError, on every profile",
        None,
        advice="compile with backend='tpu' (or no backend: TPU inputs select it)",
        signature=r"[Ii]nductor.*(TPU|tpu)|(TPU|tpu).*[Ii]nductor",
    ),
    Gap(
        "weight_tying",
        "tpu and CPU tensors are not shallow-copy compatible: Module.to('tpu') replaces parameters (tied weights "
        "come back untied, the model takes twice the memory) and `param.data = tpu_tensor` raises (diffusers' group "
        "offloading)",
        "0.1.2.dev [ci]; 0.2.0 [wheel: no _has_compatible_shallow_copy_type kernel]",
        "aten::_has_compatible_shallow_copy_type answers False for tpu/CPU pairs",
        "tpu_cpu_shallow_copy",
        signature=r"_has_compatible_shallow_copy_type|incompatible tensor type",
    ),
    Gap(
        "fully_masked_attention_row",
        "SDPA with a boolean mask: a query row masked everywhere (a fully padded sequence) returns a mix of the "
        "values instead of zeros",
        "0.1.2.dev [ci]",
        "the boolean mask becomes an additive mask with a large finite negative, so the row softmaxes uniformly",
        "attention_zero_fully_masked_rows",
        ops=("scaled_dot_product_attention.bool_mask",),
        hidden_on_xla_cpu="its flash attention is a Pallas kernel; XLA:CPU runs TorchTPU's math path",
    ),
    Gap(
        "multinomial_seeding",
        "torch.multinomial ignores the seed and generator=, so sampling (generate(do_sample=True)) is not reproducible",
        "0.1.2.dev [ci]; fixed in 0.2.0 [run: one seed, the same draws]",
        "each multinomial call draws from a freshly, randomly seeded generator",
        "seeded_multinomial",
        ops=("multinomial",),
        fixed_in="0.2.0",
    ),
    Gap(
        "multinomial_unchecked",
        "torch.multinomial on tpu draws from an invalid distribution (a negative or nan weight, an all-zero row) "
        "instead of raising as CPU and CUDA do: a bug upstream of sampling (a corrupted logit, a bad mask) goes "
        "unnoticed",
        "0.2.0 [run: multinomial([-1, 2]) draws 1, multinomial([0, 0]) draws 0, without an error]",
        "negative and nan weights count as 0 (an infinite one is always drawn), an all-zero row draws index 0",
        None,
        advice="check the weights yourself where they can be invalid (a check on the chip costs a host sync per call)",
        ops=("multinomial",),
    ),
    Gap(
        "differentiable_attention_mask",
        "SDPA refuses an attn_mask that requires grad (T5's relative attention bias, any learned bias): the flash "
        "kernel's autograd says it is not differentiable with respect to attn_mask",
        "0.1.2.dev [ci: 37 failures]",
        "the backend choice takes the flash kernel for such masks, whose autograd raises that error",
        "attention_math_for_differentiable_mask",
        signature=r"not differentiable with respect to .?attn_mask",
        ops=("scaled_dot_product_attention.grad_mask",),
        hidden_on_xla_cpu="its flash attention is a Pallas kernel; XLA:CPU runs TorchTPU's math path",
    ),
    Gap(
        "avg_pool1d_gradient",
        "F.avg_pool1d's output has no grad_fn: layers before it silently get no gradient",
        "0.1.2.dev [ci]; 0.2.0 [wheel: a direct avg_pool1d kernel, so autograd's composite is bypassed]",
        "an AutogradPrivateUse1 kernel that computes avg_pool1d without recording it",
        "avg_pool1d_through_2d",
        ops=("avg_pool1d",),
    ),
    Gap(
        "boolean_mask_indexing",
        "x[:, :, mask2d] (a multi-dimensional boolean index after a slice) raises a shape error",
        "0.1.2.dev [ci]; fixed in 0.2.0 [run: the right shape and values]",
        "aten::index raises IndexError 'shape mismatch' for such an index",
        "boolean_mask_to_indices",
        signature=r"shape mismatch: indexing tensors could not be broadcast",
        ops=("aten.index.bool_mask",),
        fixed_in="0.2.0",
    ),
    Gap(
        "interpolate_same_size",
        "F.interpolate(mode='linear') to the size the input already has aborts the process",
        "0.1.2.dev [ci]; fixed in 0.2.0 [run: a copy of the input]",
        "RuntimeError 'TorchTPU aborts the process here' in upsample_linear1d",
        "interpolate_same_size_is_a_copy",
        signature=r"upsample_linear1d",
        ops=("aten.upsample_linear1d",),
        fixed_in="0.2.0",
    ),
    Gap(
        "attention_precision",
        "SDPA computes in bfloat16 whatever torch.set_float32_matmul_precision says: float32 attention is off by "
        "bfloat16 rounding even at 'highest'",
        "0.1.2.dev [ci: 108 of 115 float32 precision failures pass at 'highest', the rest are attention]",
        "q, k, v (and float masks) in bfloat16 for the attention kernel, output cast back",
        "attention_math_at_highest",
        ops=("scaled_dot_product_attention",),
        hidden_on_xla_cpu="its flash attention is a Pallas kernel; XLA:CPU runs TorchTPU's math path",
    ),
    Gap(
        "device_index",
        "Tensor.to(<int>) / Module.to(<int>) ignore the index and land on chip 0, so accelerate's integer device "
        "maps put every layer on one chip",
        "0.1.2.dev [ci: 25 failures]",
        "Tensor.to and Module.to map an int device to tpu:0 (plain process on a multi-chip host)",
        "int_device_means_that_chip",
        needs_chips=2,
        hidden_on_xla_cpu="XLA:CPU gives TorchTPU one device",
    ),
    Gap(
        "device_index_out_of_range",
        "a tensor made on tpu:N with N beyond the process's chips lands on tpu:0 without an error "
        "(torch.ones(2, device='tpu:1') in a one-chip process): a device-placement bug goes unnoticed",
        "0.2.0 [run: torch.ones(2, device='tpu:1') is a tensor on tpu:0]",
        "not reproduced: the emulator refuses such an index, naming the process's chips",
        None,
        advice="use torch.device('tpu', torch.accelerator.current_device_index()), or check the index against "
        "torch.accelerator.device_count()",
        emulated=False,
    ),
    Gap(
        "visible_devices",
        "TPU_VISIBLE_DEVICES restricts the chips a process opens, but device_count() still reports every chip of "
        "the host",
        "0.1.2.dev [ci]",
        "device_count() reports the host's chips while only the visible ones can hold tensors",
        None,
        advice="launch one process per chip (`hf-tpu launch -n N`) instead of pinning chips; hf-tpu warns at set-up",
        needs_chips=2,
        hidden_on_xla_cpu="XLA:CPU gives TorchTPU one device",
    ),
    Gap(
        "device_sharing",
        "a second process cannot open a chip this one holds: the runtime aborts (tests that re-run themselves in a "
        "subprocess fail once the parent touched the device)",
        "0.1.2.dev [ci: 37 failures]",
        "the first process to use a chip locks it for its emulated host; another process aborts (RuntimeError "
        "naming the holder)",
        None,
        advice="run device work in one process per chip; hf-tpu names the process that holds a chip",
        signature=r"runtime cannot open|held by (another )?process",
        hidden_on_xla_cpu="XLA:CPU holds no chip: every process opens its own CPU client",
    ),
    Gap(
        "record_stream",
        "Tensor.record_stream on a tpu tensor is not implemented (diffusers' group offloading with streams)",
        "0.2.0 [wheel: no record_stream kernel; reading: its boxed fallback raises]",
        "RuntimeError \"operator 'aten::record_stream' is not implemented for TPU\", as TorchTPU's fallback says",
        "record_stream_noop",
        signature=r"record_stream",
        ops=("record_stream",),
    ),
    Gap(
        "autocast_integer_dtype",
        "torch.autocast('tpu', dtype=torch.int8) (or any integer/bool dtype) is accepted, and float32 matmuls "
        "inside it come back as int8",
        "0.2.0 [wheel: get_amp_supported_dtype() lists 20 dtypes, int8/16/32/64, uint8..64 and bool among them; "
        "torch's autocast only checks membership] [run: accepted, a float32 matmul's inputs cast to int8; XLA:CPU "
        "then refuses the int8 matmul ('mm(): not implemented for int8 ... PjRt version: cpu')]",
        "the device module answers the same list, on every profile",
        "autocast_floating_dtypes_only",
    ),
    Gap(
        "autocast_default_float16",
        "torch.autocast('tpu') without a dtype computes in float16, not bfloat16: TorchTPU's device module answers "
        "bfloat16 (torch.tpu._get_autocast_dtype()) but never sets torch's autocast dtype for the device, whose "
        "default is float16 (Trainer and accelerate pass bfloat16 explicitly; a bare torch.autocast('tpu') does not)",
        "0.2.0 [run: torch.get_autocast_dtype('tpu') is torch.float16 once TorchTPU has set the device up]",
        "torch's autocast dtype for the device stays float16, as TorchTPU leaves it",
        "autocast_defaults_to_bfloat16",
    ),
    Gap(
        "adamw_bfloat16_moments",
        "torch.tpu.optimizers.AdamW() keeps its moments in bfloat16 by default, and its step fails on float32 "
        "parameters ('expected dtype c10::BFloat16 for `end` but got dtype float': torch.optim.adam's lerp_ of a "
        "bfloat16 moment toward a float32 gradient)",
        "0.2.0 [run: AdamW(lr=...).step on a float32 nn.Linear's parameters]",
        "the same RuntimeError from the emulator's AdamW, for moments and gradients of different dtypes",
        None,
        advice="pass use_bfloat16_moments=False for float32 parameters (or train in bfloat16)",
        signature=r"expected dtype c10::BFloat16 for `end`",
    ),
    Gap(
        "autograd_exit_abort",
        "a process that ran a backward on the device aborts as it exits (std::terminate, exit status 134) in about "
        "half the runs: every training script's exit status is a coin toss",
        "torch 2.13 [reading: torch/autograd/graph.py stashes a contextvars.Context in autograd's thread-local "
        "state; a device worker thread that drops the last GraphTask and is still waiting for the GIL when "
        "finalization starts is ended by pthread_exit inside a noexcept destructor (a core dump shows it); left "
        "alone, seen in 10 of 20 runs on one machine and 0 of 40 on another; the probe forces the interleaving "
        "and sees it every run]",
        "nothing to emulate: it is torch's own engine, on every profile",
        "autograd_drained_at_exit",
        component="torch",
        intermittent=True,
    ),
    Gap(
        "compile_options_ignored",
        "torch.compile(backend='tpu', options={...}) ignores keys it does not read: a misspelt option (or one of "
        "Inductor's) silently does nothing",
        "0.2.0 [wheel: TpuBackend reads its options with dict.get; run: an unknown key compiles without a word]",
        "the same: unknown keys are ignored",
        "unknown_compile_options_warn",
    ),
    Gap(
        "cpu_tensor_into_compiled_graph",
        "a compiled graph refuses a CPU tensor input that eager mode accepts ('execute(): failed to prepare compiled "
        "mode arguments: ... expected tensor to be on tpu, got cpu'): transformers' StaticCache when the compiled "
        "region sets it up (its cumulative_length starts on the CPU), diffusers' QwenImage (its pos_freqs buffer)",
        "0.2.0 [run: the real wheel on XLA:CPU, a two-line compiled function and both models]",
        "the compile backend refuses a graph's CPU tensor inputs (pinned host memory excepted) with TorchTPU's message",
        "compiled_graphs_take_cpu_inputs",
        signature=r"failed to prepare compiled mode arguments|expected tensor to be on tpu, got cpu",
    ),
    Gap(
        "safetensors_device",
        "safetensors' load_file(..., device='tpu') / safe_open(device='tpu') raise 'device tpu is invalid' "
        "(diffusers' disk offloading)",
        "safetensors 0.8 (its device parser knows cpu, cuda, mps, npu, xpu, ... but not tpu)",
        "nothing to emulate: it is safetensors' own code",
        "safetensors_load_to_tpu",
        component="safetensors",
        signature=r"device tpu is invalid",
    ),
)

BY_NAME: dict[str, Gap] = {gap.name: gap for gap in GAPS}


def get(name: str) -> Gap:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown gap {name!r}; known: {', '.join(BY_NAME)}") from None
