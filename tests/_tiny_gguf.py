"""A tiny random-weight Qwen2 GGUF that both llama.cpp and transformers' GGUF loader take: F32 tensors in
Qwen2's GGUF layout (untied output head, q/k/v biases), a byte-level BPE vocabulary (GPT-2's 256 byte
symbols, a few merges, Qwen's chat specials) and a minimal ChatML template. Tests that need a real
llama.cpp model without real weights build one here in milliseconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes (what byte-level BPE vocabularies list)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {b: b for b in printable}, 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = 256 + extra
            extra += 1
    return [chr(symbols[b]) for b in range(256)]


def tiny_qwen2_gguf(path: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, ffn: int = 128) -> Path:
    """Write the model to ``path`` (weights drawn from ``seed``) and return ``path``."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    tokens = [*_byte_symbols(), *(m.replace(" ", "") for m in MERGES), *SPECIAL]
    types = [1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL)  # normal, control
    kv = hidden // heads * kv_heads
    w = GGUFWriter(str(path), arch="qwen2")
    w.add_name("tiny-random-qwen2")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    def tensor(name: str, *shape: int, scale: float | None = None) -> None:  # numpy shape: (out, in)
        std = 1 / np.sqrt(shape[-1]) if scale is None else scale
        w.add_tensor(name, (rng.normal(size=shape) * std).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    tensor("output.weight", len(tokens), hidden)
    for i in range(layers):
        block = f"blk.{i}."
        w.add_tensor(block + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(block + "ffn_norm.weight", np.ones(hidden, np.float32))
        for name, out in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv)):
            tensor(f"{block}{name}.weight", out, hidden)
            tensor(f"{block}{name}.bias", out, scale=0.1)
        tensor(block + "attn_output.weight", hidden, hidden)
        tensor(block + "ffn_gate.weight", ffn, hidden)
        tensor(block + "ffn_up.weight", ffn, hidden)
        tensor(block + "ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
