"""Figures of the report: matplotlib (Agg) → SVG data URIs, so report.html stays one offline file.

SVG inside ``<img src="data:...">`` keeps each figure sharp at any zoom and isolated (no id clashes
between inline SVGs); text is drawn as paths, so no font has to exist on the reader's machine.
Every figure has labelled axes with units and names its configs. One visual encoding throughout:
colour = config, hatch (bars) or line style (lines) = setting, so twenty (config, setting) groups
still need only one legend entry per config and per setting. Each function takes the metrics dict and
returns a data URI, or None when there is nothing to draw.
"""

from __future__ import annotations

import base64
import io
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

Metrics = dict[str, Any]

_STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "hatch.color": "#333333",
    "hatch.linewidth": 0.6,
    "svg.hashsalt": "fhirgym",  # deterministic SVG ids: the same numbers give the same file
    "svg.fonttype": "path",
}
_HATCHES = ["", "//", "..", "xx", "\\\\", "oo", "--", "++"]
_LINESTYLES = ["-", "--", ":", "-."]
_OUTCOME_MARKERS = {"pass": "o", "fail": "X", "error": "s"}


# ------------------------------------------------------------------ encoding


class _Enc:
    """Colour per config, hatch / line style per setting, short wrapped tick labels per group."""

    def __init__(self, m: Metrics) -> None:
        groups = m["meta"]["groups"]
        self.labels = [g["label"] for g in groups]
        self.configs = list(dict.fromkeys(g["config"] for g in groups))
        self.settings = list(dict.fromkeys(g["setting"] for g in groups))
        self.multi = len(self.settings) > 1
        cmap = plt.get_cmap("tab10")
        self.config_color = {c: cmap(i % 10) for i, c in enumerate(self.configs)}
        self.of = {g["label"]: (g["config"], g["setting"]) for g in groups}

    def color(self, label: str) -> Any:
        return self.config_color[self.of[label][0]]

    def hatch(self, label: str) -> str:
        return _HATCHES[self.settings.index(self.of[label][1]) % len(_HATCHES)]

    def linestyle(self, label: str) -> str:
        return _LINESTYLES[self.settings.index(self.of[label][1]) % len(_LINESTYLES)]

    def tick(self, label: str) -> str:
        config, setting = self.of[label]
        lines = textwrap.wrap(config, 14) or [config]
        if self.multi:
            lines += [f"({line})" if i == 0 else line for i, line in enumerate(textwrap.wrap(setting, 14))]
        return "\n".join(lines)

    def handles(self, labels: list[str], *, lines: bool = False) -> list[Any]:
        """Legend proxies: one per config present, then one per setting present (when several)."""
        configs = list(dict.fromkeys(self.of[lb][0] for lb in labels))
        settings = list(dict.fromkeys(self.of[lb][1] for lb in labels))
        if lines:
            out: list[Any] = [Line2D([], [], color=self.config_color[c], label=c, linewidth=2) for c in configs]
        else:
            out = [Patch(facecolor=self.config_color[c], label=c) for c in configs]
        if self.multi:
            for s in settings:
                i = self.settings.index(s)
                if lines:
                    out.append(Line2D([], [], color="#444444", linestyle=_LINESTYLES[i % 4], label=f"setting {s}"))
                else:
                    out.append(Patch(facecolor="white", edgecolor="#444444", hatch=_HATCHES[i % len(_HATCHES)],
                                     label=f"setting {s}"))
        return out


def _to_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fig(width: float = 7.5, height: float = 3.6, ncols: int = 1) -> tuple[Figure, Any]:
    return plt.subplots(1, ncols, figsize=(min(width, 15.0), height), layout="constrained", squeeze=True)


def _legend_below(ax: Any, handles: list[Any], title: str | None = None, ncols: int = 4) -> None:
    ax.legend(handles=handles, title=title, frameon=False, ncols=min(ncols, max(1, len(handles))),
              loc="upper left", bbox_to_anchor=(0, -0.2))


def _legend_right(ax: Any, handles: list[Any], title: str | None = None) -> None:
    ax.legend(handles=handles, title=title, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))


