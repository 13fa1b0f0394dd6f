"""The node's own decoding loop against transformers' `generate` and forward pass, and against the
softmax it samples."""

import threading

import pytest
import torch

from sapo.training.decoder.decoding import (
    GenerationInterrupted,
    LlamaDecoder,
    _StaticDecoding,
    decode_samples,
    sample_tokens,
)
from sapo.training.models.policy import LoraOptions, _wrap_lora
from sapo.training.models.tiny import build_tiny
from tests.support.decoding import hf_greedy, teacher_forced_logits

PROMPTS = [
    "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 17 - 5? Think, then answer in tags.<|im_end|>\n<|im_start|>assistant\n",
]
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # A node's setting. With a thread per core on a machine whose cores other jobs also use, every
    # small op waits for a descheduled OpenMP worker: these tests ran 10-30x slower that way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    # A few random steps off the seeded init, so greedy paths differ between prompts and positions.
    model, tokenizer = build_tiny("tiny", 3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    return model, tokenizer


def test_greedy_matches_generate_with_left_padding(tiny):
    model, tokenizer = tiny
    ours = decode_samples(
        model, tokenizer, PROMPTS, samples_per_prompt=1, max_new_tokens=24, temperature=None, seed=0, device=CPU
    )
    assert ours.token_ids == hf_greedy(model, tokenizer, PROMPTS, 24)
    assert len(set(map(tuple, ours.token_ids))) == 2  # the two prompts really lead to different text
    alone = [
        decode_samples(
            model, tokenizer, [p], samples_per_prompt=1, max_new_tokens=24, temperature=None, seed=0, device=CPU
        ).token_ids[0]
        for p in PROMPTS
    ]
    assert alone == ours.token_ids


def test_shared_prefill_repeats_each_prompt_for_its_samples(tiny):
    model, tokenizer = tiny
    greedy = decode_samples(
        model, tokenizer, PROMPTS, samples_per_prompt=1, max_new_tokens=16, temperature=None, seed=0, device=CPU
    ).token_ids
    cold = decode_samples(
        model, tokenizer, PROMPTS, samples_per_prompt=3, max_new_tokens=16, temperature=1e-4, seed=0, device=CPU
    ).token_ids
    assert cold == [greedy[0]] * 3 + [greedy[1]] * 3


def test_first_token_frequencies_follow_the_tempered_softmax(tiny):
    model, tokenizer = tiny
    temperature, draws = 2.0, 4000
    ids = tokenizer([PROMPTS[0]], return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0, -1] / temperature, -1)
    out = decode_samples(
        model,
        tokenizer,
        [PROMPTS[0]],
        samples_per_prompt=draws,
        max_new_tokens=1,
        temperature=temperature,
        seed=1,
        device=CPU,
    )
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
        decode_samples(
            model,
            tokenizer,
            PROMPTS,
            samples_per_prompt=2,
            max_new_tokens=8,
            temperature=1.0,
            seed=0,
            device=CPU,
            stop=event,
        )


# --- the sampler ---------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampler_draws_from_the_tempered_softmax(temperature):
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, float("-inf"), 3.0, -2.0])
    draws = 40_000
    chosen = sample_tokens(logits.expand(draws, -1), temperature, torch.Generator().manual_seed(7))
    assert chosen.shape == (draws,) and chosen.dtype == torch.long
    frequencies = torch.bincount(chosen, minlength=len(logits)).double() / draws
    expected = torch.softmax(logits.double() / temperature, -1)
    assert frequencies[5] == 0  # a -inf logit is never drawn
    # 5 binomial standard errors per token, and a chi-square far inside its 99.9 % bound (7 dof: 24.3)
    assert ((frequencies - expected).abs() <= 5 * (expected * (1 - expected) / draws).sqrt() + 1e-12).all()
    live = expected > 0
    chi2 = (draws * (frequencies[live] - expected[live]) ** 2 / expected[live]).sum()
    assert chi2 < 24.3


