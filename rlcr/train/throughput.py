"""The update's compute rate next to the device's matmul peak, measured in the same process.

GFLOP/s of an update = 6 × parameters (all of them, the tied embedding once) × prefix-tree tokens (the nodes
the model processes, every micro-batch's, over all ranks) / the update's wall seconds (π_old pre-pass and
steps): the nominal forward + backward count ``bench/perf/update.py`` uses, so the flow's figure and the
benchmark's compare directly. The peak is a plain ``torch.mm`` of two n×n matrices, best of a few.
"""

from __future__ import annotations

import time

import torch

__all__ = ["matmul_gflops", "update_gflops"]


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
