"""The decode bound is plain arithmetic; check it against numbers worked by hand."""

from __future__ import annotations

import pytest

from bench.bandwidth import DecodeGeometry, copy_bandwidth_gbs, decode_bound_tokens_per_s
from bench.peer_bench.common import force_signal, score


def test_decode_bound_by_hand():
    g = DecodeGeometry(weight_bytes=500_000_000, kv_bytes_per_token=50_000)
    # B=1, no context: one read of 0.5 GB per token at 10 GB/s -> 20 tok/s
    assert decode_bound_tokens_per_s(g, 1, 0, 10.0) == pytest.approx(20.0)
    # B=32 at context 200: 0.5 GB + 32 x 50 kB x 200 = 0.82 GB per step -> 32 / 0.082 s
    assert decode_bound_tokens_per_s(g, 32, 200, 10.0) == pytest.approx(32 / 0.082)


def test_geometry_of_a_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    g = DecodeGeometry.of(model)
    assert g.weight_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert g.kv_bytes_per_token == 2 * 3 * 2 * 16 * 4  # k and v, layers, kv heads, head dim, fp32


def test_copy_bandwidth_is_positive():
    assert copy_bandwidth_gbs(size_mb=8, repeats=1) > 0


def test_peer_scoring_matches_reasoning_gym_default():
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.utils import extract_answer

    for text, oracle in [
        ("so <answer>7</answer>", "7"),
        ("<answer> 7 </answer>", "7"),
        ("<answer>-17</answer>", "7"),
        ("no tag 7", "7"),
        ("<answer>1</answer> <answer>7</answer>", "7"),
        ("<answer></answer>", "7"),
    ]:
        expected = ProceduralDataset.score_answer(None, extract_answer(text), {"answer": oracle})
        assert score(text, oracle) == pytest.approx(expected), text
    assert force_signal([0.0, 0.0, 0.0, 0.0]) == [0.0, 1.0, 0.0, 1.0]
    assert force_signal([0.0, 1.0]) == [0.0, 1.0]
