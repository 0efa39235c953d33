"""Retrieval: corpus store, dense + BM25 indexes, build/reload, the HTTP contract, load, bad input, client."""

import asyncio
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from retrieval.app import create_app
from retrieval.client import RetrievalClient, RetrievalRequestError, RetrieverUnavailable, contents_of
from retrieval.corpus import CorpusError, CorpusStore
from retrieval.folder import read_manifest
from retrieval.index import load_retriever
from retrieval.settings import ServerConfig
from tests.conftest import LiveServer, free_port


def test_corpus_store_o1_rows(tmp_path, corpus_path):
    store = CorpusStore(corpus_path, tmp_path / "off.npy", progress=False)
    assert len(store) == 5148
    with open(corpus_path) as f:
        lines = f.readlines()
    for row in (0, 1, 2500, 5147):
        assert store.get(row) == json.loads(lines[row])
    with pytest.raises(IndexError):
        store.get(5148)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "\\"T\\"\\nx"}\nnot json\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2"):
        CorpusStore(bad, progress=False).get(1)
    with pytest.raises(CorpusError, match="not found"):
        CorpusStore(tmp_path / "missing.jsonl")


def test_dense_build_reload_and_resume(dense_index_dir, small_corpus, tmp_path):
    m = read_manifest(dense_index_dir)
    assert m["kind"] == "dense" and m["count"] == 300 and m["dim"] == 384 and m["encoder"]["pooling"] == "mean"
    r = load_retriever(dense_index_dir, device="cpu")
    doc = r.corpus.get(17)
    title = doc["contents"].split("\n")[0].strip('"')
    hits = r.search([doc["contents"][:200]], 3)[0]
    assert hits[0][0]["id"] == doc["id"] and hits[0][1] > 0.9, (title, hits[0])
    # resume: a half-finished build continues where it stopped and gives the same vectors
    from retrieval import dense_build

    out = tmp_path / "resume"
    dense_build.build_dense(str(small_corpus), str(out), limit=40, progress=False)
    first = np.fromfile(out / "embeddings.f32", dtype=np.float32).reshape(40, 384).copy()
    state = json.loads((out / "progress.json").read_text())
    state["done"] = 16
    (out / "progress.json").write_text(json.dumps(state))
    with open(out / "embeddings.f32", "r+b") as f:  # rows after the checkpoint were "never written"
        f.seek(16 * 384 * 4)
        f.write(b"\0" * (24 * 384 * 4))
    dense_build.build_dense(str(small_corpus), str(out), limit=40, progress=False)
    again = np.fromfile(out / "embeddings.f32", dtype=np.float32).reshape(40, 384)
    np.testing.assert_allclose(again, first, atol=1e-5)


def test_bare_index_file_like_search_r1_release(dense_index_dir, small_corpus, tmp_path):
    """Search-R1 ships e5_Flat.index + wiki-18.jsonl with no manifest: load such a pair as it is."""
    import shutil

    bare = tmp_path / "minilm_Flat.index"
    shutil.copy(dense_index_dir / "index.faiss", bare)
    r = load_retriever(bare, small_corpus, encoder="minilm", device="cpu")
    doc = r.corpus.get(5)
    assert r.search([doc["contents"][:200]], 1)[0][0][0]["id"] == doc["id"]
    with pytest.raises(ValueError, match="encoder"):
        load_retriever(bare, small_corpus)
    with pytest.raises(ValueError, match="corpus"):
        load_retriever(bare)


