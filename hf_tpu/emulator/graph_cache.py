"""The emulator's compiled graphs across processes, through Inductor's own on-disk caches.

A chip's second process loads its executables from TorchTPU's persistent cache; the emulator's equivalent is
Inductor's FX-graph and AOTAutograd caches, keyed by the CPU graph (the numerics rewrite is part of it), torch's
version and Inductor's configuration, so a change of code, torch or numerics profile misses. Three things stood
between them and a warm second process (measured on the demo's compiled training step, 2 cores):

1. Inductor bypasses its FX-graph cache for a graph compiled outside a tracing context ("No shape env"): the
   emulator now compiles under one with a static shape environment (:func:`cacheable`). First step of a second
   process: 12.3 s -> 6.1 s (cold: 38.3 s).
2. Inductor probes the CPU's vector ISAs in every process, each by loading a test library in a child Python
   (1.8 s of those 6.1 s): a library that loaded once is remembered beside it, in Inductor's cache
   (:func:`remember_isa_probes`).
3. The caches live under ``$HF_TPU_CACHE/inductor`` when ``TORCHINDUCTOR_CACHE_DIR`` is unset, where ``hf-tpu
   env`` shows them (the default, ``/tmp/torchinductor_<user>``, goes at a reboot).
4. AOTAutograd's cache keeps only graphs compiled by Inductor itself: the emulator's compiled graphs are now kept
   in its entries (bundled entries, ``compile._cacheable_graph_class``), so a second process skips AOTAutograd's
   joint tracing and partitioning. Warm first step: 5.3-5.6 s -> 3.8-4.0 s (cold: 44-51 s).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from hf_tpu import settings
from hf_tpu.plumbing import compile_cache


def aot_cache_enabled() -> bool:
    """Whether compiled graphs go into AOTAutograd's cache (bundled entries: the graphs are pickled into them); not
    with a torch whose AOTAutograd lacks what that needs (the graphs are then traced again in every process)."""
    if not compile_cache.enabled():
        return False
    import torch._functorch.config

    try:
        from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler  # noqa: F401
        from torch._inductor.output_code import OutputCode  # noqa: F401
        from torch.fx._graph_pickler import GraphPickler  # noqa: F401
    except ImportError:
        return False
    return bool(torch._functorch.config.enable_autograd_cache) and bool(
        getattr(torch._functorch.config, "bundled_autograd_cache", False)
    )


def install() -> None:
    """Put Inductor's caches under hf-tpu's cache directory (unless the user chose one), remember ISA probes, and
    keep AOTAutograd's cache entries bundled (the emulator's graphs are not Inductor's, so an entry must carry them:
    read when a backward graph is saved, after the compile call returned, so set for the process)."""
    if not compile_cache.enabled():
        return
    import torch._functorch.config

    if hasattr(torch._functorch.config, "bundled_autograd_cache"):
        torch._functorch.config.bundled_autograd_cache = True
    from hf_tpu.plumbing.import_hooks import when_imported

    if (settings.text(compile_cache.INDUCTOR) or _inductor_default()) == _inductor_default():
        os.environ[compile_cache.INDUCTOR] = str(compile_cache.inductor_dir())
    when_imported("torch._inductor.cpu_vec_isa", lambda _module: remember_isa_probes())


def _inductor_default() -> str:
    """Inductor's own default directory (Inductor writes it into the environment variable on first use, so that
    value means "unset")."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()


@contextlib.contextmanager
def cacheable() -> Iterator[None]:
    """Around Inductor's compile of a CPU graph: a tracing context with a static shape environment (Inductor's
    FX-graph cache serves only graphs compiled under one), or, with ``HF_TPU_COMPILE_CACHE=0``, Inductor's on-disk
    caches off for it, so that every process compiles its graphs, as TorchTPU without its persistent cache."""
    import torch._functorch.config
    import torch._inductor.config
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if not compile_cache.enabled():
        with (
            torch._inductor.config.patch(fx_graph_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            yield
        return
    with tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv()))):
        yield


def remember_isa_probes() -> None:
    """Inductor checks that a test library built for each vector ISA loads, in a child Python, in every process.
    Remember a library that loaded (a marker file beside it in Inductor's cache, so clearing the cache forgets
    it) and skip the child next time. Inductor versions without the probe are left alone."""
    try:
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:
        return
    probe = getattr(VecISA, "_probe_load", None)
    if probe is None or getattr(probe, "_hf_tpu_remembered", False):
        return

    @functools.wraps(probe)
    def _probe_load(self: Any, output_path: str) -> bool:
        marker = f"{output_path}.hf-tpu-loaded"
        if os.path.exists(marker) and os.path.getmtime(marker) >= os.path.getmtime(output_path):
            return True
        loaded = probe(self, output_path)
        if loaded:
            with contextlib.suppress(OSError):
                open(marker, "w").close()  # noqa: SIM115
        return loaded

    _probe_load._hf_tpu_remembered = True  # type: ignore[attr-defined]
    VecISA._probe_load = _probe_load  # type: ignore[method-assign]
