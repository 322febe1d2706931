"""What a LoRA adapter costs on llama.cpp: its GGUF's size, applying it to a loaded base, and swapping it
for another (``LocalBackend.use_lora``: load the new one, set it, free the old one, clear the KV cache).

Two random rank-``--rank`` adapters over q/k/v/o (the trainer's modules), shaped from the base GGUF, are
written as PEFT checkpoints and exported with ``write_lora_gguf``; the base loads once; the first apply
and ``--swaps`` alternating swaps are timed. No token is decoded: what a swap costs afterwards is that
the next call prefills its whole prompt (the prefix cache is gone). Needs the rl extra (``gguf``,
``safetensors``). Asserts nothing.

Usage: ``python bench/bench_lora_swap.py [--model qwen2.5-coder-0.5b|PATH.gguf] [--rank 16] [--swaps 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fhirgym.agents import LOCAL_MODELS, LocalBackend, model_path
from fhirgym.rl import write_lora_gguf

_MODULES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj"}


def random_checkpoint(base: Path, out: Path, rank: int, seed: int) -> Path:
    """A PEFT-format LoRA checkpoint of ``base`` with random A and B (B non-zero), no torch needed."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for t in GGUFReader(str(base)).tensors:
        parts = t.name.split(".")  # blk.N.attn_q.weight
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in _MODULES and parts[3] == "weight":
            n_in, n_out = (int(n) for n in t.shape)
            pre = f"base_model.model.model.layers.{parts[1]}.self_attn.{_MODULES[parts[2]]}"
            tensors[f"{pre}.lora_A.weight"] = (rng.normal(size=(rank, n_in)) * 0.01).astype(np.float32)
            tensors[f"{pre}.lora_B.weight"] = (rng.normal(size=(n_out, rank)) * 0.01).astype(np.float32)
    out.mkdir()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank, "peft_type": "LORA",
                                                         "base_model_name_or_path": str(base)}))
    (out / "fhirgym_base.json").write_text(json.dumps({"model": str(base)}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--swaps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    base = model_path(args.model) if args.model in LOCAL_MODELS else Path(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        adapters = [write_lora_gguf(random_checkpoint(base, root / f"ck{i}", args.rank, i), root / f"a{i}.gguf")
                    for i in (0, 1)]
        size = adapters[0].stat().st_size
        backend = LocalBackend(str(base), n_ctx=512, n_threads=args.threads)
        t0 = time.perf_counter()
        backend.load()
        loaded = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend.use_lora(adapters[0])
        first = time.perf_counter() - t0
        swaps = []
        for i in range(args.swaps):
            t0 = time.perf_counter()
            backend.use_lora(adapters[(i + 1) % 2])
            swaps.append(time.perf_counter() - t0)
    print(f"{base.name} ({base.stat().st_size / 1e6:.0f} MB), LoRA r {args.rank} on q/k/v/o, F32 adapter "
          f"{size / 1e6:.2f} MB")
    print(f"base load {loaded:.2f} s; first apply {first * 1000:.1f} ms; swap median {statistics.median(swaps) * 1000:.1f}"
          f" ms, max {max(swaps) * 1000:.1f} ms over {len(swaps)} swaps")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
