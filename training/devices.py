"""Choosing the torch device a node trains on."""

from __future__ import annotations

import torch

_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def available_devices() -> list[str]:
    """The device names this machine can run on, e.g. ["cuda:0", "cuda:1", "cpu"]."""
    names = []
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        names.append("mps")
    names.append("cpu")
    return names


def resolve_device(name: str) -> torch.device:
    """Turn a device setting into a usable torch.device.

    "auto" picks the first CUDA GPU, then Apple MPS, then the CPU. An explicit name is checked
    against this machine, so a typo or a missing GPU fails at startup instead of mid-round.
    A bare "cuda" or "mps" means index 0, so devices compare equal to a parameter's `.device`.
    """
    text = name.strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", 0)
        if _mps_available():
            return torch.device("mps", 0)
        return torch.device("cpu")

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {name!r}; choose {_CHOICES}") from None

    available = ", ".join(available_devices())
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} asked for CUDA, which is not available here; "
                f"available: {available}"
            )
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"available: {available}"
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        if not _mps_available():
            raise ValueError(
                f"device {name!r} asked for Apple MPS, which is not available here; "
                f"available: {available}"
            )
        if device.index not in (None, 0):
            raise ValueError(f"device {name!r}: MPS has only index 0; available: {available}")
        return torch.device("mps", 0)
    raise ValueError(f"unsupported device {name!r}; choose {_CHOICES}")
