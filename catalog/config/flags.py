"""Command-line flags and form fields generated from the config dataclasses.

Each field of ``ScienceConfig`` and ``ExecutionConfig`` carries its help text, and
optionally its flag, choices and kind, in its metadata; ``ncat`` and the explorer's
job form are built from ``specs()``, so a default or a help text is written once.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from catalog.core.arith import OPERATORS

BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "yes": True,
              "no": False, "1": True, "0": False}


def _bool(text: str) -> bool:
    word = text.strip().lower()
    if word not in BOOL_WORDS:
        raise ValueError(f"expected one of {', '.join(BOOL_WORDS)}, got {text!r}")
    return BOOL_WORDS[word]


def _operators(text: str) -> tuple[str, ...]:
    ops = tuple(c for c in text if not c.isspace() and c != ",")
    bad = [c for c in ops if c not in OPERATORS]
    if bad or not ops:
        raise ValueError(f"unknown operator(s) {''.join(bad)!r}; use some of + - * /")
    return ops


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _methods(text: str) -> tuple[str, ...]:
    named = {"both": ("exact", "attribution"), "exact": ("exact",),
             "attribution": ("attribution",)}
    return named.get(text.strip()) or _words(text)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(w) for w in text.split(",") if w.strip())


# how a field of each kind is read from text (a kind not here: the text itself)
PARSERS: dict[str, Callable[[str], Any]] = {
    "int": int, "float": float, "bool": _bool, "operators": _operators, "methods": _methods,
    "words": _words, "floats": _floats}


@dataclass(frozen=True)
class FieldSpec:
    """One config field as a user sees it."""

    name: str
    flag: str
    default: Any
    help: str
    kind: str  # int | float | bool | str | operators | methods | words | floats
    choices: tuple | None
    form: bool

    def parse(self, text: str) -> Any:
        """The field's value from what a user typed; ValueError names the flag."""
        try:
            return PARSERS.get(self.kind, str)(text)
        except ValueError as exc:
            raise ValueError(f"{self.flag}: {exc}") from None

    def show(self, value: Any) -> str:
        """How the value is written on a command line or in a form."""
        if self.kind == "operators":
            return "".join(value)
        if self.kind == "bool":
            return "on" if value else "off"
        if self.kind == "methods" and len(value) == 2:
            return "both"
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        return str(value)


def _kind(tp: Any, meta: dict) -> str:
    if "kind" in meta:
        return meta["kind"]
    return {int: "int", float: "float", str: "str", bool: "bool"}[tp]


def specs(cls) -> list[FieldSpec]:
    """The user-facing description of every field of a config dataclass."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        out.append(FieldSpec(
            name=f.name, flag=meta.get("flag") or "--" + f.name.replace("_", "-"),
            default=f.default, help=meta["help"], kind=_kind(hints[f.name], meta),
            choices=meta.get("choices"), form=bool(meta.get("form"))))
    return out


def add_arguments(parser: argparse.ArgumentParser, cls, base=None) -> None:
    """One optional flag per field of ``cls``; defaults shown from ``base`` (an instance)
    or the class. Values stay None unless given, so ``from_args`` can tell."""
    group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0])
    for spec in specs(cls):
        default = getattr(base, spec.name) if base is not None else spec.default
        shown = spec.show(default)
        if not shown.strip():  # a newline or a space: written as a Python string, '\n'
            shown = repr(shown)
        group.add_argument(spec.flag, dest=spec.name, default=None, metavar=spec.kind.upper(),
                           choices=spec.choices,
                           # argparse %-formats help texts: a literal % must be doubled
                           help=f"{spec.help} (default {shown})".replace("%", "%%"))


def from_args(cls, args: argparse.Namespace, base=None):
    """An instance of ``cls`` from parsed flags over ``base`` (default: the class's
    defaults). Raises ValueError naming the flag or field that is wrong."""
    values = {}
    for spec in specs(cls):
        text = getattr(args, spec.name, None)
        if text is not None:
            values[spec.name] = spec.parse(text)
    base = base if base is not None else cls()
    return dataclasses.replace(base, **values)
