"""What the APIs call, free of any wire: generation and embeddings through the router, and the
retriever's links to the models.
"""
