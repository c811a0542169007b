"""``generate()`` on ``"tpu"`` at the shapes a chip needs, so that a warm model compiles nothing for a new request.

TorchTPU compiles one XLA executable per op and shape (eager) or per graph and shape (compiled). Upstream's
defaults change shapes all the time: the DynamicCache grows by one position per token, and every prompt length is
new. Measured on the real torch-tpu 0.2.0 (XLA:CPU), tiny Qwen3, 5 requests of 25-266 prompt tokens: 1,493
compilations, and every further request of a new length compiles again. On ``"tpu"``, when the caller chose no
cache, hf-tpu:

- uses transformers' static cache, sized to a power of two (it only grows, so once the largest request was seen
  every decode step has one shape, and transformers compiles that step once);
- left-pads the prompt, on the host, to the next bucket strictly above its length (16, 32, 64, ...: always at
  least one pad column, so every request takes the same masked-attention path) and strips that padding from the
  result: the same tokens as upstream, since the mask hides the pad and positions follow the mask.

Once every bucket met has run (``hf_tpu.warm_up_generate``), a request of a new length compiles nothing. Off with
``HF_TPU_GENERATE_BUCKETS=0``; a caller who passes ``cache_implementation`` or ``past_key_values`` gets upstream's
behaviour. Padding is left out (the static cache stays) wherever it could change a result: processors that read
the prompt's tokens (repetition penalty, n-gram blocking, ...), user logits processors, stopping criteria,
streamers, assisted decoding, or outputs with per-position attentions and hidden states.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SWITCH = "HF_TPU_GENERATE_BUCKETS"
MIN_BUCKET = 16

# generate() arguments whose presence means the prompt's exact tokens or length matter to something we do not see
_UNPADDABLE_ARGS = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "assistant_model",
    "streamer",
    "negative_prompt_ids",
    "custom_generate",
    "synced_gpus",
    "inputs_embeds",
    "assistant_tokenizer",
    "tokenizer",
    "prompt_lookup_num_tokens",
)
# generation settings that read the prompt's tokens or length; their neutral values
_NEUTRAL = {
    "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "exponential_decay_length_penalty": (None,),
    "sequence_bias": (None,),
    "watermarking_config": (None,),
    "output_attentions": (None, False),
    "output_hidden_states": (None, False),
    "prompt_lookup_num_tokens": (None,),
    "assistant_early_exit": (None,),
}


def enabled() -> bool:
    from hf_tpu import settings

    return settings.get(SWITCH)


def bucket(length: int) -> int:
    """The padded prompt length: the smallest power of two (at least 16) strictly above ``length``."""
    size = MIN_BUCKET
    while size <= length:
        size *= 2
    return size


def cache_length(padded_prompt: int, max_new_tokens: int) -> int:
    """The static cache's length: a power of two holding the padded prompt and the new tokens."""
    size = MIN_BUCKET
    while size < padded_prompt + max_new_tokens:
        size *= 2
    return size


@dataclass
class Plan:
    """What hf-tpu changes for one generate() call."""

    pad: int  # columns of left padding added (0: none)
    kwargs: dict[str, Any]


def _setting(config: Any, kwargs: dict[str, Any], name: str) -> Any:
    return kwargs[name] if name in kwargs else getattr(config, name, None)


def _new_tokens(config: Any, kwargs: dict[str, Any], prompt: int) -> int:
    new = _setting(config, kwargs, "max_new_tokens")
    if new is None:
        new = (_setting(config, kwargs, "max_length") or 20) - prompt
    return max(int(new), 0)


