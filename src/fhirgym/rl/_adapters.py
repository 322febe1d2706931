"""Thin shells over :class:`TextEpisode` for the RL frameworks: SkyRL's ``BaseTextEnv``, a
Gymnasium-style text env, and a TRL ``environment_factory`` class. Each adds no logic of its own, so
the same transcript gets the same reward in all three (``tests/test_rl.py`` holds them to it).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import orjson

from ..agents import parse_tool_calls
from ..env import get_config
from ._data import ENV_CLASSES, episode_for
from ._reward import RewardSpec
from ._text import TextEpisode, TextStep

# -- Gymnasium style -----------------------------------------------------------------------------------

class FhirTextEnv:
    """``reset(options={"extra_info": row}) -> (messages, info)``; ``step(text) -> (observations, reward,
    terminated, truncated, info)``. Gymnasium's signatures, with text for observations and actions."""

    def __init__(self, config: str | None = None, reward: RewardSpec | None = None) -> None:
        self.config, self.reward = config, reward  # config None: the row's
        self.text: TextEpisode | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        extra = dict((options or {}).get("extra_info") or {})
        if seed is not None and "seed" not in extra:
            extra["seed"] = seed
        self.close()
        self.text = episode_for(extra, self.config, self.reward)
        return self.text.reset(), {"task_id": extra.get("task_id"), "seed": extra.get("seed")}

    def step(self, action: str) -> tuple[list[dict], float, bool, bool, dict]:
        assert self.text is not None, "reset() first"
        out = self.text.step(action)
        truncated = out.done and out.info.get("stop") == "max_turns"
        return out.observations, out.reward, out.done and not truncated, truncated, out.info

    def close(self) -> None:
        if self.text is not None:
            self.text.close()
            self.text = None


# -- SkyRL ---------------------------------------------------------------------------------------------

def skyrl_env_class():
    """The ``skyrl_gym.envs.base_text_env.BaseTextEnv`` subclass (built on first use: skyrl-gym is optional)."""
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    class FhirSkyRLEnv(BaseTextEnv):
        """A fhirgym episode as a SkyRL text env; ``extras`` is the dataset row less prompt and env_class.

        The episode is built in :meth:`init`, not here: SkyRL's generator makes its environments on its
        asyncio event loop and runs ``init``/``step``/``close`` in its env thread pool
        (``environment.skyrl_gym.max_env_workers``), so building here would stall every rollout of the
        batch behind each instance's construction. The tools are the row's ``extra_info.config`` (SkyRL's
        ``env_config`` for these ids is always empty)."""

        def __init__(self, env_config: Any = None, extras: dict | None = None) -> None:
            super().__init__()
            extras = extras or {}
            self.extra = dict(extras.get("extra_info") or {})
            if extras.get("max_turns"):
                self.extra["max_turns"] = extras["max_turns"]
            self.config = env_config.get("config") if isinstance(env_config, Mapping) else None
            self.max_turns = int(self.extra.get("max_turns") or 12)
            self.text: TextEpisode | None = None

        def init(self, prompt: list[dict]) -> tuple[list[dict], dict]:
            if self.text is not None:
                self.text.close()
            self.text = episode_for(self.extra, self.config)
            return self.text.reset(), {}

        def step(self, action: str) -> BaseTextEnvStepOutput:
            if self.text is None:
                raise RuntimeError("init() the environment before stepping it")
            out: TextStep = self.text.step(action)
            self.turns = self.text.turns
            return BaseTextEnvStepOutput(observations=out.observations, reward=out.reward, done=out.done,
                                         metadata=out.info, postprocessed_action=None)

        def get_metrics(self) -> dict:
            verdict = None if self.text is None else self.text.verdict
            return {} if verdict is None else {"success": float(verdict.success), "turns": self.text.turns,
                                               "malformed_turns": self.text.malformed}

        def close(self) -> None:
            if self.text is not None:
                self.text.close()

    return FhirSkyRLEnv


def register_skyrl() -> None:
    """Register ``fhirgym-action`` and ``fhirgym-qa`` with skyrl-gym (call it inside SkyRL's Ray entrypoint
    too). One class serves both: the row's ``extra_info.track`` says which instance to build."""
    from skyrl_gym.envs.registration import register, registry

    cls = skyrl_env_class()
    for env_id in ENV_CLASSES.values():
        if env_id not in registry:
            register(id=env_id, entry_point=cls)


# -- TRL -----------------------------------------------------------------------------------------------

_PY_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list}


