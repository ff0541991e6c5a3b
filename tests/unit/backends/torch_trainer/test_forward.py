from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import find_packed_sequence_indices

from rlpost.algo.steps import validate_sample
from rlpost.backends.torch_trainer.attention import packed_sdpa_attention
from rlpost.backends.torch_trainer.forward import forward_tokens, pack_samples
from rlpost.backends.torch_trainer.model_io import load_causal_lm
from rlpost.types import TrainSample

Samples = Callable[..., list[TrainSample]]


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_pack_samples_layout() -> None:
    samples = [TrainSample([5, 6, 7], 1, 0.0), TrainSample([8, 9, 10, 11], 2, 0.0)]
    packed = pack_samples(samples)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    # Token 7 is predicted at row position 1; tokens 10, 11 at positions 4, 5.
    assert packed.logit_positions.tolist() == [1, 4, 5]
    assert packed.targets.tolist() == [7, 10, 11]
    assert packed.segment_ids.tolist() == [0, 1, 1]
    assert [t.tolist() for t in packed.split(torch.tensor([1.0, 2.0, 3.0]))] == [[1.0], [2.0, 3.0]]


def test_transformers_reads_position_restarts_as_sequence_boundaries() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0]])
    assert find_packed_sequence_indices(positions).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2]]


@pytest.mark.parametrize("attn", ["rlpost_packed_sdpa", "sdpa", "eager"])
def test_packed_forward_equals_one_by_one(
    tiny_model_dir: Path, make_samples: Samples, attn: str
) -> None:
    model = load_causal_lm(tiny_model_dir, attn)
    samples = make_samples(6, seed=1)
    with torch.no_grad():
        packed = pack_samples(samples)
        together = packed.split(forward_tokens(model, packed, 0.7).logp)
        alone = [forward_tokens(model, pack_samples([s]), 0.7).logp for s in samples]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_no_attention_across_packed_samples(tiny_model_dir: Path) -> None:
    model = load_causal_lm(tiny_model_dir)
    second = TrainSample([3, 4, 5, 6], 2, 0.0)
    with torch.no_grad():
        outs = [
            forward_tokens(model, pack_samples([TrainSample(first, 1, 0.0), second]), 1.0).logp[1:]
            for first in ([10, 11, 12], [40, 41, 42, 43, 44, 45])
        ]
    assert torch.allclose(outs[0], outs[1], atol=1e-6)


def test_temperature_divides_logits(tiny_model_dir: Path) -> None:
    model = load_causal_lm(tiny_model_dir)
    packed = pack_samples([TrainSample([3, 4, 5, 6], 3, 0.0)])
    with torch.no_grad():
        logits = model(input_ids=packed.input_ids, use_cache=False).logits[0, :-1] / 0.5
        expected = torch.log_softmax(logits, -1).gather(-1, packed.targets[:, None])[:, 0]
        got = forward_tokens(model, packed, 0.5, entropy="detached")
    assert torch.allclose(got.logp, expected, atol=1e-6)
    probs = torch.softmax(logits, -1)
    assert torch.allclose(got.entropy, -(probs * probs.log()).sum(-1), atol=1e-5)


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        (TrainSample([1, 2, 3], 3, 0.0), "at least one prompt token"),
        (TrainSample([1, 2, 3], 0, 0.0), "at least one prompt token"),
        (TrainSample([1, 2, 3], 2, 0.0, loss_mask=[1]), "loss_mask has 1 entries"),
        (TrainSample([1, 2, 3], 2, 0.0, rollout_logprobs=[0.1]), "rollout_logprobs"),
    ],
)
def test_malformed_samples_are_rejected(sample: TrainSample, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_sample(sample, 0)


def test_packed_attention_matches_a_block_diagonal_mask_with_gqa() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = [3, 7, 1, 5]
    total, dim = sum(lengths), 8
    query = torch.randn(1, 4, total, dim, generator=gen, requires_grad=True)
    key = torch.randn(1, 2, total, dim, generator=gen, requires_grad=True)
    value = torch.randn(1, 2, total, dim, generator=gen, requires_grad=True)
    cu = torch.tensor([0, 3, 10, 11, 16])
    out, _ = packed_sdpa_attention(nn.Module(), query, key, value, None, cu_seq_lens_q=cu)
    segment = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))
    pos = torch.arange(total)
    mask = (segment[:, None] == segment[None, :]) & (pos[:, None] >= pos[None, :])
    dense = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    assert out.shape == (1, total, 4, dim)
    assert torch.allclose(out, dense, atol=1e-6)
    weights = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * weights).sum(), (query, key, value))
    dense_grads = torch.autograd.grad((dense * weights).sum(), (query, key, value))
    for a, b in zip(grads, dense_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
