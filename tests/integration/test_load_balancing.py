"""Several daemons behind a load balancer (issue 17): two real ``llamad serve`` processes on
loopback ports, 8 clients streaming Generate calls all along, behind a real HAProxy
(Debian's, tests/support/haproxy.py) and then with gRPC's client-side round_robin and no
proxy. Drain node 1: no call fails and new calls go to node 2. kill -9 node 1: its streams
fail with UNAVAILABLE, none hangs, new calls go to node 2. Node 1 back: it gets calls again.

The children are the fake llama-server (supervisor/testing) streaming a token every 50 ms:
what is tested is routing, draining and failing over, not a model's output.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from clients import Client, LlamadError
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import inference_pb2_grpc
from supervisor.testing import fake_child_command
from tests.support import haproxy
from tests.support.daemon_process import DaemonProcess
from tests.support.load import patience
from tests.support.models import write_model
from tests.support.procs import free_port

pytestmark = pytest.mark.timeout(patience(180))

TOKENS = 8  # a stream: 8 tokens, 50 ms apart
DEADLINE = 30.0  # per call: a stream that hangs ends DEADLINE_EXCEEDED, which fails a test


class Node:
    """One daemon on fixed ports (so it can come back on them), restartable."""

    def __init__(self, tmp: Path, name: str, llama_bin: Path, model: Path,
                 **env: str) -> None:
        self.name = name
        self.port, self.agent_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._tmp = tmp / name
        self._tmp.mkdir()
        self._env = {
            "LLAMAD_LISTEN": self.address,
            "LLAMAD_AGENT_LISTEN": f"127.0.0.1:{self.agent_port}",
            "LLAMAD_STATE_DIR": str(self._tmp / "state"),
            "LLAMAD_GENERATION_MODEL": str(model),
            "LLAMAD_GENERATION_RUNTIME": "llama-server",
            "LLAMAD_LLAMA_BIN": str(llama_bin),
            "LLAMAD_GENERATION_PARALLEL": "8",
            "LLAMAD_GENERATION_THREADS": "1",
            "LLAMAD_EMBEDDING_ENABLED": "false",
            "LLAMAD_RETRIEVAL_ENABLED": "false",
            "LLAMAD_LOG_FORMAT": "json",
            **env,
        }
        self.runs: list[DaemonProcess] = []

    def start(self) -> None:
        self.runs.append(DaemonProcess(self._tmp, self._env))
        self.runs[-1].wait_running()

    @property
    def proc(self) -> DaemonProcess:
        return self.runs[-1]

    def served(self) -> int:
        """Generate calls finished OK, over every run of this node."""
        return sum(1 for run in self.runs for r in run.records()
                   if r.get("event") == "rpc" and r.get("method") == "Generate"
                   and r.get("code") == "OK")

    def in_flight(self) -> int:
        return self.proc.status().in_flight

    def agent(self) -> str:
        """The agent-check port's line now."""
        with socket.create_connection(("127.0.0.1", self.agent_port), timeout=5) as s:
            return s.makefile("rb").read().decode()

    def drain(self, draining: bool) -> None:
        with Client(self.address, timeout=10) as client:
            client.set_draining(draining, reason="test")


class Load:
    """8 threads, each streaming Generate calls one after another until stopped; every
    call's outcome is kept with the time it started."""

    def __init__(self, call: Callable[[], int]) -> None:
        self._call = call
        self._stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[tuple[float, str]] = []  # (started, code name)
        self.failures: list[str] = []  # code and details, for the assertion messages
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(8)]

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                tokens = self._call()
                code = "OK" if tokens == TOKENS else f"SHORT:{tokens}"
            except grpc.RpcError as exc:
                code = exc.code().name
                with self.lock:
                    self.failures.append(f"{code}: {exc.details()}")
            except LlamadError as exc:  # the client library's (client-side balancing)
                code = exc.code
                with self.lock:
                    self.failures.append(f"{code}: {exc.details}")
            with self.lock:
                self.outcomes.append((began, code))

    def codes(self, since: float = 0.0) -> Counter[str]:
        with self.lock:
            return Counter(code for began, code in self.outcomes if began >= since)

    def wait_calls(self, n: int, since: float) -> None:
        """Wait until ``n`` calls started after ``since`` have ended."""
        deadline = time.monotonic() + 60
        while sum(self.codes(since).values()) < n:
            assert time.monotonic() < deadline, f"calls stalled: {self.codes()}"
            time.sleep(0.05)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(DEADLINE + 5)


