"""Threads allocating, computing and freeing on the device at once: counters back to baseline, RSS flat."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import torch

STRESS_SECONDS = 3.0  # a bound on the test's length, not a measurement


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _work(seed: int, stop: float, errors: list[BaseException]) -> None:
    gen = torch.Generator(device="tpu").manual_seed(seed)
    try:
        while time.monotonic() < stop:
            x = torch.randn(64, 64, device="tpu", generator=gen, requires_grad=True)
            y = (x @ x.T).relu().sum()
            y.backward()
            keep = [torch.empty(1 << 16, device="tpu") for _ in range(8)]
            assert x.grad is not None and x.grad.device.type == "tpu"
            torch.tpu.manual_seed(seed)  # seeding while other threads draw from the generators
            del keep, x, y
    except BaseException as err:  # noqa: BLE001  (reported by the test)
        errors.append(err)


def _round(seconds: float) -> None:
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds
    threads = [threading.Thread(target=_work, args=(i, stop, errors)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert not errors, errors


@pytest.mark.emulator_only(
    "the emulator's own bookkeeping returns every byte (TorchTPU keeps an executable per op and shape)"
)
def test_threads_hammering_the_device_leave_nothing_behind():
    gc.collect()
    allocated = torch.accelerator.memory_allocated()
    _round(0.5)  # warm-up: first-use allocations (kernels, caches) happen here
    gc.collect()
    rss = _rss()
    _round(STRESS_SECONDS)
    gc.collect()
    assert torch.accelerator.memory_allocated() == allocated
    assert _rss() - rss < 64 << 20, f"RSS grew by {(_rss() - rss) >> 20} MiB"
