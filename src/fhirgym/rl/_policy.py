"""The policy's weights for torch: a GGUF fhirgym assembles (dequantised), a LoRA checkpoint of ours, any HF model.

``load_policy(model)``: a local model name (``qwen2.5-coder-0.5b``, the GGUF fhirgym assembles, dequantised
to fp32 by transformers with the ``gguf`` package), a path to a ``.gguf`` file, a directory holding a
Hugging Face model or a LoRA checkpoint of ours (its base named in ``fhirgym_base.json``), or any Hugging
Face hub id. The trainer, behaviour cloning, the evaluation protocol and the exporters all load through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..agents import LOCAL_MODELS, model_path

BASE_FILE = "fhirgym_base.json"


#: Weight dtypes ``load_policy`` takes: bfloat16 halves a forward and backward pass on a CPU with
#: ``avx512_bf16`` (measured in docs/RL.md) and halves the weights' memory.
DTYPES = ("float32", "bfloat16")


def load_policy(model: str, *, dtype: str = "float32") -> tuple[Any, Any]:
    """``(model, tokenizer)`` for training or evaluation (see the module docstring for the forms of ``model``).

    In bfloat16 the output head still computes in float32 (:func:`fp32_logits`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    net, tok = _load_weights(model, dtype)
    return fp32_logits(net), tok


def fp32_logits(net: Any) -> Any:
    """Give a low-precision model a float32 output head (an untied float32 copy of its weight).

    bfloat16 keeps 8 significant bits: a logit near 20 is rounded to 0.125, which would move a token's
    log-probability, and so GRPO's importance ratio, by up to 13 % with no change in the policy. The head is
    one matrix; float32 there keeps the ratio exact to float32 at a small share of the compute."""
    import torch

    head = net.get_output_embeddings()
    if head is None or head.weight.dtype == torch.float32:
        return net
    fp32 = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, dtype=torch.float32)
    fp32.weight = torch.nn.Parameter(head.weight.detach().float().clone(), requires_grad=head.weight.requires_grad)
    if head.bias is not None:
        fp32.bias = torch.nn.Parameter(head.bias.detach().float().clone(), requires_grad=head.bias.requires_grad)
    fp32.register_forward_pre_hook(lambda _module, args: (args[0].float(), *args[1:]))
    net.config.tie_word_embeddings = False  # the copy is the head's own now
    net.set_output_embeddings(fp32)
    return net


def _load_weights(model: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    path = Path(model)
    if model in LOCAL_MODELS or model.endswith(".gguf"):
        gguf = model_path(model) if model in LOCAL_MODELS else path
        if not gguf.is_file():
            raise FileNotFoundError(f"no GGUF file at {gguf}")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        net = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch_dtype)
        # Qwen2/Llama GGUFs load through transformers' legacy loader, which dequantises every tensor into a
        # plain parameter; the model stays tagged "GGUF-quantised" all the same, and Trainer refuses to train
        # such a model. The tag is dropped once the parameters are checked to be plain floats.
        odd = {str(p.dtype) for p in net.parameters() if p.dtype != torch_dtype}
        if odd:
            raise ValueError(f"{gguf.name} loaded with {odd} parameters: not trainable as plain {dtype}")
        if getattr(net, "hf_quantizer", None) is not None:
            net.hf_quantizer.remove_quantization_config(net)
        return net, tok
    if (path / "adapter_config.json").is_file():  # a LoRA checkpoint: its base, then the adapter
        from peft import PeftModel

        base_file = path / BASE_FILE  # ours names the base as given to train (a GGUF dir is no model id)
        base_name = (json.loads(base_file.read_text())["model"] if base_file.is_file()
                     else json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"])
        base, tok = load_policy(base_name, dtype=dtype)
        if (path / "tokenizer_config.json").is_file():
            tok = AutoTokenizer.from_pretrained(str(path))
        return PeftModel.from_pretrained(base, str(path)), tok
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype)
    return net, AutoTokenizer.from_pretrained(model)