def test_index_id_names_what_a_server_serves(bm25_index_dir, dense_index_dir, small_corpus, corpus_path, tmp_path):
    """Replicas on several nodes must serve the same thing (scripts/multinode.sh compares /health index_id):
    a copy of an index folder or file is the same; an exact index built again from the same corpus and
    encoder is the same; another corpus, encoder or build is not."""
    import shutil

    from retrieval import bm25, dense_build
    from retrieval.folder import index_id

    def name(*args, **kw):
        return index_id(load_retriever(*args, **kw).identity)

    copy = tmp_path / "copy"
    shutil.copytree(bm25_index_dir, copy)
    assert name(copy) == name(bm25_index_dir)
    other = bm25.build_bm25(str(small_corpus), str(tmp_path / "bm25_300"), progress=False)  # another corpus
    assert name(other) != name(bm25_index_dir)
    a = dense_build.build_dense(str(small_corpus), str(tmp_path / "a"), limit=40, progress=False)
    b = dense_build.build_dense(str(small_corpus), str(tmp_path / "b"), limit=40, progress=False)
    assert name(a, device="cpu") == name(b, device="cpu") != name(dense_index_dir, device="cpu")
    # a bare index file (Search-R1's e5_Flat.index): its size, the encoder and the corpus, not its file name
    bare = tmp_path / "minilm_Flat.index"
    shutil.copy(dense_index_dir / "index.faiss", bare)
    shutil.copy(bare, tmp_path / "renamed.index")
    assert name(bare, small_corpus, encoder="minilm", device="cpu") == \
        name(tmp_path / "renamed.index", small_corpus, encoder="minilm", device="cpu")
    lines = small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    swapped = tmp_path / "swapped.jsonl"  # the same rows and bytes, two passages in the other order
    swapped.write_text("".join([lines[1], lines[0], *lines[2:]]), encoding="utf-8")
    shutil.copy(bare, tmp_path / "third.index")
    assert name(bare, small_corpus, encoder="minilm", device="cpu") != \
        name(tmp_path / "third.index", swapped, encoder="minilm", device="cpu")


def test_bm25_and_hnsw(bm25_index_dir, dense_index_dir):
    r = load_retriever(bm25_index_dir)
    hits = r.search(["Harvey Pekar autobiographical comics"], 3)[0]
    assert len(hits) == 3 and "Pekar" in hits[0][0]["contents"]
    from retrieval.dense import DenseIndex

    vecs = np.random.default_rng(0).standard_normal((2000, 32)).astype(np.float32)
    flat = DenseIndex.build("Flat", vecs)
    hnsw = DenseIndex.build("HNSW32", vecs)
    q = vecs[:20]
    _, fi = flat.search(q, 3)
    _, hi = hnsw.search(q, 3)
    assert (fi[:, 0] == np.arange(20)).all()
    assert (hi[:, 0] == fi[:, 0]).mean() >= 0.9


def test_api_contract_both_return_scores(bm25_server):
    url = bm25_server.url + "/retrieve"
    r = httpx.post(url, json={"queries": ["Denise Levertov poet"], "topk": 2, "return_scores": True}).json()
    assert set(r) == {"result"} and len(r["result"]) == 1 and len(r["result"][0]) == 2
    item = r["result"][0][0]
    assert set(item) == {"document", "score"} and isinstance(item["score"], float)
    assert set(item["document"]) >= {"id", "contents"} and isinstance(item["document"]["id"], str)
    r2 = httpx.post(url, json={"queries": ["Denise Levertov poet"], "topk": 2, "return_scores": False}).json()
    assert r2["result"][0] == [it["document"] for it in r["result"][0]]
    r3 = httpx.post(url, json={"queries": ["a", "b"], "extra": 1}).json()  # default topk 3, unknown field ignored
    assert [len(x) for x in r3["result"]] == [3, 3]
    h = httpx.get(bm25_server.url + "/health").json()
    assert h["status"] == "ok" and h["passages"] == 5148


BAD = [
    ("not json", {"content": b"{nope", "headers": {"Content-Type": "application/json"}}, 400, "not valid JSON"),
    ("content type", {"content": b'{"queries": ["x"]}', "headers": {"Content-Type": "text/plain"}}, 415,
     "Content-Type"),
    ("too large", {"json": {"queries": ["x" * 100] * 50000}}, 413, "too large"),
    ("missing", {"json": {"topk": 3}}, 400, "'queries' is missing"),
    ("not list", {"json": {"queries": "x"}}, 400, "must be a list"),
    ("empty list", {"json": {"queries": []}}, 400, "is empty"),
    ("non string", {"json": {"queries": ["x", 3]}}, 400, r"queries\[1\] is not a string"),
    ("empty string", {"json": {"queries": ["x", " "]}}, 400, r"queries\[1\] is empty"),
    ("too many", {"json": {"queries": ["x"] * 65}}, 400, "maximum is 64"),
    ("too long", {"json": {"queries": ["x" * 5000]}}, 400, "characters"),
    ("topk type", {"json": {"queries": ["x"], "topk": "3"}}, 400, "'topk' must be an integer"),
    ("topk bool", {"json": {"queries": ["x"], "topk": True}}, 400, "'topk' must be an integer"),
    ("topk small", {"json": {"queries": ["x"], "topk": 0}}, 400, "between 1 and"),
    ("topk big", {"json": {"queries": ["x"], "topk": 1000}}, 400, "between 1 and"),
    ("scores type", {"json": {"queries": ["x"], "return_scores": "yes"}}, 400, "'return_scores' must be a boolean"),
    ("body list", {"json": ["x"]}, 400, "JSON object"),
]


