"""The PostgreSQL + pgvector store: the knowledge base several nodes share, its schema, BM25 in
SQL and its lexical rankers.
"""
