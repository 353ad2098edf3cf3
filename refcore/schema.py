"""Parse op schema strings, in the spirit of ATen's ``native_functions.yaml``.

Grammar (one line)::

    name(Type arg[=default], ..., *, Type kwarg[=default], ...) -> Tensor

``Type`` is ``Tensor`` (compute dtype ``T``), ``Tensor(int32|int64)`` (explicit dtypes, ``T`` may
appear among them), or an attribute type from `refcore.spec.ATTR_TYPES`. A trailing ``?`` marks
an optional argument (``None`` allowed). Defaults are Python literals (``None``, ``True``, ``1e-5``,
``'none'``).

Example:
    >>> str(parse("gelu(Tensor input, str approximate='none') -> Tensor"))
    "gelu(Tensor input, str approximate='none') -> Tensor"
"""

from __future__ import annotations

import ast
import re

from refcore.spec import ATTR_TYPES, DTYPES, Arg, Signature

_SIG = re.compile(r"^\s*(?P<name>\w+)\s*\((?P<args>.*)\)\s*->\s*(?P<ret>[\w\[\], ()]+?)\s*$")
_ARG = re.compile(
    r"^(?P<type>Tensor(?:\((?P<dtypes>[\w|]+)\))?|[\w\[\]2|]+?)(?P<opt>\?)?\s+"
    r"(?P<name>\w+)(?:\s*=\s*(?P<default>.+))?$"
)


class SchemaError(ValueError):
    """A schema string that does not follow the grammar."""


def _split_top_level(text: str) -> list[str]:
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _parse_default(text: str, where: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise SchemaError(f"{where}: default {text!r} is not a Python literal") from e


def parse(schema: str) -> Signature:
    """Parse one schema string into a `Signature`; raise `SchemaError` naming the bad part."""
    m = _SIG.match(schema)
    if not m:
        raise SchemaError(f"schema {schema!r} does not match 'name(args) -> Tensor'")
    name, args, kwarg_only, seen = m["name"], [], False, set()
    for part in _split_top_level(m["args"]):
        if part == "*":
            kwarg_only = True
            continue
        am = _ARG.match(part)
        if not am:
            raise SchemaError(f"{name}: argument {part!r} is not 'Type name[=default]'")
        typ = "Tensor" if am["type"].startswith("Tensor") else am["type"]
        if typ != "Tensor" and typ not in ATTR_TYPES:
            raise SchemaError(
                f"{name}: argument {am['name']!r} has type {typ!r}; expected Tensor or one of "
                f"{', '.join(ATTR_TYPES)}"
            )
        dtypes = tuple(am["dtypes"].split("|")) if am["dtypes"] else ("T",)
        bad = [d for d in dtypes if d != "T" and d not in DTYPES]
        if bad:
            raise SchemaError(f"{name}: argument {am['name']!r} names unknown dtypes {bad}")
        if am["name"] in seen:
            raise SchemaError(f"{name}: argument {am['name']!r} appears twice")
        seen.add(am["name"])
        kw = {}
        if am["default"] is not None:
            kw["default"] = _parse_default(am["default"], f"{name}.{am['name']}")
        args.append(
            Arg(
                name=am["name"],
                type=typ,
                optional=bool(am["opt"]),
                kwarg_only=kwarg_only,
                dtypes=dtypes,
                **kw,
            )
        )
    _check_default_order(name, args)
    return Signature(name=name, args=tuple(args), returns=m["ret"].strip())


def _check_default_order(name: str, args: list[Arg]) -> None:
    seen_default = False
    for a in args:
        if a.kwarg_only:
            continue
        if a.has_default:
            seen_default = True
        elif seen_default:
            raise SchemaError(
                f"{name}: positional argument {a.name!r} without default follows one with"
            )
