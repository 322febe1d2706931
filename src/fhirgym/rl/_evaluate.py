"""The RL evaluation protocol: ``n`` passes per held-out prompt, the way RL papers report a policy.

``rl_eval`` runs every row of a split ``n`` times as a :class:`TextEpisode` (the environment training uses) and reports
the mean reward ± its standard deviation over the ``n`` pass means, pass@k for k = 1 … n (the unbiased estimator 1 −
C(n−c, k)/C(n, k) per prompt, averaged), the mean number of turns, breakdowns by resource type (of the family, or the QA
question's gold types) and by answer shape (QA shape; action tasks: ``write`` or ``read``), and what the policy did
(:mod:`fhirgym.rl._behaviour`: the share of negative answers, mean calls, answers without a look). The policy is either
a torch model with its tokenizer (a LoRA checkpoint, a GGUF dequantised by transformers, any HF model) sampled with
``generate``, or a fhirgym chat backend (``local/…`` GGUF on llama.cpp, ``openai/…``, ``openai-compatible/…``
endpoints). Episodes go to ``episodes.jsonl``, the report to ``report.json`` (docs/RL.md).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ._behaviour import behaviour_of, figures
from ._data import DEFAULT_QA, DEFAULT_WORLD, dataset_rows, episode_for
from ._text import TextEpisode


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` successes in ``n`` samples (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _torch_sampler(model: Any, tokenizer: Any, max_new_tokens: int, temperature: float, seed: int):
    """``sample(list of message lists) -> list of reply texts``, batched, left-padded."""
    import torch

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def sample(conversations: list[list[dict]]) -> list[str]:
        texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        kwargs = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
        if temperature > 0:
            kwargs["temperature"] = temperature
        with torch.no_grad():
            out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **kwargs)
        new = out[:, enc["input_ids"].size(1):]
        return [tokenizer.decode(row, skip_special_tokens=True) for row in new]

    return sample


def _backend_sampler(backend: Any, max_new_tokens: int, temperature: float):
    """The same over a fhirgym chat backend; its parsed tool calls are written back as ``<tool_call>`` text."""

    def sample(conversations: list[list[dict]]) -> list[str]:
        out = []
        for c in conversations:
            r = backend.chat(c, temperature=temperature, max_tokens=max_new_tokens)
            calls = "".join("<tool_call>\n" + json.dumps({"name": t.name, "arguments": t.arguments}) + "\n</tool_call>"
                            for t in r.tool_calls)
            out.append((r.text or "") + calls)
        return out

    return sample


def _labels(text: TextEpisode) -> tuple[list[str], str]:
    fam = text.episode.instance.family
    question = getattr(fam, "question", None)
    if question is not None:
        return (question.gold_types or ["(none)"]), question.shape
    return list(fam.resource_types) or ["(none)"], "write" if fam.writes else "read"


def run_passes(sample, rows: list[dict], n: int, *, config: str = "baseline", max_turns: int = 12,
               episodes_file: Path | None = None) -> list[dict]:
    """Every row ``n`` times, the ``n`` passes of a row sampled together turn by turn; one dict per episode."""
    results = []
    for row in rows:
        extra = {**row["extra_info"], "max_turns": max_turns}
        texts = [episode_for(extra, config) for _ in range(n)]
        chats = [t.reset() for t in texts]
        live = list(range(n))
        ends: dict[int, Any] = {}
        while live:
            replies = sample([chats[i] for i in live])
            still = []
            for i, reply in zip(live, replies, strict=True):
                step = texts[i].step(reply)
                chats[i] = [*chats[i], {"role": "assistant", "content": reply}, *step.observations]
                if step.done:
                    ends[i] = step
                else:
                    still.append(i)
            live = still
        for i, t in enumerate(texts):
            types, shape = _labels(t)
            results.append({"task_id": extra["task_id"], "seed": extra.get("seed"),
                            "question_id": extra.get("question_id"), "pass": i, "reward": ends[i].reward,
                            "success": bool(ends[i].info.get("success")), "turns": t.turns,
                            "stop": ends[i].info.get("stop"), "resource_types": types, "shape": shape,
                            "behaviour": behaviour_of(t, t.episode.answer), "transcript": chats[i][2:]})
            t.close()
    if episodes_file is not None:
        episodes_file.parent.mkdir(parents=True, exist_ok=True)
        with open(episodes_file, "w") as fh:
            for r in results:
                fh.write(json.dumps(r, default=str) + "\n")
    return results


def summarise(results: list[dict], n: int) -> dict[str, Any]:
    """Mean ± sd (over the n pass means), pass@k, mean turns, breakdowns by resource type and shape."""
    by_prompt: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        by_prompt[(r["task_id"], r["seed"], r["question_id"])].append(r)
    pass_means = [statistics.fmean(r["reward"] for r in results if r["pass"] == p) for p in range(n)]

    def block(rs: list[dict]) -> dict[str, Any]:
        return {"episodes": len(rs), "mean": statistics.fmean(r["reward"] for r in rs),
                "success": statistics.fmean(r["success"] for r in rs)}

    by_type: dict[str, list[dict]] = defaultdict(list)
    by_shape: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        for t in r["resource_types"]:
            by_type[t].append(r)
        by_shape[r["shape"]].append(r)
    return {
        "prompts": len(by_prompt), "episodes": len(results), "n": n,
        "mean": statistics.fmean(r["reward"] for r in results),
        "sd": statistics.stdev(pass_means) if n > 1 else 0.0,
        "pass_means": pass_means,
        "pass@k": {str(k): statistics.fmean(pass_at_k(n, sum(r["success"] for r in rs), k)
                                            for rs in by_prompt.values()) for k in range(1, n + 1)},
        "mean_turns": statistics.fmean(r["turns"] for r in results),
        "behaviour": figures([r["behaviour"] for r in results]),
        "by_resource_type": {k: block(v) for k, v in sorted(by_type.items())},
        "by_shape": {k: block(v) for k, v in sorted(by_shape.items())},
    }


def rl_eval(model: Any, tokenizer: Any = None, *, track: str = "action", split: str = "test", tasks: str = "all",
            per_family: int = 4, n: int = 4, world: dict | None = None, qa: dict | None = None,
            config: str = "baseline", max_turns: int = 6, max_new_tokens: int = 512, temperature: float = 1.0,
            seed: int = 0, out: Path | None = None, example: bool = False) -> dict[str, Any]:
    """Evaluate a policy on a split: ``model`` is a torch model (with ``tokenizer``) or a chat backend."""
    rows = dataset_rows(track, split, tasks=tasks, per_family=per_family, world=world or DEFAULT_WORLD,
                        max_turns=max_turns, qa=qa or DEFAULT_QA, config=config, example=example)
    if not rows:
        raise ValueError(f"--tasks {tasks!r} gives no {split} rows on the {track} track")
    sample = (_backend_sampler(model, max_new_tokens, temperature) if hasattr(model, "chat")
              else _torch_sampler(model, tokenizer, max_new_tokens, temperature, seed))
    results = run_passes(sample, rows, n, config=config, max_turns=max_turns,
                         episodes_file=out / "episodes.jsonl" if out else None)
    report = {"track": track, "split": split, "tasks": tasks, **summarise(results, n)}
    if out:
        (out / "report.json").write_text(json.dumps(report, indent=1))
    return report
