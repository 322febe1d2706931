"""A LoRA checkpoint served to llama.cpp as an adapter GGUF (``write_lora_gguf``, ``rl export --adapter``)
computes what PEFT computes: on a tiny random-weight Qwen2 GGUF with random (non-zero B) adapters, the
llama.cpp logits of base + adapter, applied at load or swapped in, equal PEFT's on the same checkpoint and
the merged GGUF's (``merge_into_gguf``); a swap leaves no stale prefix behind.

Tolerances. llama.cpp runs these F32 tensors in F32 (the KV cache too, ``type_k``/``type_v`` F32 here), so
the adapter differs from PEFT by float32 summation order only: measured 1.7e-5 on logits of order 1-10,
asserted < 1e-4. The merged file stores its projections in F16 (and llama.cpp then rounds their inputs to
F16), so it is itself off PEFT by ~5e-2 here; the adapter must be as close to it as PEFT is (within 1e-4)
while the LoRA moves the logits by ~5, a hundred times more: a wrong scale, a transposed factor or a
stale cache would show at that size."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("gguf")

from _tiny_gguf import random_lora_checkpoint, tiny_qwen2_gguf  # noqa: E402
from fhirgym.agents import BackendError, LocalBackend, make_backend  # noqa: E402
from fhirgym.rl import load_policy, merge_into_gguf, write_lora_gguf  # noqa: E402
from fhirgym.rl._export import gguf_header  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
F32_KV = {"type_k": 0, "type_v": 0}  # GGML_TYPE_F32
TEXT = "hello the world in a tin, the end"
MESSAGES = [{"role": "user", "content": TEXT}]
PEFT_TOL = 1e-4


def _checkpoint(base, out, seed, targets=TARGETS):
    """A real PEFT checkpoint of ``base`` (r 4, alpha 8, as the trainer configures it: alpha = 2r) with
    random A and B, recorded on its GGUF base as ``rl train`` records it."""
    return random_lora_checkpoint(base, out, seed=seed, targets=tuple(targets))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = tiny_qwen2_gguf(root / "tiny.gguf")
    _, tok = load_policy(str(base))
    out = {"root": root, "base": base, "tokens": tok(TEXT)["input_ids"]}
    for i in (1, 2):
        out[f"peft{i}"] = _checkpoint(base, root / f"ck{i}", seed=i)
        out[f"adapter{i}"] = write_lora_gguf(root / f"ck{i}", root / f"adapter{i}.gguf")
        out[f"merged{i}"] = merge_into_gguf(root / f"ck{i}", root / f"merged{i}.gguf")
    return out


def _backend(tiny, n_ctx, **kw):
    return LocalBackend(str(tiny["base"]), n_ctx=n_ctx, n_threads=1, logits_all=True, **F32_KV, **kw)


def _logits(llama, tokens):
    llama.reset()
    llama.eval(tokens)
    return np.array(llama.scores[: len(tokens)])


def _reference(model, tokens, lora=None):
    """Logits from a Llama of its own (no shared instance), with llama-cpp-python's own ``lora_path``."""
    from llama_cpp import Llama

    llama = Llama(str(model), lora_path=lora and str(lora), n_ctx=128, n_threads=1, logits_all=True,
                  verbose=False, **F32_KV)
    try:
        return _logits(llama, tokens)
    finally:
        llama.close()


