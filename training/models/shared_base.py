"""Several nodes on one base model: one frozen copy of the base weights in memory, one LoRA adapter
per node on it, each node with its own optimizer and checkpoint.

`SharedLoraBase` loads the base once and wraps it in one PEFT model holding every node's adapter.
`AdapterView` is what a node's `Policy.model` is then: a module whose forward passes run with its
own adapter active, whose parameters are that adapter's alone, and which saves (and resumes) as a
plain single-adapter checkpoint, interchangeable with a `--lora` node's own. Generation for all
of them can run as one batch through the base weights (decoding.decode_mixed).

The adapters are switched, not stacked: a forward pass runs one adapter, so the nodes' updates
take turns, as they do under the study's torch lock anyway.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sapo.training.decoder.packed_forward import fits
from sapo.training.models.devices import resolve_device
from sapo.training.models.policy import LoraOptions, Policy, _load_base, use_bf16, use_bf16_generation
from sapo.training.models.sources import is_tiny
from sapo.training.problems.prompts import PromptStyle, prompt_style_for

if TYPE_CHECKING:
    from peft import PeftModel


def adapter_name(index: int) -> str:
    return f"node{index}"


class AdapterView(torch.nn.Module):
    """One node's adapter on a shared PEFT model, as the node's own model."""

    shared: PeftModel  # set through __dict__ in __init__, so that it is no submodule

    def __init__(self, shared: PeftModel, name: str):
        super().__init__()
        # Not a submodule: `parameters()` (the optimizer's, the gradient clip's) must be this
        # node's adapter only, never the base or the other nodes' adapters.
        self.__dict__["shared"] = shared
        self.name = name
        self.config = shared.config
        self._own = [p for n, p in shared.named_parameters() if f".{name}." in n]
        if not self._own:
            raise ValueError(f"the shared model has no adapter {name!r}")
        for parameter in self._own:
            parameter.requires_grad_(True)

    def activate(self):
        """The shared model with this adapter active. PEFT also freezes the other adapters;
        they are made trainable again, so that each node's optimizer and gradient clip see its
        parameters as trainable whichever node ran last (an inactive adapter takes no part in a
        forward pass, so it gets no gradient)."""
        if self.shared.active_adapter != self.name:
            self.shared.set_adapter(self.name)
            for parameter_name, parameter in self.shared.named_parameters():
                if not parameter.requires_grad and ".lora_" in parameter_name:  # an adapter's, never the base's
                    parameter.requires_grad_(True)
        return self.shared

    def forward(self, *args, **kwargs):
        return self.activate()(*args, **kwargs)

    def get_base_model(self):
        """The base model, with this adapter active in its LoRA layers (what LlamaDecoder reads)."""
        return self.activate().get_base_model()

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, parameter in self.shared.named_parameters():
            if f".{self.name}." in name:
                yield prefix + name, parameter

    def parameters(self, recurse: bool = True):
        yield from self._own

    def train(self, mode: bool = True):
        self.training = mode
        self.shared.train(mode)
        return self

    def save_pretrained(self, path: Path) -> None:
        """This adapter alone, as PEFT saves a model's only adapter (`PeftModel.from_pretrained` loads it)."""
        path = Path(path)
        with tempfile.TemporaryDirectory(dir=path.parent if path.parent.exists() else None) as scratch:
            self.shared.save_pretrained(scratch, selected_adapters=[self.name])
            saved = Path(scratch) / self.name  # PEFT puts a non-default adapter in a folder of its name
            path.mkdir(parents=True, exist_ok=True)
            for item in saved.iterdir():
                shutil.move(str(item), path / item.name)


class SharedLoraBase:
    """One base model, `nodes` LoRA adapters on it; `policy(k)` is node k's Policy."""

    def __init__(
        self,
        source: str,
        nodes: int,
        *,
        lora: LoraOptions,
        seeds: list[int],
        models_dir: Path,
        device: str = "auto",
        prompt_style: str = "auto",
        one_shot: bool = True,
        precision: str = "auto",
        generation_precision: str = "auto",
        adapters_from: list[Path | None] | None = None,
    ):
        from peft import LoraConfig, get_peft_model

        if len(seeds) != nodes:
            raise ValueError(f"one seed per node: {nodes} nodes, {len(seeds)} seeds")
        self.device = resolve_device(device)
        torch.manual_seed(seeds[0])
        base, self.tokenizer = _load_base(source, seed=seeds[0], models_dir=models_dir, weights_from=None)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        adapters_from = adapters_from or [None] * nodes
        model = None
        for k in range(nodes):
            torch.manual_seed(seeds[k])  # each node's adapter initialised from its own seed, as alone
            if model is None:
                model = get_peft_model(base, config, adapter_name=adapter_name(k))
            else:
                model.add_adapter(adapter_name(k), config)
            if adapters_from[k] is not None:
                model.load_adapter(str(adapters_from[k]), adapter_name=adapter_name(k), is_trainable=True)
        assert model is not None  # nodes >= 1: with none, seeds[0] above has already raised
        self.model = model
        self.model.to(self.device)
        self.source = source
        self.style: PromptStyle = prompt_style_for(prompt_style, is_tiny(source))
        self.one_shot = one_shot
        self.bf16 = use_bf16(precision, self.device, packed=fits(self.model))
        self.generation_bf16 = use_bf16_generation(generation_precision, self.device)
        self.views = [AdapterView(self.model, adapter_name(k)) for k in range(nodes)]

    def policy(self, index: int) -> Policy:
        return Policy(
            self.views[index],
            self.tokenizer,
            self.device,
            self.source,
            self.style,
            self.one_shot,
            True,
            self.bf16,
            self.generation_bf16,
        )
