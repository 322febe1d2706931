"""A local model's chat template and grammar without its weights: what exact text and tokens it is shown.

Training data for a local model (behaviour cloning) must be the very token stream ``fhirgym eval`` feeds
llama.cpp, and a trained reply must be one the turn's grammar lets llama.cpp sample. So both come from
llama.cpp itself: the GGUF's own chat template rendered by llama-cpp-python's ``Jinja2ChatFormatter``
(the class ``create_chat_completion`` renders with, given the same template and special tokens), the
tokens from llama.cpp's tokenizer (``special=True``, no BOS: as the chat handler tokenizes), and a reply
checked token by token against the GBNF grammar with llama.cpp's grammar sampler. A vocab-only model
(metadata and tokenizer, no weights) is enough and loads in under a second.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import threading
from typing import Any

_lock = threading.Lock()
_models: dict[str, Any] = {}


def _vocab_model(path: str) -> Any:
    """One vocab-only ``Llama`` per file and process, closed at exit (llama.cpp's own finalizers fail once
    the interpreter has started tearing its modules down)."""
    with _lock:
        if path not in _models:
            from llama_cpp import Llama

            if not _models:
                atexit.register(_close_all)
            _models[path] = Llama(model_path=path, vocab_only=True, verbose=False)
        return _models[path]


def _close_all() -> None:
    with _lock:
        for model in _models.values():
            with contextlib.suppress(Exception):
                model.close()
        _models.clear()


class ChatTemplate:
    """The chat template, tokenizer and grammar checker of one GGUF file (its vocabulary only)."""

    def __init__(self, path: str) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.llama = _vocab_model(path)
        model = self.llama._model
        eos, bos = self.llama.token_eos(), self.llama.token_bos()
        self.eos_id = eos
        self.eos = model.token_get_text(eos) if eos != -1 else ""
        bos_text = model.token_get_text(bos) if bos != -1 else ""
        template = self.llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{path} has no chat template")
        self._prompt = Jinja2ChatFormatter(template=template, eos_token=self.eos, bos_token=bos_text,
                                           stop_token_ids=[eos])
        self._whole = Jinja2ChatFormatter(template=template, eos_token=self.eos, bos_token=bos_text,
                                          add_generation_prompt=False, stop_token_ids=[eos])

    def render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool = True) -> str:
        """The text llama.cpp is given (``generation_prompt``: ending where the model starts its turn)."""
        formatter = self._prompt if generation_prompt else self._whole
        return formatter(messages=messages, tools=tools).prompt

    def tokenize(self, text: str) -> list[int]:
        """Tokens as the chat handler makes them: special tokens parsed, no BOS added."""
        with _lock:
            return list(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def accepts(self, gbnf: str, reply: str) -> str | None:
        """None when the grammar lets llama.cpp sample ``reply`` and then end the turn; else where it stops."""
        import llama_cpp

        tokens = [*self.tokenize(reply), self.eos_id]
        with _lock:
            sampler = llama_cpp.llama_sampler_init_grammar(self.llama._model.vocab, gbnf.encode(), b"root")
            if not sampler:
                raise ValueError("llama.cpp rejected the grammar")
            data = (llama_cpp.llama_token_data * 1)()
            candidates = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
            try:
                for i, token in enumerate(tokens):
                    data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
                    candidates.size = 1
                    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
                    if data[0].logit == float("-inf"):
                        shown = "end of turn" if i == len(tokens) - 1 else repr(self.llama.detokenize([token]).decode(
                            "utf-8", "replace"))
                        done = self.llama.detokenize(tokens[:i]).decode("utf-8", "replace")
                        return f"the grammar refuses {shown} after {done[-60:]!r}"
                    llama_cpp.llama_sampler_accept(sampler, token)
            finally:
                llama_cpp.llama_sampler_free(sampler)
        return None
