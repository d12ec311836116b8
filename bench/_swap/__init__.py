"""The parts of ``bench.bench_swap`` (the entry point), one module each."""
