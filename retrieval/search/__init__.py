"""Hybrid search: the BM25 and HNSW lists of a store fused by reciprocal rank fusion."""