def plan(model: Any, args: dict[str, Any], kwargs: dict[str, Any]) -> Plan | None:
    """The fixed-shape form of a generate() call, or None to leave it to upstream."""
    if not enabled() or getattr(model, "device", torch.device("cpu")).type != "tpu":
        return None
    config = args.get("generation_config") or model.generation_config
    if kwargs.get("past_key_values") is not None or _setting(config, kwargs, "cache_implementation") is not None:
        return None  # the caller chose the cache
    if _setting(config, kwargs, "use_cache") is False or model.config.is_encoder_decoder:
        return None
    if not getattr(model, "_can_compile_fullgraph", False) or not model._supports_default_dynamic_cache():
        return None  # the model cannot run on a static cache
    ids = args.get("inputs") if args.get("inputs") is not None else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] == 0:
        return None
    prompt = ids.shape[1]
    new_tokens = _new_tokens(config, kwargs, prompt)
    out = dict(kwargs, cache_implementation="static")
    paddable = not any(args.get(a) is not None or kwargs.get(a) is not None for a in _UNPADDABLE_ARGS) and all(
        _setting(config, kwargs, k) in neutral for k, neutral in _NEUTRAL.items()
    )
    padded = bucket(prompt) if paddable else prompt
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    if limit is not None and padded + new_tokens > limit:
        padded = prompt  # padding would run past the model's positions
    out["max_cache_len"] = cache_length(padded, new_tokens)
    if limit is not None and out["max_cache_len"] > limit:
        out["max_cache_len"] = max(limit, padded + new_tokens)
    if padded == prompt:
        return Plan(0, out)
    out["max_new_tokens"] = new_tokens  # a max_length counted the unpadded prompt
    out.pop("max_length", None)
    min_length = _setting(config, kwargs, "min_length")
    if min_length and _setting(config, kwargs, "min_new_tokens") is None:
        out["min_new_tokens"] = max(min_length - prompt, 0)
        out.pop("min_length", None)
    return Plan(padded - prompt, out)


def _pad_token(model: Any, config: Any, kwargs: dict[str, Any]) -> int:
    for value in (_setting(config, kwargs, "pad_token_id"), _setting(config, kwargs, "eos_token_id")):
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if isinstance(value, torch.Tensor):
            value = int(value.flatten()[0])
        if value is not None:
            return int(value)
    return 0


def left_pad(
    ids: torch.Tensor, mask: torch.Tensor | None, pad: int, pad_token: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad ids and mask by ``pad`` columns, built on the host: on the chip, a pad of a new width would be an op
    of a new shape (a compilation)."""
    device = ids.device
    host_ids = ids.cpu()
    host_mask = torch.ones_like(host_ids) if mask is None else mask.cpu()
    batch = host_ids.shape[0]
    ids = torch.cat([host_ids.new_full((batch, pad), pad_token), host_ids], 1)
    mask = torch.cat([host_mask.new_zeros((batch, pad)), host_mask], 1)
    return ids.to(device), mask.to(device)


def _strip(result: Any, pad: int) -> Any:
    if isinstance(result, torch.Tensor):
        return _unpad(result, pad)
    if getattr(result, "sequences", None) is not None:
        result.sequences = _unpad(result.sequences, pad)
    return result


def _unpad(sequences: torch.Tensor, pad: int) -> torch.Tensor:
    # On the host, then back: a slice of a new offset read on the chip would be an executable of a new shape.
    return sequences.cpu()[:, pad:].to(sequences.device)


def wrap_generate(original: Callable[..., Any]) -> Callable[..., Any]:
    """``GenerationMixin.generate`` with the fixed-shape plan applied on tpu."""
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # let upstream name the bad argument
        named = {k: v for k, v in bound.arguments.items() if k not in ("self", "kwargs")}
        extra = dict(bound.arguments.get("kwargs", {}))
        chosen = plan(self, named, extra)
        if chosen is None:
            return original(self, *args, **kwargs)
        if chosen.pad:
            config = named.get("generation_config") or self.generation_config
            key = "inputs" if named.get("inputs") is not None else None
            ids = named["inputs"] if key else extra.pop("input_ids")
            ids, mask = left_pad(ids, extra.get("attention_mask"), chosen.pad, _pad_token(self, config, extra))
            chosen.kwargs["attention_mask"] = mask
            chosen.kwargs.pop("input_ids", None)
            named["inputs"] = ids
        result = original(self, **named, **chosen.kwargs)
        return _strip(result, chosen.pad) if chosen.pad else result

    generate.__wrapped__ = original  # type: ignore[attr-defined]
    return generate
