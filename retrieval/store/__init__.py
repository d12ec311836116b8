"""The embedded store: SQLite metadata (the source of truth), a tantivy BM25 index and an
hnswlib HNSW index, kept crash-consistent together.
"""
