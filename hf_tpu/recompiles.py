"""Which graphs torch.compile built, and why each recompile happened, in words.

Recompiles are the first complaint of every TPU user: each new graph costs an XLA compile.
This module listens to Dynamo itself (its bytecode hook fires once per compiled frame, its
``recompiles`` log carries the guard that failed), so it works with any backend, on a real
TPU or the emulated one.

    with hf_tpu.watch_compiles() as report:
        model(x)
    print(report)                    # one row per graph, with the reason for each recompile

    with hf_tpu.strict_recompile():  # or HF_TPU_STRICT_RECOMPILE=1 for the whole process
        model(x_of_a_new_shape)      # raises hf_tpu.RecompileError naming what changed
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = [
    "CompileReport",
    "GraphCompile",
    "RecompileError",
    "compile_report",
    "explain_guard_failure",
    "strict_recompile",
    "watch_compiles",
]


class RecompileError(RuntimeError):
    """A graph was recompiled while recompiles were forbidden (strict mode)."""


@dataclass(frozen=True)
class GraphCompile:
    """One compiled frame: the function, where it is, and why it was (re)compiled."""

    function: str
    location: str
    reason: str | None  # None: the first compile of this function
    guard_failures: tuple[str, ...] = ()

    @property
    def is_recompile(self) -> bool:
        return self.reason is not None


@dataclass(eq=False)  # identity matters: reports are added to and removed from a shared list
class CompileReport:
    """The graphs compiled while the report was recording."""

    compiles: list[GraphCompile] = field(default_factory=list)

    @property
    def recompiles(self) -> list[GraphCompile]:
        return [c for c in self.compiles if c.is_recompile]

    def count(self, function: str | None = None) -> int:
        return sum(1 for c in self.compiles if function is None or c.function == function)

    def __str__(self) -> str:
        if not self.compiles:
            return "no graphs compiled"
        rows = [f"{len(self.compiles)} graph(s) compiled, {len(self.recompiles)} recompile(s)"]
        for i, c in enumerate(self.compiles):
            why = c.reason if c.reason is not None else "first compile"
            rows.append(f"{i:>3}  {c.function} ({c.location}): {why}")
        return "\n".join(rows)


_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"tensor '(?P<n>.+?)' size mismatch at index (?P<i>\d+)\. expected (?P<a>\S+), actual (?P<b>\S+)"),
        "input '{n}' dim {i} changed {a} → {b}",
    ),
    (
        re.compile(r"tensor '(?P<n>.+?)' stride mismatch at index (?P<i>\d+)\. expected (?P<a>\S+), actual (?P<b>\S+)"),
        "input '{n}' stride {i} changed {a} → {b} (a different memory layout)",
    ),
    (
        re.compile(r"tensor '(?P<n>.+?)' dtype mismatch\. expected (?P<a>\S+), actual (?P<b>\S+)"),
        "input '{n}' dtype changed {a} → {b}",
    ),
    (
        re.compile(r"tensor '(?P<n>.+?)' requires_grad mismatch\. expected requires_grad=(?P<a>\S+)"),
        "input '{n}' requires_grad changed (was {a})",
    ),
    (
        re.compile(r"tensor '(?P<n>.+?)' rank mismatch\. expected (?P<a>\S+), actual (?P<b>\S+)"),
        "input '{n}' number of dims changed {a} → {b}",
    ),
    (
        re.compile(r"tensor '(?P<n>.+?)' (?:dispatch key set|device) mismatch"),
        "input '{n}' moved to another device",
    ),
    (
        re.compile(r"^(?P<n>.+?)\.storage_offset\(\) == (?P<a>\d+)"),
        "input '{n}' storage offset changed (it was {a}): a view into a larger tensor, e.g. timesteps[i]; pass a clone",
    ),
    (re.compile(r"___check_global_state\(\)"), "global state changed (grad mode, autocast or default dtype)"),
    (re.compile(r"___check_obj_id\((?P<n>[^,]+),"), "a different object was passed as {n}"),
    (re.compile(r"^(?P<n>[A-Za-z_][\w.\[\]'\"]*) == (?P<a>.+?)\s*(?:#|$)"), "value of {n} changed (it was {a})"),
    (re.compile(r"len\((?P<n>[^)]+)\) == (?P<a>\d+)"), "length of {n} changed (it was {a})"),
]


def _clean_name(name: str) -> str:
    """``L['self']._modules['lin'].weight`` -> ``self.lin.weight``; ``L['x']`` -> ``x``."""
    name = re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", name)
    name = re.sub(r"^[LG]\['([^']+)'\]", r"\1", name)
    name = re.sub(r"^kwargs\['([^']+)'\]", r"\1", name)  # keyword arguments of a **kwargs wrapper
    return name


def explain_guard_failure(raw: str) -> str:
    """Turn one Dynamo guard-failure line into a sentence a user understands."""
    text = re.sub(r"^\d+/\d+: ", "", raw.strip().splitlines()[0]).strip()
    for pattern, template in _PATTERNS:
        match = pattern.search(text)
        if match:
            return template.format(**{k: _clean_name(v.strip()) for k, v in match.groupdict().items()})
    return text


class _Recorder(logging.Handler):
    """Receives Dynamo's recompile messages and bytecode-hook calls; feeds the active reports."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._state_lock = threading.Lock()
        self.pending: dict[tuple[str, str], list[str]] = {}
        self.reports: list[CompileReport] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        head = re.match(r"Recompiling function (\S+) in (.+):(\d+)", message)
        if head is None:
            return
        failures = [line.strip()[2:] for line in message.splitlines() if line.strip().startswith("- ")]
        # "- User stack trace:" lines and their frames are context, not failures.
        failures = [f for f in failures if re.match(r"^\d+/\d+: ", f)]
        with self._state_lock:
            self.pending[(head.group(1), f"{head.group(2)}:{head.group(3)}")] = failures

    def on_compiled(self, code: object, new_code: object) -> None:
        key = (code.co_name, f"{code.co_filename}:{code.co_firstlineno}")  # type: ignore[attr-defined]
        with self._state_lock:
            failures = self.pending.pop(key, None)
            entry = GraphCompile(
                function=key[0],
                location=key[1],
                reason=explain_guard_failure(failures[0]) if failures else None,
                guard_failures=tuple(failures or ()),
            )
            for report in self.reports:
                report.compiles.append(entry)


