"""References for the node's own decoder: transformers' greedy `generate`, and teacher-forced
logits from LlamaDecoder beside the model's own forward pass."""

import torch

from sapo.training.decoder.decoding import LlamaDecoder, _StaticDecoding


def hf_greedy(model, tokenizer, prompts, max_new_tokens):
    """transformers' greedy continuation of each left-padded prompt, EOS and padding dropped."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    return [[t for t in row.tolist() if t not in special] for row in out[:, enc["input_ids"].shape[1] :]]


def teacher_forced_logits(model, tokenizer, prompts, continuation, dtype=torch.float32):
    """LlamaDecoder's logits for `continuation` [rows, n] after the left-padded prompts, and the
    model's own forward pass over the same full sequences: both [rows, n, vocab]."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, attention = enc["input_ids"], enc["attention_mask"]
    with torch.inference_mode():
        decoding = _StaticDecoding(LlamaDecoder.of(model, dtype), ids, attention, 1, continuation.shape[1])
        ours = [decoding.first_logits]
        for column in continuation.T[:-1]:
            ours.append(decoding.step(column))
        full = torch.cat([ids, continuation], 1)
        full_attention = torch.cat([attention, torch.ones_like(continuation)], 1)
        positions = (full_attention.cumsum(-1) - 1).clamp_min(0)
        reference = model(input_ids=full, attention_mask=full_attention, position_ids=positions).logits
    return torch.stack(ours, 1), reference[:, ids.shape[1] - 1 : -1].float()
