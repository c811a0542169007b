"""The ``"tpu"`` torch.compile backend of the emulated TPU, with TorchTPU's contract.

Pipeline, as TorchTPU's: Dynamo graph -> AOTAutograd (min-cut partitioner) -> one compiled
callable per forward/backward graph. Where
TorchTPU lowers each graph to XLA, the emulator compiles it *as a CPU graph* with Inductor's
C++ code generation and runs it on zero-copy CPU aliases of the device tensors; outputs come
back as device tensors without a copy. Without a C++ compiler the graphs run eagerly on the
device (``aot_eager``), which is what TorchTPU's CPU default does too.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from hf_tpu.emulator import _build, gaps, graph_cache, numerics


@dataclass
class PerfStats:
    """Compilation-cache telemetry, as ``torch.tpu._get_cache_stats()`` returns it."""

    num_cache_reqs: int = 0
    num_cache_hits: int = 0
    num_compilations: int = 0
    peak_compilation_host_memory_bytes: int = 0
    per_entry_stats: list[dict[str, Any]] = field(default_factory=list)


_stats = PerfStats()
_cache: dict[tuple, _CompiledGraph] = {}
_lock = threading.Lock()  # guards the graph cache and its stats; nothing under it compiles, imports or calls out


def cache_stats() -> PerfStats:
    """Compiled graphs (``_stats``) and eager executables (the core's model, ``executables``) together, as
    TorchTPU's one executable cache counts them."""
    from hf_tpu.emulator import executables

    requests, hits, persisted_hits, compilations = executables.stats()
    with _lock:
        return PerfStats(
            num_cache_reqs=_stats.num_cache_reqs + requests,
            num_cache_hits=_stats.num_cache_hits + hits + persisted_hits,
            num_compilations=_stats.num_compilations + compilations,
            peak_compilation_host_memory_bytes=_stats.peak_compilation_host_memory_bytes,
            per_entry_stats=list(_stats.per_entry_stats),
        )


def clear_cache() -> None:
    global _stats
    from hf_tpu.emulator import executables

    with _lock:
        _cache.clear()
        _stats = PerfStats()
    executables.clear()


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """Inductor's CPU code as a chip runs an XLA program: the same way every time. Without torch's deterministic
    algorithms, Inductor lowers scatter-adds (an embedding's backward, index_put with accumulate) to atomic adds
    from several threads, so equal indices sum in another order each run. The flag is torch's global: set while a
    graph compiles (its code then takes the deterministic fallbacks) and runs (those fallbacks read it), restored
    after; warn_only, and without NaN-filling new memory, so nothing else changes."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    if was:
        yield
        return
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def _cxx_available() -> bool:
    from hf_tpu import settings

    if settings.get("HF_TPU_COMPILE_FALLBACK") == "aot_eager":
        return False
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def _is_tpu(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def _cpu_device(x: Any) -> Any:
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("cpu")
    return x


def _to_cpu_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose device arguments and tensor constants are on CPU (constants as aliases)."""
    core = _build.load()
    cpu_gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for node in cpu_gm.graph.nodes:
        node.args = torch.fx.node.map_aggregate(node.args, _cpu_device)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, _cpu_device)
        if node.op == "get_attr":
            value = getattr(cpu_gm, node.target)
            if _is_tpu(value):
                alias = core.cpu_alias(value.detach())
                setattr(cpu_gm, node.target, alias)
    cpu_gm.recompile()
    return cpu_gm


def _output_devices(gm: torch.fx.GraphModule) -> list[bool]:
    """For each graph output: does it belong on the device (per the traced fake value)?"""
    (outputs,) = gm.graph.output_node().args
    flags = []
    for out in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
        val = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
        flags.append(isinstance(val, torch.Tensor) and val.device.type == "tpu")
    return flags


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type, x.requires_grad)
    return ("V", type(x).__name__, x if isinstance(x, (int, float, bool, str, type(None))) else None)


