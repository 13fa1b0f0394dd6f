from sapo.training.models.tiny import build_tiny
from sapo.training.problems.prompts import render_prompt
from sapo.training.problems.tasks import TaskSampler, default_task_specs


def test_chat_prompt_carries_system_one_shot_and_question():
    _, tokenizer = build_tiny("tiny", 0)
    problem = TaskSampler(default_task_specs(["basic_arithmetic"]), 0, 0).sample(1)[0]
    with_example = render_prompt(problem, tokenizer, "chat", one_shot=True)
    without = render_prompt(problem, tokenizer, "chat", one_shot=False)
    assert "<answer>" in with_example and "<answer>7</answer>" in with_example
    assert "<answer>7</answer>" not in without
    assert with_example.rstrip().endswith("assistant") and problem.question in with_example
    assert render_prompt(problem, tokenizer, "plain", one_shot=True) == problem.question + "\n"
