"""The parts of ``bench.bench_generation`` (the entry point), one module each."""