class _CompiledGraph:
    """One AOT graph compiled for the CPU, called with device tensors."""

    def __init__(self, gm: torch.fx.GraphModule, use_inductor: bool) -> None:
        super().__init__()  # OutputCode's fields, for the cacheable kind (_cacheable_graph_class)
        # Boxed calling convention (one list the callee may clear). An instance attribute, so
        # the functools.wraps of Dynamo's disable() around backward graphs carries it over.
        self._boxed_call = True
        self.gm = gm
        self.use_inductor = use_inductor
        self.on_device = _output_devices(gm)
        self.compiled: Callable[..., Any] | None = None
        self.cpu_gm: torch.fx.GraphModule | None = None
        self.rounded_inputs: list[int] = []  # inputs the graph also takes rounded to bf16 (numerics.apply_to_graph)
        self.entry: dict[str, Any] = {"read_count": 0, "compilation_duration": 0.0, "last_read": None}
        self.lock = threading.Lock()  # this graph's one-time preparation and compile (Inductor runs in its own thread)

    def _prepare(self) -> None:
        """The CPU graph, rewritten to compute what the chip computes (once, on the first call)."""
        with self.lock:
            if self.cpu_gm is None:
                cpu_gm = _to_cpu_graph(self.gm)
                self.rounded_inputs = numerics.apply_to_graph(cpu_gm, gaps.reproduced())
                self.cpu_gm = cpu_gm

    def _compile(self, cpu_args: list[Any]) -> Callable[..., Any]:
        start = time.perf_counter()
        cpu_gm = self.cpu_gm  # set by _prepare, which __call__ runs first

        def build() -> Callable[..., Any]:
            # A fresh thread: none of the caller's AOTAutograd runtime state (TLS dispatch
            # keys and modes) leaks into Inductor's own tracing of the CPU graph.
            with torch.no_grad(), _deterministic(), graph_cache.cacheable():
                return torch._inductor.compile(cpu_gm, cpu_args)

        from torch._dynamo.utils import counters

        hits = counters["inductor"]["fxgraph_cache_hit"]
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hf-tpu-compile") as pool:
            compiled = pool.submit(build).result()
        self.entry["compilation_duration"] = time.perf_counter() - start
        # As TorchTPU's persistent cache: a graph loaded from Inductor's on-disk cache was not compiled again.
        if counters["inductor"]["fxgraph_cache_hit"] == hits:
            _stats.num_compilations += 1
        return compiled

    def __call__(self, args: list[Any]) -> list[Any]:
        if "cpu_tensor_into_compiled_graph" in gaps.reproduced():
            _refuse_cpu_inputs(args)
        if not self.use_inductor:  # aot_eager: run the graph op by op on the device
            inputs = list(args)
            args.clear()
            return list(self.gm(*inputs))
        core = _build.load()
        device_by_ptr: dict[int, torch.Tensor] = {}
        cpu_args = []
        device = -1
        for a in args:
            if _is_tpu(a):
                device = a.device.index if device < 0 else device
                ptr = a.untyped_storage().data_ptr()
                if ptr:
                    device_by_ptr.setdefault(ptr, a)
                cpu_args.append(core.cpu_alias(a.detach()))
            else:
                cpu_args.append(a)
        if self.cpu_gm is None:
            self._prepare()
        # Rounded copies of the matmul operands that are graph inputs: a weight's rounded once per version.
        cpu_args.extend(core.rounded_operand(args[i]) for i in self.rounded_inputs)
        args.clear()  # boxed calling convention: the callee owns (and may free) the inputs
        if self.compiled is None:
            with self.lock:
                if self.compiled is None:
                    self.compiled = self._compile(cpu_args)
        self.entry["read_count"] += 1
        self.entry["last_read"] = time.time()
        with _deterministic():
            outs = self.compiled(*cpu_args)
        fresh: dict[int, torch.Tensor] = {}
        result = []
        for out, on_device in zip(outs, self.on_device, strict=False):
            result.append(
                _to_device(out, device_by_ptr, fresh, core, device)
                if on_device and isinstance(out, torch.Tensor)
                else out
            )
        return result