def test_sampler_keeps_a_long_vocabularys_tail():
    # SmolLM2-sized: one token holds half the mass, 49,151 others share the rest. A float32 running
    # sum would round the tail's tiny steps; the float64 one keeps them.
    vocab, draws = 49_152, 4_000
    logits = torch.zeros(vocab)
    logits[123] = torch.tensor(vocab - 1.0).log()
    generator = torch.Generator().manual_seed(3)
    chosen = torch.cat([sample_tokens(logits.expand(500, -1), 1.0, generator) for _ in range(draws // 500)])
    top = (chosen == 123).double().mean()
    assert abs(top - 0.5) < 5 * (0.25 / draws) ** 0.5
    tail = chosen[chosen != 123]
    assert len(set(tail.tolist())) > 0.9 * len(tail) * (1 - len(tail) / (2 * vocab))  # spread over the whole tail
    assert tail.min() < vocab // 10 and tail.max() > vocab - vocab // 10


def test_sampler_is_greedy_without_temperature_and_repeatable_with_a_seed():
    logits = torch.randn(64, 100)
    assert torch.equal(sample_tokens(logits, None, torch.Generator()), logits.argmax(-1))
    first = sample_tokens(logits, 1.0, torch.Generator().manual_seed(11))
    assert torch.equal(first, sample_tokens(logits, 1.0, torch.Generator().manual_seed(11)))
    assert not torch.equal(first, sample_tokens(logits, 1.0, torch.Generator().manual_seed(12)))


# --- the static-cache decoder against the model's own forward --------------------------------------


def continuation_for(tokenizer, rows, n, seed=0):
    return torch.randint(4, len(tokenizer), (rows, n), generator=torch.Generator().manual_seed(seed))


def test_static_decoder_computes_the_models_forward(tiny):
    model, tokenizer = tiny
    # 40 steps: the rows' own part of the cache grows twice (16 -> 32 -> 40 columns) on the way
    ours, reference = teacher_forced_logits(model, tokenizer, PROMPTS, continuation_for(tokenizer, 2, 40))
    assert LlamaDecoder.unsupported(model) is None
    assert (ours - reference).abs().max() < 1e-4 * reference.abs().max()


def test_static_decoder_folds_in_a_lora_adapter(tiny):
    base, tokenizer = build_tiny("tiny", 3)
    model = _wrap_lora(base, LoraOptions(rank=4, alpha=8), None)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # B starts at zero; make the adapter change the outputs
    continuation = continuation_for(tokenizer, 2, 8)
    ours, reference = teacher_forced_logits(model, tokenizer, PROMPTS, continuation)
    with model.disable_adapter():
        _, without = teacher_forced_logits(model, tokenizer, PROMPTS, continuation)
    assert (reference - without).abs().max() > 0.05  # the adapter matters here
    assert (ours - reference).abs().max() < 1e-4 * reference.abs().max()


def test_static_decoder_handles_qwen2_biases(tiny):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = tiny
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1 and p.shape[0] != 64:  # the q/k/v biases (norm weights are 64 wide)
                p.normal_(0, 0.5)
    ours, reference = teacher_forced_logits(model, tokenizer, PROMPTS, continuation_for(tokenizer, 2, 8))
    assert (ours - reference).abs().max() < 1e-4 * reference.abs().max()


def test_bf16_decoder_stays_close_to_fp32(tiny):
    model, tokenizer = tiny
    continuation = continuation_for(tokenizer, 2, 12)
    low, reference = teacher_forced_logits(model, tokenizer, PROMPTS, continuation, dtype=torch.bfloat16)
    assert low.dtype == torch.float32
    # bf16 keeps about 3 significant digits; the softmax of each position barely moves
    assert (low - reference).abs().max() < 0.05 * reference.abs().max()
    p, q = torch.softmax(reference, -1), torch.softmax(low, -1)
    assert (p - q).abs().sum(-1).max() / 2 < 0.03  # total variation per position


def test_a_model_outside_the_llama_family_decodes_through_its_forward(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tokenizer = tiny
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).eval()
    assert "gpt2" in LlamaDecoder.unsupported(model)
    ours = decode_samples(
        model, tokenizer, PROMPTS, samples_per_prompt=1, max_new_tokens=12, temperature=None, seed=0, device=CPU
    )
    assert ours.token_ids == hf_greedy(model, tokenizer, PROMPTS, 12)


def test_rows_that_leave_do_not_disturb_the_rest(tiny):
    model, tokenizer = tiny
    alone = [
        decode_samples(
            model, tokenizer, [p], samples_per_prompt=1, max_new_tokens=20, temperature=None, seed=0, device=CPU
        ).token_ids[0]
        for p in PROMPTS
    ]
    # Row 0 stops after its first n tokens (the stop text, which row 1 never writes), so the cache
    # drops it after step n; row 1 goes on alone.
    n = next(n for n in range(1, 8) if tokenizer.decode(alone[0][:n]) not in tokenizer.decode(alone[1]))
    out = decode_samples(
        model,
        tokenizer,
        PROMPTS,
        samples_per_prompt=1,
        max_new_tokens=20,
        temperature=None,
        seed=0,
        device=CPU,
        stop_text=tokenizer.decode(alone[0][:n]),
    )
    assert out.token_ids == [alone[0][:n], alone[1]] and n < len(alone[1])


def test_shared_prompt_attention_is_exact_for_one_prompt(tiny):
    model, tokenizer = tiny
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS[:1], return_tensors="pt", add_special_tokens=False)
    continuation = continuation_for(tokenizer, 2, 6, seed=5)
    with torch.inference_mode():
        decoding = _StaticDecoding(LlamaDecoder.of(model, torch.float32), enc["input_ids"], enc["attention_mask"], 2, 6)
        ours = torch.stack([decoding.first_logits] + [decoding.step(column) for column in continuation.T[:-1]], 1)
        reference = model(input_ids=torch.cat([enc["input_ids"].expand(2, -1), continuation], 1)).logits
    reference = reference[:, enc["input_ids"].shape[1] - 1 : -1]
    assert (ours - reference).abs().max() < 1e-4 * reference.abs().max()


def test_shared_prompt_attention_is_exact_as_rows_leave(tiny):
    # Three samples per prompt share each prompt's keys; rows leave at steps 3 and 17 (as stops
    # make them; the own part of the cache has grown from 16 columns by then), and every row's
    # logits must still be the model's own for its sequence.
    model, tokenizer = tiny
    samples, steps = 3, 20
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, attention = enc["input_ids"], enc["attention_mask"]
    continuation = continuation_for(tokenizer, len(PROMPTS) * samples, steps, seed=4)
    live = list(range(len(PROMPTS) * samples))
    with torch.inference_mode():
        decoding = _StaticDecoding(LlamaDecoder.of(model, torch.float32), ids, attention, samples, steps)
        ours = {row: [decoding.first_logits[row]] for row in live}
        for step in range(steps - 1):
            if step in (3, 17):
                keep = [p for p, row in enumerate(live) if row not in ({1, 4} if step == 3 else {0, 5})]
                decoding.keep(torch.tensor(keep))
                live = [live[p] for p in keep]
            logits = decoding.step(continuation[live, step])
            for position, row in enumerate(live):
                ours[row].append(logits[position])
        full = torch.cat([ids.repeat_interleave(samples, 0), continuation], 1)
        full_attention = torch.cat([attention.repeat_interleave(samples, 0), torch.ones_like(continuation)], 1)
        positions = (full_attention.cumsum(-1) - 1).clamp_min(0)
        reference = model(input_ids=full, attention_mask=full_attention, position_ids=positions).logits
    reference = reference[:, ids.shape[1] - 1 : -1]
    assert live == [2, 3]  # what is left after both drops
    for row, logits in ours.items():
        got = torch.stack(logits)
        assert len(got) == (4 if row in (1, 4) else 18 if row in (0, 5) else steps)
        assert (got - reference[row, : len(got)]).abs().max() < 1e-4 * reference.abs().max(), row
