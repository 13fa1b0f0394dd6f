"""Matmul rates on this machine: GFLOPS of one linear layer's shape, its weights streamed from memory.

Shared by bench/roofline.py (decoding against its roofline) and bench/update_bound.py (the
GRPO update against its compute bound). On a CPU the clock is the process's CPU time; on a GPU
wall time after a synchronize.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

CPU = torch.device("cpu")


class Clock:
    """On a CPU the process's CPU clock (other jobs hide little); on a GPU wall time after a
    synchronize, so that queued kernels count."""

    def __init__(self, device: torch.device):
        self.device = device
        self.gpu = device.type == "cuda"
        self.unit = "s" if self.gpu else "CPU s"

    def __call__(self) -> float:
        if self.gpu:
            torch.cuda.synchronize(self.device)
            return time.perf_counter()
        return time.process_time()


def streamed_weights(
    out: int, inp: int, dtype: torch.dtype, stream_bytes: float, device: torch.device = CPU
) -> list[torch.Tensor]:
    """Distinct copies of an [out x in] weight, more bytes of them than the caches hold."""
    copies = max(1, math.ceil(stream_bytes / (out * inp * torch.tensor([], dtype=dtype).element_size())))
    return [torch.randn(out, inp, device=device).mul_(0.02).to(dtype) for _ in range(copies)]


def kernels_on(device: torch.device) -> tuple[str, ...]:
    """F.linear everywhere; oneDNN's packed matmul (LlamaDecoder's) on a CPU only."""
    return ("F.linear", "packed") if device.type == "cpu" else ("F.linear",)


def matmul_gflops(weights: list[torch.Tensor], batch: int, kernel: str, seconds: float, clock: Clock) -> float:
    """GFLOPS of [batch x in] @ [in x out], cycling through `weights` so that each call reads its
    weight from memory, as a decoding step does (best of 3 rounds); NaN without the kernel."""
    out, inp = weights[0].shape
    x = torch.randn(batch, inp, device=weights[0].device).to(weights[0].dtype)
    linear = F.linear
    if kernel == "packed":  # training/decoder/decoding.py's kernel
        from sapo.training.decoder.decoder_weights import onednn_linear, onednn_packer

        packer, linear = onednn_packer(weights[0].dtype, weights[0].device, batch), onednn_linear
        if packer is None:
            return float("nan")
        weights = [packer(w) for w in weights]
    started = clock()
    for w in weights:  # warm-up, and the time of one call
        linear(x, w)
    per_call = (clock() - started) / len(weights)
    flops = 2.0 * batch * out * inp
    calls = max(len(weights), int(seconds / max(per_call, 1e-7)))
    best = float("inf")
    for _ in range(3):
        started = clock()
        for i in range(calls):
            linear(x, weights[i % len(weights)])
        best = min(best, clock() - started)
    return calls * flops / best / 1e9


def peak_matmul_tflops(device: torch.device, size: int = 8192) -> float:
    """The card's bf16 matrix rate: one large product on random data, mean of 10 after 3 warm-ups."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize(device)
    return 10 * 2.0 * size**3 / (time.perf_counter() - started) / 1e12
