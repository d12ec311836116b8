"""The model's own state machine (daemon/models/_states.py): every legal transition
accepted, every illegal one rejected, the table exhaustive; and the model refusing an
illegal change instead of fixing it up."""

from __future__ import annotations

import itertools

import pytest

from daemon.config.inference_mode import InferenceMode
from daemon.errors import Disabled
from daemon.models._states import TRANSITIONS, ModelState, check_transition
from supervisor import IllegalTransitionError, State
from tests.support.scripted import PERMANENT, settle
from tests.support.scripted_model import rig, setup_for

U, L, S, W, D, X = (ModelState.UNLOADED, ModelState.LOADING, ModelState.SERVING,
                    ModelState.SWAPPING, ModelState.DRAINING, ModelState.STOPPED)
# The intended machine, written out independently of the table it checks.
LEGAL = [(U, L), (U, S), (U, X), (L, S), (L, U), (L, X), (S, W), (S, D), (S, X), (W, S),
         (W, X), (D, U), (D, X)]
ILLEGAL = [(old, new) for old, new in itertools.product(ModelState, ModelState)
           if (old, new) not in LEGAL]


@pytest.mark.parametrize(("old", "new"), LEGAL, ids=[f"{o.value}->{n.value}" for o, n in LEGAL])
def test_every_legal_transition_is_accepted(old: ModelState, new: ModelState) -> None:
    """A move in the table passes the check."""
    check_transition(old, new)


@pytest.mark.parametrize(("old", "new"), ILLEGAL,
                         ids=[f"{o.value}->{n.value}" for o, n in ILLEGAL])
def test_every_illegal_transition_is_rejected(old: ModelState, new: ModelState) -> None:
    """A move not in the table raises, naming both states."""
    with pytest.raises(IllegalTransitionError, match=f"{old.value} -> {new.value}"):
        check_transition(old, new)


def test_table_is_exhaustive() -> None:
    """Every state has a row; every state is reachable from unloaded; shutdown is
    reachable from every state and leads nowhere."""
    assert set(TRANSITIONS) == set(ModelState)
    assert {(o, n) for o, news in TRANSITIONS.items() for n in news} == set(LEGAL)
    reached, frontier = {ModelState.UNLOADED}, [ModelState.UNLOADED]
    while frontier:
        for new in TRANSITIONS[frontier.pop()] - reached:
            reached.add(new)
            frontier.append(new)
    assert reached == set(ModelState)
    assert all(ModelState.STOPPED in TRANSITIONS[s] for s in ModelState
               if s is not ModelState.STOPPED)
    assert TRANSITIONS[ModelState.STOPPED] == frozenset()


async def test_model_walks_the_table() -> None:
    """Start, a swap, an unload and a shutdown move the model through its states."""
    r = await rig(start=False)
    assert (r.model.state, r.model.status) == (ModelState.UNLOADED, "unloaded")
    r.model.start()
    assert r.model.state is ModelState.SERVING
    await settle(r.supervisor, State.RUNNING)
    assert r.model.status == "ready"
    await r.model.replace(r.target(["ok"]))
    assert r.model.state is ModelState.SERVING
    await r.model.unload()
    assert (r.model.state, r.model.mode.kind) == (ModelState.UNLOADED, InferenceMode.DISABLED)
    await r.model.stop()
    assert (r.model.state, r.model.status) == (ModelState.STOPPED, "unloaded")


async def test_illegal_change_is_refused_not_fixed_up() -> None:
    """Unloading a model that is not serving raises and changes nothing; so does giving a
    serving child's model a new setup outside a swap; a stopped model stays stopped."""
    r = await rig(start=False)
    with pytest.raises(IllegalTransitionError, match="unloaded -> draining"):
        await r.model.unload()
    assert (r.model.state, r.model.mode.kind) == (ModelState.UNLOADED, InferenceMode.EMBEDDED)
    r.model.start()
    before = r.model.current
    with pytest.raises(IllegalTransitionError, match="only through replace"):
        r.model.configure(r.model.config, setup_for("/models/other.gguf"))
    assert r.model.current is before
    await r.model.stop()
    with pytest.raises(IllegalTransitionError, match="stopped -> serving"):
        r.model.start()


async def test_failed_child_shows_as_failed() -> None:
    """While serving, the status follows the supervisor: a breaker opened is "failed",
    with the cause as the model's last error."""
    r = await rig(outcomes=[PERMANENT], start=False)
    r.model.start()
    await settle(r.supervisor, State.FAILED)
    assert r.model.state is ModelState.SERVING
    assert r.model.status == "failed"
    assert r.model.last_error == PERMANENT.message
    await r.model.stop()


async def test_reset_is_refused_while_disabled_and_retries_otherwise() -> None:
    """Reset of a disabled model says how to enable it; of a failed one, it retries now
    with the breaker closed."""
    off = await rig(mode=InferenceMode.DISABLED, start=False)
    with pytest.raises(Disabled, match="SetMode"):
        off.model.reset()
    r = await rig(outcomes=[PERMANENT, "ok"], start=False)
    r.model.start()
    await settle(r.supervisor, State.FAILED)
    r.model.reset()
    await settle(r.supervisor, State.RUNNING)
    assert r.model.status == "ready"
    await r.model.stop()
