"""What load balancers see: the agent-check line for each state of the roles, the agent
port's one-line answers and its connection cap, the drain switch, and agent_listen's
configuration checks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from daemon.config import ConfigError, load
from daemon.config.inference_mode import InferenceMode, Mode
from daemon.ops.balancing import AgentServer, Drainer, agent_reply, in_flight
from supervisor import State
from tests.support.load import patience


@dataclass
class _Admission:
    limit: int = 4
    in_flight: int = 0
    queued: int = 0


@dataclass
class _Supervisor:
    state: State = State.RUNNING


@dataclass
class _Role:
    mode: Mode = field(default_factory=lambda: Mode(InferenceMode.EMBEDDED))
    supervisor: _Supervisor = field(default_factory=_Supervisor)
    admission: _Admission = field(default_factory=_Admission)


def test_up_with_the_share_of_free_slots() -> None:
    """Serving roles answer ``up ready N%``, N the free share of their slots."""
    roles = {"generation": _Role(admission=_Admission(limit=4, in_flight=1)),
             "embedding": _Role(admission=_Admission(limit=4, in_flight=1))}
    assert agent_reply(roles, draining=False) == "up ready 75%\n"
    roles["generation"].admission.in_flight = 4
    roles["embedding"].admission.in_flight = 3
    assert agent_reply(roles, draining=False) == "up ready 12%\n"


def test_weight_never_zero_when_every_slot_is_busy() -> None:
    """A full node says 1%, not 0% (HAProxy would take 0% as a drain)."""
    roles = {"generation": _Role(admission=_Admission(limit=2, in_flight=2, queued=5))}
    assert agent_reply(roles, draining=False) == "up ready 1%\n"


def test_only_serving_roles_count() -> None:
    """A disabled or failed role's slots are not free capacity."""
    roles = {"generation": _Role(admission=_Admission(limit=2, in_flight=1)),
             "embedding": _Role(mode=Mode(InferenceMode.DISABLED),
                                admission=_Admission(limit=8))}
    assert agent_reply(roles, draining=False) == "up ready 50%\n"


def test_down_with_a_reason_when_no_role_serves() -> None:
    """No role running: ``down#`` and each role's state."""
    roles = {"generation": _Role(supervisor=_Supervisor(State.BACKOFF)),
             "embedding": _Role(mode=Mode(InferenceMode.DISABLED))}
    assert agent_reply(roles, draining=False) == (
        "down#no model can serve: generation backoff, embedding disabled\n")


def test_drain_wins() -> None:
    """Draining answers ``drain`` whatever the roles do."""
    assert agent_reply({"generation": _Role()}, draining=True) == "drain\n"
    down = {"generation": _Role(supervisor=_Supervisor(State.FAILED))}
    assert agent_reply(down, draining=True) == "drain\n"


def test_drainer_is_idempotent_and_tells_on_change() -> None:
    """Setting the same state twice tells once; in_flight counts running and queued."""
    told: list[bool] = []
    roles = {"generation": _Role(admission=_Admission(in_flight=2, queued=1))}
    drainer = Drainer(lambda: roles, told.append)
    drainer.set(True, "maintenance")
    drainer.set(True)
    drainer.set(False)
    assert told == [True, False]
    assert not drainer.drained
    assert drainer.in_flight() == in_flight(roles) == 3


async def _read(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(), patience(5))
    finally:
        writer.close()


async def test_agent_port_answers_one_line_and_closes() -> None:
    """Each connection reads the state now, then EOF; HAProxy's agent-send is ignored."""
    state = {"line": "up ready 100%\n"}
    server = AgentServer(lambda: state["line"], max_connections=4, timeout=1.0)
    port = await server.start("127.0.0.1:0")
    try:
        assert await _read(port) == b"up ready 100%\n"
        state["line"] = "drain\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"backend/server\n")  # what agent-send would send
        assert await asyncio.wait_for(reader.read(), patience(5)) == b"drain\n"
        writer.close()
    finally:
        await server.close()


async def test_agent_port_caps_connections() -> None:
    """Past max_connections a connection is closed unanswered; within it, answered."""
    gate = asyncio.Event()
    entered = asyncio.Event()

    class Slow(AgentServer):
        async def _answer(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
            if self._open < self._max:
                entered.set()
                self._open += 1
                try:
                    await gate.wait()  # hold the one slot
                finally:
                    self._open -= 1
            await super()._answer(reader, writer)

    server = Slow(lambda: "up ready 100%\n", max_connections=1, timeout=1.0)
    port = await server.start("127.0.0.1:0")
    try:
        held = asyncio.create_task(_read(port))
        await asyncio.wait_for(entered.wait(), patience(5))
        assert await _read(port) == b""  # over the cap
        gate.set()
        assert await held == b"up ready 100%\n"
    finally:
        await server.close()


async def test_agent_port_names_an_address_in_use() -> None:
    """A port already taken fails start with one line naming agent checks and the address."""
    first = AgentServer(lambda: "drain\n", max_connections=1, timeout=1.0)
    port = await first.start("127.0.0.1:0")
    try:
        with pytest.raises(OSError, match=f"cannot answer agent checks on 127.0.0.1:{port}"):
            await AgentServer(lambda: "drain\n", max_connections=1,
                              timeout=1.0).start(f"127.0.0.1:{port}")
    finally:
        await first.close()


def test_agent_listen_is_checked() -> None:
    """agent_listen takes any host:port (it reads nothing); a socket or junk is refused."""
    env = {"LLAMAD_GENERATION_ENABLED": "false", "LLAMAD_EMBEDDING_ENABLED": "false"}
    assert load(None, env={**env, "LLAMAD_AGENT_LISTEN": "0.0.0.0:9777"}).settings.agent_listen \
        == "0.0.0.0:9777"
    with pytest.raises(ConfigError, match="agent_listen: must be a host:port"):
        load(None, env={**env, "LLAMAD_AGENT_LISTEN": "unix:/tmp/agent.sock"})
    with pytest.raises(ConfigError, match="agent_listen: 'nonsense' is not host:port"):
        load(None, env={**env, "LLAMAD_AGENT_LISTEN": "nonsense"})
