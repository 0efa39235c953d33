"""The retrieval server's flags are its settings' fields: none without the other, every value reaches its field."""

from __future__ import annotations

import dataclasses

import pytest

from retrieval import server
from retrieval.flags import MIB, flag_of
from retrieval.settings import LoadConfig, ServeConfig, ServerConfig

CLASSES = (LoadConfig, ServerConfig, ServeConfig)


def _options() -> dict[str, str]:
    """flag -> dest of every option of ``python -m retrieval.server`` (help aside)."""
    return {s: a.dest for a in server.parser()._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_every_field_has_its_flag_and_every_flag_its_field():
    options = _options()
    fields = {f"{cls.__name__}.{f.name}": flag_of(cls, f.name) for cls in CLASSES for f in dataclasses.fields(cls)}
    assert {flag: dest for flag, dest in options.items()} == {flag: dest for dest, flag in fields.items()}


def _non_default(cls, f):
    """A valid value other than the field's default, in flag units."""
    unit = f.metadata.get("unit", 1)
    v = f.default
    if f.name == "kind":
        return "bm25"
    if f.name in ("host",):
        return "127.0.0.2"
    if isinstance(v, bool):
        return True
    if isinstance(v, float):
        return v + 1.5
    if isinstance(v, int) and not isinstance(v, bool):
        return v // unit + 3 if f.name != "default_topk" else 5
    if f.name == "threads":
        return 7
    return f"/x/{f.name}"


def test_every_value_reaches_its_field():
    argv = []
    want = {}
    for cls in CLASSES:
        for f in dataclasses.fields(cls):
            v = _non_default(cls, f)
            flag = flag_of(cls, f.name)
            argv += [flag] if v is True else [flag, str(v)]
            unit = f.metadata.get("unit", 1)
            want[(cls, f.name)] = v * unit if unit != 1 else v
    load, cfg, serve = server.parse(argv)
    for obj in (load, cfg, serve):
        for f in dataclasses.fields(obj):
            assert getattr(obj, f.name) == want[(type(obj), f.name)], f.name


def test_command_line_defaults_are_the_documented_ones():
    load, cfg, serve = server.parse(["--index", "x"])
    assert cfg.cache_bytes == 256 * MIB and ServerConfig().cache_bytes == 0  # the library's default is off
    assert cfg.max_query_chars == ServerConfig().max_query_chars and serve.host == "127.0.0.1"
    assert load.gpu_workspace_bytes == 256 * MIB and serve.threads is None


@pytest.mark.parametrize("argv, message", [
    (["--max-batch", "0"], "--max-batch must be >= 1"),
    (["--topk", "200"], "--topk must be between 1 and --max-topk"),
    (["--max-body-mb", "0"], "--max-body-mb must be >= 1"),
    (["--cache-mb", "-1"], "--cache-mb must be >= 0"),
    (["--gpu-workspace-mb", "0"], "--gpu-workspace-mb must be > 0"),
    (["--request-timeout-s", "0"], "--request-timeout-s must be > 0"),
    (["--port", "70000"], "--port must be between 0 and 65535"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--kind", "faiss"], "invalid choice"),
])
def test_bad_values_name_their_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        server.parse(["--index", "x", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