def _clipped(ys: list[float], sds: list[float], upper: float | None) -> list[list[float]]:
    """Asymmetric error bars: ± sd, cut at 0 and at ``upper`` (a rate cannot leave [0, 100])."""
    lo = [min(sd, y) for y, sd in zip(ys, sds)]
    hi = [min(sd, upper - y) if upper is not None else sd for y, sd in zip(ys, sds)]
    return [lo, hi]


def _grouped(ax: Any, enc: _Enc, cats: list[Any], value: dict[tuple[str, Any], float | None],
             err: dict[tuple[str, Any], float | None] | None = None, labels: list[str] | None = None,
             upper: float | None = None) -> list[str]:
    """Bars of every group side by side for each category on the x axis; returns the labels drawn."""
    labels = [lb for lb in (labels or enc.labels) if any(value.get((lb, c)) is not None for c in cats)]
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(cats))]
        ys = [value.get((label, c)) for c in cats]
        es = [(err or {}).get((label, c)) or 0.0 for c in cats]
        keep = [k for k, y in enumerate(ys) if y is not None]
        yerr = _clipped([ys[k] for k in keep], [es[k] for k in keep], upper) if err else None
        ax.bar([xs[k] for k in keep], [ys[k] for k in keep], width, yerr=yerr, capsize=2, color=enc.color(label),
               hatch=enc.hatch(label), edgecolor="white", linewidth=0.4, error_kw={"elinewidth": 0.9})
    ax.set_xticks(range(len(cats)), [str(c) for c in cats])
    return labels


def _group_axis(ax: Any, enc: _Enc, labels: list[str]) -> None:
    ax.set_xticks(range(len(labels)), [enc.tick(lb) for lb in labels], fontsize=10 if len(labels) <= 6 else 8.5)
    ax.set_xlabel("config" + (" (setting)" if enc.multi else ""))


def _width_per(n: int, per: float, base: float, lo: float = 5.0) -> float:
    return max(lo, per * n + base)


# ------------------------------------------------------------------ success


def success_overview(m: Metrics) -> str | None:
    rows = [r for r in m["success"] if r["mean"] is not None]
    if not rows:
        return None
    enc = _Enc(m)
    if enc.multi:
        return _success_by_setting(rows, enc)
    labels = [r["label"] for r in rows]
    fig, ax = _fig(_width_per(len(rows), 0.95, 2.0, 4.5), 3.8)
    ys = [r["mean"] for r in rows]
    ax.bar(range(len(rows)), ys, yerr=_clipped(ys, [r["sd"] or 0 for r in rows], 100), capsize=4,
           color=[enc.color(lb) for lb in labels], hatch=[enc.hatch(lb) for lb in labels], edgecolor="white")
    for x, r in enumerate(rows):
        txt = f"{r['mean']:.1f}" + (f"\n± {r['sd']:.1f}" if r["sd"] is not None else "")
        ax.text(x, min(r["mean"] + (r["sd"] or 0), 100) + 2, txt, ha="center", va="bottom", fontsize=8.5)
    _group_axis(ax, enc, labels)
    ax.set_ylim(0, 118)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("strict success rate (%)")
    ax.set_title("Success rate per config (mean ± sd over runs)")
    return _to_uri(fig)