_CACHED_STATE_FORMAT = 1  # what a cached graph's pickled state holds: change it when that changes


@functools.cache
def _cacheable_graph_class() -> type:
    """A compiled graph that AOTAutograd's cache can keep (an Inductor ``OutputCode``): a second process then loads
    its forward and backward graphs from the cache entry instead of tracing and partitioning the model again
    (AOTAutograd: ~1.5 s of the demo's 4.7 s warm first step). What it keeps is the AOT graph; the CPU graph, its
    numerics rewrite (for this process's profile and precision) and Inductor's code are made again on the first
    call, the code from Inductor's FX-graph cache. Made on first use: Inductor's import costs a second."""
    from torch._inductor.output_code import OutputCode

    class CacheableGraph(_CompiledGraph, OutputCode):
        __hash__ = object.__hash__  # OutputCode is a dataclass (eq=True); graphs are compared by identity

        def __getstate__(self) -> dict[str, Any]:
            from torch.fx._graph_pickler import GraphPickler, Options

            state = dict(self.__dict__)
            state.update(compiled=None, cpu_gm=None, lock=None, rounded_inputs=[])
            state["entry"] = {"read_count": 0, "compilation_duration": 0.0, "last_read": None}
            state["state_format"] = _CACHED_STATE_FORMAT
            if self.gm is not None:  # with its nodes' fake values, which the numerics rewrite reads
                state.update(gm=None, graph_bytes=GraphPickler.dumps(self.gm, Options(ops_filter=None)))
            return state

        def __setstate__(self, state: dict[str, Any]) -> None:
            if state.pop("state_format", None) != _CACHED_STATE_FORMAT:  # AOTAutograd then compiles afresh
                raise ValueError("an AOTAutograd cache entry written by another hf-tpu version")
            self.__dict__.update(state)
            self.lock = threading.Lock()

        def prepare_for_serialization(self) -> None:
            """Nothing to drop: ``__getstate__`` keeps the graph only."""

        def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
            """Loaded from AOTAutograd's cache: the graph back (its fake values in the inputs' fake mode), and a
            request the persistent cache served."""
            if self.gm is None:
                from torch._guards import detect_fake_mode
                from torch._subclasses.fake_tensor import FakeTensorMode
                from torch.fx._graph_pickler import GraphPickler
                from torch.fx.experimental.symbolic_shapes import ShapeEnv

                fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(shape_env=ShapeEnv())
                self.gm = GraphPickler.loads(self.__dict__.pop("graph_bytes"), fake_mode)
                self.gm.recompile()
            with _lock:
                _stats.num_cache_reqs += 1
                _stats.num_cache_hits += 1
                _stats.per_entry_stats.append(self.entry)

        def set_triton_bundle(self, triton_bundle: Any) -> None:
            """No Triton kernels: the graphs compile to C++."""

    CacheableGraph.__qualname__ = CacheableGraph.__name__ = "_CacheableGraph"
    return CacheableGraph


def __getattr__(name: str) -> Any:
    # the cacheable class by its module-level name, for unpickling a cache entry in another process
    if name == "_CacheableGraph":
        return _cacheable_graph_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _refuse_cpu_inputs(args: list[Any]) -> None:
    """Gap ``cpu_tensor_into_compiled_graph``: TorchTPU's compiled programs take device buffers only (and pinned
    host memory for offloaded activations); eager ops accept a CPU 0-dim tensor, a compiled graph refuses it."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "cpu" and not a.is_pinned():
            raise RuntimeError(
                "execute(): failed to prepare compiled mode arguments: failed to get buffer from argument tensor: "
                f"shape={list(a.shape)}, dtype={a.dtype}, device=cpu, expected tensor to be on tpu, got cpu (known gap "
                "'cpu_tensor_into_compiled_graph': move the tensor to the chip before the compiled call)"
            )


def _to_device(
    out: torch.Tensor, inputs: dict[int, torch.Tensor], fresh: dict[int, torch.Tensor], core: Any, device: int
) -> torch.Tensor:
    """A device tensor over ``out``'s memory: a view of an input, of another output, or adopted memory."""
    ptr = out.untyped_storage().data_ptr()
    base = inputs.get(ptr) if ptr else None
    if base is None and ptr:
        base = fresh.get(ptr)
    if base is None:
        wrapped = core.wrap_cpu(out, device)
        if ptr:
            fresh[ptr] = wrapped
        return wrapped
    view = torch.empty(0, dtype=out.dtype, device=base.device)
    return view.set_(base.untyped_storage(), out.storage_offset(), out.size(), out.stride())


