"""The parts of ``bench.soak`` (the entry point), one module each."""
