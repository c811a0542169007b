"""Gap ``autocast_integer_dtype``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="autocast_integer_dtype",
    breaks="torch.autocast('tpu', dtype=torch.int8) (or any integer/bool dtype) is accepted, and float32 matmuls "
    "inside it come back as int8",
    evidence="0.2.0 [wheel: get_amp_supported_dtype() lists 20 dtypes, int8/16/32/64, uint8..64 and bool among them; "
    "torch's autocast only checks membership] [run: accepted, a float32 matmul's inputs cast to int8; XLA:CPU "
    "then refuses the int8 matmul ('mm(): not implemented for int8 ... PjRt version: cpu')]",
    emulator="the device module answers the same list, on every profile",
    workaround="autocast_floating_dtypes_only",
    emulation="every profile",
)

# the smallest script that shows it (``hf-tpu gaps --show autocast_integer_dtype``): raises while the gap is present
PROBE = """
try:
    autocast = torch.autocast(DEVICE, dtype=torch.int8)
except (ValueError, RuntimeError) as err:  # refused, naming the dtype: no gap
    print(f"refused: {err}")
else:  # accepted: torch itself disables autocast (with a warning) for a dtype the backend does not list
    with autocast:
        try:
            product = torch.ones(2, 2, device=DEVICE) @ torch.ones(2, 2, device=DEVICE)
        except RuntimeError as err:  # the inputs were cast to int8, then the backend had no int8 matmul
            raise RuntimeError(f"torch.autocast accepted dtype=torch.int8; a float32 matmul ran in int8: {err}")
    if product.dtype != torch.float32:
        raise RuntimeError(f"torch.autocast accepted dtype=torch.int8; a float32 matmul came back as {product.dtype}")
"""
