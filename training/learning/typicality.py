"""How surprising a completion's words are to this node's own policy, beyond what sampling from
it would give: the measurement behind the screen of peers' completions (sampling/screen.py).

For each token x_t of a completion, given everything before it, the policy's surprise is
-log p(x_t) and its expected surprise, had it sampled the token itself, is the entropy H_t of its
next-token distribution. Their difference, the excess surprise z_t = -log p(x_t) - H_t, has mean 0
over the policy's own samples (at temperature 1) whatever the model, the task or how far training
has gone, and is large where a text says what this policy would not: an injected phrase, working
that this policy would not write. So z is comparable across rounds of a drifting policy, which
raw likelihood is not.

The answer itself (the content of the last `<answer>…</answer>`, which the verifier checked) is
left out: a right answer this node does not yet know is exactly what sharing should teach it, and
its tokens are surprising for that good reason. The tags around it count.
"""

from __future__ import annotations

import torch

from sapo.training.learning.update import encode_completion, shared_prompt_logits
from sapo.training.models.policy import Policy
from sapo.training.problems.rewards import answer_span as last_answer_span
from sapo.training.problems.rollouts import QuestionGroup

# Rows per forward pass: the full next-token distribution is kept for every position, so a pass
# holds rows x completion length x vocabulary floats (SmolLM2: 8 x 128 x 49k x 4 B = 200 MB).
ROWS_PER_PASS = 8


def answer_span(text: str) -> tuple[int, int]:
    """Character span of the last answer's content (what the verifier reads); (0, 0) if none."""
    return last_answer_span(text) or (0, 0)


@torch.no_grad()
def excess_surprise(
    policy: Policy, groups: list[QuestionGroup], max_tokens: int, with_entropy: bool = True
) -> list[list[list[float]]]:
    """Per group, per completion, the excess surprise of each of its tokens outside the answer's
    content, in order, as this node's tokenizer encodes it for training (the same truncation and
    end-of-sequence token as the update). `with_entropy=False` gives the plain surprise,
    -log p, for bench/screen_roc.py's comparison."""
    model, tokenizer = policy.model, policy.tokenizer
    model.eval()
    out: list[list[list[float]]] = []
    for group in groups:
        if not group.completions:
            out.append([])
            continue
        prompt = tokenizer(policy.prompt(group.problem), add_special_tokens=False)["input_ids"]
        encoded = tokenizer(group.completions, add_special_tokens=False)["input_ids"]
        rows = []
        for text, ids, answer in zip(group.completions, encoded, answer_tokens(tokenizer, group.completions)):
            ids = encode_completion(tokenizer, text, list(ids), max_tokens)
            rows.append((ids, [i not in answer for i in range(len(ids))]))
        values: list[list[float]] = []
        for first in range(0, len(rows), ROWS_PER_PASS):
            values += _rows_excess(policy, prompt, rows[first : first + ROWS_PER_PASS], with_entropy)
        out.append(values)
    return out


def answer_tokens(tokenizer, texts: list[str]) -> list[range]:
    """Per text, the positions of the tokens that overlap its answer's content: exactly, from a
    fast tokenizer's character offsets; else as the tokens between those of the text before the
    answer and of the text through it (a slow tokenizer has no offsets)."""
    spans = [answer_span(text) for text in texts]
    try:
        offsets = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except (NotImplementedError, ValueError, TypeError):
        count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        return [range(count(t[:a]), count(t[:b])) if b > a else range(0) for t, (a, b) in zip(texts, spans)]
    out = []
    for (start, end), marks in zip(spans, offsets):
        inside = [i for i, (s, e) in enumerate(marks) if s < end and e > start]
        out.append(range(inside[0], inside[-1] + 1) if inside else range(0))
    return out


def _rows_excess(
    policy: Policy, prompt: list[int], rows: list[tuple[list[int], list[bool]]], with_entropy: bool = True
) -> list[list[float]]:
    """One pass over completions of one prompt: the excess surprise of each row's counted tokens.

    The prompt runs once and its keys and values are repeated for every row (as the update's
    shared-prompt pass does): a question's prompt is most of what its short answers are read
    with (SmolLM2's one-shot prompt is about 100 tokens, make run's answers about 20). In fp32,
    as the model's own weights are: bf16 autocast would cast every weight again on every call."""
    width = max((len(ids) for ids, _ in rows), default=0)
    if width == 0:
        return [[] for _ in rows]
    pad = policy.tokenizer.pad_token_id
    completions = torch.tensor([row + [pad] * (width - len(row)) for row, _ in rows], device=policy.device)
    logits = shared_prompt_logits(policy.model, prompt, completions)
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else torch.zeros(logp.shape[:-1], device=logp.device)
    picked = logp.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    excess = (-picked - entropy).tolist()
    return [[z for z, keep in zip(excess[i][: len(row)], counted) if keep] for i, (row, counted) in enumerate(rows)]
