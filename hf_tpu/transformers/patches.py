"""One small patch per upstream gap, named for what it fixes, applied on import.

Each patch checks that the device is a TPU before changing anything, so CPU/CUDA users of
the same process see upstream behaviour. Each has a test that fails without it.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from hf_tpu.fixes import Fix, install_patches
from hf_tpu.plumbing.backend import on_tpu


def _size(n: float) -> str:
    from hf_tpu.emulator.generations import format_bytes

    return format_bytes(int(n))


# ---- max_memory_rejects_tpu_keys: max_memory={"tpu:0": ...} -------------------------------------------------------
def _normalize_max_memory(max_memory: dict | None) -> dict | None:
    """``"tpu"``, ``"tpu:0"`` and ``torch.device("tpu:0")`` keys become the index accelerate expects."""
    if max_memory is None or not on_tpu():
        return max_memory
    out = {}
    for key, value in max_memory.items():
        if isinstance(key, (str, torch.device)) and key not in ("cpu", "disk", "mps") and on_tpu(key):
            key = torch.device(key).index or 0
        out[key] = value
    return out


def max_memory_tpu_keys(module: ModuleType) -> None:
    """transformers.integrations.accelerate: accept ``max_memory={"tpu:0": "8GiB", "cpu": ...}``."""
    original = module.get_max_memory

    @functools.wraps(original)
    def get_max_memory(max_memory=None):
        return original(_normalize_max_memory(max_memory))

    module.get_max_memory = get_max_memory


# ---- auto_device_map_loads_on_cpu: device_map="auto" says how much went where ------------------------------------
def auto_offload_report(module: ModuleType) -> None:
    """transformers.modeling_utils: one warning with the bytes placed on the chip and offloaded to CPU/disk."""
    original = module._get_device_map

    @functools.wraps(original)
    def _get_device_map(model, device_map, max_memory, hf_quantizer):
        requested = device_map
        result = original(model, device_map, max_memory, hf_quantizer)
        if isinstance(requested, str) and isinstance(result, dict) and on_tpu():
            _report_placement(model, requested, result, _normalize_max_memory(max_memory))
        return result

    module._get_device_map = _get_device_map


def _report_placement(model: Any, requested: str, device_map: dict, max_memory: dict | None) -> None:
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model)
    placed: dict[str, int] = {"tpu:0": 0}
    for name, device in device_map.items():
        label = "tpu:0" if isinstance(device, int) or on_tpu(device) else str(device)
        placed[label] = placed.get(label, 0) + sizes.get(name, 0)
    offloaded = {k: v for k, v in placed.items() if not k.startswith("tpu")}
    if not offloaded:
        return
    budget = (max_memory or {}).get(0)
    if budget is None:
        budget_text = f"the chip had {_size(torch.accelerator.get_memory_info()[0])} free HBM"
    else:
        budget_text = f"max_memory for the chip: {budget if isinstance(budget, str) else _size(budget)}"
    where = ", ".join(f"{_size(v)} on {k}" for k, v in placed.items())
    warnings.warn(
        f"hf-tpu: device_map={requested!r} placed {where} ({budget_text}). Offloaded layers run "
        "from host memory and are copied to the chip at every forward: slow. Shard over more chips (tp_plan) or "
        "use a smaller dtype to fit.",
        UserWarning,
        stacklevel=4,
    )


# ---- allocator_warmup_takes_the_whole_model: no whole-model allocator warm-up on TPU ---------------------------------------
def skip_allocator_warmup(module: ModuleType) -> None:
    """transformers.modeling_utils: the warm-up allocates the model's whole size at once; skip it for tpu."""
    original = module.caching_allocator_warmup

    @functools.wraps(original)
    def caching_allocator_warmup(model, expanded_device_map, hf_quantizer):
        kept = {k: v for k, v in expanded_device_map.items() if not (isinstance(v, int) and on_tpu()) and not on_tpu(v)}
        if kept:
            return original(model, kept, hf_quantizer)
        return None

    module.caching_allocator_warmup = caching_allocator_warmup


# ---- compile_config_defaults_to_inductor: CompileConfig defaults that suit TPU -----------------------------------------
def compile_config_for_tpu(module: ModuleType) -> None:
    """transformers.modeling_utils: an explicit ``CompileConfig()`` keeps inductor/reduce-overhead, which TPU
    refuses; on tpu those class defaults become ``backend="tpu", mode="default", dynamic=False``."""
    cls = module.PreTrainedModel
    original = cls.get_compiled_call

    @functools.wraps(original)
    def get_compiled_call(self, compile_config):
        if compile_config is not None and self.device.type == "tpu" and compile_config.backend == "inductor":
            fixed = copy.copy(compile_config)
            fixed.backend, fixed.mode = "tpu", "default"
            if fixed.dynamic is not False:
                fixed.dynamic = False
            compile_config = fixed
        return original(self, compile_config)

    cls.get_compiled_call = get_compiled_call


# ---- no_tpu_memory_accounting: memory queries see the chip ----------------------------------------------------
def _tpu_memory_breakdown(original: Any) -> Any:
    @functools.wraps(original)
    def get_device_and_memory_breakdown():
        if not on_tpu():
            return original()
        free, total = torch.accelerator.get_memory_info()
        return (
            torch.device("tpu", 0),
            total,
            torch.accelerator.memory_reserved(),
            torch.accelerator.memory_allocated(),
        )

    return get_device_and_memory_breakdown


def memory_breakdown_utils(module: ModuleType) -> None:
    """Continuous batching sizes its cache from host RAM on TPU; answer with the chip's HBM."""
    module.get_device_and_memory_breakdown = _tpu_memory_breakdown(module.get_device_and_memory_breakdown)


