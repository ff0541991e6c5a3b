import math

import pytest
import torch
from torch import nn

from rlpost.algo.schedule import lr_at_step
from rlpost.backends.torch_trainer.optim import build_optimizer
from rlpost.schema import OptimConfig


def test_constant_lr_with_warmup() -> None:
    optim = OptimConfig(lr=1e-3, lr_warmup_steps=4)
    assert [lr_at_step(s, optim) for s in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]
    )


def test_linear_decay_from_the_end_of_warmup_to_min_lr() -> None:
    optim = OptimConfig(
        lr=1.0, min_lr=0.1, lr_decay_style="linear", lr_warmup_steps=2, lr_decay_steps=12
    )
    assert lr_at_step(2, optim) == pytest.approx(1.0)
    assert lr_at_step(7, optim) == pytest.approx(0.55)
    assert lr_at_step(12, optim) == pytest.approx(0.1)
    assert lr_at_step(100, optim) == pytest.approx(0.1)


def test_cosine_decay() -> None:
    optim = OptimConfig(lr=2.0, min_lr=0.0, lr_decay_style="cosine", lr_decay_steps=8)
    assert lr_at_step(0, optim) == pytest.approx(2.0)
    assert lr_at_step(2, optim) == pytest.approx(1.0 + math.cos(math.pi / 4))
    assert lr_at_step(4, optim) == pytest.approx(1.0)
    assert lr_at_step(8, optim) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr_decay_style": "cosine"}, "lr_decay_steps, which is not set"),
        ({"lr_decay_style": "linear", "lr_decay_steps": 5, "lr_warmup_steps": 5}, "must exceed"),
        ({"lr_decay_style": "linear", "lr_decay_steps": 5, "min_lr": 1.0}, "above lr"),
        ({"min_lr": 1e-7}, "has no effect"),
    ],
)
def test_schedules_that_cannot_run_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OptimConfig(**kwargs)


def test_adamw_decays_matrices_but_not_norms_or_biases() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    optim = OptimConfig(lr=0.1, weight_decay=0.5, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6)
    optimizer = build_optimizer(model, optim)
    decayed, exempt = optimizer.param_groups
    assert decayed["weight_decay"] == 0.5 and exempt["weight_decay"] == 0.0
    assert [p.ndim for p in decayed["params"]] == [2]
    assert len(exempt["params"]) == 3
    assert decayed["betas"] == (0.8, 0.95) and decayed["eps"] == 1e-6
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    after = list(model.parameters())
    # Zero gradients: only weight decay moves anything, and only the matrix.
    assert torch.allclose(after[0], before[0] * (1 - 0.1 * 0.5))
    assert all(torch.equal(a, b) for a, b in zip(after[1:], before[1:], strict=True))


def test_the_fused_adamw_steps_as_torchs_reference_adamw() -> None:
    """The trainer's fused kernel against torch's loop-over-parameters AdamW: three steps
    of the same gradients land on the same weights to float32 rounding."""
    torch.manual_seed(0)
    optim = OptimConfig(lr=1e-2, weight_decay=0.1, adam_beta2=0.98, adam_eps=1e-8)
    fused_model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    reference_model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    reference_model.load_state_dict(fused_model.state_dict())
    fused = build_optimizer(fused_model, optim)
    assert all(group["fused"] for group in fused.param_groups)
    decayed = [p for p in reference_model.parameters() if p.ndim >= 2]
    exempt = [p for p in reference_model.parameters() if p.ndim < 2]
    reference = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": 0.1}, {"params": exempt, "weight_decay": 0.0}],
        lr=optim.lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        eps=optim.adam_eps,
        foreach=False,
    )
    for _ in range(3):
        grads = [torch.randn_like(p) for p in fused_model.parameters()]
        for model in (fused_model, reference_model):
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g.clone()
        fused.step()
        reference.step()
    for a, b in zip(fused_model.parameters(), reference_model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
