"""Hybrid retrieval (tantivy BM25 + hnswlib HNSW, fused by RRF). Filled by a later issue."""
