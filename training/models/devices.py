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
            raise ValueError(f"device {name!r} asked for CUDA, which is not available here; available: {available}")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s); available: {available}"
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        if not _mps_available():
            raise ValueError(
                f"device {name!r} asked for Apple MPS, which is not available here; available: {available}"
            )
        if device.index not in (None, 0):
            raise ValueError(f"device {name!r}: MPS has only index 0; available: {available}")
        return torch.device("mps", 0)
    raise ValueError(f"unsupported device {name!r}; choose {_CHOICES}")


def owned_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """How many CPU cores this process may run on: its affinity mask (taskset, a cpuset, a
    container's --cpuset-cpus), capped by a cgroup CPU quota (a container's --cpus), rounded up."""
    import math
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota(root: str) -> float | None:
    """The cgroup's CPU quota in cores (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`), None without one."""

    def read(name: str) -> list[str] | None:
        try:
            with open(f"{root}/{name}") as file:
                return file.read().split()
        except OSError:
            return None

    v2 = read("cpu.max")  # "quota period", quota "max" when unlimited
    quota, period = (
        v2[:2] if v2 else ((read("cpu/cpu.cfs_quota_us") or ["-1"])[0], (read("cpu/cpu.cfs_period_us") or ["0"])[0])
    )
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # "max"
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def configure_torch_threads(setting: int) -> int:
    """Set torch's CPU threads for this process, once, where the process starts (torch's thread
    pool is process-wide): the `torch_threads` setting if given, else one per core this process
    may use. Torch's own default counts the machine's cores, so a container limited to 2 CPUs on
    a 64-core host would run 64 threads on 2 CPUs. Also has the allocator keep freed memory
    (retain_freed_memory), the other process-wide setting a round's CPU time depends on."""
    import torch

    threads = setting if setting > 0 else owned_cpus()
    torch.set_num_threads(threads)
    retain_freed_memory()
    return threads


def retain_freed_memory() -> bool:
    """Have glibc keep freed memory for the process's next allocations instead of handing it back
    to the OS (mallopt M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2 GiB); True where that was applied.

    Every round allocates and frees the same large tensors (decoding's copy of the weights, the
    update's activations and logits). By default glibc maps each block over its threshold afresh
    and unmaps it when freed, so every round pays page faults on all of it again: measured on
    SmolLM2's one-step LoRA update, about a million faults and 1.4 s of system time in a 13 s
    update (bench/results/update-2026-12-03/README.md). The cost: the process keeps its peak memory between
    rounds, which it reaches again every round anyway.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc (musl has no mallopt)
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