def _success_by_setting(rows: list[dict[str, Any]], enc: _Enc) -> str:
    """Several settings: one cluster of config bars per setting, value printed above each bar."""
    configs = [c for c in enc.configs if any(enc.of[r["label"]][0] == c for r in rows)]
    width = 0.8 / len(configs)
    fig, ax = _fig(_width_per(len(rows), 0.6, 3.5, 7.0), 3.9)
    for r in rows:
        config, setting = enc.of[r["label"]]
        x = enc.settings.index(setting) + (configs.index(config) - (len(configs) - 1) / 2) * width
        [lo], [hi] = _clipped([r["mean"]], [r["sd"] or 0], 100)
        ax.bar(x, r["mean"], width, yerr=[[lo], [hi]], capsize=3, color=enc.color(r["label"]), edgecolor="white")
        ax.text(x, r["mean"] + hi + 1.5, f"{r['mean']:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(enc.settings)), enc.settings)
    ax.set_xlabel("setting")
    ax.set_ylim(0, 112)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("strict success rate (%)")
    ax.set_title("Success rate per config and setting (mean ± sd over runs)")
    _legend_right(ax, [Patch(facecolor=enc.config_color[c], label=c) for c in configs], "config")
    return _to_uri(fig)


def success_by(m: Metrics, field: str) -> str | None:
    rows = [r for r in m[f"success_by_{field}"] if r["mean"] is not None]
    if not rows:
        return None
    enc = _Enc(m)
    cats = sorted({r[field] for r in rows}, key=str)
    fig, ax = _fig(_width_per(len(cats) * len(enc.labels), 0.22, 3.0, 6.5), 3.8)
    drawn = _grouped(ax, enc, cats, {(r["label"], r[field]): r["mean"] for r in rows},
                     {(r["label"], r[field]): r["sd"] for r in rows}, upper=100)
    ax.set_ylim(0, 105)
    ax.set_ylabel("strict success rate (%)")
    ax.set_xlabel("task difficulty (1 = easiest, 3 = hardest)" if field == "difficulty" else "task category")
    ax.set_title(f"Success rate by {field} (mean ± sd over runs)")
    _legend_below(ax, enc.handles(drawn), "config", ncols=5)
    return _to_uri(fig)


def light_vs_strict(m: Metrics) -> str | None:
    rows = [r for r in m["light_success"] if r["n"]]
    if not rows:
        return None
    enc = _Enc(m)
    fig, ax = _fig(_width_per(len(rows), 1.1, 2.5, 5.0), 3.8)
    w = 0.38
    for off, key, name, color in ((-w / 2, "strict", "strict validator", "#37474f"),
                                  (w / 2, "light", "light validator", "#90a4ae")):
        ys = [r[f"{key}_mean"] or 0 for r in rows]
        ax.bar([i + off for i in range(len(rows))], ys, w, yerr=_clipped(ys, [r[f"{key}_sd"] or 0 for r in rows], 100),
               capsize=3, label=name, color=color)
    _group_axis(ax, enc, [r["label"] for r in rows])
    ax.set_ylim(0, 105)
    ax.set_ylabel("success on writing tasks (%)")
    ax.set_title("Writing tasks: strict vs light validator (mean ± sd over runs)")
    _legend_right(ax, ax.get_legend_handles_labels()[0], "validator")
    return _to_uri(fig)


def variance_stack(m: Metrics) -> str | None:
    rows = [r for r in m["variance"] if r["n"]]
    if not rows:
        return None
    enc = _Enc(m)
    fig, ax = _fig(_width_per(len(rows), 1.0, 3.5, 5.5), 3.9)
    parts = (("between_task", "between tasks", "#4c72b0"), ("within_task", "within task (variations)", "#55a868"),
             ("same_prompt", "same prompt (run to run)", "#c44e52"))
    bottom = [0.0] * len(rows)
    for key, name, color in parts:
        vals = [r[key] or 0.0 for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=name, color=color, width=0.6)
        for i, (v, b, r) in enumerate(zip(vals, bottom, rows)):
            share = r["share"][key]
            if share is not None and share >= 0.07:
                ax.text(i, b + v / 2, f"{100 * share:.0f}%", ha="center", va="center", color="white", fontsize=8.5)
        bottom = [b + v for b, v in zip(bottom, vals)]
    _group_axis(ax, enc, [r["label"] for r in rows])
    ax.set_ylabel("variance of success (%²)")
    ax.set_title("Variance decomposition of success (labels: share of the sum)")
    _legend_right(ax, ax.get_legend_handles_labels()[0], "component")
    return _to_uri(fig)


# ------------------------------------------------------------------ tools


def error_heatmap(m: Metrics, which: str) -> str | None:
    """Tool error rate per tool (``which="tool"``) or resource type, one column per group, n in each cell."""
    rows = m[f"tool_errors_by_{which}"]
    if not rows:
        return None
    enc = _Enc(m)
    labels = [lb for lb in enc.labels if any(r["label"] == lb for r in rows)]
    keys = sorted({r["key"] for r in rows})
    cell = {(r["key"], r["label"]): r for r in rows}
    data = [[cell[(k, lb)]["rate"] if (k, lb) in cell else float("nan") for lb in labels] for k in keys]
    fig, ax = _fig(_width_per(len(labels), 1.3 if enc.multi else 1.0, 3.8, 5.5), max(2.4, 0.5 * len(keys) + 1.8))
    vmax = max([v for row in data for v in row if v == v] + [10.0])
    cmap = plt.get_cmap("Reds").with_extremes(bad="#eeeeee")
    im = ax.imshow(data, cmap=cmap, vmin=0, vmax=vmax, aspect="auto")
    ax.grid(False)
    for i, k in enumerate(keys):
        for j, lb in enumerate(labels):
            r = cell.get((k, lb))
            if r is None:
                ax.text(j, i, "–", ha="center", va="center", fontsize=8, color="#777777")
                continue
            ax.text(j, i, f"{r['rate']:.0f}%\nn={r['calls']}", ha="center", va="center", fontsize=8,
                    color="white" if r["rate"] > 0.6 * vmax else "black", linespacing=1.1)
    ax.set_xticks(range(len(labels)), [enc.tick(lb) for lb in labels], fontsize=10 if len(labels) <= 6 else 8.5)
    ax.set_yticks(range(len(keys)), keys)
    ax.set_xlabel("config" + (" (setting)" if enc.multi else ""))
    ax.set_ylabel("tool" if which == "tool" else "FHIR resource type")
    ax.set_title(f"Tool error rate by {'tool' if which == 'tool' else 'resource type'} (n = tool calls)")
    fig.colorbar(im, ax=ax, label="tool calls with an error (%)", shrink=0.9)
    return _to_uri(fig)


def failure_modes(m: Metrics) -> str | None:
    rows = [r for r in m["failure_modes"] if r["n_failed"]]
    if not rows:
        return None
    modes = [k for k in rows[0]["counts"] if any(r["counts"].get(k) for r in rows)]
    if not modes:
        return None
    enc = _Enc(m)
    fig, ax = _fig(8.0, max(2.6, 0.18 * len(modes) * len(rows) + 1.5))
    h = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ys = [j + (i - (len(rows) - 1) / 2) * h for j in range(len(modes))]
        ax.barh(ys, [100 * r["counts"].get(k, 0) / r["n_failed"] for k in modes], h, color=enc.color(r["label"]),
                hatch=enc.hatch(r["label"]), edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(modes)), [k.replace("_", " ") for k in modes])
    ax.invert_yaxis()
    ax.set_xlabel("failed episodes showing the mode (% of the config's failed episodes)")
    ax.set_title("Failure modes of failed episodes (counts in the table)")
    _legend_right(ax, enc.handles([r["label"] for r in rows]), "config")
    return _to_uri(fig)


