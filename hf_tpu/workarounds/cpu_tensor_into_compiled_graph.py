"""Gap ``cpu_tensor_into_compiled_graph``: compiled graphs take the CPU tensors they are given, as eager ops do.

TorchTPU's compiled programs read device buffers only, so a graph given a CPU tensor fails at its first call,
where the same code in eager mode works. Users meet it in transformers' StaticCache (``cumulative_length`` starts
as a CPU 0-dim tensor and moves to the chip inside the graph when the compiled region sets the cache up) and in
diffusers' QwenImage (``pos_freqs``, a CPU buffer moved inside the graph). The compiled callable the "tpu" backend
returns now moves such inputs to the graph's chip first (pinned host memory, which TorchTPU accepts, stays), and
writes an input the graph changes in place (Dynamo's trace says which) back to the caller's CPU tensor. A graph with no tpu input is left
alone: there is no chip to move to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import calling_like, tpu_compile_hooks

NAME = "compiled_graphs_take_cpu_inputs"


def _mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Graph inputs the graph writes in place: Dynamo's fake value of such an input has a version above 0."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return {i for i, node in enumerate(placeholders) if getattr(node.meta.get("example_value"), "_version", 0) > 0}


def _moves_cpu_inputs(compiled: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type == "tpu"), None)
    moved = [
        i
        for i, x in enumerate(example_inputs)
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and not x.is_pinned()
    ]
    if device is None or not moved:
        return compiled
    written = _mutated_inputs(gm)

    def run(args: list[Any]) -> Any:
        write_back = []
        for i in moved:
            value = args[i]
            if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.is_pinned():
                args[i] = value.to(device)
                if i in written:
                    write_back.append((value, args[i]))
        result = compiled(*args)
        with torch.no_grad():
            for original, on_chip in write_back:
                original.copy_(on_chip)
        return result

    return calling_like(compiled, run)


def apply() -> None:
    tpu_compile_hooks.add(NAME, wrap=_moves_cpu_inputs)


def revert() -> None:
    tpu_compile_hooks.remove(NAME)


WORKAROUNDS = (
    Fix.workaround(
        NAME, "cpu_tensor_into_compiled_graph", "the callable the 'tpu' compile backend returns", __doc__, apply, revert
    ),
)