def test_bad_input_sweep_then_valid(bm25_server):
    url = bm25_server.url + "/retrieve"
    for name, kw, status, msg in BAD:
        r = httpx.post(url, **kw)
        assert r.status_code == status, (name, r.status_code, r.text)
        if status == 413:  # refused by waitress from the Content-Length, before the app: plain text
            assert "Request Entity Too Large" in r.text, r.text
            continue
        assert re.search(msg, r.json()["error"]), (name, r.json())
    r = httpx.get(url)
    assert r.status_code == 405 and "not allowed" in r.json()["error"]
    r = httpx.post(bm25_server.url + "/nope", json={})
    assert r.status_code == 404 and "no such path" in r.json()["error"]
    ok = httpx.post(url, json={"queries": ["Harvey Pekar"], "topk": 1})
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 1


def test_correct_under_concurrent_load(bm25_server, qa_path):
    questions = [json.loads(line)["question"] for line in open(qa_path)][:320]
    client = RetrievalClient(bm25_server.url, topk=3)
    expected = {q: client.retrieve([q]) for q in questions[:40]}

    def worker(i):
        c = RetrievalClient(bm25_server.url, topk=3)
        got = []
        for j in range(20):
            qs = [questions[(i * 20 + j + k) % 40] for k in range(1 + j % 3)]
            res = c.retrieve(qs)
            got.append(all(res[n] == expected[q][0] for n, q in enumerate(qs)))
        c.close()
        return all(got)

    before = bm25_server.batcher.batches
    with ThreadPoolExecutor(16) as ex:
        assert all(ex.map(worker, range(16)))
    batches = bm25_server.batcher.batches - before
    assert batches < 16 * 20  # requests were merged


def test_async_client_and_formatting(bm25_server):
    async def go():
        c = RetrievalClient(bm25_server.url, topk=2)
        res = await asyncio.gather(*[c.aretrieve([q]) for q in ["Harvey Pekar", "Denise Levertov", "Centaurium"]])
        await c.aclose()
        return res

    res = asyncio.run(go())
    assert [len(r[0]) for r in res] == [2, 2, 2]
    assert all(c.startswith('"') for c in contents_of(res[0][0]))
    with pytest.raises(RetrievalRequestError, match="rejected"):
        RetrievalClient(bm25_server.url).retrieve([""])


def test_client_retries_then_clear_error():
    port = free_port()
    c = RetrievalClient(f"127.0.0.1:{port}", retries=2, backoff=0.01, timeout=1)
    with pytest.raises(RetrieverUnavailable, match="retrieval_launch.sh"):
        c.retrieve(["x"])


def test_client_retries_5xx_then_succeeds(bm25_index_dir):
    class Flaky:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0
            self.corpus, self.index, self.kind = inner.corpus, inner.index, inner.kind

        def search(self, q, k):
            self.calls += 1
            if self.calls <= 2:
                raise RuntimeError("transient")
            return self.inner.search(q, k)

    flaky = Flaky(load_retriever(bm25_index_dir))
    srv = LiveServer(create_app(flaky, ServerConfig()), free_port())
    try:
        res = RetrievalClient(srv.url, retries=3, backoff=0.01).retrieve(["Harvey Pekar"])
        assert len(res[0]) == 3 and flaky.calls == 3
    finally:
        srv.close()


def test_health_cli_for_launch_scripts(bm25_server):
    from retrieval.client import main

    assert main([bm25_server.url]) == 0
    assert main([bm25_server.url + "/retrieve", "--wait", "1"]) == 0


class _Counting:
    """A real retriever that records what reaches its index (one list of query texts per search)."""

    def __init__(self, retriever):
        self.inner, self.searched = retriever, []
        self.corpus, self.index, self.kind = retriever.corpus, retriever.index, retriever.kind

    def search(self, queries, k):
        self.searched.append(list(queries))
        return self.inner.search(queries, k)


