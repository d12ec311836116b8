"""Several addresses make one balanced channel (round_robin, health-checked); ``llamad
health`` exits with the documented statuses; ``llamad drain``/``undrain`` reach the daemon
and one daemon only."""

from __future__ import annotations

import json

import pytest

from clients import Client
from clients._channel import balanced_target, settings
from clients.testing import FakeLlamad
from tests.support.cli_run import Run, runner
from tests.support.procs import free_port


@pytest.fixture
def llamad(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """Run ``llamad ARGS`` (each names its --address); return (status, stdout, stderr)."""
    return runner(capsys, monkeypatch)


def test_several_addresses_make_one_balanced_target() -> None:
    """IPv4 (and localhost), or IPv6, become one ipv4:/ipv6: target with round_robin and
    health checking; one address keeps the default policy."""
    assert balanced_target(["127.0.0.1:5001", "localhost:5002"]) == \
        "ipv4:127.0.0.1:5001,127.0.0.1:5002"
    assert balanced_target(["[::1]:5001", "[::1]:5002"]) == "ipv6:[::1]:5001,[::1]:5002"
    s = settings("127.0.0.1:5001, 127.0.0.1:5002")
    assert s.balanced and s.target == "ipv4:127.0.0.1:5001,127.0.0.1:5002"
    config = json.loads(dict(s.options)["grpc.service_config"])
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config["healthCheckConfig"] == {"serviceName": ""}
    assert config["methodConfig"]  # the retry policies stay
    one = settings("127.0.0.1:5001")
    assert not one.balanced
    assert "loadBalancingConfig" not in json.loads(dict(one.options)["grpc.service_config"])


def test_several_addresses_are_checked() -> None:
    """Names, mixed families, empty entries and both address forms are refused, by name."""
    with pytest.raises(ValueError, match=r"IP address and a port, got 'db\.example:1'"):
        settings("127.0.0.1:1,db.example:1")
    with pytest.raises(ValueError, match="all IPv4 or all IPv6"):
        settings(["127.0.0.1:1", "[::1]:2"])
    with pytest.raises(ValueError, match="an empty address"):
        settings("127.0.0.1:1,")
    with pytest.raises(ValueError, match="address or addresses, not both"):
        Client("127.0.0.1:1", addresses=["127.0.0.1:2"])
    with pytest.raises(ValueError, match="in the clear"):
        settings("127.0.0.1:1,10.0.0.2:1", token="t")


def test_client_balances_over_the_serving_daemons() -> None:
    """Client(addresses=...) reaches the fakes; calls go to more than one of them."""
    with FakeLlamad() as a, FakeLlamad() as b, \
            Client(addresses=[a.address, b.address], timeout=10) as client:
        assert client.balanced
        client.wait_serving(timeout=10)
        for _ in range(8):
            client.status()
        assert a.calls["ControlService/Status"] > 0
        assert b.calls["ControlService/Status"] > 0


def test_health_exit_statuses(fake: FakeLlamad, llamad: Run) -> None:
    """0 serving, 4 unknown service, 3 no answer, 2 several addresses; -q prints nothing."""
    assert llamad("health", "--address", fake.address) == (0, '"": serving\n', "")
    status, out, _ = llamad("health", "--address", fake.address, "--service", "generation")
    assert (status, out) == (0, "generation: serving\n")
    status, out, _ = llamad("health", "--address", fake.address, "--service", "nope")
    assert (status, out) == (4, "nope: unknown service\n")
    assert llamad("health", "-q", "--address", fake.address, "--service", "nope") == (4, "", "")
    status, out, _ = llamad("health", "--address", f"127.0.0.1:{free_port()}",
                            "--timeout", "3")
    assert status == 3 and out.startswith("no answer from 127.0.0.1:")
    status, _, err = llamad("health", "--address", f"{fake.address},{fake.address}")
    assert (status, err) == (2, "llamad: health: talks to one daemon: give one --address\n")


def test_drain_and_undrain(fake: FakeLlamad, llamad: Run) -> None:
    """drain sets the daemon's drain (status says DRAINED), undrain clears it."""
    assert llamad("drain", "--address", fake.address, "--reason", "kernel update") == (
        0, "drained: 1 calls in flight\n", "")
    assert fake.calls["ControlService/SetDraining"] == 1
    _, out, _ = llamad("status", "--address", fake.address)
    assert "DRAINED" in out.splitlines()[0]
    assert llamad("undrain", "--address", fake.address) == (0, "undrained\n", "")
    _, out, _ = llamad("status", "--address", fake.address)
    assert "DRAINED" not in out.splitlines()[0]
    status, _, err = llamad("drain", "--address", f"{fake.address},{fake.address}")
    assert status == 2 and "give one --address" in err


def test_drain_wait_gives_up_while_calls_run(fake: FakeLlamad, llamad: Run) -> None:
    """--wait returns 1, naming the calls still running, when they do not finish."""
    status, _, err = llamad("drain", "--address", fake.address, "--wait", "0.6")
    assert status == 1
    assert err == "llamad: drain: 1 calls still in flight after 0.6 s\n"
