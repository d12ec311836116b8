"""A generation its client abandons mid-way: what the cancel tests against real children
(tests/integration/test_daemon.py, test_child_keepalive.py) start before they look at
whether the child stopped generating for it."""

from __future__ import annotations

from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import SMALL_MODEL, model_path
from tests.support.daemon import Clients
from tests.support.endless import never_end


async def abandon_a_long_generation(c: Clients, after: int = 5) -> None:
    """Start a 3000-token generation that cannot end early, read ``after`` of its
    messages, then cancel the call."""
    call = c.inference.Generate(pb.GenerateRequest(
        prompt="Write a very long story about the sea.",
        sampling=pb.SamplingParams(max_tokens=3000,
                                   logit_bias=never_end(model_path(SMALL_MODEL)))))
    got = 0
    async for _ in call:
        got += 1
        if got == after:
            break
    assert got == after, f"the generation ended after {got} messages"
    call.cancel()