def _stream(qa_path, n_questions=12, samples=5):
    """GRPO-shaped requests: each question's samples search its words, some reworded, at topk 3 and 5."""
    questions = [json.loads(line)["question"] for line in open(qa_path)][:n_questions]
    reqs = []
    for i, q in enumerate(questions):
        for s in range(samples):
            words = q if s % 2 == 0 else q.rstrip("?") + f" answer {s}"
            reqs.append(([words, questions[(i + 1) % len(questions)]], 5 if s == 3 else 3))
    reqs.append(([questions[0]] * 4 + [questions[1]], 5))  # repeats inside one request, deeper than before
    return reqs


def test_repeated_queries_are_searched_once_and_answer_as_an_uncached_server(bm25_index_dir, qa_path):
    from retrieval.batching import MicroBatcher

    stream = _stream(qa_path)
    plain, cached = _Counting(load_retriever(bm25_index_dir)), _Counting(load_retriever(bm25_index_dir))
    a = MicroBatcher(plain, ServerConfig(max_batch=256))
    b = MicroBatcher(cached, ServerConfig(max_batch=256, cache_bytes=8 << 20))
    try:
        for queries, topk in stream:  # one request at a time: every repeat is a repeat across batches
            want = a.submit(queries, topk).result(timeout=60)
            got = b.submit(queries, topk).result(timeout=60)
            assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), queries
        plain_searched = sum(map(len, plain.searched))
        # and many at once: repeats inside a batch share one search row
        with ThreadPoolExecutor(8) as ex:
            wants = list(ex.map(lambda r: a.submit(*r).result(timeout=60), stream))
        fresh = _Counting(load_retriever(bm25_index_dir))
        c = MicroBatcher(fresh, ServerConfig(max_batch=256))
        try:
            with ThreadPoolExecutor(8) as ex:
                gots = list(ex.map(lambda r: c.submit(*r).result(timeout=60), stream))
        finally:
            c.close()
        assert json.dumps(gots, sort_keys=True) == json.dumps(wants, sort_keys=True)
        assert all(len(set(batch)) == len(batch) for batch in fresh.searched)
    finally:
        a.close()
        b.close()
    asked = sum(len(q) for q, _ in stream)
    distinct = len({q for qs, _ in stream for q in qs})
    searched = sum(map(len, cached.searched))
    assert plain_searched == asked - 3  # without a cache, only the request's own 4 copies of one text share a row
    # each text is searched once, and again only when a deeper topk is asked than what was kept (once per
    # question here: its neighbour's text, kept at 3, asked at 5 by sample 3)
    assert distinct <= searched <= distinct + 12 and searched < asked / 2, (searched, distinct, asked)
    stats = b.cache.stats()
    assert stats["hits"] == asked - searched - b.repeated_in_batch and stats["evictions"] == 0, stats


def test_the_result_cache_stays_within_its_bytes(bm25_index_dir, qa_path):
    from retrieval.batching import MicroBatcher

    stream = _stream(qa_path, n_questions=30, samples=2)
    counting = _Counting(load_retriever(bm25_index_dir))
    b = MicroBatcher(counting, ServerConfig(cache_bytes=20_000))
    plain = MicroBatcher(load_retriever(bm25_index_dir))
    try:
        for _ in range(2):
            for queries, topk in stream:
                got = b.submit(queries, topk).result(timeout=60)
                assert got == plain.submit(queries, topk).result(timeout=60)
                stats = b.cache.stats()
                assert 0 < stats["bytes"] <= 20_000, stats
        assert stats["evictions"] > 0 and stats["hits"] > 0, stats
        # a result bigger than the whole cache is served, not kept
        tiny = MicroBatcher(load_retriever(bm25_index_dir), ServerConfig(cache_bytes=100))
        try:
            assert tiny.submit(["Harvey Pekar"], 3).result(timeout=30)
            assert tiny.cache.stats()["entries"] == 0
        finally:
            tiny.close()
    finally:
        b.close()
        plain.close()


def test_health_reports_the_cache_and_the_command_line_refuses_a_negative_size(bm25_index_dir, capsys):
    from retrieval.server import main

    srv = LiveServer(create_app(load_retriever(bm25_index_dir), ServerConfig(cache_bytes=1 << 20)), free_port())
    try:
        for _ in range(3):
            assert httpx.post(f"{srv.url}/retrieve",
                              json={"queries": ["Harvey Pekar", "Harvey Pekar"]}).status_code == 200
        health = httpx.get(f"{srv.url}/health").json()
        assert health["queries"] == 1 and health["repeated_in_batch"] == 3, health
        assert health["cache"]["hits"] == 2 and health["cache"]["entries"] == 1, health
    finally:
        srv.close()
    with pytest.raises(SystemExit) as e:
        main(["--index", str(bm25_index_dir), "--cache-mb", "-1"])
    assert e.value.code == 2 and "--cache-mb must be >= 0" in capsys.readouterr().err


