"""Serve a trained LoRA checkpoint to ``fhirgym eval``: as a llama.cpp adapter GGUF, or merged into its base.

:func:`write_lora_gguf` writes what llama.cpp's ``convert_lora_to_gguf.py`` writes, without needing the
base's Hugging Face config: PEFT's A and B unchanged in F32 under the base's tensor names, so llama.cpp's
``scale · (alpha / r) · B(A x)`` is PEFT's forward, and a base loads once while adapters are swapped on it.
Trained rows of the output head (``rl sft``, :func:`head_rows`) travel as an exact rank-k LoRA of
``output.weight``. :func:`merge_into_gguf` copies every tensor and key of the base and writes the adapted
matrices in F16; :func:`merge_to_hf` merges into a Hugging Face directory for a base that is no GGUF. The
base is checked from its header alone (:func:`gguf_header`): ``GGUFReader`` takes 20 s on Qwen's 150k
vocabulary, too slow for an export every training step. docs/RL.md, "Serving a checkpoint".
"""

from __future__ import annotations

import functools
import json
import mmap
import re
import struct
from pathlib import Path
from typing import Any

from ..agents import LOCAL_MODELS, model_path

#: PEFT module name → GGUF tensor name (Qwen2/Llama layout).
_GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_KEY = re.compile(r"layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.lora_([AB])\.weight$")
_HEAD_ROWS = "lm_head.token_adapter.trainable_tokens_delta"  # PEFT's trainable rows of the output head


def base_of(checkpoint: Path) -> str:
    """The model a checkpoint was trained from (``fhirgym_base.json``, else PEFT's record)."""
    ours = checkpoint / "fhirgym_base.json"
    if ours.is_file():
        return json.loads(ours.read_text())["model"]
    return json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"]


def lora_pairs(checkpoint: Path) -> tuple[dict[str, tuple[Any, Any]], float]:
    """``({gguf tensor name: (A, B)}, alpha)`` of a plain PEFT LoRA over q/k/v/o (float32 numpy, A r × in,
    B out × r); anything else in the checkpoint (other modules, biases, per-module ranks) is refused."""
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "adapter_config.json").read_text())
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError("rsLoRA/DoRA adapters are not supported (fhirgym trains plain LoRA)")
    if config.get("rank_pattern") or config.get("alpha_pattern") or config.get("fan_in_fan_out"):
        raise ValueError("per-module ranks/alphas and fan_in_fan_out are not supported (fhirgym trains one r "
                         "and one alpha)")
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    parts: dict[str, dict[str, Any]] = {}
    for key, value in weights.items():
        if key.endswith(_HEAD_ROWS):
            continue  # head_rows reads it
        m = _KEY.search(key)
        if not m:
            raise ValueError(f"adapter tensor {key!r} is not a LoRA of an attention projection "
                             f"({', '.join(_GGUF_NAMES)})")
        parts.setdefault(f"blk.{m.group(1)}.{_GGUF_NAMES[m.group(2)]}.weight", {})[m.group(3)] = value
    pairs = {}
    for name, p in parts.items():
        if set(p) != {"A", "B"}:
            raise ValueError(f"{name}: the checkpoint holds lora_{''.join(p)} only")
        a, b = p["A"].astype(np.float32), p["B"].astype(np.float32)
        if a.shape[0] != config["r"] or b.shape[1] != config["r"]:
            raise ValueError(f"{name}: A {a.shape}, B {b.shape} do not have the configured rank {config['r']}")
        pairs[name] = (a, b)
    if float(config["lora_alpha"]) <= 0:  # llama.cpp reads alpha 0 as "unscaled", PEFT as a zero update
        raise ValueError(f"lora_alpha {config['lora_alpha']}: must be > 0")
    return pairs, float(config["lora_alpha"])


def head_rows(checkpoint: Path) -> tuple[list[int], Any] | None:
    """``(token ids, their new output-head rows)`` (float32, k × hidden) a checkpoint trained with PEFT's
    ``trainable_token_indices`` on ``lm_head`` (``rl sft``), else None; rows of any other layer are refused."""
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "adapter_config.json").read_text())
    targets = config.get("trainable_token_indices") or {}
    if not targets:
        return None
    if set(targets) != {"lm_head"}:
        raise ValueError(f"trainable tokens of {sorted(targets)}: only the output head's (lm_head) are supported")
    rows = [v for k, v in load_file(str(checkpoint / "adapter_model.safetensors")).items() if k.endswith(_HEAD_ROWS)]
    ids = [int(i) for i in targets["lm_head"]]
    if len(rows) != 1 or rows[0].shape[0] != len(ids):
        raise ValueError(f"the checkpoint's head rows do not match its {len(ids)} trainable token ids")
    return ids, rows[0].astype(np.float32)


def _output_weight(reader: Any) -> Any:
    """The base's output head (float32, vocabulary × hidden), dequantised."""
    import numpy as np
    from gguf.quants import dequantize

    for t in reader.tensors:
        if t.name == "output.weight":
            return dequantize(t.data, t.tensor_type).astype(np.float32)
    raise ValueError("the base GGUF has no output.weight (a tied head): its trained rows cannot be exported")


@functools.lru_cache(maxsize=4)
def _base_rows(base_gguf: str, ids: tuple[int, ...]) -> Any:
    """The base head's rows at ``ids``, read once per base (a GRPO run exports the adapter every batch, and
    reading the head costs a full ``GGUFReader`` pass)."""
    from gguf import GGUFReader

    return _output_weight(GGUFReader(base_gguf))[list(ids)]


