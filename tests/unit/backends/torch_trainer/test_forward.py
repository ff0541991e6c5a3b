from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import find_packed_sequence_indices

from rlpost.algo.steps import validate_sample
from rlpost.backends.torch_trainer.attention import ROWS_KWARG, SampleRows, packed_sdpa_attention
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
    assert [g.tolist() for g in packed.rows.groups] == [[[0, 1, 2, 0], [3, 4, 5, 6]]]
    assert packed.rows.owner.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert not packed.shared


def test_pack_samples_shares_a_prompt_once_per_row() -> None:
    samples = [
        TrainSample([1, 2, 3, 7], 1, 0.0),
        TrainSample([4, 5, 6], 1, 0.0),
        TrainSample([1, 2, 3, 8, 9], 2, 0.0),
    ]
    packed = pack_samples(samples, share_prompts=True)
    assert packed.shared
    assert packed.input_ids.tolist() == [[1, 2, 3, 7, 4, 5, 6, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4]]
    # The third sample's response is predicted from the shared prompt's last token (row 2),
    # then from its own first response token (row 7).
    assert packed.logit_positions.tolist() == [2, 5, 2, 7]
    assert packed.targets.tolist() == [7, 6, 8, 9]
    assert packed.segment_ids.tolist() == [0, 1, 2, 2]
    assert [g.tolist() for g in packed.rows.groups] == [
        [[0, 1, 2, 3, 0], [4, 5, 6, 0, 0], [0, 1, 2, 7, 8]]
    ]
    # Row positions 0-3 from the first sample, 4-6 from the second, 7-8 from the third.
    assert packed.rows.owner.tolist() == [0, 1, 2, 3, 5, 6, 7, 13, 14]
    unshared = pack_samples(samples, share_prompts=False)
    assert unshared.num_tokens == 12 and not unshared.shared


def test_shared_prompts_give_the_same_logprobs_entropy_and_grads(
    tiny_model_dir: Path, make_groups: Samples
) -> None:
    model = load_causal_lm(tiny_model_dir)
    samples = make_groups(3, 4, seed=2)
    gen = torch.Generator().manual_seed(0)
    results = []
    for share in (False, True):
        packed = pack_samples(samples, share_prompts=share)
        assert packed.shared == share
        out = forward_tokens(model, packed, 0.7, entropy="grad")
        weights = torch.randn(out.logp.shape, generator=gen.manual_seed(0))
        loss = (out.logp * weights).sum() + out.entropy.sum()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append((out.logp.detach(), out.entropy.detach(), grads))
    (logp, entropy, grads), (shared_logp, shared_entropy, shared_grads) = results
    assert torch.allclose(logp, shared_logp, atol=1e-5), (logp - shared_logp).abs().max()
    assert torch.allclose(entropy, shared_entropy, atol=1e-5)
    for a, b in zip(grads, shared_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    with torch.no_grad():
        alone = [forward_tokens(model, pack_samples([s]), 0.7).logp for s in samples]
    assert torch.allclose(torch.cat(alone), shared_logp, atol=1e-5)


def test_a_shared_row_is_refused_by_transformers_attention(
    tiny_model_dir: Path, make_groups: Samples
) -> None:
    model = load_causal_lm(tiny_model_dir, "sdpa")
    packed = pack_samples(make_groups(1, 2, seed=0), share_prompts=True)
    with pytest.raises(ValueError, match="needs the 'rlpost_packed_sdpa' attention"):
        forward_tokens(model, packed, 1.0)


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


@pytest.mark.parametrize("heads_first", [True, False], ids=["bhsd", "bshd-view"])
def test_packed_attention_matches_a_block_diagonal_mask_with_gqa(
    heads_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against one masked SDPA call over the row, for query, key and value laid out heads first
    or (as transformers' attention gets them) as views of [1, T, H, D]; every SDPA call of the
    packed attention gets its inputs in the BSHD layout, which SDPA's kernels (and cuDNN's
    ragged plans, rlpost.backends.sdpa) work in without a copy."""
    from rlpost.backends import sdpa

    gen = torch.Generator().manual_seed(0)
    lengths = [3, 7, 1, 5]
    total, dim = sum(lengths), 8

    def made(heads: int) -> torch.Tensor:
        if heads_first:
            return torch.randn(1, heads, total, dim, generator=gen).requires_grad_()
        return torch.randn(1, total, heads, dim, generator=gen).transpose(1, 2).requires_grad_()

    query, key, value = made(4), made(2), made(2)
    layouts: list[bool] = []
    attend = F.scaled_dot_product_attention

    def recorded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> Any:
        layouts.append(sdpa.is_bshd(q, k, v))
        return attend(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    segment = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))
    starts = [sum(lengths[:s]) for s in range(4)]
    rows = SampleRows.of(
        [range(start, start + n) for start, n in zip(starts, lengths, strict=True)],
        [(int(s), t - starts[s]) for t, s in enumerate(segment.tolist())],
    )
    out, _ = packed_sdpa_attention(nn.Module(), query, key, value, None, **{ROWS_KWARG: rows})
    monkeypatch.undo()
    assert layouts and all(layouts)
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


def save_tiny_phi3(path: Path) -> Path:
    """Phi-3's fused QKV and gate-up projections, random weights."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    config = Phi3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )
    Phi3ForCausalLM(config).save_pretrained(path)
    return path


def save_tiny_gemma(path: Path) -> Path:
    """Gemma's GeGLU, scaled embeddings and (1 + weight) norms, random weights."""
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    config = GemmaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )
    GemmaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["mistral", "phi3", "gemma"])
def test_models_megatron_does_not_express_pack_and_share_prompts_exactly(
    family: str, tiny_mistral_dir: Path, tmp_path: Path, make_groups: Samples
) -> None:
    """The packed attention is registered with transformers, so any causal LM that reads the
    attention interface trains packed, prompts shared, equal to one sample at a time."""
    folders = {"phi3": save_tiny_phi3, "gemma": save_tiny_gemma}
    folder = tiny_mistral_dir if family == "mistral" else folders[family](tmp_path / family)
    model = load_causal_lm(folder)
    samples = make_groups(3, 3, seed=4)
    with torch.no_grad():
        shared = forward_tokens(model, pack_samples(samples, share_prompts=True), 0.7).logp
        alone = [forward_tokens(model, pack_samples([s]), 0.7).logp for s in samples]
    assert torch.allclose(torch.cat(alone), shared, atol=1e-5), (
        (torch.cat(alone) - shared).abs().max()
    )