def tool_calls(m: Metrics) -> str | None:
    rows = [r for r in m["tool_calls"] if r["n"]]
    pts = m["tool_calls_by_expected"]
    if not rows:
        return None
    enc = _Enc(m)
    fig, (ax1, ax2) = _fig(12.0, 4.2, ncols=2)
    outcomes = [o for o in ("pass", "fail", "error") if any(r["outcome"] == o for r in rows)]
    drawn = _grouped(ax1, enc, outcomes, {(r["label"], r["outcome"]): r["mean_calls"] for r in rows},
                     {(r["label"], r["outcome"]): r["sd_calls"] for r in rows})
    width = 0.8 / max(1, len(drawn))
    for i, lb in enumerate(drawn):
        for j, o in enumerate(outcomes):
            r = next((r for r in rows if r["label"] == lb and r["outcome"] == o), None)
            if r is not None:
                x = j + (i - (len(drawn) - 1) / 2) * width
                ax1.hlines(r["mean_expected"], x - width / 2, x + width / 2, colors="black", linewidth=2.2)
    ax1.set_xlabel("outcome")
    ax1.set_ylabel("tool calls per episode (mean ± sd)")
    ax1.set_title("Tool calls by outcome (black: expected minimum)")
    hi = 1.0 + max((p["expected_min_calls"] for p in pts), default=0)
    for lb in enc.labels:
        for o in ("pass", "fail"):
            ps = [p for p in pts if p["label"] == lb and p["outcome"] == o]
            if ps:
                ax2.plot([p["expected_min_calls"] for p in ps], [p["mean_calls"] for p in ps],
                         marker=_OUTCOME_MARKERS[o], linestyle=enc.linestyle(lb), color=enc.color(lb),
                         markerfacecolor=enc.color(lb) if o == "pass" else "white", markersize=6)
    ax2.plot([0, hi], [0, hi], color="grey", linestyle=(0, (4, 3)), linewidth=1)
    ax2.set_xlabel("expected minimum tool calls (reference solution)")
    ax2.set_ylabel("mean tool calls per episode")
    ax2.set_title("Tool calls vs expected minimum")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [*enc.handles(drawn, lines=True),
               Line2D([], [], color="#444444", marker="o", linestyle="none", label="passed"),
               Line2D([], [], color="#444444", marker="X", markerfacecolor="white", linestyle="none", label="failed"),
               Line2D([], [], color="grey", linestyle=(0, (4, 3)), label="calls = expected minimum"),
               Line2D([], [], color="black", linewidth=2.2, label="expected minimum (left)")]
    _legend_right(ax2, handles)
    return _to_uri(fig)


