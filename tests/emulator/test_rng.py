"""Random numbers on the device: reproducible, seedable, and the same engine as CPU."""

from __future__ import annotations

import warnings

import pytest
import torch


def test_device_generator_is_reproducible():
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(7)
    a = torch.randn(5, device="tpu", generator=g)
    g.manual_seed(7)
    b = torch.randn(5, device="tpu", generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    state = g.get_state()
    c = torch.rand(3, device="tpu", generator=g)
    g.set_state(state)
    assert torch.equal(torch.rand(3, device="tpu", generator=g).cpu(), c.cpu())


def test_manual_seed_reaches_the_device():
    torch.manual_seed(1)
    x = torch.rand(3, device="tpu")
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), x.cpu())


@pytest.mark.emulator_only("the emulator draws with CPU's generator engine; TorchTPU's stream is its own")
def test_the_emulator_draws_cpus_numbers_for_a_seed():
    torch.manual_seed(123)
    a = torch.randn(4, 4, device="tpu")
    torch.manual_seed(123)
    assert torch.equal(a.cpu(), torch.randn(4, 4))


def test_device_and_cpu_streams_are_separate():
    torch.manual_seed(5)
    torch.rand(10)  # drawing on CPU must not advance the device generator
    a = torch.rand(3, device="tpu")
    torch.manual_seed(5)
    b = torch.rand(3, device="tpu")
    assert torch.equal(a.cpu(), b.cpu())


def test_rng_state_apis():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.tpu.manual_seed(11)
        gen = torch.tpu.default_generators[0]
        assert gen.initial_seed() == 11
        assert gen is torch.tpu.default_generators[0]
        s = gen.get_state()
        x = torch.randn(2, device="tpu")
        torch.tpu.set_rng_state(s)
        assert torch.equal(torch.randn(2, device="tpu").cpu(), x.cpu())
        with pytest.raises(ValueError):
            torch.tpu.set_rng_state(s, device="cpu")
        # The saved state is a copy: drawing moved the generator on, not the copy, so restoring it replays again.
        assert not torch.equal(gen.get_state(), s)
        torch.tpu.set_rng_state(s)
        assert torch.equal(torch.randn(2, device="tpu").cpu(), x.cpu())


def test_dropout_and_multinomial_follow_the_seed():
    x = torch.ones(100, device="tpu")
    torch.manual_seed(0)
    a = torch.nn.functional.dropout(x, 0.5)
    p = torch.multinomial(torch.ones(10, device="tpu"), 5)
    torch.manual_seed(0)
    b = torch.nn.functional.dropout(x, 0.5)
    q = torch.multinomial(torch.ones(10, device="tpu"), 5)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(p.cpu(), q.cpu())


def test_a_cpu_generator_is_refused_for_tpu_tensors():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, device="tpu", generator=torch.Generator())


def test_seeding_and_drawing_from_threads():
    """Each thread's own generator gives its own reproducible stream while others draw and seed beside it."""
    import concurrent.futures

    def draws(seed: int) -> list[torch.Tensor]:
        gen = torch.Generator(device="tpu").manual_seed(seed)
        out = []
        for _ in range(50):
            out.append(torch.rand(64, device="tpu", generator=gen).cpu())
            torch.tpu.manual_seed(seed)  # the default generators, seeded concurrently, must not disturb `gen`
        return out

    # Reference: the same streams drawn one after the other on this thread (valid on a chip too: it does not
    # assume the device's engine is CPU's).
    expected = [
        [torch.rand(64, device="tpu", generator=gen).cpu() for _ in range(50)]
        for gen in (torch.Generator(device="tpu").manual_seed(seed) for seed in [1, 2, 3, 4])
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(draws, [1, 2, 3, 4]))
    for seed, got, want in zip([1, 2, 3, 4], threaded, expected, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), seed


def test_tpu_generator_refused_for_cpu_tensors():
    g = torch.Generator(device="tpu")
    # torch's words on the emulator; TorchTPU's kernel takes the call and says "normal_(): expected tensor to be on tpu"
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator|expected tensor to be on tpu"):
        torch.randn(3, generator=g)
