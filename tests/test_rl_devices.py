"""Where ``rl train`` trains and generates, as a mapping from the spec to ``trl.GRPOConfig`` arguments (there
is no GPU here: the mapping, TRL's own checks of it and the command line's refusals are what is tested)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("trl")

from click.testing import CliRunner
from trl import GRPOConfig

from fhirgym.cli import main
from fhirgym.rl import TrainSpec
from fhirgym.rl._trainer import device_args, grpo_args

HF_MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def test_the_device_and_vllm_options_map_in_one_place(tmp_path):
    spec = TrainSpec(out=tmp_path)
    assert device_args(spec) == {"use_cpu": True, "bf16": False, "fp16": False, "use_vllm": False}
    cuda = TrainSpec(out=tmp_path, device="cuda")
    assert device_args(cuda) == {"use_cpu": False, "bf16": True, "fp16": False, "use_vllm": False}
    colocate = TrainSpec(out=tmp_path, device="cuda", model=HF_MODEL, use_vllm=True)
    assert device_args(colocate) == {"use_cpu": False, "bf16": True, "fp16": False, "use_vllm": True,
                                     "vllm_mode": "colocate"}
    server = TrainSpec(out=tmp_path, device="cuda", model=HF_MODEL, use_vllm=True, vllm_mode="server",
                       vllm_server_url="http://gpu-box:8000")
    assert device_args(server) == {"use_cpu": False, "bf16": True, "fp16": False, "use_vllm": True,
                                   "vllm_mode": "server", "vllm_server_base_url": "http://gpu-box:8000"}

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for s in (spec, cuda, colocate, server):
        args = grpo_args(s)
        assert device_args(s).items() <= args.items()  # grpo_args takes them from there, and only there
        assert set(args) <= fields, set(args) - fields  # every key is a TRL 1.16 GRPOConfig field
        # TRL's own checks of the rest (bf16 itself needs a GPU, which TrainingArguments looks for)
        GRPOConfig(**{**args, "bf16": False})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"use_vllm": True}, "vLLM generates on GPUs"),
    ({"device": "cuda", "use_vllm": True}, "not the GGUF 'qwen2.5-coder-0.5b'"),
    ({"device": "cuda", "use_vllm": True, "model": "weights/policy.gguf"}, "not the GGUF"),
    ({"device": "cuda", "model": HF_MODEL, "vllm_server_url": "http://x:8000"}, "needs --use-vllm --vllm-mode server"),
    ({"device": "tpu"}, "device 'tpu': one of cpu, cuda"),
    ({"device": "cuda", "use_vllm": True, "model": HF_MODEL, "vllm_mode": "remote"}, "vllm_mode 'remote'"),
])
def test_device_choices_that_cannot_work_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        device_args(TrainSpec(out=tmp_path, **kwargs))


def test_rl_train_refuses_vllm_on_the_cpu_before_loading_anything(tmp_path):
    result = CliRunner().invoke(main, ["rl", "train", "--use-vllm", "--out", str(tmp_path / "run")])
    assert result.exit_code != 0 and "vLLM generates on GPUs: use it with --device cuda" in result.output
    assert not (tmp_path / "run").exists()
