"""The parts of ``bench.bench_retrieval`` (the entry point), one module each."""