MAX_DYNAMIC_BUCKETS = 8


class AsyncCompilationSubmitted(Exception):  # noqa: N818  (TorchTPU's name)
    """Raised by the first call of a graph compiled with ``options={"async_compile": True}``, as on TorchTPU:
    that call only submits the (background) compilation and does not run; call again for the result."""

    def __init__(self, artifact: Any = None) -> None:
        super().__init__()
        self.artifact = artifact

    def resolve(self) -> None:
        """Wait for the compilation (the emulator compiles synchronously: nothing to wait for)."""


@dataclass
class TpuCompileDebug:
    """What ``options={"debug_callback": fn}`` hands ``fn`` after the forward graph compiles (TorchTPU's fields;
    the emulator lowers to CPU code, not StableHLO, so the StableHLO lists stay empty)."""

    pre_autograd_fx_code: list[str] = field(default_factory=list)
    pre_autograd_fx_readable: list[str] = field(default_factory=list)
    post_autograd_fx_forward_code: list[str] = field(default_factory=list)
    post_autograd_fx_forward_readable: list[str] = field(default_factory=list)
    post_autograd_fx_backward_code: list[str] = field(default_factory=list)
    post_autograd_fx_backward_readable: list[str] = field(default_factory=list)
    stablehlo_forward_text: list[str] = field(default_factory=list)
    stablehlo_backward_text: list[str] = field(default_factory=list)
    compiled_executables: list[Any] = field(default_factory=list)


def _parse_options(options: dict[str, Any]) -> tuple[bool, Callable[..., Any] | None]:
    """TorchTPU's option rules: bucket settings and the callback validated, anything else read as given and
    unknown keys ignored (gap ``compile_options_ignored``: hf-tpu's workaround warns about them)."""
    buckets = options.get("num_dynamic_buckets", 1)
    buckets = 1 if buckets is None else buckets
    if not isinstance(buckets, int) or not 1 <= buckets <= MAX_DYNAMIC_BUCKETS:
        raise ValueError(f"`num_dynamic_buckets` must be an integer between 1 and {MAX_DYNAMIC_BUCKETS}, got {buckets}")
    bucket_size = options.get("bucket_size", 128)
    bucket_size = 128 if bucket_size is None else bucket_size
    if not isinstance(bucket_size, int) or bucket_size <= 0:
        raise ValueError(f"`bucket_size` must be a positive integer, got {bucket_size}")
    callback = options.get("debug_callback")
    if callback is not None and not callable(callback):
        raise TypeError("'debug_callback' must be callable")
    return bool(options.get("async_compile", False)), callback


def _first_call_submits(compiled: Callable[..., Any]) -> Callable[..., Any]:
    submitted = False

    def call(*args: Any) -> Any:
        nonlocal submitted
        if not submitted:
            submitted = True
            raise AsyncCompilationSubmitted()
        return compiled(*args)

    for attr in ("serialize", "zero_grad"):
        if hasattr(compiled, attr):
            setattr(call, attr, getattr(compiled, attr))
    return call


