"""Gap ``multinomial_seeding``: ``torch.multinomial`` on tpu draws from the seeded generator.

TorchTPU's multinomial ignores the seed (and ``generator=``) while ``torch.rand`` honours it, so the
kernel here is built from ``torch.rand``: inverse-CDF sampling with replacement, and the exponential
race (the k largest ``p_i / E_i``, ``E_i ~ Exp(1)``) without replacement, which is how PyTorch's own
CPU kernel samples. Results are reproducible for a seed; they are not the CPU's stream.
"""

from __future__ import annotations

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Kernels

_kernels = Kernels()


def seeded_multinomial(
    probs: torch.Tensor, num_samples: int, replacement: bool = False, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    if probs.dim() not in (1, 2):
        raise RuntimeError(f"prob_dist must be 1 or 2 dim, got {probs.dim()}")
    categories = probs.shape[-1]
    if num_samples <= 0:
        raise RuntimeError(f"cannot sample n_sample <= 0 samples, got {num_samples}")
    if not replacement and num_samples > categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    p = probs.float()
    invalid = ((p < 0) | ~p.isfinite()).any() | (p.sum(-1) <= 0).any()
    too_few = ((p > 0).sum(-1) < num_samples).any() if not replacement else torch.zeros((), dtype=torch.bool)
    if bool(invalid | too_few.to(invalid.device)):  # one sync, as PyTorch's own checks
        if bool(invalid):
            raise RuntimeError(
                "invalid multinomial distribution (sum of probabilities <= 0, or an entry < 0, inf or nan)"
            )
        raise RuntimeError(
            "invalid multinomial distribution (with replacement=False, not enough non-negative category to sample)"
        )
    batch = p.shape[:-1]
    if replacement:
        cdf = p.cumsum(-1)
        u = torch.rand(*batch, num_samples, generator=generator, device=p.device) * cdf[..., -1:]
        return torch.searchsorted(cdf, u, right=True).clamp_(max=categories - 1)
    u = torch.rand(p.shape, generator=generator, device=p.device)
    keys = p / -torch.log(u)  # zero probability -> key 0, never among the top k (checked above)
    return keys.topk(num_samples, dim=-1).indices


def apply() -> None:
    _kernels.register({"multinomial": seeded_multinomial})


def revert() -> None:
    _kernels.remove()


WORKAROUNDS = (
    Fix.workaround(
        "seeded_multinomial", "multinomial_seeding", "aten::multinomial (tpu kernel)", __doc__, apply, revert
    ),
)
