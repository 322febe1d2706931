"""The four experiment settings of the paper: which instances train a memory and which evaluate it.

    same         train 1 variation per family, evaluate the same one (the positive control)
    unseen       train variations 0,1; evaluate variations 2,3,4 of the same families
    paraphrased  as unseen, prompts paraphrased in training (phrasing 1) and evaluation (phrasing 2)
    held-out     train variations 0,1 of the split's train families; evaluate variations 2,3,4 of its
                 eval families, paraphrased (the split is fixed and shipped: ``tasks.heldout_split``)

Outside ``same``, a training and an evaluation instance never share a (family, seed): :func:`plan_setting`
checks it and refuses a plan that would break it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tasks import heldout_split, select

SETTINGS = ("same", "unseen", "paraphrased", "held-out")
DEFAULT_SEEDS = {"same": ([0], [0]), "unseen": ([0, 1], [2, 3, 4]), "paraphrased": ([0, 1], [2, 3, 4]),
                 "held-out": ([0, 1], [2, 3, 4])}
#: (training paraphrase, evaluation paraphrase): 0 = the template prompt
PARAPHRASES = {"same": (0, 0), "unseen": (0, 0), "paraphrased": (1, 2), "held-out": (1, 2)}


class SettingError(ValueError):
    pass


@dataclass(frozen=True)
class SettingPlan:
    name: str
    train_tasks: list[str]
    train_seeds: list[int]
    train_paraphrase: int
    eval_tasks: list[str]
    eval_seeds: list[int]
    eval_paraphrase: int
    notes: list[str] = field(default_factory=list)

    def train_instances(self) -> set[tuple[str, int]]:
        return {(t, s) for t in self.train_tasks for s in self.train_seeds}

    def eval_instances(self) -> set[tuple[str, int]]:
        return {(t, s) for t in self.eval_tasks for s in self.eval_seeds}


def plan_setting(name: str, tasks: str = "default", train_seeds: list[int] | None = None,
                 eval_seeds: list[int] | None = None) -> SettingPlan:
    """The train and evaluation instances of setting ``name`` over the families ``tasks`` selects."""
    if name not in SETTINGS:
        raise SettingError(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}")
    default_train, default_eval = DEFAULT_SEEDS[name]
    train_seeds = list(train_seeds if train_seeds is not None else default_train)
    eval_seeds = list(eval_seeds if eval_seeds is not None else default_eval)
    try:
        chosen = [f.id for f in select(tasks)]
    except KeyError as exc:
        raise SettingError(str(exc.args[0])) from None
    if not chosen:
        raise SettingError(f"tasks {tasks!r} select no family")
    train_tasks = eval_tasks = chosen
    if name == "held-out":
        split = heldout_split()
        train_tasks = [t for t in chosen if t in split["train"]]
        eval_tasks = [t for t in chosen if t in split["eval"]]
        if not train_tasks or not eval_tasks:
            raise SettingError(f"tasks {tasks!r} leave one side of the held-out split empty")
    tp, ep = PARAPHRASES[name]
    plan = SettingPlan(name, train_tasks, train_seeds, tp, eval_tasks, eval_seeds, ep)
    if name == "same":
        if plan.eval_instances() - plan.train_instances():
            raise SettingError("same: every evaluated variation must be a trained one")
    elif plan.train_instances() & plan.eval_instances():
        shared = sorted(plan.train_instances() & plan.eval_instances())[:3]
        raise SettingError(f"{name}: training and evaluation share (family, seed) {shared}")
    return plan