def wait_for(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def parts(tmp: Path) -> tuple[Path, Path]:
    """A "llama-server" (the fake child, a token every 50 ms) and a tiny GGUF model."""
    argv = fake_child_command(port=1, model="-")
    llama_bin = tmp / "llama-server"
    llama_bin.write_text(f'#!/bin/sh\nexec "{argv[0]}" "{argv[1]}" --token-delay 0.05 "$@"\n')
    llama_bin.chmod(0o755)
    return llama_bin, write_model(tmp / "tiny.gguf")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    llama_bin, model = parts(tmp_path)
    pair = (Node(tmp_path, "n1", llama_bin, model), Node(tmp_path, "n2", llama_bin, model))
    try:
        for node in pair:
            node.start()
        yield pair
    finally:
        for node in pair:
            for run in node.runs:
                run.kill()


def scenario(n1: Node, n2: Node, load: Load, *, drained: Callable[[], None],
             down: Callable[[], None], back: Callable[[], None],
             cut: frozenset[str] = frozenset({"UNAVAILABLE"})) -> None:
    """Drain, kill -9 and bring back node 1 under ``load``; ``drained``, ``down`` and
    ``back`` wait until the balancer has seen each; a stream cut by the kill ends with one
    of the codes ``cut``."""
    wait_for("both nodes serve", lambda: n1.served() > 0 and n2.served() > 0)

    # Drain node 1: calls on it finish, no call fails, new calls go to node 2 only.
    n1.drain(True)
    drained()
    wait_for("node 1's calls finish", lambda: n1.in_flight() == 0)
    load.wait_calls(8, time.monotonic())  # a call sent as the balancer learnt it has ended
    before, since = n1.served(), time.monotonic()
    load.wait_calls(24, since)
    assert (n1.served(), n1.in_flight()) == (before, 0), "a drained node got new calls"
    assert set(load.codes()) == {"OK"}, load.codes()

    # Undrain: node 1 gets calls again.
    n1.drain(False)
    wait_for("node 1 serves again", lambda: n1.served() > before)

    # kill -9 node 1 with streams running on it: they fail, none hangs, new calls go on.
    # One long stream straight to node 1 is surely running when it dies (the balanced
    # streams are 0.4 s long: any of them may just have ended).
    long_stream: list[str] = []
    with grpc.insecure_channel(n1.address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        request = pb.GenerateRequest(prompt="hello",
                                     sampling=pb.SamplingParams(max_tokens=400))
        replies = stub.Generate(request, timeout=DEADLINE)
        next(replies)  # running on node 1

        def drain_stream() -> None:
            try:
                for _ in replies:
                    pass
                long_stream.append("OK")
            except grpc.RpcError as exc:
                long_stream.append(exc.code().name)

        reader = threading.Thread(target=drain_stream)
        reader.start()
        wait_for("streams on node 1", lambda: n1.in_flight() > 0)
        n1.proc.kill()
        killed = time.monotonic()
        reader.join(DEADLINE + 5)
    assert long_stream == ["UNAVAILABLE"], long_stream
    down()
    seen_down = time.monotonic()
    load.wait_calls(24, seen_down)
    after_kill = load.codes(killed - DEADLINE)
    failed = {code for code in after_kill if code != "OK"}
    # Balanced streams that ran on node 1 failed with an error, never cut short silently
    # (a SHORT outcome) and never DEADLINE_EXCEEDED (none hung).
    assert failed <= cut, load.failures
    assert set(load.codes(seen_down)) == {"OK"}, load.codes(seen_down)

    # Node 1 back on its ports: it gets calls again.
    n1.start()
    back()
    served = n1.served()
    wait_for("node 1 back in rotation", lambda: n1.served() > served)
    assert "DEADLINE_EXCEEDED" not in load.codes()


def _generate(channel: grpc.Channel) -> Callable[[], int]:
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    request = pb.GenerateRequest(prompt="hello", sampling=pb.SamplingParams(max_tokens=TOKENS))

    def call() -> int:  # tokens, not messages: a busy relay sends several in one
        return sum(m.tokens for m in stub.Generate(request, timeout=DEADLINE))

    return call


def test_behind_haproxy(nodes: tuple[Node, Node], tmp_path: Path) -> None:
    """HAProxy with an agent check per daemon: drain, kill -9 and return of node 1 under
    8 streaming clients (the agent says drain; the TCP check sees the kill; a call sent
    to the dead node before the check is redispatched)."""
    binary = haproxy.haproxy()
    n1, n2 = nodes
    servers = [haproxy.Node(n.name, n.port, n.agent_port) for n in nodes]
    with haproxy.running(binary, tmp_path, free_port(), servers) as lb:
        lb.wait_state("n1", "UP")
        lb.wait_state("n2", "UP")
        with grpc.insecure_channel(lb.address) as channel, Load(_generate(channel)) as load:
            scenario(n1, n2, load,
                     drained=lambda: lb.wait_state("n1", "DRAIN"),
                     down=lambda: lb.wait_state("n1", "DOWN"),
                     back=lambda: lb.wait_state("n1", "UP"),
                     # HAProxy ends some of the streams it was relaying from the killed
                     # daemon with END_STREAM and no gRPC trailers, which gRPC reports
                     # as UNKNOWN ("Stream removed"); the others get RST_STREAM:
                     # UNAVAILABLE (docs/scale-out.md).
                     cut=frozenset({"UNAVAILABLE", "UNKNOWN"}))


def test_client_side_round_robin(nodes: tuple[Node, Node]) -> None:
    """No proxy: Client(addresses=[n1, n2]) balances with round_robin and follows each
    daemon's grpc.health.v1 through the same drain, kill -9 and return."""
    n1, n2 = nodes
    # A node that comes back is reconnected to after the channel's backoff (gRPC's default
    # grows to 120 s); keep it short here, as docs/scale-out.md suggests.
    backoff = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 500)]
    with Client(addresses=[n1.address, n2.address], options=backoff) as client:
        client.wait_serving(timeout=30)

        def call() -> int:
            return sum(c.tokens for c in client.generate("hello", max_tokens=TOKENS,
                                                         timeout=DEADLINE))

        def health_of(node: Node, status: str) -> Callable[[], None]:
            def wait() -> None:
                with Client(node.address, timeout=5) as one:
                    wait_for(f"{node.name} {status}", lambda: one.health() == status)
            return wait

        with Load(call) as load:
            scenario(n1, n2, load, drained=health_of(n1, "not_serving"),
                     down=lambda: None, back=health_of(n1, "serving"))


