"""``torch.tpu.optimizers``: TorchTPU's functional optimizers and SingleTraceTrainer on the emulated TPU.

Each update rule is checked against torch.optim's (the rule TorchTPU's optimizers wrap) at precision "highest",
where float32 matmuls are exact, so the comparison can be tight; constructors are compared with the real wheel's
by tests/contract.
"""

from __future__ import annotations

import pytest
import torch

import hf_tpu
from hf_tpu.gaps.status import present

pytestmark = pytest.mark.filterwarnings("ignore:<TorchTpu/ApiStage/ExperimentalApi/>")


@pytest.fixture(autouse=True)
def highest():
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        yield


def _run(ours, reference, steps: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    cpu = torch.nn.Linear(6, 4, bias=False)
    tpu = torch.nn.Linear(6, 4, bias=False).to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    group, ref = ours.init_param_group(tpu), reference(cpu.parameters())
    for _ in range(steps):
        x = torch.randn(5, 6)
        cpu(x).square().mean().backward()
        ref.step()
        ref.zero_grad()
        batch = x.to("tpu")
        grads = torch.func.grad(lambda p, b=batch: torch.func.functional_call(tpu, p, (b,)).square().mean())
        group = ours.step(group, grads(group.params))
    return group.params["weight"].cpu(), cpu.weight.detach()


def test_adamw_and_sgd_follow_torch_optim():
    opt = torch.tpu.optimizers
    got, want = _run(opt.AdamW(lr=1e-2, use_bfloat16_moments=False), lambda p: torch.optim.AdamW(p, lr=1e-2))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    if present("adamw_bfloat16_moments")[0]:  # bf16 moments (the default) on float32 parameters: TorchTPU fails
        with pytest.raises(RuntimeError, match=r"expected dtype c10::BFloat16 for `end` but got dtype float"):
            _run(opt.AdamW(lr=1e-2), lambda p: torch.optim.AdamW(p, lr=1e-2))
    sgd = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    got, want = _run(opt.Sgd(**sgd), lambda p: torch.optim.SGD(p, **sgd))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_muon_follows_torch_optim():
    got, want = _run(torch.tpu.optimizers.Muon(lr=1e-2), lambda p: torch.optim.Muon(p, lr=1e-2))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-3)  # Newton-Schulz runs in bfloat16 in both


def test_hyperparameters_are_fixed_and_read_only():
    adamw = torch.tpu.optimizers.AdamW(lr=3e-4)
    assert adamw.defaults["lr"] == 3e-4 and adamw.defaults["use_bfloat16_moments"] is True
    with pytest.raises(TypeError):
        adamw.defaults["lr"] = 1.0
    group = adamw.init_param_group({"w": torch.zeros(2, 2, device="tpu")})
    assert group.opt_state_m["w"].dtype == torch.bfloat16 and float(group.opt_steps["w"]) == 0.0


def test_single_trace_trainer_compiles_one_graph_and_trains_like_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    x, ref_opt = torch.randn(16, 4), torch.optim.SGD(reference.parameters(), lr=0.1)
    y = x.sum(1, keepdim=True)
    # fused=False: TorchTPU's default fused SGD is an in-place op that a torch.compile'd trace cannot functionalize
    trainer = torch.tpu.optimizers.SingleTraceTrainer(
        model,
        torch.tpu.optimizers.Sgd(lr=0.1, fused=False),
        compile_fn=lambda gm, inputs: torch.compile(gm, backend="tpu"),
    )
    with hf_tpu.watch_compiles() as report:
        step = trainer.make_compiled_train_step(x.to("tpu"), y.to("tpu"))
        losses = [float(step(x.to("tpu"), y.to("tpu"))) for _ in range(4)]
    want = []
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(reference(x), y)  # with targets, the loss is their MSE
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(float(loss))
    torch.testing.assert_close(losses, want, rtol=1e-5, atol=0)
    assert report.count() == 1 and not report.recompiles  # forward, backward and update: one graph
    torch.testing.assert_close(model[0].weight.cpu(), reference[0].weight.detach(), rtol=0, atol=1e-5)


def test_single_trace_trainer_without_optimizer_leaves_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("tpu")
    x = torch.randn(4, 3, device="tpu")
    trainer = torch.tpu.optimizers.SingleTraceTrainer(model, compile_fn=lambda gm: gm)  # one-argument compile_fn
    loss = trainer.make_compiled_train_step(x)(x)  # no targets: the mean of the output
    model.zero_grad(set_to_none=True)
    model(x).mean().backward()
    expected = model.weight.grad.clone()
    model.zero_grad()
    trainer.make_compiled_train_step(x)(x)
    torch.testing.assert_close(model.weight.grad.cpu(), expected.cpu())
    assert loss.shape == ()
