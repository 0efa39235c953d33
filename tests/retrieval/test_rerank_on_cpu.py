"""Reranking (retrieval/rerank.py): retrieve N, score (query, passage) pairs with a cross-encoder, return
the best k, as Search-R1's rerank server does. A tiny cross-encoder built here (2-layer BERT with
MiniLM's tokenizer, random weights) shows the mechanics and the contract; quality needs a real model."""

import json

import httpx
import pytest

from retrieval.app import create_app
from retrieval.index import load_retriever
from retrieval.rerank import CrossEncoder, RerankingRetriever, passage_text
from retrieval.settings import ServerConfig
from tests.conftest import LiveServer, free_port


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory) -> str:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from retrieval.encoder import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, num_labels=1))
    out = tmp_path_factory.mktemp("cross_encoder")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


class _ByWord:
    """A stand-in scorer: 1.0 for a passage holding ``word``, else 0.0 (to see the reordering)."""

    name, batch_size = "by-word", 32

    def __init__(self, word):
        self.word, self.pairs = word, []

    def score(self, pairs):
        self.pairs += list(pairs)
        return [1.0 if self.word in p else 0.0 for _, p in pairs]


def test_scores_are_the_cross_encoders_and_the_best_k_of_the_depth_come_back(tiny_cross_encoder, bm25_index_dir,
                                                                           qa_path):
    questions = [json.loads(line)["question"] for line in open(qa_path)][:6]
    base = load_retriever(bm25_index_dir)
    ce = CrossEncoder(tiny_cross_encoder, device="cpu", batch_size=7)  # batches that split a query's passages
    rr = RerankingRetriever(base, ce, depth=10)
    got = rr.search(questions, 3)
    first = base.search(questions, 10)
    for q, hits, top in zip(questions, first, got):
        want = ce.score([(q, passage_text(doc)) for doc, _ in hits])
        ranked = sorted(zip([doc["id"] for doc, _ in hits], want), key=lambda t: -t[1])[:3]
        assert [doc["id"] for doc, _ in top] == [i for i, _ in ranked], q
        assert [s for _, s in top] == pytest.approx([s for _, s in ranked], abs=1e-6)
        assert all(0.0 < s < 1.0 for _, s in top)  # one-label model: the sigmoid of its logit
    assert rr.kind == "bm25+rerank" and rr.describe()["searches"] == 1
    # the passage as Search-R1's reranker shows it
    assert passage_text({"contents": '"Harvey Pekar"\nHarvey Pekar was a writer.'}) == \
        '(Title: "Harvey Pekar") Harvey Pekar was a writer.'


def test_each_query_is_paired_with_its_own_passages_and_reordered(bm25_index_dir, qa_path):
    questions = [json.loads(line)["question"] for line in open(qa_path)][:4]
    base = load_retriever(bm25_index_dir)
    first = base.search(questions, 10)
    # the word of the 8th passage retrieved for question 0: reranking lifts passages holding it to the top
    word = passage_text(first[0][7][0]).split(")", 1)[1].split()[0]
    scorer = _ByWord(word)
    got = RerankingRetriever(base, scorer, depth=10).search(questions, 3)
    assert len(scorer.pairs) == sum(len(h) for h in first)
    assert [q for q, _ in scorer.pairs] == [q for q, hits in zip(questions, first) for _ in hits]
    assert got[0][0][0]["id"] == next(d["id"] for d, _ in first[0] if word in passage_text(d))
    assert all(word in passage_text(d) for d, s in got[0] if s == 1.0)
    # ties keep the first stage's order; k deeper than the depth retrieves k
    plain = RerankingRetriever(base, _ByWord("\0"), depth=2).search(questions[:1], 5)
    assert [d["id"] for d, _ in plain[0]] == [d["id"] for d, _ in base.search(questions[:1], 5)[0]]


def test_the_server_reranks_reports_it_and_refuses_a_bad_model(tiny_cross_encoder, bm25_index_dir, capsys):
    from retrieval.server import main

    rr = RerankingRetriever(load_retriever(bm25_index_dir), CrossEncoder(tiny_cross_encoder, device="cpu"), depth=5)
    srv = LiveServer(create_app(rr, ServerConfig(default_topk=2)), free_port())
    try:
        r = httpx.post(srv.url + "/retrieve", json={"queries": ["Harvey Pekar", "Denise Levertov"],
                                                    "return_scores": True}, timeout=60)
        assert r.status_code == 200, r.text
        rows = r.json()["result"]
        assert [len(x) for x in rows] == [2, 2]
        assert all(a["score"] >= b["score"] for x in rows for a, b in zip(x, x[1:]))
        health = httpx.get(srv.url + "/health").json()
        assert health["kind"] == "bm25+rerank" and health["rerank"]["depth"] == 5, health
        assert health["rerank"]["model"] == tiny_cross_encoder and health["rerank"]["searches"] >= 1
        # replicas that rerank differently are not the same retriever (scripts/multinode.sh compares index_id)
        from retrieval.folder import index_id

        plain = load_retriever(bm25_index_dir)
        assert health["index_id"] == index_id(rr.identity) != index_id(plain.identity)
    finally:
        srv.close()
    assert main(["--index", str(bm25_index_dir), "--rerank", str(bm25_index_dir / "no-such-model")]) == 2
    assert "\nerror: cannot load the reranker" in "\n" + capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--index", str(bm25_index_dir), "--rerank", tiny_cross_encoder, "--rerank-depth", "0"])
    assert e.value.code == 2 and "--rerank-depth" in capsys.readouterr().err
