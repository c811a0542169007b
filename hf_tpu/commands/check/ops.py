"""What a model calls, for ``hf-tpu check``'s risks: the torch functions and aten ops of one forward pass.

A shrunk random copy of the architecture (``toy.shrink``: the same classes and layout kinds) runs one
forward and one backward on CPU under a function mode and a dispatch mode that record names; the gap table
(``hf_tpu.gaps``, each gap's ``ops``) turns them into the gaps this architecture meets. CPU suffices: the names,
not the numbers, are the evidence, and the copy is tiny (well under a second).
"""

from __future__ import annotations

from typing import Any


def ops_used(config: Any) -> set[str]:
    """Names of the torch functions (``scaled_dot_product_attention``) and aten ops (``aten.index``) a forward
    and backward of ``config``'s architecture call, with refinements the gap table uses (``.bool_mask``,
    ``.grad_mask`` for attention masks, ``aten.index.bool_mask`` for indexing with a boolean mask)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from hf_tpu.commands.check.toy import auto_class, shrink

    names: set[str] = set()

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            names.add(name)
            if name == "scaled_dot_product_attention":
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                if isinstance(mask, torch.Tensor):
                    names.add(name + (".bool_mask" if mask.dtype == torch.bool else ""))
                    if mask.requires_grad:
                        names.add(name + ".grad_mask")
            return func(*args, **kwargs)

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            packet = f"aten.{func._overloadpacket.__name__}"
            names.add(packet)
            if packet == "aten.index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
            ):
                names.add("aten.index.bool_mask")
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = auto_class(config).from_config(shrink(config))
    ids = torch.randint(1, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    inputs["attention_mask"][0, :3] = 0  # padding: the masks real batches carry
    if getattr(model.config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids[:, :4]
    with Functions(), Ops():
        out = model(**inputs)
        out.logits.float().sum().backward()
    return names


def gaps_met(names: set[str]) -> list[Any]:
    """The gaps of ``hf_tpu.gaps`` whose ops are among ``names``."""
    from hf_tpu.gaps import GAPS

    return [gap for gap in GAPS if gap.ops and any(op in names for op in gap.ops)]
