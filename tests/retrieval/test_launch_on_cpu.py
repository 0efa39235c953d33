"""python -m retrieval.launch: presets become settings objects, the server gets the objects, a missing index is
built in a child process, and the build's flags are derived from its settings."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from retrieval import launch, server
from retrieval.flags import from_args, to_argv
from retrieval.settings import BuildSettings, LoadConfig, ServeConfig, ServerConfig


def test_flags_derived_from_an_object_make_the_same_object():
    import retrieval.build as build

    chosen = BuildSettings(corpus="c.jsonl", out="idx", kind="bm25", encoder="e5", factory="IVF16,PQ8",
                           batch_size=7, pooling="cls", limit=30, strict=True, nprobe=5, recall_sample=0)
    assert from_args(BuildSettings, build.parser().parse_args(to_argv(chosen))) == chosen
    assert to_argv(BuildSettings(corpus="c", out="o")) == ["--corpus", "c", "--out", "o"]  # defaults not written
    served = (LoadConfig(index="x", gpu=True, gpu_workspace_bytes=64 << 20, rerank="m"),
              ServerConfig(max_batch=17, cache_bytes=3 << 20, max_wait_ms=2.5),
              ServeConfig(host="0.0.0.0", port=0, threads=9))
    assert server.parse([a for c in served for a in to_argv(c)]) == served
    # the command line's cache default (256 MiB) differs from the library's (0): written when off
    assert "--cache-mb" in to_argv(ServerConfig()) and server.parse(["--index", "x"])[1].cache_bytes == 256 << 20


def test_build_flags_are_the_settings_fields():
    import retrieval.build as build

    flags = {s for a in build.parser()._actions for s in a.option_strings} - {"-h", "--help"}
    fields = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(BuildSettings) if f.name != "progress"}
    assert flags == fields


def _wiki18(tmp_path):
    d = tmp_path / "wiki18"
    d.mkdir()
    for name in ("e5_Flat.index", "wiki-18.jsonl"):
        (d / name).write_text("")
    return d


def test_presets_are_objects_and_flags_after_the_separator_win(tmp_path):
    d = _wiki18(tmp_path)
    p = launch.plan(["e5-cpu", "--wiki18", str(d), "--port", "8123", "--", "--max-batch", "512", "--threads", "9"])
    assert p.build is None and isinstance(p.load, LoadConfig)
    assert (p.load.index, p.load.corpus, p.load.encoder) == (str(d / "e5_Flat.index"), str(d / "wiki-18.jsonl"),
                                                             "intfloat/e5-base-v2")
    assert p.load.mmap and not p.load.gpu  # exact fp32 on CPU, memory-mapped
    assert (p.server.max_batch, p.server.cache_bytes, p.serve.port, p.serve.threads) == (512, 256 << 20, 8123, 9)
    e5 = launch.plan(["e5", "--wiki18", str(d), "--rerank", "m", "--", "--gpu-workspace-mb", "64"])
    assert e5.load.gpu and not e5.load.mmap and e5.load.rerank == "m" and e5.load.gpu_workspace_bytes == 64 << 20
    with pytest.raises(launch.PresetError, match="download_wiki18.sh") as e:
        launch.plan(["e5-hnsw", "--wiki18", str(d)])
    assert e.value.exit_code == 2


def test_a_missing_index_is_built_in_a_child_process_and_the_server_gets_objects(small_corpus, tmp_path,
                                                                                 monkeypatch, capfd):
    """The launch builds nothing in its own process (the server's batching thread is the only one that ever
    runs torch there): the builder is called by ``python -m retrieval.build`` in a child."""
    import retrieval.bm25 as bm25

    def not_here(*a, **kw):
        raise AssertionError("the index was built in the launching process")

    monkeypatch.setattr(bm25, "build_folder", not_here)
    served = []
    monkeypatch.setattr(server, "serve", lambda *configs: served.append(configs))
    root = tmp_path / "index"
    argv = ["bm25", "--corpus", str(small_corpus), "--index-root", str(root), "--port", "0"]
    assert launch.main(argv) == 0
    out = capfd.readouterr().out
    assert "building the bm25 index" in out and f"index written to {root / 'bm25'}" in out  # the child's output
    assert (root / "bm25" / "manifest.json").is_file()
    (load, server_cfg, serve_cfg), = served
    assert (load.index, serve_cfg.port, server_cfg) == (str(root / "bm25"), 0, server.parse(["--index", "x"])[1])
    assert launch.plan(argv).build is None  # built once


def test_a_failed_build_exits_2_naming_the_command(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    monkeypatch.setattr(server, "serve", lambda *configs: pytest.fail("served after a failed build"))
    assert launch.main(["bm25", "--corpus", str(bad), "--index-root", str(tmp_path / "i")]) == 2
    err = capsys.readouterr().err
    assert "error: building the index failed (exit 2)" in err and f"{sys.executable} -m retrieval.build" in err