def _annotation(schema: dict) -> Any:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    types = [_PY_TYPES[k] for k in kinds if k in _PY_TYPES]
    if not types:
        return Any
    out = types[0]
    for t in types[1:]:
        out = out | t
    return out


def _tool_method(tool) -> Any:
    """A method named like the tool, with a signature and a Google-style docstring from its JSON schema
    (what TRL reads to show the tool to the model); calling it steps the episode."""
    props = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, schema in sorted(props.items(), key=lambda kv: kv[0] not in required):
        ann = _annotation(schema)
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ann,
                                        default=inspect.Parameter.empty if name in required else None))

    def method(self, *args, **kwargs) -> str:
        bound = method.__signature__.bind(self, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self" and v is not None}
        return self._call(tool.name, arguments)

    method.__name__ = method.__qualname__ = tool.name
    method.__signature__ = inspect.Signature(params, return_annotation=str)
    method.__annotations__ = {p.name: p.annotation for p in params[1:]} | {"return": str}
    args_doc = "\n".join(f"    {n}: {props[n].get('description', n)}" for n in (p.name for p in params[1:]))
    method.__doc__ = f"{tool.description}\n\nArgs:\n{args_doc}\n\nReturns:\n    The tool's JSON result." \
        if args_doc else f"{tool.description}\n\nReturns:\n    The tool's JSON result."
    return method


def trl_environment(config: str = "baseline", reward: RewardSpec | None = None) -> type:
    """A class for ``GRPOTrainer(environment_factory=...)``: ``reset(**row)``, one public method per tool of
    ``config`` (TRL shows every public method to the model as a tool, so there is no other). TRL ends a
    rollout on a reply without a tool call, which the environment never sees: the reward function hands
    that final text over with :func:`trl_reward`."""
    namespace: dict[str, Any] = {}
    for tool in get_config(config).tools:
        namespace[tool.name] = _tool_method(tool)

    def __init__(self) -> None:
        self.text = None

    def reset(self, **row) -> str | None:
        if self.text is not None:
            self.text.close()
        self.text = episode_for(row.get("extra_info") or {}, config, reward)
        self.text.reset()
        return None

    def _call(self, name: str, arguments: dict) -> str:
        if self.text.verdict is not None:
            return '{"error": {"message": "the episode is over"}}'
        return orjson.dumps(self.text.episode.step({"name": name, "arguments": arguments}).output,
                            default=str).decode()

    namespace.update(__init__=__init__, reset=reset, _call=_call,
                     __doc__="fhirgym episode for TRL's environment_factory (tools: "
                             + ", ".join(t.name for t in get_config(config).tools) + ").")
    return type("FhirTrlEnv", (), namespace)


def trl_tool_parsing(tokenizer: Any, config: str = "baseline") -> Any:
    """``tokenizer`` with its ``parse_response`` (what TRL's tool loop reads calls with) extended to the call
    forms :class:`TextEpisode` accepts. TRL's Qwen response template finds only ``<tool_call>``-tagged calls;
    the 0.5B mostly writes the bare JSON object, which every other adapter executes. Without this, TRL would
    end such a rollout on its first turn and the same transcript would score differently under TRL."""
    names = {t.name for t in get_config(config).tools}
    native = tokenizer.parse_response  # bound: TRL sets the response template on this same object later

    def one(parsed: Any) -> Any:
        if not isinstance(parsed, dict) or parsed.get("tool_calls"):
            return parsed
        calls, rest = parse_tool_calls(parsed.get("content") or "", names)
        if not calls:
            return parsed
        return {**parsed, "content": rest.strip(),
                "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in calls]}

    def parse_response(response: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            parsed = native(response, *args, **kwargs)
        except (ValueError, TypeError):  # e.g. a malformed tagged call: read the text as the episode would
            if not isinstance(response, str) and response and not isinstance(response[0], int):
                raise  # a batch: leave it to TRL's own fallback
            text = response if isinstance(response, str) else tokenizer.decode(response, skip_special_tokens=True)
            parsed = {"role": "assistant", "content": text.removesuffix(tokenizer.eos_token or "")}
        return [one(p) for p in parsed] if isinstance(parsed, list) else one(parsed)

    tokenizer.parse_response = parse_response
    return tokenizer


def trl_reward(env: Any, final_text: str | None) -> float:
    """Judge a TRL environment's episode on the model's final reply (once); the reward every adapter gives."""
    if env.text.verdict is None:
        env.text.finish(final_text)
    return env.text.last_reward
