"""Retrieval and data never serve or train on silently wrong data, and one bad request harms no
other (the fault cases of an adversarial user, all on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from retrieval.app import create_app
from retrieval.batching import MicroBatcher
from retrieval.bm25 import build_bm25
from retrieval.client import RetrievalClient, RetrievalResponseError, RetrievalServerError, RetrieverUnavailable
from retrieval.corpus import CorpusStore
from retrieval.dense_build import build_dense
from retrieval.folder import BuildError, IndexLoadError
from retrieval.index import load_retriever
from retrieval.settings import ServerConfig
from tests.conftest import LiveServer, free_port, refuses

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def corpus40(tmp_path, corpus_path) -> Path:
    out = tmp_path / "c40.jsonl"
    with open(corpus_path, encoding="utf-8") as f:
        out.write_text("".join(line for _, line in zip(range(40), f)), encoding="utf-8")
    return out


def _vectors(index_dir: Path) -> np.ndarray:
    import faiss

    idx = faiss.read_index(str(index_dir / "index.faiss"))
    return idx.reconstruct_n(0, idx.ntotal)


def _cli(module, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


# 1-2. resume trusts the vectors and the corpus content, not progress.json ---------------------------

def test_resume_after_embeddings_deleted_or_truncated(tmp_path, corpus40):
    out = tmp_path / "idx"
    build_dense(str(corpus40), str(out), batch_size=16, progress=False)
    good = _vectors(out)
    assert np.abs(good).sum(axis=1).min() > 0
    (out / "embeddings.f32").unlink()
    build_dense(str(corpus40), str(out), batch_size=16, progress=False)
    np.testing.assert_allclose(_vectors(out), good, atol=1e-5)
    with open(out / "embeddings.f32", "r+b") as f:
        f.truncate(1000)
    build_dense(str(corpus40), str(out), batch_size=16, progress=False)
    np.testing.assert_allclose(_vectors(out), good, atol=1e-5)
    # same size, vectors zeroed behind progress.json's back: the last batch's checksum catches it
    emb = np.memmap(out / "embeddings.f32", dtype=np.float32, mode="r+", shape=good.shape)
    emb[:] = 0
    emb.flush()
    del emb
    build_dense(str(corpus40), str(out), batch_size=16, progress=False)
    np.testing.assert_allclose(_vectors(out), good, atol=1e-5)


def test_edited_passage_is_re_encoded(tmp_path, corpus40):
    out = tmp_path / "idx"
    build_dense(str(corpus40), str(out), batch_size=16, progress=False)
    lines = corpus40.read_text(encoding="utf-8").splitlines(keepends=True)
    doc = json.loads(lines[5])
    doc["contents"] = '"Zorblat"\nZorblat is a purple volcano on the moon of Quux.'
    lines[5] = json.dumps(doc) + "\n"
    corpus40.write_text("".join(lines), encoding="utf-8")  # same path, same row count
    build_dense(str(corpus40), str(out), batch_size=16, progress=False)
    hits = load_retriever(out).search(["purple volcano Zorblat"], 1)
    assert hits[0][0][0]["contents"].startswith('"Zorblat"')


# 3. the server refuses a corpus that is not the one indexed; no empty index --------------------------

def test_server_refuses_a_changed_corpus_and_builder_an_empty_one(tmp_path, corpus40):
    out = tmp_path / "idx"
    build_bm25(str(corpus40), str(out), progress=False)
    load_retriever(out)  # the corpus it was built from: fine
    text = corpus40.read_text(encoding="utf-8")
    corpus40.write_text('{"id": "new", "contents": "\\"X\\"\\ninserted"}\n' + text, encoding="utf-8")
    with pytest.raises(IndexLoadError, match=r"c40\.jsonl is not the one .*manifest\.json was built from \(41 rows "
                                             r"instead of 40\)"):
        load_retriever(out)
    r = _cli("retrieval.server", "--index", out, "--port", free_port())
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not the one" in r.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(BuildError, match="no passages"):
        build_bm25(str(empty), str(tmp_path / "e"), progress=False)
    r = _cli("retrieval.build", "--corpus", empty, "--out", tmp_path / "e2", "--kind", "bm25")
    assert r.returncode == 2 and "no passages" in r.stderr and "Traceback" not in r.stderr


# 4. data preparation --------------------------------------------------------------------------------

@pytest.mark.parametrize("golds, message", [
    ([None, ""], r"golden_answers\[0\] is NoneType None"),
    (["", "  "], r"golden_answers\[0\] is empty"),
    ([1984], r"golden_answers\[0\] is int 1984, not a string"),
    ([True], r"golden_answers\[0\] is bool True"),
    ([], "row has no gold answer"),
])
def test_data_prep_rejects_bad_golds_with_file_and_line(tmp_path, golds, message, capsys):
    from train.data_prep import main as prep

    src = tmp_path / "qa.jsonl"
    src.write_text(json.dumps({"question": "q1?", "golden_answers": ["a"]}) + "\n"
                   + json.dumps({"question": "q2?", "golden_answers": golds}) + "\n")
    refuses(prep, ["--out", str(tmp_path / "o"), "--local", str(src)], capsys, rf"qa\.jsonl:2: {message}", code=2)


def test_data_prep_refuses_no_rows_and_non_utf8(tmp_path, capsys):
    from train.data_prep import main as prep

    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    refuses(prep, ["--out", str(tmp_path / "o"), "--local", str(blank)], capsys, "no rows", code=2)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps({"question": "Qui a écrit ?", "golden_answers": ["moi"]}, ensure_ascii=False)
                      .encode("latin-1") + b"\n")
    refuses(prep, ["--out", str(tmp_path / "o"), "--local", str(latin)], capsys,
            r"latin\.jsonl:1: not UTF-8 \(byte 0xe9", code=2)
    assert not (tmp_path / "o" / "train.parquet").exists()


# 5-6, 8-9. one request harms no other ----------------------------------------------------------------

class Scripted:
    """A retriever stand-in with controllable time and failures (the batching is what is tested)."""

    kind = "fake"

    class index:
        ntotal = 1

    corpus = [None]

    def __init__(self, per_query_s=0.0, poison=None, first_s=0.0):
        self.per_query_s, self.poison, self.batches, self.first_s = per_query_s, poison, [], first_s

    def search(self, queries, k):
        self.batches.append(list(queries))
        time.sleep(self.per_query_s * len(queries) + (self.first_s if len(self.batches) == 1 else 0.0))
        if self.poison and any(self.poison in q for q in queries):
            raise RuntimeError("the encoder choked on a query")
        return [[({"id": str(i), "contents": q}, 1.0)] for i, q in enumerate(queries)]


def test_surrogate_query_is_a_400_naming_it_and_others_are_served(bm25_server):
    r = httpx.post(f"{bm25_server.url}/retrieve", content=b'{"queries": ["fine", "\\ud800 lone"]}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "queries[1] is not valid text" in r.json()["error"]
    assert httpx.post(f"{bm25_server.url}/retrieve", json={"queries": ["Harvey Pekar"]}).status_code == 200


def test_a_failing_batch_is_retried_per_request_so_only_the_culprit_fails():
    # the first search takes 1 s: the other requests all arrive while it runs, even on a busy machine
    fake = Scripted(per_query_s=0.05, poison="POISON", first_s=1.0)
    srv = LiveServer(create_app(fake, ServerConfig()), free_port())
    try:
        def post(q):
            return httpx.post(f"{srv.url}/retrieve", json={"queries": [q]}, timeout=30).status_code

        with ThreadPoolExecutor(12) as ex:
            first = ex.submit(post, "warm")  # while it runs, the others queue into one batch
            time.sleep(0.02)
            futures = [ex.submit(post, f"q{i}") for i in range(5)] + [ex.submit(post, "POISON pill")] + \
                [ex.submit(post, f"q{i}") for i in range(5, 10)]
            codes = [f.result() for f in futures]
        assert first.result() == 200
        assert codes[:5] + codes[6:] == [200] * 10 and codes[5] == 500
        assert any(len(b) > 1 and any("POISON" in q for q in b) for b in fake.batches)  # it was batched with others
    finally:
        srv.close()


def test_a_maximal_request_does_not_block_a_small_one():
    fake = Scripted(per_query_s=0.002)  # 512 queries = ~1 s in one batch
    b = MicroBatcher(fake, ServerConfig(max_batch=64, max_batch_chars=64 * 4096))
    try:
        big = b.submit([f"big {i} " + "x" * 4000 for i in range(512)], 100)
        time.sleep(0.05)
        t0 = time.perf_counter()
        small = b.submit(["small"], 3)
        small.result(timeout=30)
        small_s = time.perf_counter() - t0
        big.result(timeout=30)
        big_s = time.perf_counter() - t0
        assert small_s < big_s / 3, (small_s, big_s)
        assert max(len(x) for x in fake.batches) <= 64
        assert all(sum(map(len, x)) <= 64 * 4096 for x in fake.batches)
        assert big.result()[511][0][0]["contents"].startswith("big 511")  # order kept across slices
    finally:
        b.close()


def test_character_cap_splits_batches():
    fake = Scripted()
    b = MicroBatcher(fake, ServerConfig(max_batch=256, max_batch_chars=10_000))
    try:
        res = b.submit(["y" * 3000] * 10, 3).result(timeout=10)
        assert len(res) == 10 and max(sum(map(len, x)) for x in fake.batches) <= 10_000
    finally:
        b.close()


def test_dead_batcher_is_unhealthy_and_timeouts_say_what_timed_out():
    class Dies(Scripted):
        def search(self, queries, k):
            raise SystemExit("simulated crash of the batching thread")

    srv = LiveServer(create_app(Dies(), ServerConfig()), free_port())
    try:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": ["a"]}, timeout=10)
        assert r.status_code == 500
        time.sleep(0.2)
        h = httpx.get(f"{srv.url}/health")
        assert h.status_code == 503 and "batching thread" in h.json()["error"]
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": ["a"]}, timeout=10)
        assert r.status_code == 503 and "restart" in r.json()["error"]
    finally:
        srv.close()
    # a request past its deadline gets a 504 that says what timed out, lone or not
    slow = LiveServer(create_app(Scripted(per_query_s=1.0), ServerConfig(request_timeout_s=0.2)), free_port())
    try:
        r = httpx.post(f"{slow.url}/retrieve", json={"queries": ["a"]}, timeout=10)
        assert r.status_code == 504 and "did not finish within 0.2 s" in r.json()["error"], r.text
    finally:
        slow.close()


def test_deeply_nested_json_is_a_400(bm25_server):
    body = b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{bm25_server.url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nest" in r.json()["error"]


def test_oversized_body_is_refused_before_it_is_read(bm25_server):
    with socket.create_connection(("127.0.0.1", bm25_server.port), timeout=10) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 300000000\r\n\r\n" + b"x" * 1000)
        head = s.recv(200)
    assert b" 413 " in head.split(b"\r\n")[0]


def test_sigterm_drains_in_flight_requests_and_exits_0(dense_index_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", str(dense_index_dir), "--port",
                             str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    try:
        client = RetrievalClient(f"127.0.0.1:{port}")
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        queries = [f"question number {i} about comics and poetry" for i in range(48)]

        def post(i):
            return httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": queries}, timeout=120).status_code

        with ThreadPoolExecutor(32) as ex:
            futures = [ex.submit(post, i) for i in range(32)]
            time.sleep(1.0)  # 32 x 48 queries take several seconds on 2 cores: most are in flight
            proc.send_signal(signal.SIGTERM)
            codes = [f.result() for f in futures]
        rc = proc.wait(timeout=120)
        assert codes == [200] * 32
        assert rc == 0, proc.stdout.read()[-2000:]
        with pytest.raises(RetrieverUnavailable):  # and it no longer accepts
            RetrievalClient(f"127.0.0.1:{port}", retries=0, timeout=2).retrieve(["x"])
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()


# 10. client: what the server said, a total deadline, the response schema -------------------------------

class RawServer:
    """A one-behaviour HTTP server on a raw socket (answers each connection with ``respond``)."""

    def __init__(self, respond):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.respond = respond
        self.stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.recv(65536)
            self.respond(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop = True
        self.sock.close()


def _json_response(body: bytes, status="200 OK"):
    def respond(conn):
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)
    return respond


def test_persistent_5xx_reports_what_the_server_answered():
    srv = RawServer(_json_response(b'{"error": "index shard 3 is offline"}', "503 Service Unavailable"))
    try:
        with pytest.raises(RetrievalServerError, match="kept failing.*HTTP 503: index shard 3 is offline"):
            RetrievalClient(f"127.0.0.1:{srv.port}", retries=1, backoff=0.01, timeout=10).retrieve(["x"])
    finally:
        srv.close()


def test_timeout_is_a_total_deadline_against_a_trickling_server():
    def trickle(conn):
        for b in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n":
            conn.sendall(bytes([b]))
            time.sleep(0.5)

    srv = RawServer(trickle)
    try:
        t0 = time.perf_counter()
        with pytest.raises(RetrieverUnavailable, match="no complete answer within 2 s"):
            RetrievalClient(f"127.0.0.1:{srv.port}", retries=0, timeout=2).retrieve(["x"])
        assert time.perf_counter() - t0 < 4
    finally:
        srv.close()


@pytest.mark.parametrize("body, message", [
    (b'{"result": "oops"}', "not a list of lists"),
    (b'{"result": [[], []]}', "2 result lists for 1 queries"),
    (b'{"answer": []}', "without a 'result' field"),
    (b'{"result": [[{"document": {"id": "1"}}]]}', "unexpected result item"),
    (b"<html>", "non-JSON"),
])
def test_malformed_responses_raise_a_clear_error(body, message):
    srv = RawServer(_json_response(body))
    try:
        with pytest.raises(RetrievalResponseError, match=message):
            RetrievalClient(f"127.0.0.1:{srv.port}", retries=0, timeout=5).retrieve(["x"])
    finally:
        srv.close()


# 11. builder and loader errors: one line naming the file and line --------------------------------------

def test_corrupt_files_and_bad_rows_give_one_line(tmp_path, corpus40):
    out = tmp_path / "idx"
    build_bm25(str(corpus40), str(out), progress=False)
    (out / "manifest.json").write_text("{not json")
    r = _cli("retrieval.server", "--index", out, "--port", free_port())
    assert r.returncode == 2 and "manifest.json is not valid JSON" in r.stderr and "Traceback" not in r.stderr
    # a corrupt offsets.npy is rebuilt; a corrupt progress.json restarts the encoding
    (out / "offsets.npy").write_bytes(b"garbage")
    assert len(CorpusStore(corpus40, out / "offsets.npy", progress=False)) == 40
    dense = tmp_path / "dense"
    build_dense(str(corpus40), str(dense), batch_size=16, progress=False)
    good = _vectors(dense)
    (dense / "progress.json").write_text("{{{")
    build_dense(str(corpus40), str(dense), batch_size=16, progress=False)
    np.testing.assert_allclose(_vectors(dense), good, atol=1e-5)

    lines = corpus40.read_text(encoding="utf-8").splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:3]) + '{"id": "x", "contents": 42}\n', encoding="utf-8")
    r = _cli("retrieval.build", "--corpus", bad, "--out", tmp_path / "b1", "--kind", "bm25")
    assert r.returncode == 2 and "bad.jsonl:4: 'contents' is int, not a string" in r.stderr
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes("".join(lines[:2]).encode() + '{"id": "é", "contents": "café"}\n'.encode("latin-1"))
    r = _cli("retrieval.build", "--corpus", latin, "--out", tmp_path / "b2", "--kind", "bm25")
    assert r.returncode == 2 and "latin.jsonl:3: not UTF-8" in r.stderr and "Traceback" not in r.stderr
    trailing = tmp_path / "trailing.jsonl"
    trailing.write_text("".join(lines[:5]) + "\n\n", encoding="utf-8")
    assert len(CorpusStore(trailing, tmp_path / "t.npy", progress=False)) == 5
    middle = tmp_path / "middle.jsonl"
    middle.write_text("".join(lines[:2]) + "\n" + "".join(lines[2:4]), encoding="utf-8")
    r = _cli("retrieval.build", "--corpus", middle, "--out", tmp_path / "b3", "--kind", "bm25")
    assert r.returncode == 2 and "middle.jsonl:3: a blank line" in r.stderr


def test_duplicate_ids_warn_with_count_or_fail_with_strict(tmp_path, corpus40):
    lines = corpus40.read_text(encoding="utf-8").splitlines(keepends=True)
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(lines[:6] + lines[:2]), encoding="utf-8")
    r = _cli("retrieval.build", "--corpus", dup, "--out", tmp_path / "d1", "--kind", "bm25")
    assert r.returncode == 0 and "warning:" in r.stdout and "2 passages repeat an id" in r.stdout
    r = _cli("retrieval.build", "--corpus", dup, "--out", tmp_path / "d2", "--kind", "bm25", "--strict")
    assert r.returncode == 2 and "2 passages repeat an id" in r.stderr and "--strict" in r.stderr
