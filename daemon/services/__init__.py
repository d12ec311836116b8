"""What the APIs call, free of any wire: generation and embeddings through the router
(:mod:`.inference`), grounded answers (:mod:`.ask`), search (:mod:`.search`), and the
retriever's links to the models (:mod:`.retrieval_bridge`). Plain arguments in, plain
results out, refusals carrying their field; the gRPC and HTTP adapters translate.
"""