def lora_deltas(checkpoint: Path) -> dict[str, Any]:
    """``{gguf tensor name: (alpha / r) · B @ A}`` (float32 numpy, shape out × in) of a PEFT adapter."""
    pairs, alpha = lora_pairs(checkpoint)
    return {name: (alpha / a.shape[0]) * (b @ a) for name, (a, b) in pairs.items()}


def _base_gguf(checkpoint: Path) -> Path:
    base = base_of(checkpoint)
    if base in LOCAL_MODELS:
        return model_path(base)
    if base.endswith(".gguf"):
        return Path(base)
    raise ValueError(f"the checkpoint's base {base!r} is no GGUF: use merge_to_hf, then llama.cpp's "
                     "convert_hf_to_gguf.py")


def write_lora_gguf(checkpoint: Path, out: Path, base_gguf: Path | None = None) -> Path:
    """Write ``out``: the checkpoint's LoRA as a llama.cpp adapter GGUF (F32) for the GGUF it was trained
    from, checked against that base (architecture, tensor names and shapes) so llama.cpp will take it."""
    from gguf import GGUFType, GGUFWriter, Keys

    pairs, alpha = lora_pairs(checkpoint)
    arch, shapes = gguf_header(base_gguf or _base_gguf(checkpoint))
    for name, (a, b) in pairs.items():
        if name not in shapes:
            raise ValueError(f"the base GGUF has no tensor {name}: not the checkpoint's base")
        if shapes[name] != (a.shape[1], b.shape[0]):
            raise ValueError(f"{name}: base (in, out) {shapes[name]} vs adapter {(a.shape[1], b.shape[0])}")
    rows = head_rows(checkpoint)
    if rows is not None:
        import numpy as np

        # new rows R at ids = W + S·(R - W[ids]), S the ids' one-hot columns: a LoRA of rank k = len(ids),
        # B = S, A = (R - W[ids]) · k / alpha against llama.cpp's alpha / r scale; exact, whatever W's quants
        ids, new = rows
        old = _base_rows(str(base_gguf or _base_gguf(checkpoint)), tuple(ids))
        select = np.zeros((shapes["output.weight"][1], len(ids)), np.float32)
        select[ids, range(len(ids))] = 1.0
        pairs["output.weight"] = ((new - old) * (len(ids) / alpha), select)
    writer = GGUFWriter(str(out), arch=arch)
    writer.add_type(GGUFType.ADAPTER)
    writer.add_string(Keys.Adapter.TYPE, "lora")
    writer.add_float32(Keys.Adapter.LORA_ALPHA, alpha)
    for name in sorted(pairs, key=_tensor_order):
        a, b = pairs[name]
        writer.add_tensor(f"{name}.lora_a", a)
        writer.add_tensor(f"{name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def gguf_header(path: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """``(general.architecture, {tensor name: shape in ggml order, (in, out) for a matrix})`` of a
    little-endian GGUF, read from its header without touching metadata values or tensor data."""
    import numpy as np
    from gguf import GGUF_MAGIC, GGUFReader, GGUFValueType

    sizes = {t: np.dtype(d).itemsize for t, d in GGUFReader.gguf_scalar_to_np.items()}

    def string(off: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", mm, off)
        return mm[off + 8:off + 8 + n].decode(), off + 8 + n

    def skip(off: int, kind: int) -> int:
        if kind == GGUFValueType.STRING:
            return string(off)[1]
        if kind != GGUFValueType.ARRAY:
            return off + sizes[GGUFValueType(kind)]
        item, count = struct.unpack_from("<IQ", mm, off)
        off += 12
        if item in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            for _ in range(count):
                off = skip(off, item)
            return off
        return off + count * sizes[GGUFValueType(item)]

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", mm, 0)
        if magic != GGUF_MAGIC or version not in (2, 3):
            raise ValueError(f"{path} is not a little-endian GGUF (v2/v3) file")
        off, arch = 24, None
        for _ in range(n_kv):
            key, off = string(off)
            (kind,) = struct.unpack_from("<I", mm, off)
            if key == "general.architecture" and kind == GGUFValueType.STRING:
                arch = string(off + 4)[0]
            off = skip(off + 4, kind)
        shapes = {}
        for _ in range(n_tensors):
            name, off = string(off)
            (dims,) = struct.unpack_from("<I", mm, off)
            shapes[name] = struct.unpack_from(f"<{dims}Q", mm, off + 4)
            off += 4 + 8 * dims + 4 + 8  # dims, then the type and the data offset
    if arch is None:
        raise ValueError(f"{path} names no general.architecture")
    return arch, shapes


def _tensor_order(name: str) -> tuple[int, str]:
    """Blocks in layer order, then the output head (GGUF's own order)."""
    parts = name.split(".")
    return (int(parts[1]) if parts[0] == "blk" else 1 << 30), name


def merge_into_gguf(checkpoint: Path, out: Path, base_gguf: Path | None = None) -> Path:
    """Write ``out``: the base GGUF with the checkpoint's LoRA merged into its attention projections."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    deltas = lora_deltas(checkpoint)
    reader = GGUFReader(str(base_gguf or _base_gguf(checkpoint)))
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
    rows = head_rows(checkpoint)
    if rows is not None:
        head = _output_weight(reader)
        head[rows[0]] = rows[1]
        merged["output.weight"] = head.astype(np.float16)
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
    from ._policy import load_policy

    model, tok = load_policy(str(checkpoint))
    model.merge_and_unload().save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
