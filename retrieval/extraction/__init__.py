"""Files and bytes into text: document kinds, encodings, HTML, PDF (in a worker process), a
document's own date, and reading a directory source without leaving its root.
"""
