"""The node's own decoding loop against transformers' `generate` and against the softmax it samples."""

import threading

import pytest
import torch

from sapo.training.decoding import GenerationInterrupted, decode_samples
from sapo.training.tiny import build_tiny

PROMPTS = [
    "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 17 - 5? Think, then answer in tags.<|im_end|>\n<|im_start|>assistant\n",
]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    # A few random steps off the seeded init, so greedy paths differ between prompts and positions.
    model, tokenizer = build_tiny("tiny", 3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    return model, tokenizer


def hf_greedy(model, tokenizer, prompts, max_new_tokens):
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    return [[t for t in row.tolist() if t not in special] for row in out[:, enc["input_ids"].shape[1]:]]


def test_greedy_matches_generate_with_left_padding(tiny):
    model, tokenizer = tiny
    ours = decode_samples(model, tokenizer, PROMPTS, samples_per_prompt=1, max_new_tokens=24,
                          temperature=None, seed=0, device=CPU)
    assert ours.token_ids == hf_greedy(model, tokenizer, PROMPTS, 24)
    assert len(set(map(tuple, ours.token_ids))) == 2  # the two prompts really lead to different text
    alone = [decode_samples(model, tokenizer, [p], samples_per_prompt=1, max_new_tokens=24, temperature=None,
                            seed=0, device=CPU).token_ids[0] for p in PROMPTS]
    assert alone == ours.token_ids


def test_shared_prefill_repeats_each_prompt_for_its_samples(tiny):
    model, tokenizer = tiny
    greedy = decode_samples(model, tokenizer, PROMPTS, samples_per_prompt=1, max_new_tokens=16,
                            temperature=None, seed=0, device=CPU).token_ids
    cold = decode_samples(model, tokenizer, PROMPTS, samples_per_prompt=3, max_new_tokens=16,
                          temperature=1e-4, seed=0, device=CPU).token_ids
    assert cold == [greedy[0]] * 3 + [greedy[1]] * 3


def test_first_token_frequencies_follow_the_tempered_softmax(tiny):
    model, tokenizer = tiny
    temperature, draws = 2.0, 4000
    ids = tokenizer([PROMPTS[0]], return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0, -1] / temperature, -1)
    out = decode_samples(model, tokenizer, [PROMPTS[0]], samples_per_prompt=draws, max_new_tokens=1,
                         temperature=temperature, seed=1, device=CPU)
    counts = torch.zeros_like(probs)
    for row in out.token_ids:
        counts[row[0] if row else tokenizer.eos_token_id] += 1
    top = probs.topk(5).indices
    # binomial standard error at 4000 draws is at most 0.008; allow 4 of them
    assert (counts[top] / draws - probs[top]).abs().max() < 0.032
    assert out.new_tokens == sum(len(r) for r in out.token_ids)


def test_rows_stop_at_the_stop_text_and_leave_the_batch(tiny):
    model, tokenizer = tiny
    kwargs = dict(samples_per_prompt=4, max_new_tokens=40, temperature=1.0, seed=5, device=CPU)
    free = decode_samples(model, tokenizer, PROMPTS, **kwargs)
    # Every row is in the batch for the first step, so row 0 starts the same way with a stop text:
    # make its first character the stop text, and row 0 must end right there.
    stop_text = tokenizer.decode(free.token_ids[0][:1])
    out = decode_samples(model, tokenizer, PROMPTS, stop_text=stop_text, **kwargs)
    assert out.token_ids[0] == free.token_ids[0][:1]
    for row in out.token_ids:
        text = tokenizer.decode(row, skip_special_tokens=True)
        assert stop_text not in text[:-1]  # nobody runs past the stop text
    # the batch stops when its last row does (one more step if that row ended with EOS)
    assert out.steps <= max(len(r) for r in out.token_ids) + 1


def test_a_set_stop_event_interrupts(tiny):
    model, tokenizer = tiny
    event = threading.Event()
    event.set()
    with pytest.raises(GenerationInterrupted):
        decode_samples(model, tokenizer, PROMPTS, samples_per_prompt=2, max_new_tokens=8, temperature=1.0,
                       seed=0, device=CPU, stop=event)