class TpuBackend:
    """The ``"tpu"`` Dynamo backend. Accepts only ``options=``, refuses ``dynamic=True``, as TorchTPU's."""

    def __init__(self, debug: bool = False, dynamism: bool = False, enable_serialization: bool = True) -> None:
        self.debug = debug

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
        options = kwargs.pop("options", None) or {}
        if kwargs:
            raise TypeError(
                f"Unexpected keyword arguments: {kwargs} (the 'tpu' backend takes only options=, e.g. "
                "torch.compile(m, backend='tpu', options={'async_compile': False}); a mode other than 'default' is "
                "not supported on TPU)"
            )
        async_compile, callback = _parse_options(options)
        if not torch._dynamo.config.assume_static_by_default:
            raise NotImplementedError(
                "TPU backend does not support torch.compile(..., dynamic=True, ...). Use dynamic=False (the default "
                "for the tpu backend) and pad inputs to a few fixed shapes."
            )
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        _guard_input_storage_offsets(gm)
        use_inductor = _cxx_available()
        debug = TpuCompileDebug() if callback is not None else None
        # AOTAutograd's cache keeps the graphs for the next process (not with a debug callback: it wants the
        # post-autograd graphs of this compile)
        cacheable = use_inductor and debug is None and graph_cache.aot_cache_enabled()
        if debug is not None:
            debug.pre_autograd_fx_code.append(gm.code)
            debug.pre_autograd_fx_readable.append(gm.print_readable(print_output=False))

        def compiler(forward: bool, graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> _CompiledGraph:
            compiled = _graph_compiler(graph, inputs, use_inductor=use_inductor, cacheable=cacheable)
            if debug is not None:
                side = "forward" if forward else "backward"
                getattr(debug, f"post_autograd_fx_{side}_code").append(graph.code)
                getattr(debug, f"post_autograd_fx_{side}_readable").append(graph.print_readable(print_output=False))
                debug.compiled_executables.append(compiled)
                if forward:
                    callback(debug)  # type: ignore[misc]  (TorchTPU calls it once the forward graph compiled)
            return compiled

        fw_compiler: Any = functools.partial(compiler, True)
        bw_compiler: Any = functools.partial(compiler, False)
        if cacheable:
            from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
            from torch._inductor.output_code import OutputCode

            fw_compiler = SerializableAOTDispatchCompiler(OutputCode, fw_compiler)
            bw_compiler = SerializableAOTDispatchCompiler(OutputCode, bw_compiler)
        compiled = aot_autograd(
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler,
            partition_fn=min_cut_rematerialization_partition,
            # TorchTPU applies input mutations outside the graph (False). Here Inductor applies them in
            # place on the CPU aliases, i.e. in device memory, which saves copying a whole static KV
            # cache back after every decode step (1.1x -> 1.5x eager in bench/generate.py).
            keep_inference_input_mutations=True,
        )(gm, example_inputs)
        return _first_call_submits(compiled) if async_compile else compiled


def _guard_input_storage_offsets(gm: torch.fx.GraphModule) -> None:
    """TorchTPU's first compile step: a graph is valid only for its inputs' storage offsets.

    So a view that moves through a buffer (``timesteps[i]`` in a denoising loop) recompiles
    every step, as on the chip; the guards fail with "storage_offset()" in Dynamo's reason.
    """
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import TensorProperty, TensorPropertySource

    for node in gm.graph.find_nodes(op="placeholder"):
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        if source is None or not isinstance(getattr(arg, "example", None), torch.Tensor):
            continue
        install_guard(TensorPropertySource(source, TensorProperty.STORAGE_OFFSET).make_guard(GuardBuilder.EQUALS_MATCH))


def _graph_compiler(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, use_inductor: bool, cacheable: bool = False
) -> _CompiledGraph:
    key = (
        gm.code,
        tuple(_meta(x) for x in example_inputs),
        use_inductor,
        cacheable,
        numerics.graph_key(gaps.reproduced()),
    )
    with _lock:
        _stats.num_cache_reqs += 1
        hit = _cache.get(key)
        if hit is not None:
            _stats.num_cache_hits += 1
            return hit
        compiled = (_cacheable_graph_class() if cacheable else _CompiledGraph)(gm, use_inductor)
        _cache[key] = compiled
        _stats.per_entry_stats.append(compiled.entry)
        return compiled


# ---- torch.compile defaults, as TorchTPU patches them after device init ----------------

_UNSET: Any = object()


def _default_backend_selector(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``torch.compile()`` without a backend: "tpu" when any input is a tpu tensor, else Inductor on CPU."""
    from torch._dynamo.backends.registry import lookup_backend

    if any(_is_tpu(x) for x in example_inputs):
        return lookup_backend("tpu")(gm, example_inputs, **kwargs)
    name = "inductor" if _cxx_available() else "aot_eager"
    return lookup_backend(name)(gm, example_inputs, **kwargs)


def _is_tpu_backend(backend: Any) -> bool:
    return backend == "tpu" or backend is _default_backend_selector or isinstance(backend, TpuBackend)


def _register_device_interface() -> None:
    """Dynamo's device interface for "tpu": upstream's TpuInterface rules, answering for the emulated chip."""
    from torch._dynamo import device_interface as di

    di.get_interface_for_device("tpu")  # let upstream register its own first, so ours wins (as TorchTPU does)

    class EmulatedTpuInterface(di.TpuInterface):
        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def device_count() -> int:
            return 1

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

    di.register_interface_for_device("tpu", EmulatedTpuInterface)


def _dynamo_settings() -> None:
    """What importing TorchTPU's compile package sets for every torch.compile in the process: Dynamo traces
    through RNNs and autograd ops, and tpu RNG is functionalised graph-safely in AOTAutograd."""
    import torch._dynamo.config
    import torch._functorch.config
    from torch._functorch._aot_autograd import utils as aot_utils

    for name in ("trace_autograd_ops", "allow_rnn"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, True)
    if hasattr(aot_utils, "register_graphsafe_rng_device_type"):
        aot_utils.register_graphsafe_rng_device_type("privateuseone")
        aot_utils._GRAPHSAFE_RNG_DEVICE_TYPES.add("tpu")
        torch._functorch.config.graphsafe_rng_functionalization = True
        torch._functorch.config.functionalize_rng_ops = False


def _register_with_dynamo(_module: Any = None) -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    _dynamo_settings()
    _register_device_interface()
    if not isinstance(_COMPILER_FNS.get("tpu"), TpuBackend):
        _COMPILER_FNS.pop("tpu", None)
        register_backend(compiler_fn=TpuBackend(), name="tpu")


def install() -> None:
    """Register the backend and patch ``torch.compile`` the way TorchTPU does.

    Dynamo costs over a second to import, so the backend is registered when Dynamo is first
    imported (by ``torch.compile`` or anything else), not during ``import torch``.
    """
    from hf_tpu.plumbing.import_hooks import when_imported

    graph_cache.install()
    when_imported("torch._dynamo", _register_with_dynamo)
    if getattr(torch.compile, "_hf_tpu_patched", False):
        return
    original_compile = torch.compile

    @functools.wraps(original_compile)
    def compile(model: Any = None, *, backend: Any = _UNSET, dynamic: Any = _UNSET, **kwargs: Any) -> Any:  # noqa: A001
        from hf_tpu import recompiles

        recompiles.install()  # start the recompile report before the first graph
        if backend is _UNSET or backend is None:
            backend = _default_backend_selector
        if dynamic is _UNSET:
            dynamic = False if _is_tpu_backend(backend) else None
        return original_compile(model, backend=backend, dynamic=dynamic, **kwargs)

    compile._hf_tpu_patched = True  # type: ignore[attr-defined]
    torch.compile = compile

    wrapper_call = torch._TorchCompileInductorWrapper.__call__

    @functools.wraps(wrapper_call)
    def inductor_call(self: Any, model_: Any, inputs_: Sequence[Any]) -> Any:
        if any(_is_tpu(x) for x in inputs_) and self.config.get("tpu_backend") != "pallas":
            raise RuntimeError(
                "torch.compile(..., backend='inductor') on TPU is experimental and not supported: use "
                "backend='tpu' (or no backend: tpu inputs select it), or options={'tpu_backend': 'pallas'}."
            )
        return wrapper_call(self, model_, inputs_)

    torch._TorchCompileInductorWrapper.__call__ = inductor_call
