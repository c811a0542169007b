"""Transfer and sync counters, with the user frame that caused each event."""

from __future__ import annotations

import pytest
import torch

import hf_tpu.emulator as emulator

pytestmark = pytest.mark.emulator_only("the emulator's transfer and sync tracker")


def test_track_counts_transfers_and_syncs_with_frames():
    before = emulator.counters()
    with emulator.track() as t:
        x = torch.ones(4, 4).to("tpu")  # 1 host->device, 64 bytes
        y = (x * 2).sum()
        value = y.item()  # sync
        host = x.cpu()  # device->host (and a sync)
        listed = x[0].tolist()  # device->host
    assert value == 32.0 and host.shape == (4, 4) and listed == [1.0] * 4
    assert len(t.host_to_device) == 1 and t.host_to_device[0].nbytes == 64
    assert len(t.device_to_host) == 2
    assert len(t.syncs) == 3
    assert all(__file__ in e.frame for e in t.events), [e.frame for e in t.events]
    report = t.report()
    assert "host_to_device" in report and "test_tracking.py" in report
    after = emulator.counters()
    assert after["host_to_device"][0] - before["host_to_device"][0] == 1
    assert after["syncs"][0] - before["syncs"][0] == 3


def test_nothing_recorded_outside_track():
    with emulator.track() as t:
        pass
    before = emulator.counters()
    torch.ones(2).to("tpu").cpu()  # counted, but belongs to no tracker
    with emulator.track() as u:
        torch.ones(3).to("tpu")
    assert t.events == []
    assert [(e.kind, e.nbytes) for e in u.events] == [("host_to_device", 12)]
    assert emulator.counters()["host_to_device"][0] - before["host_to_device"][0] == 2


def test_track_sees_transfers_made_by_other_threads():
    import threading

    def copy_in_a_thread() -> None:
        torch.ones(8).to("tpu")  # the line reported

    with emulator.track() as t:
        worker = threading.Thread(target=copy_in_a_thread)
        worker.start()
        worker.join(timeout=60)
    assert [(e.kind, e.nbytes) for e in t.events] == [("host_to_device", 32)]
    assert "copy_in_a_thread" in t.events[0].frame and __file__ in t.events[0].frame
