"""Seconds to save the full training state (weights, tokenizer, AdamW moments) into a local store, the way the
trainer does (issue 34: the save was most of what is left of an iteration's overhead at demo scale).

Both ways side by side, taking turns, on SmolLM2-135M with the AdamW state of one real optimizer step
(1.6 GB in all), each into a fresh ``rel`` of one local store on this machine's disk:

  copy    the former way: the checkpoint written to a temporary directory, then ``Store.put_dir`` copies it
          into the store's temp sibling, fsyncs and renames it into place
  direct  ``rlcr.train.checkpoint.save_checkpoint`` as it is now: written into ``Store.writing_dir``, the
          store's temp sibling itself, then fsynced and renamed (nothing copied)

Prints each round as it finishes, then the medians; last line ``checkpoint save direct/copy: X``.

    python bench/perf/save.py [--rounds 3] [--store DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", default=None, help="a local directory (default: a temporary one under ./)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcr.models.smollm2 import prepare_smollm2
    from rlcr.storage import Store
    from rlcr.train.checkpoint import TRAINING_STATE_FILE, save_checkpoint

    model_dir = prepare_smollm2()
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-6)
    lm(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "step": 1}
    root = Path(args.store or tempfile.mkdtemp(prefix="bench-save-", dir="."))
    store = Store(str(root))

    def copy(rel: str) -> None:  # the former save_checkpoint: a temporary directory, then put_dir
        with tempfile.TemporaryDirectory(prefix="rlcr-ckpt-") as d:
            lm.save_pretrained(d, safe_serialization=True)
            tok.save_pretrained(d)
            torch.save(state, f"{d}/{TRAINING_STATE_FILE}")
            store.put_dir(d, rel)

    def direct(rel: str) -> None:
        save_checkpoint(lm, tok, store, rel, training_state=state)

    sides = {"copy": copy, "direct": direct}
    times: dict[str, list[float]] = {k: [] for k in sides}
    size = 0
    try:
        for r in range(args.rounds):
            for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                rel = f"r{r}-{name}"
                t0 = time.perf_counter()
                sides[name](rel)
                times[name].append(time.perf_counter() - t0)
                size = sum(p.stat().st_size for p in (root / rel).rglob("*") if p.is_file())
                shutil.rmtree(root / rel)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items())
                  + f" ({size / 1e9:.2f} GB)", flush=True)
    finally:
        if not args.store:
            shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:7s} median {med[k]:.2f} s (range {min(v):.2f}–{max(v):.2f}, n = {len(v)})")
    print(f"checkpoint save direct/copy: {med['direct'] / med['copy']:.2f}")


if __name__ == "__main__":
    main()
