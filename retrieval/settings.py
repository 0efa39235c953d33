"""The retrieval server's settings: one typed object per concern, each field its own flag.

- :class:`ServerConfig`: what the app and the batching engine do with a request (limits, batching,
  deadline, cache);
- :class:`LoadConfig`: what is served (index, corpus, encoder, GPUs, reranker);
- :class:`ServeConfig`: where and how it is served (address, request threads, connections);
- :class:`BuildSettings`: what ``python -m retrieval.build`` builds, and how.

The commands' flags are derived from these fields (:mod:`retrieval.flags`: :func:`add_flags`,
:func:`from_args`, and :func:`to_argv` back): a field added here is a flag there, with its help, and a
flag cannot exist without its field. Each class checks its own values (``problems()``), with messages
that name the flag. A command that starts another passes the object (``launch`` calls the server with
its three objects) or the flags :func:`to_argv` derives from it (``launch`` runs the build).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from retrieval.client import MAX_QUERY_CHARS  # the server's default limit (the agent loop caps queries to it)
from retrieval.flags import MIB, flag_of, opt, shown
from retrieval.folder import BuildOptions


def kind_names() -> list[str]:
    """The registered index kinds (the ``--kind`` choices)."""
    from retrieval.kinds import KINDS

    return sorted(KINDS)


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
                                    "lucene for a folder, dense for a file)", choices=kind_names)
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


@dataclass(frozen=True)
class BuildSettings(BuildOptions):
    """What ``python -m retrieval.build`` builds (``corpus``, ``out``, ``kind``) and how (the
    :class:`~retrieval.folder.BuildOptions` it is, which the kind's builder reads)."""

    corpus: str = opt("", "wiki-18-format jsonl (required)")
    out: str = opt("", "index directory to write (required)")
    kind: str = opt("dense", "dense: FAISS over encoder vectors (Flat, HNSW, IVF, IVF-PQ: --factory); bm25: "
                                "bm25s; lucene: pyserini's Lucene (the lucene extra)", choices=kind_names)

    def problems(self) -> list[str]:
        out = []
        if not self.corpus or not self.out:
            out.append("--corpus and --out are required")
        elif not Path(self.corpus).is_file():
            out.append(f"--corpus: file not found: {self.corpus}")
        if self.batch_size < 1:
            out.append("--batch-size must be >= 1")
        if self.train_size < 1 or self.nprobe < 1 or self.recall_sample < 0:
            out.append("--train-size and --nprobe must be >= 1, --recall-sample >= 0")
        return out
