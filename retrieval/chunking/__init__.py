"""Chunking: extracted text in, citable chunks out, by the structure of each kind."""
