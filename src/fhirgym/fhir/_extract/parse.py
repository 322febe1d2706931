"""The FHIRPath subset the walkers compile: paths, unions, ``as``/``ofType``, ``extension(url)``,
``where(field = 'x')``, ``where(resolve() is T)``, ``where(hasExtension(url))`` and ``[n]``.

Anything else raises :class:`Unsupported`, and that parameter falls back to fhirpathpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class Unsupported(Exception):
    """An expression outside the compiled subset (it falls back to fhirpathpy)."""


_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^'\\]|\\.)*')
      | (?P<num>\d+(?:\.\d+)?)
      | (?P<ext>%[A-Za-z_][A-Za-z0-9_]*)
      | (?P<id>[A-Za-z_][A-Za-z0-9_]*|`[^`]*`)
      | (?P<op>!=|<=|>=|[().\[\]|=,<>+\-*/&~])
    )""",
    re.X,
)


@dataclass(frozen=True, slots=True)
class Path:
    """One union branch: where it starts (type name, ``%resource`` or None = context) and its steps."""

    start: str | None
    steps: tuple[tuple, ...] = ()

    def plus(self, step: tuple) -> Path:
        return Path(self.start, (*self.steps, step))


def _tokenize(expr: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if not m or m.end() == pos:
            raise Unsupported(f"cannot tokenize at {expr[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        text = m.group(kind)
        if kind == "id" and text.startswith("`"):
            text = text[1:-1]
        tokens.append((kind, text))
        pos = m.end()
    return tokens


class Parser:
    """Recursive descent over the path subset; anything else raises :class:`Unsupported`."""

    def __init__(self, expr: str):
        self.toks = _tokenize(expr)
        self.i = 0

    def parse(self) -> list[Path]:
        paths = self.union()
        if self.i != len(self.toks):
            raise Unsupported(f"unexpected {self.toks[self.i][1]!r}")
        return paths

    def peek(self, text: str | None = None, kind: str | None = None) -> bool:
        if self.i >= len(self.toks):
            return False
        k, t = self.toks[self.i]
        return (text is None or t == text) and (kind is None or k == kind)

    def take(self, text: str | None = None, kind: str | None = None) -> str:
        if not self.peek(text, kind):
            got = self.toks[self.i][1] if self.i < len(self.toks) else "end"
            raise Unsupported(f"expected {text or kind}, got {got!r}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def union(self) -> list[Path]:
        paths = self.typed()
        while self.peek("|", "op"):
            self.i += 1
            paths += self.typed()
        return paths

    def typed(self) -> list[Path]:
        paths = self.postfix()
        while self.peek("as", "id"):
            self.i += 1
            t = self.take(kind="id")
            paths = [p.plus(("type", t)) for p in paths]
        return paths

    def postfix(self) -> list[Path]:
        paths = self.primary()
        while True:
            if self.peek(".", "op"):
                self.i += 1
                name = self.take(kind="id")
                if self.peek("(", "op"):
                    step = self.function(name)
                else:
                    step = ("child", name)
                paths = [p.plus(step) for p in paths]
            elif self.peek("[", "op"):
                self.i += 1
                n = int(self.take(kind="num"))
                self.take("]")
                paths = [p.plus(("index", n)) for p in paths]
            else:
                return paths

    def primary(self) -> list[Path]:
        if self.peek("(", "op"):
            self.i += 1
            paths = self.union()
            self.take(")")
            return paths
        if self.peek("%resource", "ext"):
            self.i += 1
            return [Path("%resource")]
        name = self.take(kind="id")
        if self.peek("(", "op"):
            raise Unsupported(f"function {name}() at start")
        if name[0].isupper():
            return [Path(name)]
        return [Path(None, (("child", name),))]

    def string(self) -> str:
        s = self.take(kind="str")
        return s[1:-1].replace("\\'", "'")

    def function(self, name: str) -> tuple:
        self.take("(")
        if name in ("as", "ofType"):
            step: tuple = ("type", self.take(kind="id"))
        elif name == "extension":
            step = ("ext", self.string())
        elif name == "where":
            step = self.condition()
        else:
            raise Unsupported(f"function {name}()")
        self.take(")")
        return step

    def condition(self) -> tuple:
        if self.peek("resolve", "id"):
            self.i += 1
            self.take("(")
            self.take(")")
            self.take("is")
            return ("resolve_is", self.take(kind="id"))
        if self.peek("hasExtension", "id"):
            self.i += 1
            self.take("(")
            url = self.string()
            self.take(")")
            return ("hasext", url)
        field = self.take(kind="id")
        self.take("=")
        return ("eq", field, self.string())


def split_top(expr: str, sep: str) -> list[str]:
    """``expr`` split at ``sep`` outside parentheses and string literals."""
    parts, depth, quote, start, i = [], 0, False, 0, 0
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == "'":
                quote = False
        elif ch == "'":
            quote = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and expr.startswith(sep, i):
            parts.append(expr[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts]
