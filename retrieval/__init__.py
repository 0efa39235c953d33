"""Search-R1 compatible retrieval: corpus store, encoders, dense/BM25 indexes, server, client."""