class _Gated(_Counting):
    """A real retriever whose searches record their thread and can be held until ``gate`` is set."""

    def __init__(self, retriever):
        super().__init__(retriever)
        self.threads, self.gate, self.entered = [], threading.Event(), threading.Event()
        self.gate.set()
        self.fail_on = None

    def search(self, queries, k):
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(30)
        if self.fail_on in queries:
            raise RuntimeError(f"cannot search {self.fail_on!r}")
        return super().search(queries, k)


def test_every_search_runs_on_the_batching_thread_under_a_rotating_load(bm25_index_dir, qa_path, bm25_server):
    """No device work on a request thread: torch keeps a cuBLAS workspace per (thread, GPU) for the thread's
    life, so the encoder and the index must only ever run on the batcher's own thread, whichever of the
    server's rotating request threads took the request, lone or concurrent."""
    from retrieval.batching import MicroBatcher

    questions = [json.loads(line)["question"] for line in open(qa_path)][:60]
    gated = _Gated(load_retriever(bm25_index_dir))
    plain = MicroBatcher(load_retriever(bm25_index_dir), ServerConfig(max_batch=256))
    srv = LiveServer(create_app(gated, ServerConfig()), free_port())
    try:
        # lone requests, one after another, each on a new connection (waitress hands them to its threads in turn)
        for q in questions[:10]:
            r = httpx.post(srv.url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
            assert r.status_code == 200
            want = plain.submit([q], 3).result(timeout=60)[0]
            assert [row["document"] for row in r.json()["result"][0]] == [d for d, _ in want]
        # concurrent requests from many client threads, with keep-alive and without
        def one(i):
            with httpx.Client(timeout=60) as c:
                return c.post(srv.url + "/retrieve", json={"queries": [questions[i % 60]]}).status_code

        with ThreadPoolExecutor(48) as ex:
            assert set(ex.map(one, range(240))) == {200}
        # a request whose search fails is answered 500; the next is served, still on the same thread
        gated.fail_on = questions[20]
        assert httpx.post(srv.url + "/retrieve", json={"queries": [questions[20]]}).status_code == 500
        assert httpx.post(srv.url + "/retrieve", json={"queries": [questions[21]]}).status_code == 200
        assert set(gated.threads) == {srv.batcher.thread_name} == {"retrieval-batcher"}, set(gated.threads)
        assert len(gated.searched) >= 12 and max(map(len, gated.searched)) > 1  # concurrent ones still batch
    finally:
        srv.close()
        plain.close()
    assert httpx.post(bm25_server.url + "/retrieve", json={"queries": ["Harvey Pekar"]}).status_code == 200
    health = httpx.get(bm25_server.url + "/health").json()
    # requests per client address (a replica on every node shows only its own node's rollouts)
    assert set(health["clients"]) == {"127.0.0.1"} and health["clients"]["127.0.0.1"] >= 1, health["clients"]


def test_the_command_line_loads_the_retriever_on_the_batching_thread(bm25_index_dir):
    """The encoder and the index are loaded by the thread that searches (no other thread of the server runs
    torch: a second OpenMP team slows every encoder call on CPU), and a load that fails fails at once, in the
    caller, naming the problem."""
    from retrieval.app import create_app, state_of
    from retrieval.batching import MicroBatcher
    from retrieval.folder import IndexLoadError

    loaded_on = []

    def load():
        loaded_on.append(threading.current_thread().name)
        return load_retriever(bm25_index_dir)

    app = create_app(config=ServerConfig(), load=load)
    try:
        state = state_of(app)
        assert loaded_on == [state.batcher.thread_name] and state.batcher.retriever.kind == "bm25"
        assert state.batcher.search(["Harvey Pekar"], 2, timeout=30)[0][0][0]["contents"]
    finally:
        state_of(app).close()

    def broken():
        raise IndexLoadError("corpus x.jsonl is not the one y/manifest.json was built from")

    with pytest.raises(IndexLoadError, match="is not the one"):
        MicroBatcher(load=broken)
    with pytest.raises(ValueError, match="not both"):
        MicroBatcher(load_retriever(bm25_index_dir), load=broken)
