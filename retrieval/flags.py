"""Flags derived from a settings dataclass: each field declared with :func:`opt` is one flag, with its help.

- :func:`add_flags` puts a class's flags on a parser (a group), :func:`from_args` reads the object back;
- :func:`to_argv` writes an object as the flags that make it again (what one command passes another:
  ``python -m retrieval.launch`` runs ``python -m retrieval.build`` from a :class:`~retrieval.settings.BuildSettings`);
- :func:`flag_of` and :func:`shown` name a field's flag and show its value in the flag's units, for messages.

A field without :func:`opt` (no help) is no flag: a library-only setting. No other retrieval import here.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field
from typing import Optional

MIB = 1 << 20


def opt(default, help: str, *, flag: Optional[str] = None, unit: int = 1, cli_default=None, choices=None):
    """A field with its flag: ``flag`` (default ``--field-name``), ``unit`` (the flag counts in units of this
    many: MiB for byte fields), ``cli_default`` (the command line's default, in flag units, where it differs
    from the library's), ``choices`` (a list, or a function returning one, called when the flags are made)."""
    return field(default=default, metadata=dict(help=help, flag=flag, unit=unit, cli_default=cli_default,
                                                 choices=choices))


def flagged(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are flags."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(cls, name: str) -> str:
    f = {x.name: x for x in dataclasses.fields(cls)}[name]
    return f.metadata.get("flag") or "--" + name.replace("_", "-")


def shown(cls, name: str, obj) -> str:
    """A field's value in its flag's units."""
    f = {x.name: x for x in dataclasses.fields(cls)}[name]
    v = getattr(obj, name)
    return f"{v / f.metadata['unit']:g}" if f.metadata.get("unit", 1) != 1 else str(v)


def _type_of(f) -> type:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return {"int": int, "float": float, "str": str, "bool": bool, "Optional[int]": int,
            "Optional[str]": str}[t]


def _dest(cls, f) -> str:
    return f"{cls.__name__}.{f.name}"


def _cli_default(f):
    md, unit = f.metadata, f.metadata.get("unit", 1)
    if md.get("cli_default") is not None:
        return md["cli_default"]
    return f.default // unit if unit != 1 else f.default


def add_flags(parser: argparse.ArgumentParser, cls, title: str, overrides: Optional[dict] = None) -> None:
    """One flag per field of ``cls``, in a group named ``title``. ``overrides``: field -> value (in the
    field's units) that replaces the command line's default (a command that fills some fields before the
    user's flags: the presets of ``python -m retrieval.launch``)."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - {f.name for f in flagged(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__} has no flagged field {sorted(unknown)}")
    group = parser.add_argument_group(title)
    for f in flagged(cls):
        md = f.metadata
        flag, unit = flag_of(cls, f.name), md.get("unit", 1)
        default = _cli_default(f)
        if f.name in overrides:
            default = overrides[f.name]
            default = default // unit if unit != 1 and default is not None else default
        kw = dict(dest=_dest(cls, f), help=md["help"] + (f" (default: {default})"
                                                         if default not in (None, "", False) else ""))
        typ = _type_of(f)
        if typ is bool:
            group.add_argument(flag, action="store_true", default=bool(default), **kw)
            continue
        choices = md.get("choices")
        choices = choices() if callable(choices) else choices
        group.add_argument(flag, type=typ, default=default, choices=choices,
                           metavar=None if choices else flag.lstrip("-").upper().replace("-", "_"), **kw)


def from_args(cls, args: argparse.Namespace):
    """The ``cls`` the parsed flags describe (flag units turned back into the field's)."""
    values = {}
    for f in flagged(cls):
        v = getattr(args, _dest(cls, f))
        unit = f.metadata.get("unit", 1)
        values[f.name] = type(f.default)(v * unit) if unit != 1 and v is not None else v
    return cls(**values)


def to_argv(obj) -> list[str]:
    """The flags that make ``obj`` again from its command line's defaults: every flagged field whose value
    differs from the command line's default (``from_args(parse(to_argv(obj))) == obj``)."""
    argv: list[str] = []
    for f in flagged(type(obj)):
        v, unit = getattr(obj, f.name), f.metadata.get("unit", 1)
        shown_v = v / unit if unit != 1 and v is not None else v
        if shown_v == _cli_default(f) and not (v is None and _cli_default(f) is not None):
            continue
        flag = flag_of(type(obj), f.name)
        if _type_of(f) is bool:
            if v:
                argv.append(flag)
            continue
        if v is None:
            raise ValueError(f"{flag}: None cannot be written as a flag (its command line's default is "
                             f"{_cli_default(f)})")
        argv += [flag, f"{shown_v:g}" if isinstance(shown_v, float) else str(shown_v)]
    return argv
