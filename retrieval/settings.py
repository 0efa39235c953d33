"""The retrieval server's settings: one typed object per concern, each field its own flag.

- :class:`ServerConfig`: what the app and the batching engine do with a request (limits, batching,
  deadline, cache);
- :class:`LoadConfig`: what is served (index, corpus, encoder, GPUs, reranker);
- :class:`ServeConfig`: where and how it is served (address, request threads, connections).

``python -m retrieval.server``'s flags are derived from these fields (:func:`add_flags`,
:func:`from_args`): a field added here is a flag there, with its help, and a flag cannot exist without
its field. Each class checks its own values (``problems()``), with messages that name the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from retrieval.client import MAX_QUERY_CHARS  # the server's default limit (the agent loop caps queries to it)

MIB = 1 << 20


def opt(default, help: str, *, flag: Optional[str] = None, unit: int = 1, cli_default=None, choices=None):
    """A field with its flag: ``flag`` (default ``--field-name``), ``unit`` (the flag counts in units of this
    many: MiB for byte fields), ``cli_default`` (the command line's default, in flag units, where it differs
    from the library's)."""
    return field(default=default, metadata=dict(help=help, flag=flag, unit=unit, cli_default=cli_default,
                                                 choices=choices))


@dataclass(frozen=True)
class ServerConfig:
    default_topk: int = opt(3, "topk when a request gives none", flag="--topk")
    max_topk: int = opt(100, "largest topk a request may ask")
    max_queries: int = opt(512, "queries per request, at most")
    max_query_chars: int = opt(MAX_QUERY_CHARS, "characters per query, at most (the agent loop cuts its queries "
                                                "to the default)")
    max_body_bytes: int = opt(4 * MIB, "request body size, at most, in MiB (refused from its Content-Length)",
                              flag="--max-body-mb", unit=MIB)
    max_batch: int = opt(256, "queries per encoder/index call (1 = no batching)")
    max_batch_chars: int = opt(262144, "characters of query text per encoder call: with --max-batch, what bounds "
                                       "one batch's time (a large request is served in several batches, "
                                       "interleaved with others)")
    max_wait_ms: float = opt(0.0, "extra wait for more queries after the first (0: batch what queued while the "
                                  "previous batch ran, never wait)")
    request_timeout_s: float = opt(120.0, "seconds a request waits for its batches before a 504")
    # The command line keeps 256 MiB; the library default is off so that benchmarks measure searches.
    cache_bytes: int = opt(0, "MiB of results kept by query text, so a query asked again (the samples of one "
                              "GRPO question often search the same words) skips the encoder and the index; 0 = off",
                           flag="--cache-mb", unit=MIB, cli_default=256)

    def problems(self) -> list[str]:
        out = []
        for name in ("max_topk", "max_queries", "max_query_chars", "max_body_bytes", "max_batch", "max_batch_chars"):
            if getattr(self, name) < 1:
                out.append(f"{flag_of(ServerConfig, name)} must be >= 1, got {shown(ServerConfig, name, self)}")
        if not 1 <= self.default_topk <= self.max_topk:
            out.append(f"--topk must be between 1 and --max-topk ({self.max_topk}), got {self.default_topk}")
        if self.max_wait_ms < 0 or self.cache_bytes < 0:
            out.append("--max-wait-ms and --cache-mb must be >= 0")
        if self.request_timeout_s <= 0:
            out.append(f"--request-timeout-s must be > 0, got {self.request_timeout_s}")
        return out


@dataclass(frozen=True)
class LoadConfig:
    index: str = opt("", "index directory (manifest.json), a .index file, or a Lucene dir")
    corpus: Optional[str] = opt(None, "corpus jsonl (needed without a manifest)")
    encoder: Optional[str] = opt(None, "encoder for a bare .index file (e.g. intfloat/e5-base-v2)")
    kind: Optional[str] = opt(None, "the index kind of a folder without a manifest (default: from the manifest, or "
                                    "lucene for a folder, dense for a file)", choices="kinds")
    mmap: bool = opt(False, "memory-map an on-disk flat index")
    gpu: bool = opt(False, "search on all GPUs: a flat index exactly in torch (fp16 shards; capability checked), "
                           "an IVF index with faiss-gpu (the gpu extra)")
    gpu_workspace_bytes: int = opt(256 * MIB, "with --gpu: search scratch per GPU in MiB (score blocks; bounds "
                                              "what the flat search keeps beside a training job on the same GPU; "
                                              "its peak is twice this)", flag="--gpu-workspace-mb", unit=MIB)
    device: Optional[str] = opt(None, "encoder device (default: cuda if available)")
    rerank: Optional[str] = opt(None, "rerank with this cross-encoder (a hub name or a folder; Search-R1's: "
                                      "cross-encoder/ms-marco-MiniLM-L12-v2): retrieve --rerank-depth, return the "
                                      "best topk")
    rerank_depth: int = opt(10, "passages retrieved per query to rerank")
    rerank_batch: int = opt(32, "(query, passage) pairs per cross-encoder call")
    rerank_max_length: int = opt(512, "tokens per (query, passage) pair")

    def problems(self) -> list[str]:
        out = []
        if not self.index:
            out.append("--index is required")
        if self.gpu_workspace_bytes <= 0:
            out.append(f"--gpu-workspace-mb must be > 0 (MiB of search scratch per GPU), got "
                       f"{shown(LoadConfig, 'gpu_workspace_bytes', self)}")
        if self.rerank_depth < 1 or self.rerank_batch < 1 or self.rerank_max_length < 8:
            out.append("--rerank-depth and --rerank-batch must be >= 1 and --rerank-max-length >= 8")
        return out


@dataclass(frozen=True)
class ServeConfig:
    host: str = opt("127.0.0.1", "bind address; 0.0.0.0 for multi-node training")
    port: int = opt(8000, "port (0: any free one)")
    threads: Optional[int] = opt(None, "request threads (default: max(64, --max-batch + 32), so a batch can fill "
                                       "up; they only parse, wait and answer: no search runs on them)")
    connection_limit: int = opt(4096, "open connections, at most (the open-files limit is raised to fit)")
    channel_timeout: int = opt(10, "seconds before an idle or stalled connection is closed")

    def problems(self) -> list[str]:
        out = []
        if not 0 <= self.port <= 65535:
            out.append(f"--port must be between 0 and 65535, got {self.port}")
        if self.threads is not None and self.threads < 1:
            out.append(f"--threads must be >= 1, got {self.threads}")
        if self.connection_limit < 1 or self.channel_timeout < 1:
            out.append("--connection-limit and --channel-timeout must be >= 1")
        return out


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


def add_flags(parser: argparse.ArgumentParser, cls, title: str) -> None:
    """One flag per field of ``cls``, in a group named ``title``."""
    from retrieval.kinds import KINDS

    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        md = f.metadata
        flag, unit = flag_of(cls, f.name), md.get("unit", 1)
        default = md["cli_default"] if md.get("cli_default") is not None else \
            (f.default // unit if unit != 1 else f.default)
        kw = dict(dest=f"{cls.__name__}.{f.name}", help=md["help"] + (f" (default: {default})"
                                                                       if default not in (None, "", False) else ""))
        typ = _type_of(f)
        if typ is bool:
            group.add_argument(flag, action="store_true", **kw)
            continue
        choices = sorted(KINDS) if md.get("choices") == "kinds" else md.get("choices")
        group.add_argument(flag, type=typ, default=default, choices=choices, metavar=None if choices else
                           flag.lstrip("-").upper().replace("-", "_"),
                           required=(f.name == "index" and cls is LoadConfig), **kw)


def from_args(cls, args: argparse.Namespace):
    """The ``cls`` the parsed flags describe (flag units turned back into the field's)."""
    values = {}
    for f in dataclasses.fields(cls):
        v = getattr(args, f"{cls.__name__}.{f.name}")
        unit = f.metadata.get("unit", 1)
        values[f.name] = v * unit if unit != 1 and v is not None else v
    return cls(**values)
