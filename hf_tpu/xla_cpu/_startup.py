"""Run at Python start-up by ``hf_tpu_xla_cpu.pth`` where ``HF_TPU_XLA_CPU`` is set: point TorchTPU at XLA:CPU
before anything imports torch (TorchTPU reads its runtime's path during ``import torch``).

A ``.pth`` file cannot fail cleanly, so a problem here is left for torch's backend autoload, which calls
:func:`hf_tpu.xla_cpu.prepare` again and reports it as a warning that every use of ``"tpu"`` repeats.
"""

from __future__ import annotations

from hf_tpu.xla_cpu import prepare

try:
    prepare()
except Exception:  # noqa: BLE001, S110  (reported by the autoload, see above)
    pass