def _peft(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


def _chat(backend):
    """One chat() turn; its prompt tokens and the logits llama.cpp holds for them."""
    result = backend.chat(MESSAGES, max_tokens=1)
    llama = backend.load()
    return [int(t) for t in llama.input_ids[: result.prompt_tokens]], np.array(llama.scores[: result.prompt_tokens])


def test_the_adapter_file_holds_the_peft_factors_in_llama_cpp_s_layout(tiny):
    """general.type adapter, the base's architecture, adapter.type lora, the alpha; per adapted tensor
    ``<base name>.lora_a`` (ggml ne [in, r]) and ``.lora_b`` (ne [r, out]) = PEFT's A and B, bit for bit."""
    from gguf import GGUFReader
    from safetensors.numpy import load_file

    base = GGUFReader(str(tiny["base"]))  # the header walk that checks the base sees what gguf's reader sees
    assert gguf_header(tiny["base"]) == ("qwen2", {t.name: tuple(int(n) for n in t.shape) for t in base.tensors})
    reader = GGUFReader(str(tiny["adapter1"]))
    fields = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    assert fields == {"general.architecture": "qwen2", "general.type": "adapter", "adapter.type": "lora",
                      "adapter.lora.alpha": 8.0}
    peft = load_file(str(tiny["root"] / "ck1" / "adapter_model.safetensors"))
    tensors = {t.name: t for t in reader.tensors}
    gguf_names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
    assert len(tensors) == len(peft) == 2 * 2 * 4
    for layer in range(2):
        for module, name in gguf_names.items():
            pre = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            for ab in "AB":
                t = tensors[f"blk.{layer}.{name}.weight.lora_{ab.lower()}"]
                want = peft[f"{pre}.lora_{ab}.weight"]
                assert t.tensor_type.name == "F32" and tuple(t.shape) == want.shape[::-1]
                assert np.array_equal(np.asarray(t.data).reshape(want.shape), want)


def test_adapter_applied_at_load_equals_peft_and_the_merged_gguf(tiny):
    tokens = tiny["tokens"]
    adapted = _logits(_backend(tiny, 64, lora=tiny["adapter1"]).load(), tokens)
    base, merged = _reference(tiny["base"], tokens), _reference(tiny["merged1"], tokens)
    peft = _peft(tiny["peft1"], tokens)
    effect = np.abs(adapted - base).max()
    assert effect > 1.0  # the LoRA matters
    assert np.abs(adapted - peft).max() < PEFT_TOL
    assert np.abs(adapted - merged).max() <= np.abs(peft - merged).max() + PEFT_TOL
    assert np.abs(adapted - merged).max() < effect / 50
    # llama-cpp-python's own lora_path applies the same file the same way
    assert np.array_equal(_reference(tiny["base"], tokens, lora=tiny["adapter1"]), adapted)


def test_trained_head_rows_reach_llama_cpp_exactly(tiny):
    """``rl sft`` trains the output head's rows of special tokens (PEFT's ``trainable_token_indices``): the
    adapter carries them as a rank-k LoRA of ``output.weight`` after the blocks, so llama.cpp's logits equal
    PEFT's; the merged GGUF holds them in its head."""
    from gguf import GGUFReader
    from peft import LoraConfig, get_peft_model

    root, tokens = tiny["root"], tiny["tokens"]
    net, _ = load_policy(str(tiny["base"]))
    rows = [3, 7, 40]
    peft = get_peft_model(net, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS,
                                          trainable_token_indices={"lm_head": rows}))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name or "trainable_tokens_delta" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    peft.save_pretrained(str(root / "ck-head"))
    (root / "ck-head" / "fhirgym_base.json").write_text(json.dumps({"model": str(tiny["base"])}))
    adapter = write_lora_gguf(root / "ck-head", root / "adapter-head.gguf")
    merged = merge_into_gguf(root / "ck-head", root / "merged-head.gguf")
    names = [t.name for t in GGUFReader(str(adapter)).tensors]
    assert names[-2:] == ["output.weight.lora_a", "output.weight.lora_b"] and len(names) == 2 * (2 * 4 + 1)
    adapted, want = _reference(tiny["base"], tokens, lora=adapter), _peft(peft.eval(), tokens)
    with peft.disable_adapter():
        base = _peft(peft, tokens)
    moved = np.abs(want - base)[:, rows].max()
    assert moved > 1.0 and np.abs(adapted - want).max() < PEFT_TOL
    assert np.abs(adapted - _reference(merged, tokens)).max() < moved / 50


def test_a_swap_takes_the_new_adapter_and_reuses_no_stale_prefix(tiny):
    """Through chat(), where llama-cpp-python reuses the KV of a common prefix: a repeated prompt reuses it;
    after use_lora the same prompt is evaluated afresh and scores as the second adapter's PEFT model and
    merged GGUF; back to no adapter, as the bare base."""
    backend = _backend(tiny, 128, lora=tiny["adapter1"])
    prompt, first = _chat(backend)
    assert np.abs(first - _peft(tiny["peft1"], prompt)).max() < PEFT_TOL
    assert _chat(backend)[0] == prompt and backend.last_stats.reused_tokens > 0  # the prefix cache is in use

    backend.use_lora(tiny["adapter2"])
    assert backend.name == "local/tiny+adapter2"
    again, second = _chat(backend)
    assert again == prompt and backend.last_stats.reused_tokens == 0
    peft, merged = _peft(tiny["peft2"], prompt), _reference(tiny["merged2"], prompt)
    assert np.abs(second - peft).max() < PEFT_TOL and np.abs(second - first).max() > 1.0
    assert np.abs(second - merged).max() <= np.abs(peft - merged).max() + PEFT_TOL

    backend.use_lora(None)
    assert backend.name == "local/tiny"
    assert np.abs(_chat(backend)[1] - _reference(tiny["base"], prompt)).max() < PEFT_TOL
    assert backend.last_stats.reused_tokens == 0


def test_backends_sharing_a_base_each_run_with_their_own_adapter(tiny):
    """Two backends on one instance: when one swaps, the other's next call swaps its adapter back first."""
    one, two = (_backend(tiny, 96, lora=tiny["adapter1"]) for _ in range(2))
    assert one.load() is two.load()
    one.use_lora(tiny["adapter2"])
    prompt, logits = _chat(two)
    assert np.abs(logits - _peft(tiny["peft1"], prompt)).max() < PEFT_TOL
    prompt, logits = _chat(one)
    assert np.abs(logits - _peft(tiny["peft2"], prompt)).max() < PEFT_TOL