def memory_breakdown_cache(module: ModuleType) -> None:
    """Continuous batching's cache module imported the memory query by name; answer with the chip's HBM there too."""
    module.get_device_and_memory_breakdown = _tpu_memory_breakdown(module.get_device_and_memory_breakdown)


def _pipeline_init(original: Any) -> Any:
    signature = inspect.signature(original)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        bound = signature.bind_partial(self, *args, **kwargs)
        model = bound.arguments.get("model")
        if bound.arguments.get("device") is None and model is not None and on_tpu():
            device_map = getattr(model, "hf_device_map", None)
            if device_map is None:  # as CUDA: no device given, the accelerator's chip (a model there stays)
                bound.arguments["device"] = torch.device("tpu", torch.accelerator.current_device_index())
            elif all(isinstance(d, int) for d in device_map.values()):
                # accelerate's integer ids mean chips here; upstream would take 0 as "cpu" and feed the model
                # CPU inputs. The device argument cannot be combined with a device map, so set it afterwards.
                original(*bound.args, **bound.kwargs)
                self.device = torch.device("tpu", next(iter(device_map.values())))
                return
        original(*bound.args, **bound.kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def pipeline_default_device(module: ModuleType) -> None:
    """transformers.pipelines.base: with no device, a pipeline runs on the TPU (a model already there stays),
    as on CUDA; upstream resolved device 0 to CPU and moved the model off the chip."""
    module.Pipeline.__init__ = _pipeline_init(module.Pipeline.__init__)


# ---- transformers_env_omits_the_tpu: `transformers env` names the TPU ---------------------------------------------------
def _tpu_rows(info: dict[str, Any]) -> None:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    key = "PyTorch version (accelerator?)"
    info[key] = info[key].replace("(NA)", "(TPU)")
    name = torch.tpu.get_device_name()  # TorchTPU's public (experimental) name, e.g. "TPU v6e"
    info["Using TPU in script?"] = "<fill in>"
    info["TPU type"] = f"{name}, {torch.accelerator.device_count()} chip(s) visible to this process"
    info["torch-tpu version"] = installed("torch-tpu")
    info["hf-tpu version"] = f"{installed('hf-tpu')} (`hf-tpu env` has the rest: chips, settings, fixes)"


def environment_names_the_tpu(module: ModuleType) -> None:
    """transformers.cli.system: `transformers env` names the TPU, its chips and the TorchTPU / hf-tpu versions
    (it listed CUDA, XPU, NPU and HPU only and printed the accelerator as "NA")."""
    original = module._format_dict

    @functools.wraps(original)
    def _format_dict(d: dict) -> str:
        if "PyTorch version (accelerator?)" in d and on_tpu():
            _tpu_rows(d)  # in place: env() also returns this dict
        return original(d)

    module._format_dict = _format_dict


# ---- TPU default: generate() at fixed shapes ----------------------------------------------------
def generate_at_fixed_shapes(module: ModuleType) -> Callable[[], None]:
    """generate() on tpu with no cache chosen runs on a power-of-two static cache with the prompt left-padded (on
    the host) to a bucket, padding stripped from the result: the same tokens, and no compilation for a new prompt
    length once its bucket is warm (see hf_tpu.transformers.generate_shapes)."""
    from hf_tpu.transformers.generate_shapes import wrap_generate

    cls = module.GenerationMixin
    original = cls.generate
    cls.generate = wrap_generate(original)

    def undo() -> None:
        cls.generate = original

    return undo


# ---- TPU default: Trainer batches at bucketed shapes ---------------------------------------------
def trainer_batches_at_fixed_shapes(module: ModuleType) -> Callable[[], None]:
    """Trainer on tpu pads each batch's sequence length to a power of two and the last training batch's rows to
    the batch size (mask 0 / label -100): the same losses, and no compilation for a new length once its bucket
    ran (see hf_tpu.transformers.train_shapes)."""
    from hf_tpu.transformers.train_shapes import wrap_get_dataloader

    cls = module.Trainer
    original = cls._get_dataloader
    cls._get_dataloader = wrap_get_dataloader(original)

    def undo() -> None:
        cls._get_dataloader = original

    return undo


PATCHES: tuple[Fix, ...] = (
    Fix.patch("max_memory_rejects_tpu_keys", "transformers.integrations.accelerate", max_memory_tpu_keys),
    Fix.patch("auto_device_map_loads_on_cpu", "transformers.modeling_utils", auto_offload_report),
    Fix.patch("allocator_warmup_takes_the_whole_model", "transformers.modeling_utils", skip_allocator_warmup),
    Fix.patch("compile_config_defaults_to_inductor", "transformers.modeling_utils", compile_config_for_tpu),
    Fix.patch("no_tpu_memory_accounting", "transformers.generation.continuous_batching.utils", memory_breakdown_utils),
    Fix.patch("no_tpu_memory_accounting", "transformers.generation.continuous_batching.cache", memory_breakdown_cache),
    Fix.patch("pipeline_default_device_not_tpu", "transformers.pipelines.base", pipeline_default_device),
    Fix.patch("transformers_env_omits_the_tpu", "transformers.cli.system", environment_names_the_tpu),
    Fix.default("transformers.generation.utils", generate_at_fixed_shapes, off="HF_TPU_GENERATE_BUCKETS=0"),
    Fix.default("transformers.trainer", trainer_batches_at_fixed_shapes, off="HF_TPU_TRAIN_BUCKETS=0"),
)


def install() -> None:
    install_patches(PATCHES)
