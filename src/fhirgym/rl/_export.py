"""Serve a trained LoRA checkpoint to ``fhirgym eval``: merge it into the GGUF it was trained from.

A checkpoint of ``fhirgym rl train`` on a GGUF base (the default) is a LoRA adapter over the attention
projections. :func:`merge_into_gguf` writes a new GGUF: every tensor and every metadata key of the base
file copied as it is (quantised blocks stay quantised, the tokenizer and chat template come along),
except the adapted projections, which become ``W + (alpha / r) · B·A`` in F16, ``W`` dequantised by the
``gguf`` package. Qwen2's GGUF tensors are HF's matrices unpermuted (transformers' GGUF loader applies no
permutation for ``qwen2``), so ``blk.N.attn_q.weight`` is ``model.layers.N.self_attn.q_proj.weight``.
The result runs on llama.cpp: ``fhirgym eval --agent react --model local/OUT.gguf``. For a base that is
not a GGUF, :func:`merge_to_hf` writes a merged Hugging Face directory (llama.cpp's
``convert_hf_to_gguf.py`` turns that into a GGUF; fhirgym does not ship it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..agents import LOCAL_MODELS, model_path

#: PEFT module name → GGUF tensor name (Qwen2/Llama layout).
_GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_KEY = re.compile(r"layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.lora_([AB])\.weight$")


def base_of(checkpoint: Path) -> str:
    """The model a checkpoint was trained from (``fhirgym_base.json``, else PEFT's record)."""
    ours = checkpoint / "fhirgym_base.json"
    if ours.is_file():
        return json.loads(ours.read_text())["model"]
    return json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"]


def lora_deltas(checkpoint: Path) -> dict[str, Any]:
    """``{gguf tensor name: (alpha / r) · B @ A}`` (float32 numpy, shape out × in) of a PEFT adapter."""
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "adapter_config.json").read_text())
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError("rsLoRA/DoRA adapters are not merged here (fhirgym trains plain LoRA)")
    scale = float(config["lora_alpha"]) / float(config["r"])
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    parts: dict[str, dict[str, Any]] = {}
    for key, value in weights.items():
        m = _KEY.search(key)
        if not m:
            raise ValueError(f"adapter tensor {key!r} is not a LoRA of an attention projection")
        parts.setdefault(f"blk.{m.group(1)}.{_GGUF_NAMES[m.group(2)]}.weight", {})[m.group(3)] = value
    return {name: scale * (p["B"].astype(np.float32) @ p["A"].astype(np.float32)) for name, p in parts.items()}


def merge_into_gguf(checkpoint: Path, out: Path, base_gguf: Path | None = None) -> Path:
    """Write ``out``: the base GGUF with the checkpoint's LoRA merged into its attention projections."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    if base_gguf is None:
        base = base_of(checkpoint)
        if base in LOCAL_MODELS:
            base_gguf = model_path(base)
        elif base.endswith(".gguf"):
            base_gguf = Path(base)
        else:
            raise ValueError(f"the checkpoint's base {base!r} is no GGUF: use merge_to_hf, then llama.cpp's "
                             "convert_hf_to_gguf.py")
    deltas = lora_deltas(checkpoint)
    reader = GGUFReader(str(base_gguf))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(out), arch=arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    merged: dict[str, Any] = {}
    for t in reader.tensors:
        if t.name in deltas:
            w = dequantize(t.data, t.tensor_type).astype(np.float32)
            if w.shape != deltas[t.name].shape:
                raise ValueError(f"{t.name}: base {w.shape} vs adapter {deltas[t.name].shape}")
            merged[t.name] = (w + deltas[t.name]).astype(np.float16)
    missing = set(deltas) - set(merged)
    if missing:
        raise ValueError(f"the base GGUF has no tensors {sorted(missing)[:3]}…: not the checkpoint's base")
    for t in reader.tensors:
        if t.name in merged:
            m = merged[t.name]
            writer.add_tensor_info(t.name, m.shape, m.dtype, m.nbytes, GGMLQuantizationType.F16)
        else:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(merged.get(t.name, t.data), tensor_endianess=reader.endianess)
    writer.close()
    return out


def merge_to_hf(checkpoint: Path, out: Path) -> Path:
    """A merged Hugging Face model directory (base + LoRA folded in), e.g. for an OpenAI-compatible server."""
    from ._trainer import load_policy

    model, tok = load_policy(str(checkpoint))
    model.merge_and_unload().save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
