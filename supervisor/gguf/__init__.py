"""GGUF model files: opened safely, their header read and checked before a child is launched
with one.
"""
