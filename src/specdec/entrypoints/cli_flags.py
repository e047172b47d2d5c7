"""Command-line flags derived from the config dataclasses, so every field is a flag.

Owns turning the fields of a frozen dataclass (`SpecConfig`, `SamplingParams`) into
argparse flags (`--max-draft-len`, `--top-k`, ...), with the field's default and its source
comment as help text, and turning parsed flags back into the dataclass (its own
`__post_init__` then validates the values). A field added to a config later becomes a flag
with no change here. Knows nothing of models or strategies.

A field whose metadata names a `part` class (a `SpecConfig` part such as `CacheConfig`) is not a flag
itself: its own fields are, under their flat names, and `dataclass_from_flags` passes them
flat (the config routes each name to its part).

Value syntax by annotation: ints and floats as usual; `int | None` also takes "none";
booleans are `--flag` / `--no-flag`; `bool | str` ("auto" knobs) takes auto/true/false;
tuples of ints are comma lists ("1,4,7"); dicts are JSON ('{"eagle3": {"seed": 1}}').
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import tokenize

__all__ = ["add_dataclass_flags", "dataclass_from_flags", "field_comments"]

_NONE = ("none", "null", "")
_TRUE = ("true", "on", "yes", "1")
_FALSE = ("false", "off", "no", "0")


def field_comments(cls) -> dict[str, str]:
    """Field name -> the comment on its line in the class source (the field's description)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments, line_field = {}, {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line_field[node.lineno] = node.target.id
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in line_field:
            comments[line_field[tok.start[0]]] = tok.string.lstrip("#").strip()
    return comments


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int_or_none(text: str):
    if text.strip().lower() in _NONE:
        return None
    return _int(text)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _auto_bool(text: str):
    low = text.strip().lower()
    if low == "auto":
        return "auto"
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}")


def _int_list(text: str) -> tuple[int, ...]:
    parts = [p for p in text.replace(" ", ",").split(",") if p]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 1,4,7, got {text!r}") from None


def _int_list_or_none(text: str):
    return None if text.strip().lower() in _NONE else _int_list(text)


def _auto_int(text: str):
    return "auto" if text.strip().lower() == "auto" else _int(text)


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"eagle3\": {{}}}}', got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


_PARSERS = {
    "int": (_int, "N"),
    "float": (_float, "X"),
    "str": (str, "NAME"),
    "int | None": (_int_or_none, "N|none"),
    "float | None": (lambda t: None if t.strip().lower() in _NONE else _float(t), "X|none"),
    "bool | str": (_auto_bool, "auto|true|false"),
    "int | str": (_auto_int, "auto|N"),
    "tuple[int, ...]": (_int_list, "I,J,..."),
    "tuple[int, ...] | None": (_int_list_or_none, "I,J,...|none"),
    "dict": (_json_dict, "JSON"),
}


def _leaf_fields(cls) -> list[tuple[type, dataclasses.Field]]:
    """(owner class, field) for every flag of `cls`: its fields, a part's fields in its place."""
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("part"):
            out += _leaf_fields(f.metadata["part"])
        else:
            out.append((cls, f))
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_dataclass_flags(
    group,
    cls,
    *,
    prefix: str,
    skip: tuple[str, ...] = (),
    defaults: dict | None = None,
    extra_help: dict[str, str] | None = None,
    shown: dict[str, str] | None = None,
) -> None:
    """One flag per field of `cls` (except `skip`), stored as `{prefix}{field}`.

    Args:
        group: an argparse parser or argument group.
        prefix: dest prefix, so fields of two dataclasses never collide ("cfg_", "sp_").
        defaults: CLI defaults that differ from the dataclass's (shown in the help).
        extra_help: text appended to a field's description (e.g. the installed strategy names).
        shown: how a default is shown in the help when its value says too little (None, say).
    """
    comments = {}
    defaults = defaults or {}
    extra_help = extra_help or {}
    shown_as = shown or {}
    for owner, f in _leaf_fields(cls):
        if f.name in skip:
            continue
        if owner not in comments:
            comments[owner] = field_comments(owner)
        default = defaults.get(f.name, _default(f))
        text = comments[owner].get(f.name, f.name.replace("_", " "))
        if f.name in extra_help:
            text = f"{text}; {extra_help[f.name]}"
        text = text.replace("%", "%%")
        dest = prefix + f.name
        kind = str(f.type)
        if kind == "bool":
            group.add_argument(_flag(f.name), dest=dest, action=argparse.BooleanOptionalAction, default=default,
                               help=text + " (default: %(default)s)")
            continue
        parse, metavar = _PARSERS.get(kind, (_literal, "VALUE"))
        shown = shown_as.get(f.name, _show(default))
        group.add_argument(_flag(f.name), dest=dest, type=parse, default=default, metavar=metavar,
                           help=f"{text} (default: {str(shown).replace('%', '%%')})")


def _show(default) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "none"
    if isinstance(default, dict):
        return json.dumps(default)
    return "none" if default is None else str(default)


def _literal(text: str):
    """Unknown annotations: a Python/JSON literal when it parses, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def dataclass_from_flags(cls, args: argparse.Namespace, *, prefix: str, **overrides):
    """`cls(**fields)` from the parsed flags, parts' fields by their flat names (`overrides` win);
    the dataclass validates them."""
    kw = {}
    for _, f in _leaf_fields(cls):
        dest = prefix + f.name
        if hasattr(args, dest):
            kw[f.name] = getattr(args, dest)
    kw.update(overrides)
    return cls(**kw)
