"""`corepin reconcile`: free what died, re-apply drifted pins, repair the shield, end expired
reservations, run one node QoS period (`corepin.agent.host.qos`: best-effort suppression, CPU
burst, resctrl), and with `rebalance` move misaligned exclusive runs live
(`corepin.agent.host.rebalance`) - once, or pass after pass until SIGTERM or SIGINT (a systemd
unit in packaging/ runs it so). The QoS loop (`HostQos`) lives across passes, so CPU use is
measured between them.

A steady state writes nothing at all: no checkpoint, no cgroup file, no affinity.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Final

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.qos import HostQos
from corepin.agent.host.rebalance import move_note, rebalance
from corepin.allocation.rebalance import Move
from corepin.core.errors import StateError
from corepin.enforcement.note import Note

#: Seconds a single pass (`reconcile --once`) measures CPU use over before its QoS period, when
#: best-effort work is there to be squeezed (the QoS loop's default period).
QOS_SAMPLE: Final = 1.0


def reconcile_once(
    host: HostAgent,
    qos: HostQos | None = None,
    *,
    sample: float = 0.0,
    rebalancing: bool = False,
    rebalance_limit: int | None = None,
    moved: list[Move] | None = None,
) -> list[Note]:
    """Free what died, re-apply drifted pins, repair the shield (resize it, adopt new
    tasks), run one period of the QoS loop `qos`; steady state: no writes at all.

    With `sample` (a single pass), a QoS loop that has not measured yet first measures in a
    transaction of its own and waits `sample` seconds (without the lock), so the pass's period
    has CPU use to go by.

    With `rebalancing`, a last transaction moves the misaligned exclusive runs, at most
    `rebalance_limit` of them (None: all; one `moved` note per move; the moves are also
    appended to `moved` when given)."""
    loop = qos
    changes_first: list[Note] = []
    if loop is not None and sample > 0:
        with host.transaction() as txn:
            alive, _ = host.liveness.reap(txn.state)  # (not committed: the pass reaps)
            if loop.wants_sample(alive):
                changes_first = loop.keep_policy() + loop.period(alive)
        changes_first += _expired_notes(host)
        if loop.periods:
            time.sleep(sample)
    with host.transaction() as txn:
        if loop is not None:
            changes_first += loop.reread() + loop.keep_policy()
        before = txn.state
        state, changes = host.liveness.reap(before)
        changes[:0] = changes_first + _expired_notes(host)
        reserved = host.with_reserved(state)
        if reserved.reserved != state.reserved:
            changes.append(
                Note(
                    "reserved",
                    "host",
                    f"reserved CPUs {state.reserved or '-'} -> {reserved.reserved or '-'}",
                )
            )
            state = reserved
        if state is not before:
            state = txn.commit(state)
        changes.extend(host.enforce(state))
        if state.shield is not None:
            synced = host.sync_shield(state)
            changes.extend(
                Note(n.action, n.target, n.detail)
                for n in host.shield_notes
                if n.action not in ("left",)
            )
            if synced.shield != state.shield:
                state = txn.commit(synced)
        if loop is not None:
            changes.extend(loop.period(state))
            host.be_cpus = loop.be_cpus  # the next pass pins BE runs to it
        changes.extend(host.remove_cgroups(state))
    if rebalancing:
        moves, repinned = rebalance(host, limit=rebalance_limit)
        changes.extend(_expired_notes(host))
        changes.extend(move_note(m) for m in moves)
        changes.extend(repinned)
        if moved is not None:
            moved.extend(moves)
    return changes


def _expired_notes(host: HostAgent) -> list[Note]:
    """The reservations the host's last transaction ended because their TTL ran out."""
    return [
        Note(
            "expired",
            f"reservation {r.name}",
            f"CPUs {r.cpus}"
            + (f"; {r.consumed_by[0]} keeps them as its own" if r.consumed_by else " are free"),
        )
        for r in host.expired
    ]


def reconcile_forever(
    host: HostAgent,
    interval: float,
    show: Callable[[list[Note]], None],
    qos: HostQos | None = None,
    *,
    rebalancing: bool = False,
    rebalance_limit: int | None = None,
    moved: Callable[[list[Move]], None] | None = None,
) -> None:
    """`reconcile_once` every `interval` seconds (one QoS loop `qos` kept across the passes),
    each pass's moves (at most `rebalance_limit` a pass) given to `moved` (with `rebalancing`)
    and then its changes to `show`,
    until
    SIGTERM or SIGINT. A state lock someone else holds is a warning on stderr (busy is not
    broken: an operator may hold the lock for a while), not the end."""
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        try:
            moves: list[Move] = []
            changes = reconcile_once(
                host, qos, rebalancing=rebalancing, rebalance_limit=rebalance_limit, moved=moves
            )
            if moved is not None:
                moved(moves)
            show(changes)
        except StateError as exc:
            if exc.reason != "lock_timeout":
                raise
            print(
                f"corepin reconcile: warning: {exc}; trying again in {interval:g} s",
                file=sys.stderr,
                flush=True,
            )
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
