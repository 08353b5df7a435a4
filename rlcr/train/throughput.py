"""The update's compute rate next to the device's matmul peak, measured in the same process.

GFLOP/s of an update = 6 × parameters (all of them, the tied embedding once) × prefix-tree tokens (the nodes
the model processes, every micro-batch's, over all ranks) / the update's wall seconds (π_old pre-pass and
steps): the nominal forward + backward count ``bench/perf/update.py`` uses, so the flow's figure and the
benchmark's compare directly. The peak is a plain ``torch.mm`` of two n×n matrices, best of a few.
"""

from __future__ import annotations

import time

import torch

__all__ = ["autocast_warning", "cpu_has_bf16", "matmul_gflops", "update_gflops"]

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""CPU flags of bf16 instructions (``/proc/cpuinfo``'s ``flags`` on x86, ``Features`` on Arm): without one, bf16 on
CPU is emulated and slower."""


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this machine's CPU has bf16 instructions (:data:`BF16_FLAGS`); False where its flags cannot be read."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return any(flag in line.split() for flag in BF16_FLAGS)
    except OSError:
        return False
    return False


def autocast_warning(cfg, *, has_bf16: bool | None = None) -> str | None:
    """The warning for ``update.autocast: bfloat16`` on CPU trainers without bf16 instructions (emulated: slower
    than fp32), else None. ``has_bf16``: the CPU's answer (default: :func:`cpu_has_bf16` of the machine that asks,
    the driver's: on a cluster of other CPUs the trainer nodes' may differ)."""
    if cfg.update.autocast != "bfloat16" or cfg.update.use_gpu:
        return None
    if has_bf16 if has_bf16 is not None else cpu_has_bf16():
        return None
    return ("update.autocast=bfloat16 on a CPU without bf16 instructions (no avx512_bf16 or amx_bf16 in its flags): "
            "the update runs emulated bf16, slower than fp32")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def matmul_gflops(n: int = 2048, reps: int = 3, *, device="cpu", dtype: torch.dtype = torch.float32) -> float:
    """A plain ``torch.mm`` of two n×n matrices on ``device`` in ``dtype`` (fp32 at PyTorch's default matmul
    precision: no TF32 unless the process turns it on), best of ``reps`` after one warm-up: GFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def update_gflops(params: int, tree_tokens: float, seconds: float) -> float:
    """Nominal GFLOP/s of an update over ``tree_tokens`` prefix-tree nodes in ``seconds`` (0 if none)."""
    return 6 * params * tree_tokens / seconds / 1e9 if seconds > 0 else 0.0