# ------------------------------------------------------------------ tokens


def _k(x: float, _pos: Any = None) -> str:
    return f"{x / 1000:.0f}k" if abs(x) >= 1000 else f"{x:.0f}"


def tokens(m: Metrics) -> str | None:
    if not any(r["n"] for r in m["tokens_by_config"]):
        return None
    enc = _Enc(m)
    fig, axes = _fig(13.0, 4.0, ncols=3)
    outcome_rows = m["tokens_by_outcome"]
    outcomes = [o for o in ("pass", "fail", "error") if any(r["key"] == o for r in outcome_rows)]
    drawn = _grouped(axes[0], enc, outcomes, {(r["label"], r["key"]): r["mean_total"] for r in outcome_rows})
    axes[0].set_xlabel("outcome")
    axes[0].set_title("by outcome")
    diff_rows = m["tokens_by_difficulty"]
    diffs = sorted({r["key"] for r in diff_rows}, key=str)
    _grouped(axes[1], enc, diffs, {(r["label"], r["key"]): r["mean_total"] for r in diff_rows})
    axes[1].set_xlabel("task difficulty (1 = easiest, 3 = hardest)")
    axes[1].set_title("by difficulty")
    for lb in enc.labels:
        ps = sorted((r for r in m["tokens_by_expected_calls"] if r["label"] == lb), key=lambda r: r["key"])
        if ps:
            axes[2].plot([r["key"] for r in ps], [r["mean_total"] for r in ps], marker="o", color=enc.color(lb),
                         linestyle=enc.linestyle(lb), markersize=4)
    axes[2].set_xlabel("expected minimum tool calls")
    axes[2].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_title("by expected tool calls")
    for ax in axes:
        ax.set_ylabel("mean tokens per episode")
        ax.yaxis.set_major_formatter(FuncFormatter(_k))
    setting_lines = [h for h in enc.handles(drawn, lines=True) if h.get_label().startswith("setting ")]
    _legend_right(axes[2], [*enc.handles(drawn), *setting_lines], "config")
    fig.suptitle("Token usage: prompt + completion tokens per episode (k = thousand)")
    return _to_uri(fig)


def token_cv(m: Metrics) -> str | None:
    rows = [r for r in m["token_cv"] if r["n"]]
    if not rows:
        return None
    enc = _Enc(m)
    levels = [("same_prompt", "same prompt\n(run to run)"), ("within_task", "within task\n(across variations)"),
              ("overall", "overall\n(all episodes)")]
    fig, ax = _fig(_width_per(3 * len(rows), 0.25, 4.5, 7.0), 3.8)
    drawn = _grouped(ax, enc, [name for _, name in levels],
                     {(r["label"], name): r[key] for r in rows for key, name in levels},
                     labels=[r["label"] for r in rows])
    ax.set_xlabel("level")
    ax.set_ylabel("CV of tokens per episode (sd / mean)")
    ax.set_title("Token usage variability (coefficient of variation)")
    _legend_right(ax, enc.handles(drawn), "config")
    return _to_uri(fig)


