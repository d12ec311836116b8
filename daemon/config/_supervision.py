"""``[restart]``, ``[child]``, ``[swap]`` and ``[recycle]``: how children are supervised
(backoff and breaker, start deadlines, liveness and outcome probes, stop grace, swaps,
planned recycling), sections of :class:`~daemon.config._sections.Settings` declared apart
to keep that module short.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._options import setting


@dataclass(frozen=True)
class RestartSettings:
    """``[restart]``: the supervisor's :class:`~supervisor.RestartPolicy`."""

    backoff_base: float = setting(0.5, minimum=0.001, help="First restart backoff ceiling, s.")
    backoff_cap: float = setting(30.0, minimum=0.001, help="Largest restart backoff ceiling, s.")
    breaker_failures: int = setting(5, minimum=1, help="""
        Consecutive failed starts that open the circuit breaker.""")
    breaker_reset: float = setting(60.0, minimum=0, help="""
        Seconds of stable running that reset the failure count.""")
    breaker_cooldown: float = setting(300.0, minimum=0, help="""
        Seconds before an open breaker (transient causes) tries once more; 0 never.""")


@dataclass(frozen=True)
class ChildSettings:
    """``[child]``: the supervisor's :class:`~supervisor.Timeouts`, and more of a child."""

    start_timeout: float = setting(60.0, minimum=0.1, help="""
        Seconds a child start may go without progress (output or 'loading').""")
    start_cap: float = setting(300.0, minimum=0.1, help="""
        Hard limit of a child start, s, for a model of no size (a swap's is swap.ready_timeout);
        it grows by start_cap_per_gib per GiB of model file, up to start_cap_max.""")
    start_cap_per_gib: float = setting(10.0, minimum=0, help="""
        Seconds a start's hard limit grows by per GiB of model file (reading the weights from
        disk: 10 s/GiB is about 100 MB/s).""")
    start_cap_max: float = setting(1800.0, minimum=0.1, help="""
        The most a start's hard limit grows to with the model's size, s (never below start_cap
        or swap.ready_timeout).""")
    probe_interval: float = setting(5.0, minimum=0.05, help="Seconds between liveness probes.")
    probe_timeout: float = setting(3.0, minimum=0.05, help="Seconds a liveness probe may take.")
    probe_failures: int = setting(3, minimum=1, help="Failed probes in a row that mean hung.")
    stop_grace: float = setting(10.0, minimum=0, help="Seconds between SIGTERM and SIGKILL.")
    busy_silence: float = setting(120.0, minimum=1, help="""
        While calls run, seconds without a byte from the child before probes count again (a busy
        child may not answer them).""")
    failed_calls: int = setting(3, minimum=0, help="""
        Calls in a row that fail on a child (a server error, a dropped connection, a timeout, a
        stream with no token and no usage) before it is taken out of service and replaced,
        however its /health answers, once a 1-token probe fails too (one it answers clears the
        count); 0: never.""")
    token_probe_interval: float = setting(1.0, minimum=0.05, help="""
        Seconds between looks at a child's outcomes: a stream silent this long, or a failed
        call, gets the child a 1-token probe of llamad's own.""")
    token_probe_timeout: float = setting(4.0, minimum=0, help="""
        Seconds a 1-token probe may go unanswered (plus token_probe_per_gib per GiB of model)
        before the child is taken out of service and replaced, unless it answered other calls
        meanwhile, its serving loop answered, or its process is computing (see
        token_probe_busy_max); 0: no probes.""")
    token_probe_per_gib: float = setting(5.0, minimum=0, help="""
        Seconds added to token_probe_timeout per GiB of model file: one step of a healthy child
        (a prompt batch) must fit in the allowance.""")
    token_probe_busy_max: float = setting(60.0, minimum=0, help="""
        Longest a 1-token probe may go unanswered while the child's process is computing (its
        CPU time advances: a long prompt step on a loaded machine) before the child is judged
        stuck anyway; a child with no CPU time over token_probe_timeout is judged at once.""")
    unresponsive_grace: float = setting(2.0, minimum=0, help="""
        Seconds between SIGTERM and SIGKILL for a child taken out of service by its outcomes (a
        stuck llama-server may ignore SIGTERM).""")
    request_timeout: float = setting(600.0, minimum=1, help="""
        Longest silence from a child during a request, s.""")
    log_lines: int = setting(2000, minimum=10, help="Output lines kept per child for TailLogs.")
    max_connections: int = setting(64, minimum=1, help="""
        Requests llamad has open to one launched child at once (connections to its private
        socket); more wait for one to free.""")
    max_idle_connections: int = setting(16, minimum=0, help="""
        Connections to a launched child kept open between requests for reuse (a stream read to
        its end gives its connection back); 0: a connection per request.""")
    stream_interval: int = setting(40, minimum=0, help="""
        Milliseconds between two reads of a launched child's stream once its first token was
        relayed: what the child sent meanwhile goes to the client as one event (gRPC: one
        message), so that llamad wakes up once per interval instead of once per token (its
        CPU per token; pauses end on a grid of a quarter interval, so at 40 a reader gets an
        event about every 50 ms). The first token and a cancel are never held back; the
        stream's end or an error waits at most for the pause in progress. 0: every read at
        once.""")
    stream_interval_max: int = setting(120, minimum=0, help="""
        Milliseconds a slow stream's reads may be apart (at most; at or below
        stream_interval: none longer). A stream that gets fewer tokens than two per
        stream_interval (many streams sharing one child) would otherwise be relayed one
        token per event, and llamad's CPU per token is mostly its CPU per event: its
        interval grows with its pace to about two tokens' time, up to this. A fast stream
        keeps stream_interval; the first token, the end and a cancel are never held.""")
    slots: bool = setting(False, reload="restart", help="""
        llama-server children serve /slots (each slot's prompt and parameters), for debugging:
        still only on their private socket and with their per-launch key (LLAMA_API_KEY in the
        child's environment).""")


@dataclass(frozen=True)
class SwapSettings:
    """``[swap]``: make-before-break model swaps."""

    ready_timeout: float = setting(90.0, minimum=1, help="""
        Seconds a swapped-in child has to become ready before the swap fails.""")
    drain_timeout: float = setting(30.0, minimum=0, help="""
        Seconds calls on the old child get to finish after a swap before it stops.""")
    handover_hold: float = setting(5.0, minimum=0, help="""
        Seconds new calls may wait, after a swap switched, for the old child's calls to end
        before they start on the new child (two children computing at once on the same cores
        both slow down); 0: start them at once.""")
    launch_nice: int = setting(10, minimum=0, help="""
        Nice value added to a swap's incoming child while it loads beside the serving one, taken
        back at the switch (needs LimitNICE=+0 or CAP_SYS_NICE; without, unused); 0: none.""")


@dataclass(frozen=True)
class RecycleSettings:
    """``[recycle]``: replacing a long-running child."""

    after_requests: int = setting(0, minimum=0, help="""
        Replace a child (make-before-break) after it served this many calls; 0: never.""")
    max_rss_mb: int = setting(0, minimum=0, help="""
        Replace a child whose resident memory exceeds this many MiB; 0: never.""")
    check_interval: float = setting(10.0, minimum=0.1, help="Seconds between recycling checks.")
    min_uptime: float = setting(60.0, minimum=0, help="""
        A child is recycled at most once per this many seconds of running.""")
    cancel_grace: float = setting(60.0, minimum=0, help="""
        Seconds a llama-server child has, after a call on it was cancelled (its deadline passed
        or its client left), to answer a request that needs its serving loop; one that does not
        (stuck in one token) is replaced, make-before-break; 0: never.""")