_recorder: _Recorder | None = None
_process_report = CompileReport()
_install_lock = threading.Lock()  # held while installing; nothing under it imports or calls install() again


def install() -> None:
    """Start recording (idempotent). Called by the emulator and on a real TPU; cheap to call again."""
    global _recorder
    if _recorder is not None:
        return
    # Imported before the lock: importing Dynamo runs hf-tpu's import hooks, which may call install() again.
    import torch._dynamo.guards as guards
    from torch._dynamo.convert_frame import register_bytecode_hook
    from torch._logging._internal import log_state

    with _install_lock:
        if _recorder is not None:
            return
        recorder = _Recorder()
        recorder.reports.append(_process_report)
        logger = logging.getLogger(guards.recompiles_log.name)
        logger.addHandler(recorder)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # ours to read; TORCH_LOGS=recompiles still prints through torch's own handler
        log_state.enable_artifact("recompiles")
        register_bytecode_hook(lambda code, new_code: recorder.on_compiled(code, new_code))
        _recorder = recorder
        from hf_tpu import settings

        if settings.get("HF_TPU_STRICT_RECOMPILE"):
            import torch._dynamo.config
            import torch._dynamo.exc

            torch._dynamo.config.error_on_recompile = True
            # Dynamo raises `exc.RecompileError(message)`: make that ours, with the same explanation as
            # strict_recompile() gives (still a subclass of Dynamo's, so its own handlers are unchanged).
            dynamo_error = torch._dynamo.exc.RecompileError
            if not issubclass(dynamo_error, RecompileError):

                class ExplainedRecompileError(dynamo_error, RecompileError):
                    def __init__(self, message: str) -> None:
                        super().__init__(_explained(message))

                torch._dynamo.exc.RecompileError = ExplainedRecompileError


def _explained(dynamo_message: str) -> str:
    """Dynamo's "Recompiling function ..." message, turned into what changed and what to do."""
    lines = dynamo_message.splitlines()
    failures = [line.strip()[2:] for line in lines if re.match(r"^\s*- \d+/\d+: ", line)]
    head = (lines[0] if lines else "").replace("Recompiling function", "recompiling")
    why = explain_guard_failure(failures[0]) if failures else "unknown guard failure"
    return (
        f"hf-tpu strict recompile: {head}: {why}. Keep shapes, dtypes and Python values fixed between calls "
        "(pad inputs to fixed sizes), or warm up each shape before entering strict mode."
    )


def compile_report() -> CompileReport:
    """Every graph compiled in this process since hf-tpu started recording."""
    install()
    return _process_report


@contextlib.contextmanager
def watch_compiles() -> Iterator[CompileReport]:
    """Record the graphs compiled inside the block."""
    install()
    assert _recorder is not None
    report = CompileReport()
    with _recorder._state_lock:
        _recorder.reports.append(report)
    try:
        yield report
    finally:
        with _recorder._state_lock:
            _recorder.reports.remove(report)


@contextlib.contextmanager
def strict_recompile() -> Iterator[CompileReport]:
    """A recompile inside the block ends it with :class:`RecompileError` naming what changed.

    First compiles (warm-up) are allowed; only a second graph for the same function fails.
    """
    import torch._dynamo

    install()
    previous = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    try:
        with watch_compiles() as report:
            yield report
    except torch._dynamo.exc.RecompileError as err:
        if isinstance(err, RecompileError):
            raise
        raise RecompileError(_explained(str(err))) from err
    finally:
        torch._dynamo.config.error_on_recompile = previous
