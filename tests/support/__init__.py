"""What tests share instead of copying: one module per kind of helper.

* :mod:`tests.support.access`: role tokens, token files and quiet daemons for the access tests.
* :mod:`tests.support.config_load`: loading configuration hermetically (parser, env, TOML).
* :mod:`tests.support.corpus`: a small corpus of runbooks on disk.
* :mod:`tests.support.daemon`: a real daemon in-process on port 0 and real gRPC stubs to it.
* :mod:`tests.support.daemon_process`: the daemon as a real process (``python -m daemon serve``).
* :mod:`tests.support.modes`: unsupervised llama-servers (endpoints) for the mode tests.
* :mod:`tests.support.procs`: processes seen from /proc (alive, gone, descendants), a free port.
* :mod:`tests.support.scripted`: the supervisor's scripted launcher and children (no processes).
* :mod:`tests.support.embedder`: a deterministic hash embedder and a small corpus.
* :mod:`tests.support.chunk_samples`: texts the chunking tests cut (runbook, configs, prose).
* :mod:`tests.support.chunks`: what every chunking guarantees, as assertions.
* :mod:`tests.support.redaction`: fake secrets built at run time and the exact-output check.
* :mod:`tests.support.requests`: small request limits and a sampling-parameters strategy.
* :mod:`tests.support.models`: tiny model files (a valid GGUF, a BERT checkpoint to convert).
* :mod:`tests.support.hostile`: the hostile-input tests' seed documents and checks (``intact``).
* :mod:`tests.support.races`: the symlink-swapping attacker of the confinement tests.
* :mod:`tests.support.pdf`: small PDFs built byte by byte.
* :mod:`tests.support.pki`: a throwaway CA and certificates.
* :mod:`tests.support.extraction`: writing a file to extract; expecting an ExtractionError.
* :mod:`tests.support.fake_openai`: a fake OpenAI-compatible endpoint.
* :mod:`tests.support.fake_children`: fake llama-server children started for their own tests.
* :mod:`tests.support.fuzz`: the fuzzing properties (run by test_fuzz and bench/fuzz.py).
* :mod:`tests.support.backend`: a scripted inference backend and role (servicer unit tests).
* :mod:`tests.support.inprocess`: a real gRPC server in-process on port 0, for servicers.
* :mod:`tests.support.scaling`: linear time asserted as growth, not as seconds.
"""