def test_bad_adapters_are_refused_clearly_and_change_nothing(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    # a module the trainer does not adapt
    mlp = tmp_path / "mlp"
    _checkpoint(tiny["base"], mlp, seed=3, targets=["q_proj", "gate_proj"])
    with pytest.raises(ValueError, match=r"gate_proj.*not a LoRA of an attention projection"):
        write_lora_gguf(mlp, tmp_path / "mlp.gguf")
    # an adapter whose shapes are not the base's
    other = tiny_qwen2_gguf(tmp_path / "wide.gguf", hidden=96)
    with pytest.raises(ValueError, match=r"blk\.0\.attn_\w+\.weight: base \(in, out\)"):
        write_lora_gguf(tiny["root"] / "ck1", tmp_path / "x.gguf", base_gguf=other)
    # half a pair
    half = tmp_path / "half"
    half.mkdir()
    for name in ("adapter_config.json", "fhirgym_base.json"):
        (half / name).write_bytes((tiny["root"] / "ck1" / name).read_bytes())
    weights = load_file(str(tiny["root"] / "ck1" / "adapter_model.safetensors"))
    save_file({k: v for k, v in weights.items() if "layers.1.self_attn.v_proj.lora_B" not in k},
              str(half / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"blk\.1\.attn_v\.weight: the checkpoint holds lora_A only"):
        write_lora_gguf(half, tmp_path / "half.gguf")
    # what llama.cpp's single alpha / r scale cannot express
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("adapter_model.safetensors", "fhirgym_base.json"):
        (odd / name).write_bytes((tiny["root"] / "ck1" / name).read_bytes())
    config = json.loads((tiny["root"] / "ck1" / "adapter_config.json").read_text())
    for change, message in (({"lora_alpha": 0}, "must be > 0"), ({"rank_pattern": {"q_proj": 8}}, "per-module"),
                            ({"use_dora": True}, "DoRA")):
        (odd / "adapter_config.json").write_text(json.dumps(config | change))
        with pytest.raises(ValueError, match=message):
            write_lora_gguf(odd, tmp_path / "odd.gguf")

    # llama.cpp refuses an adapter of another base, and the loaded one stays in place
    wide_ck = tmp_path / "wide_ck"
    _checkpoint(other, wide_ck, seed=4)
    wrong = write_lora_gguf(wide_ck, tmp_path / "wide_adapter.gguf")
    backend = _backend(tiny, 80, lora=tiny["adapter1"])
    before = _logits(backend.load(), tiny["tokens"])
    with pytest.raises(BackendError, match="could not load the LoRA adapter"):
        backend.use_lora(wrong)
    with pytest.raises(BackendError, match="does not exist"):
        backend.use_lora(tmp_path / "missing.gguf")
    assert backend.lora == str(tiny["adapter1"]) and backend.name == "local/tiny+adapter1"
    assert np.array_equal(_logits(backend.load(), tiny["tokens"]), before)
    with pytest.raises(BackendError, match="does not exist"):
        _backend(tiny, 81, lora=tmp_path / "missing.gguf").load()
    with pytest.raises(ValueError, match="lora=PATH"):
        LocalBackend(str(tiny["base"]), lora_path=str(tiny["adapter1"]))


def test_model_strings_name_a_base_plus_an_adapter(tiny, tmp_path):
    backend = make_backend(f"local/{tiny['base']}+{tiny['adapter1']}", n_ctx=64)
    assert backend.source == str(tiny["base"]) and backend.lora == str(tiny["adapter1"])
    assert backend.name == "local/tiny+adapter1"
    known = make_backend("local/qwen2.5-coder-0.5b+runs/sft.gguf")
    assert known.source == "qwen2.5-coder-0.5b" and known.lora.endswith("/runs/sft.gguf")
    plain = make_backend("local/models/a+b.gguf")  # a file whose name holds a "+" is one model
    assert plain.source == "models/a+b.gguf" and plain.lora is None
    with pytest.raises(ValueError, match="names an adapter and lora= names another"):
        make_backend("local/qwen2.5-coder-0.5b+a.gguf", lora="b.gguf")


def test_rl_export_adapter_writes_the_file_and_names_the_eval_model(tiny, tmp_path):
    from click.testing import CliRunner

    from fhirgym.cli import main

    out = tmp_path / "sft.gguf"
    result = CliRunner().invoke(main, ["rl", "export", "--checkpoint", str(tiny["root"] / "ck1"), "--out", str(out),
                                       "--adapter"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == tiny["adapter1"].read_bytes()
    assert f"--model local/{tiny['base']}+{out}" in result.output
    both = CliRunner().invoke(main, ["rl", "export", "--checkpoint", str(tiny["root"] / "ck1"), "--out", str(out),
                                     "--adapter", "--hf"])
    assert both.exit_code != 0 and "give one" in both.output
