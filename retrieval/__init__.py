"""Search-R1 compatible retrieval: a corpus, indexes of several kinds, a batching HTTP server, a client.

Commands (``python -m retrieval.<name>``):

- ``server``    serve an index over HTTP (the Search-R1 contract); flags derived from ``settings``
- ``launch``    serve a named preset (minilm, bm25, e5, e5-cpu, e5-hnsw, e5-ivfpq, lucene), building it if needed
- ``build``     build an index folder of any registered kind
- ``hub``       download a wiki-18 asset (``scripts/download_wiki18.sh``)
- ``client``    the client library (sync and asyncio), and ``--wait`` health checks for scripts

The library, in import order (a module imports only those above it; ``tests/test_layout_on_cpu.py``):

- ``errors``, ``flags``
                the errors a user sees and the exit statuses of both packages; flags derived from settings fields
- ``client``, ``corpus``, ``cuda_arch``, ``cache``, ``encoder``
                the client; the corpus store; GPU architectures of a wheel; the result cache; text encoders
- ``flat``, ``folder``
                exact flat search in torch on GPUs; an index folder (manifest, identity, the ``IndexKind``
                contract, the build options, shared build steps)
- ``gpu_ivf``, ``rerank``, ``bm25``, ``lucene``
                the faiss-gpu road for IVF indexes; cross-encoder reranking; the BM25 and Lucene kinds
- ``dense``, ``recall``, ``dense_build``
                the dense (FAISS) kind; recall of an approximate index; building a dense folder
- ``kinds``     the registry of index kinds: the one list the build, server, loader and presets read
- ``settings``  the commands' settings (``ServerConfig``, ``LoadConfig``, ``ServeConfig``, ``BuildSettings``),
                one flag per field
- ``index``, ``batching``
                the retriever (encoder + index + corpus), loaded from a folder or released files; the batching
                engine (one thread owns the encoder and the index)
- ``app``       the Flask app factory: the HTTP contract, state in ``app.extensions["retrieval"]``
- ``serving``   waitress: sizing, a background handle, drain on SIGTERM, stop

``retrieval/`` imports nothing from ``train/``; ``train`` uses ``retrieval.client`` (and ``retrieval.index``
for in-process search).
"""
