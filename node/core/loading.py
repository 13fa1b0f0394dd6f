"""Loading a node's policy: from its last checkpoint, from a cached warm start (tiny models,
which know nothing until they are warm-started), or fresh from the model source."""

from __future__ import annotations

from sapo.node.core.settings import NodeSettings
from sapo.training.learning.checkpoints import Checkpoint
from sapo.training.learning.warmstart import WarmStartSettings, cached_warm_start
from sapo.training.models.policy import LoraOptions, Policy, load_policy
from sapo.training.models.sources import is_tiny
from sapo.training.problems.tasks import TaskSpec


def warm_start_settings(settings: NodeSettings) -> WarmStartSettings | None:
    m = settings.model
    steps = m.warm_start_steps if m.warm_start_steps is not None else (200 if is_tiny(m.model) else 0)
    if steps == 0 or m.lora:  # settings refuse an explicit warm start with --lora
        return None
    # A fixed seed, not the node's: the warm start stands in for a pretrained checkpoint, and
    # like the paper's 8 x Qwen2.5 every node of a swarm starts from the same one.
    share, shares = map(int, (m.warm_start_share or "0/1").split("/"))
    return WarmStartSettings(
        steps=steps,
        tag_rate=m.warm_start_tag_rate,
        answer_noise=m.warm_start_answer_noise,
        share=share % shares,
        shares=shares,
    )


def load_node_policy(
    settings: NodeSettings, checkpoint: Checkpoint | None, warm_start_tasks: list[TaskSpec] | None = None
) -> Policy:
    """The node's policy: the checkpoint's weights (or LoRA adapter) if there is one, else the
    warm start's (a specialist warm-starts on `warm_start_tasks`, a subset of what it is asked)."""
    m = settings.model
    models_dir = m.models_dir or settings.run.data_dir / "models"
    warm_start = warm_start_settings(settings)
    weights_from = adapter_from = None
    if checkpoint is not None:
        if m.lora:
            adapter_from = checkpoint.model_dir
        else:
            weights_from = checkpoint.model_dir
    elif warm_start is not None:
        weights_from = cached_warm_start(
            m.model,
            model_seed=warm_start.seed,
            tasks=warm_start_tasks or settings.tasks.specs(),
            settings=warm_start,
            models_dir=models_dir,
            device=m.device,
        )
    return load_policy(
        m.model,
        device=m.device,
        lora=LoraOptions(rank=m.lora_rank, alpha=2 * m.lora_rank) if m.lora else None,
        seed=settings.seed,
        models_dir=models_dir,
        prompt_style=m.prompt_style,
        one_shot=m.one_shot,
        weights_from=weights_from,
        adapter_from=adapter_from,
        precision=m.precision,
        generation_precision=m.generation_precision,
    )
