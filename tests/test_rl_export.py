"""A LoRA checkpoint merged into the 0.5B GGUF it was trained from runs on llama.cpp (``fhirgym rl
export``): the adapted projections are W + (alpha/r)·B·A, everything else is the base file's bytes, and
a tiny adapter leaves greedy decoding unchanged. Uses the real 0.5B GGUF (the ``model`` mark), no torch."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("safetensors")

pytestmark = pytest.mark.model


def _adapter(path, b_scale: float, seed: int = 0):
    """A hand-made PEFT adapter (r 2, alpha 4: scale 2) on layer 0's q_proj and layer 3's v_proj."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    shapes = {"0.self_attn.q_proj": (896, 896), "3.self_attn.v_proj": (128, 896)}
    tensors = {}
    for name, (out, inp) in shapes.items():
        prefix = f"base_model.model.model.layers.{name}"
        tensors[f"{prefix}.lora_A.weight"] = rng.normal(size=(2, inp)).astype(np.float32) * 0.01
        tensors[f"{prefix}.lora_B.weight"] = rng.normal(size=(out, 2)).astype(np.float32) * b_scale
    path.mkdir()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4, "base_model_name_or_path": "x",
                                                          "peft_type": "LORA"}))
    (path / "fhirgym_base.json").write_text(json.dumps({"model": "qwen2.5-coder-0.5b"}))
    return tensors


def test_merged_gguf_has_the_lora_folded_in_and_runs_on_llama_cpp(tmp_path):
    """One export: the adapted tensor is dequant(W) + 2·B·A to F16 precision (the delta, ~3e-4, well above
    F16's rounding on average), the rest is byte-identical, and llama.cpp decodes the merged file; a
    delta this small leaves greedy decoding where the base's is."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from llama_cpp import Llama

    from fhirgym.agents import model_path
    from fhirgym.rl import merge_into_gguf

    base = model_path("qwen2.5-coder-0.5b")
    tensors = _adapter(tmp_path / "lora", b_scale=0.01)
    out = merge_into_gguf(tmp_path / "lora", tmp_path / "merged.gguf")
    old, new = GGUFReader(str(base)), GGUFReader(str(out))
    o, n = ({t.name: t for t in r.tensors} for r in (old, new))
    assert list(o) == list(n)
    for name, pre in (("blk.0.attn_q.weight", "0.self_attn.q_proj"), ("blk.3.attn_v.weight", "3.self_attn.v_proj")):
        pre = f"base_model.model.model.layers.{pre}"
        w = dequantize(o[name].data, o[name].tensor_type)
        want = w + 2.0 * (tensors[f"{pre}.lora_B.weight"] @ tensors[f"{pre}.lora_A.weight"])
        got = np.asarray(n[name].data, dtype=np.float32).reshape(want.shape)
        assert n[name].tensor_type.name == "F16"
        assert np.allclose(got, want, rtol=1e-3, atol=1e-6)  # F16's precision
        assert np.abs(got - want).mean() < np.abs(got - w).mean() / 3  # the delta is in, not rounding noise
    for name in ("blk.0.attn_k.weight", "blk.1.attn_q.weight", "token_embd.weight"):  # untouched: same bytes
        assert n[name].tensor_type == o[name].tensor_type and bytes(n[name].data) == bytes(o[name].data)
    assert {f for f in new.fields if not f.startswith("GGUF.")} == {f for f in old.fields if not f.startswith("GGUF.")}
    del old, new, o, n

    prompt = "<|im_start|>user\nWhat is the capital of France? One word.<|im_end|>\n<|im_start|>assistant\n"
    texts = []
    for path in (base, out):
        llm = Llama(str(path), n_ctx=256, n_threads=2, verbose=False, seed=0)
        texts.append(llm(prompt, max_tokens=8, temperature=0.0)["choices"][0]["text"])
        del llm
    assert "Paris" in texts[0] and texts[0] == texts[1]