# ------------------------------------------------------------------ reliability and comparisons


def pass_k(m: Metrics) -> str | None:
    """pass@k (solid) and pass^k (dashed) against k, one panel per setting, colour per config."""
    rows = m["pass_k"]
    if not rows:
        return None
    enc = _Enc(m)
    settings = [s for s in enc.settings if any(enc.of[r["label"]][1] == s for r in rows)]
    fig, axes = _fig(max(7.0, 4.6 * len(settings) + 2), 3.8, ncols=len(settings))
    axes = [axes] if len(settings) == 1 else list(axes)
    for ax, setting in zip(axes, settings):
        for lb in enc.labels:
            ps = [r for r in rows if r["label"] == lb]
            if ps and enc.of[lb][1] == setting:
                ks = [r["k"] for r in ps]
                ax.plot(ks, [r["pass_at_k"] for r in ps], marker="o", color=enc.color(lb))
                ax.plot(ks, [r["pass_hat_k"] for r in ps], marker="s", linestyle="--", color=enc.color(lb),
                        markerfacecolor="white")
        ax.set_ylim(0, 105)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("k (attempts of the same task variation)")
        ax.set_ylabel("success (%)")
        ax.set_title(f"setting {setting}" if enc.multi else "pass@k (any of k) and pass^k (all k succeed)")
    if enc.multi:
        fig.suptitle("pass@k (any of k succeeds) and pass^k (all k succeed)")
    configs = list(dict.fromkeys(enc.of[r["label"]][0] for r in rows))
    handles = [Line2D([], [], color=enc.config_color[c], linewidth=2, label=c) for c in configs]
    handles += [Line2D([], [], color="#444444", marker="o", label="pass@k"),
                Line2D([], [], color="#444444", marker="s", linestyle="--", markerfacecolor="white", label="pass^k")]
    _legend_right(axes[-1], handles, "config")
    return _to_uri(fig)


def paired(m: Metrics) -> str | None:
    rows = [r for r in m["paired"] if r["diff"] is not None]
    if not rows:
        return None
    multi = len({x["setting"] for x in rows}) > 1
    fig, ax = _fig(8.0, max(2.2, 0.42 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        color = "#c44e52" if r["significant"] else "#4c72b0"
        lo = r["ci_low"] if r["ci_low"] is not None else r["diff"]
        hi = r["ci_high"] if r["ci_high"] is not None else r["diff"]
        ax.errorbar(r["diff"], i, xerr=[[r["diff"] - lo], [hi - r["diff"]]], fmt="o", color=color, capsize=4)
    ax.axvline(0, color="grey", linewidth=1)

    def name(label: str) -> str:
        return label.split(" · ")[0] if multi else label

    ax.set_yticks(range(len(rows)), [f"{name(r['b'])} − {name(r['a'])}" + (f"  [{r['setting']}]" if multi else "")
                                     for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("difference in success rate, B − A (percentage points; 95% bootstrap CI)")
    ax.set_title("Paired comparisons (red: significant, Holm-adjusted McNemar p < 0.05)")
    return _to_uri(fig)


def all_figures(m: Metrics) -> dict[str, str | None]:
    """Every figure of the report by id (None: no data for it), drawn in the report's style."""
    makers = {
        "success": success_overview,
        "success_by_category": lambda m: success_by(m, "category"),
        "success_by_difficulty": lambda m: success_by(m, "difficulty"),
        "light_success": light_vs_strict,
        "pass_k": pass_k,
        "paired": paired,
        "variance": variance_stack,
        "tool_calls": tool_calls,
        "tool_errors_by_tool": lambda m: error_heatmap(m, "tool"),
        "tool_errors_by_resource": lambda m: error_heatmap(m, "resource"),
        "failure_modes": failure_modes,
        "tokens": tokens,
        "token_cv": token_cv,
    }
    with plt.rc_context(_STYLE):
        return {name: fn(m) for name, fn in makers.items()}
