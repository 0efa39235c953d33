"""A plain retrieval server, the baseline of ``bench/bench_retrieval.py --parts versus``: FastAPI + uvicorn,
one encoder call and one index search per request, on the request's thread (a sync endpoint runs in
Starlette's thread pool), the way Search-R1's ``retrieval_server.py`` serves. Same index, corpus and
encoder as ours; no batching, no cache.

    python bench/plain_server.py --index runs/index/minilm --port 8123
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def app_for(retriever):
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Query(BaseModel):
        queries: list[str]
        topk: int = 3
        return_scores: bool = False

    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(q: Query):
        rows = retriever.search(q.queries, q.topk)
        if q.return_scores:
            return {"result": [[{"document": d, "score": s} for d, s in r] for r in rows]}
        return {"result": [[d for d, _ in r] for r in rows]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    import uvicorn

    from retrieval.index import load_retriever

    uvicorn.run(app_for(load_retriever(args.index, device="cpu")), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
