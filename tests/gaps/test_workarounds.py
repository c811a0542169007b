"""Each TorchTPU gap hf-tpu works around: the gap shows with its workaround off, and is closed with it on.

The "off" half runs only while the backend has the gap (always on the emulated TPU's torch_tpu profile;
on a chip, per ``hf-tpu gaps``' measurement or the gap table), so these tests hold on a real TPU too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import textwrap

import pytest
import torch
import torch.nn.functional as F

from hf_tpu import fixes
from hf_tpu.gaps import GAPS
from hf_tpu.gaps.status import present
from tests.conftest import run_python


@contextlib.contextmanager
def without(workaround: str, gap: str):
    """The block runs with the workaround off; yields whether the gap should then show."""
    with fixes.disabled(workaround):
        yield present(gap)[0]


def tpu(x: torch.Tensor) -> torch.Tensor:
    return x.to("tpu")


def aborts_without(workaround: str, gap: str, code: str) -> None:
    """A gap where TorchTPU ends the process: with the workaround off, ``code`` aborts a fresh process (the emulator
    too, with ``HF_TPU_EMULATOR_GAPS=abort``) while the backend has the gap."""
    if not present(gap)[0]:
        return
    body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    script = f"import torch\nimport torch.nn.functional as F\nfrom hf_tpu import fixes\nwith fixes.disabled({workaround!r}):\n{body}\n"
    proc = run_python(script, env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_GAPS": "abort"})
    assert proc.returncode in (-6, 134), (proc.returncode, proc.stderr[-2000:])


def test_every_fixable_gap_names_a_registered_workaround():
    names = {fix.name for fix in fixes.registered()}
    for gap in GAPS:
        assert gap.workaround is None or gap.workaround in names, gap.name
        assert gap.workaround is not None or gap.advice, f"{gap.name}: no workaround and no advice"
    for fix in fixes.registered():
        assert fix.name.islower() and " " not in fix.name, fix.name


def test_cholesky_runs_through_the_host():
    spd = torch.tensor([[4.0, 2.0], [2.0, 3.0]])
    with without("cholesky_on_cpu", "cholesky") as gap:
        if gap:
            with pytest.raises(RuntimeError, match="operator 'aten::linalg_cholesky_ex.*' is not implemented for TPU"):
                torch.linalg.cholesky_ex(tpu(spd))
    factor, info = torch.linalg.cholesky_ex(tpu(spd))
    assert factor.device.type == "tpu" and info.item() == 0
    torch.testing.assert_close(factor.cpu(), torch.linalg.cholesky(spd), rtol=1.3e-6, atol=1e-6)
    # What resize_token_embeddings does with it: a MultivariateNormal over the old embeddings.
    dist = torch.distributions.MultivariateNormal(tpu(torch.zeros(2)), covariance_matrix=tpu(spd))
    assert dist.sample((3,)).shape == (3, 2)


def test_ctc_loss_runs_through_the_host_forward_and_backward():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 2, 6, generator=generator)
    targets = torch.randint(1, 6, (8,), generator=generator)
    lengths = (torch.full((2,), 10), torch.full((2,), 4))

    def loss(x: torch.Tensor, device: str) -> torch.Tensor:
        return F.ctc_loss(x.log_softmax(-1), targets.to(device), *(n.to(device) for n in lengths), reduction="sum")

    aborts_without(
        "ctc_loss_on_cpu",
        "ctc_loss",
        """
        log_probs = torch.randn(10, 2, 6, device="tpu").log_softmax(-1)
        targets = torch.randint(1, 6, (8,), device="tpu")
        lengths = torch.full((2,), 10, device="tpu"), torch.full((2,), 4, device="tpu")
        F.ctc_loss(log_probs, targets, *lengths, reduction="sum").cpu()
        """,
    )
    x = tpu(logits).requires_grad_()
    value = loss(x, "tpu")
    value.backward()
    reference = logits.clone().requires_grad_()
    expected = loss(reference, "cpu")
    expected.backward()
    torch.testing.assert_close(value.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.cpu(), reference.grad, rtol=1e-5, atol=1e-5)


def tied_model() -> tuple[torch.nn.Module, torch.nn.Embedding, torch.nn.Linear]:
    embedding = torch.nn.Embedding(7, 4)
    head = torch.nn.Linear(4, 7, bias=False)
    head.weight = embedding.weight
    return torch.nn.Sequential(embedding, head), embedding, head


def test_module_to_keeps_tied_weights_tied_and_data_assignment_works():
    with without("tpu_cpu_shallow_copy", "weight_tying") as gap:
        model, embedding, head = tied_model()
        model.to("tpu")
        if gap:
            assert head.weight is not embedding.weight  # untied: two parameters now
            with pytest.raises(RuntimeError, match="incompatible tensor type"):
                torch.nn.Parameter(torch.zeros(2)).data = torch.zeros(2, device="tpu")
    model, embedding, head = tied_model()
    param = embedding.weight
    model.to("tpu")
    assert head.weight is embedding.weight is param and param.device.type == "tpu"
    assert len(list(model.parameters())) == 1
    model.to("cpu")
    assert head.weight is embedding.weight is param and param.device.type == "cpu"
    p = torch.nn.Parameter(torch.zeros(2))
    p.data = torch.ones(2, device="tpu")  # what diffusers' group offloading does
    assert p.device.type == "tpu" and p.cpu().tolist() == [1.0, 1.0]


def test_fully_masked_attention_rows_are_zero():
    query, key = tpu(torch.randn(1, 1, 3, 8)), tpu(torch.randn(1, 1, 5, 8))
    value = tpu(torch.full((1, 1, 5, 8), 1e4))
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[:, :, 1, :] = False
    with without("attention_zero_fully_masked_rows", "fully_masked_attention_row") as gap:
        if gap:
            leaked = F.scaled_dot_product_attention(query, key, value, attn_mask=tpu(mask))
            assert leaked[0, 0, 1].abs().max().item() > 1e3
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=tpu(mask))
    assert out[0, 0, 1].abs().max().item() == 0.0
    expected = F.scaled_dot_product_attention(query.cpu(), key.cpu(), value.cpu(), attn_mask=mask)
    torch.testing.assert_close(out.cpu(), expected, rtol=1.6e-2, atol=1e-2 * 1e4)  # bfloat16 attention


def draw_twice(weights: torch.Tensor, replacement: bool) -> tuple[torch.Tensor, torch.Tensor]:
    draws = []
    for _ in range(2):
        torch.manual_seed(1234)
        draws.append(torch.multinomial(weights, 5, replacement=replacement).cpu())
    return draws[0], draws[1]


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_follows_the_seed(replacement):
    weights = tpu(torch.rand(3, 20, generator=torch.Generator().manual_seed(0)) + 0.05)
    with without("seeded_multinomial", "multinomial_seeding") as gap:
        if gap:
            first, second = draw_twice(weights, replacement)
            assert not torch.equal(first, second)
    first, second = draw_twice(weights, replacement)
    assert torch.equal(first, second) and first.dtype == torch.int64
    generator = torch.Generator("tpu").manual_seed(7)
    again = torch.Generator("tpu").manual_seed(7)
    assert torch.equal(
        torch.multinomial(weights, 5, generator=generator), torch.multinomial(weights, 5, generator=again)
    )
    if not replacement:
        assert all(len(set(row)) == 5 for row in first.tolist())  # no category twice


def test_multinomial_samples_the_distribution_and_rejects_bad_ones():
    probs = tpu(torch.tensor([0.0, 0.2, 0.8]))
    draws = torch.multinomial(probs, 20000, replacement=True).cpu()
    share = torch.bincount(draws, minlength=3).float() / len(draws)
    assert share[0] == 0 and abs(share[2].item() - 0.8) < 0.02  # 0.8 +- 7 standard deviations
    assert torch.multinomial(probs, 2).sort().values.cpu().tolist() == [1, 2]
    if present("multinomial_unchecked")[0]:  # TorchTPU draws from a negative weight's distribution
        assert torch.multinomial(tpu(torch.tensor([0.0, -1.0, 2.0])), 1).cpu().tolist() == [2]
    else:
        with pytest.raises(RuntimeError, match="invalid multinomial distribution"):
            torch.multinomial(tpu(torch.tensor([0.0, -1.0])), 1)
    # TorchTPU's words ("expected the number of samples to be <= 3 ... when replacement is disabled"), or CPU's
    with pytest.raises(RuntimeError, match="when replacement is disabled|without replacement"):
        torch.multinomial(probs, 4)


def test_differentiable_attention_mask_gets_its_gradient():
    query, key, value = (tpu(torch.randn(1, 2, 4, 8)) for _ in range(3))
    with without("attention_math_for_differentiable_mask", "differentiable_attention_mask") as gap:
        if gap:
            bias = torch.zeros(1, 2, 4, 4, device="tpu", requires_grad=True)
            with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'attn_mask'"):
                F.scaled_dot_product_attention(query, key, value, attn_mask=bias)
    bias = torch.zeros(1, 2, 4, 4, device="tpu", requires_grad=True)
    F.scaled_dot_product_attention(query, key, value, attn_mask=bias).sum().backward()
    cpu_bias = torch.zeros(1, 2, 4, 4, requires_grad=True)
    F.scaled_dot_product_attention(query.cpu(), key.cpu(), value.cpu(), attn_mask=cpu_bias).sum().backward()
    torch.testing.assert_close(bias.grad.cpu(), cpu_bias.grad, rtol=1.6e-2, atol=1e-2)  # bf16 matmuls


def test_avg_pool1d_keeps_the_gradient():
    x = torch.randn(2, 3, 9)
    with without("avg_pool1d_through_2d", "avg_pool1d_gradient") as gap:
        if gap:
            assert F.avg_pool1d(tpu(x).requires_grad_(), 2).grad_fn is None
    for args in ((2,), (3, 2, 1), (3, 2, 1, True, False)):
        xt = tpu(x).requires_grad_()
        xc = x.clone().requires_grad_()
        out, expected = F.avg_pool1d(xt, *args), F.avg_pool1d(xc, *args)
        (out.sum() + (out * out).sum()).backward()
        (expected.sum() + (expected * expected).sum()).backward()
        torch.testing.assert_close(out.cpu(), expected.detach())
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    assert torch.nn.AvgPool1d(3)(tpu(x).requires_grad_()).grad_fn is not None


def test_boolean_mask_after_a_slice_selects():
    x = torch.randn(2, 3, 5, 5)
    mask = torch.eye(5, dtype=torch.bool)
    mask[0, 3] = True
    with without("boolean_mask_to_indices", "boolean_mask_indexing") as gap:
        if gap:
            with pytest.raises(IndexError, match="shape mismatch"):
                tpu(x)[:, :, tpu(mask)]
    torch.testing.assert_close(tpu(x)[:, :, tpu(mask)].cpu(), x[:, :, mask], rtol=0, atol=0)
    torch.testing.assert_close(tpu(x)[..., tpu(mask)].cpu(), x[..., mask], rtol=0, atol=0)
    torch.testing.assert_close(tpu(x)[tpu(mask[:2, :3])].cpu(), x[mask[:2, :3]], rtol=0, atol=0)  # leading: as is


def test_linear_interpolation_to_the_same_size():
    x = torch.randn(1, 4, 19)
    aborts_without(
        "interpolate_same_size_is_a_copy",
        "interpolate_same_size",
        'F.interpolate(torch.randn(1, 4, 19, device="tpu"), size=19, mode="linear").cpu()',
    )
    for kwargs in ({"size": 19}, {"scale_factor": 1.0}, {"size": 19, "align_corners": True}, {"size": 23}):
        out = F.interpolate(tpu(x), mode="linear", **kwargs)
        torch.testing.assert_close(out.cpu(), F.interpolate(x, mode="linear", **kwargs))
    assert F.interpolate(tpu(x), size=19, mode="linear").data_ptr() != tpu(x).data_ptr()


def test_record_stream_is_accepted():
    x = torch.ones(4, device="tpu")
    with without("record_stream_noop", "record_stream") as gap:
        if gap:
            with pytest.raises(RuntimeError, match="operator 'aten::record_stream' is not implemented for TPU"):
                x.record_stream(torch.accelerator.current_stream())
    x.record_stream(torch.accelerator.current_stream())


def test_safetensors_loads_onto_the_chip():
    import safetensors.torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    save_file({"w": torch.arange(6.0).reshape(2, 3)}, path)
    with without("safetensors_load_to_tpu", "safetensors_device") as gap:
        if gap:
            with pytest.raises(Exception, match="device tpu is invalid"):
                safetensors.torch.load_file(path, device="tpu")
    for device in ("tpu", "tpu:0"):
        loaded = load_file(path, device=device)["w"]
        assert loaded.device.type == "tpu" and loaded.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    with safe_open(path, framework="pt", device="tpu") as f:
        assert list(f.keys()) == ["w"]
        assert f.get_tensor("w").device.type == "tpu"
        assert f.get_slice("w")[1:].device.type == "tpu"
    with safe_open(path, framework="pt", device="cpu") as f:  # other devices: untouched
        assert f.get_tensor("w").device.type == "cpu"


def test_compiled_graphs_take_cpu_inputs_and_write_them_back():
    def step(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        count.add_(1)  # a CPU counter the graph changes in place
        return x + count.to(x.device)

    with without("compiled_graphs_take_cpu_inputs", "cpu_tensor_into_compiled_graph") as gap:
        if gap:
            torch._dynamo.reset()
            with pytest.raises(RuntimeError, match="failed to prepare compiled mode arguments.*got cpu"):
                torch.compile(step, backend="tpu")(tpu(torch.ones(2)), torch.tensor(5))
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="tpu")
    count = torch.tensor(5)
    assert compiled(tpu(torch.ones(2)), count).cpu().tolist() == [7.0, 7.0] and count.item() == 6
    assert compiled(tpu(torch.ones(2)), count).cpu().tolist() == [8.0, 8.0] and count.item() == 7
    assert count.device.type == "cpu"