def test_sigterm_drains_in_order(tmp_path: Path) -> None:
    """SIGTERM: health NOT_SERVING and agent ``drain`` first; calls arriving during
    drain_notice are served; then new calls are refused with UNAVAILABLE; the stream
    running all along finishes; exit status 0."""
    llama_bin, model = parts(tmp_path)
    node = Node(tmp_path, "n1", llama_bin, model, LLAMAD_DRAIN_NOTICE="3",
                LLAMAD_DRAIN_GRACE="20")
    node.start()
    try:
        assert node.agent() == "up ready 100%\n"
        with grpc.insecure_channel(node.address) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            request = pb.GenerateRequest(prompt="hello",
                                         sampling=pb.SamplingParams(max_tokens=80))
            running = stub.Generate(request, timeout=DEADLINE)
            first = next(running)
            assert first.text  # it runs: 80 tokens take 4 s
            node.proc.proc.send_signal(signal.SIGTERM)
            wait_for("agent says drain", lambda: node.agent() == "drain\n")
            with Client(node.address, timeout=5) as one:
                assert one.health() == "not_serving"
            assert _generate(channel)() == TOKENS  # within drain_notice: served

            codes: list[grpc.StatusCode] = []

            def refused() -> bool:
                try:
                    _generate(channel)()
                except grpc.RpcError as exc:
                    codes.append(exc.code())
                    return True
                return False

            wait_for("new calls refused", refused)
            assert codes == [grpc.StatusCode.UNAVAILABLE]
            # The first stream finished: all its tokens (a busy relay may send several in
            # one message, so messages are not counted).
            assert first.tokens + sum(m.tokens for m in running) == 80
        assert node.proc.proc.wait(timeout=30) == 0
    finally:
        node.proc.kill()
