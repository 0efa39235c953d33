"""Tests of the retriever: corpus, indexes, server, client, flat search, bad input (retrieval/)."""
