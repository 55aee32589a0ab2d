"""Rollout workers and learners kept alive from one run to the next in the same process.

    pool = ActorPool(keep=True)                   # a sweep's trial process: one per process
    workers, learner = pool.checkout(
        ActorRequest("rollout_workers", key, create=make_workers, end=end_workers),
        ActorRequest("learner", key, create=make_learner, end=end_learner))
    ...                                           # the run: per-run state reset explicitly
    pool.checkin(healthy=True)                    # kept for the next run (or ended)

Starting an actor costs a process, imports of torch and transformers and a model load:
seconds on a CPU, minutes for a vLLM engine or a sharded learner on GPUs. A sweep runs
trial after trial in one process (Tune's ``reuse_actors``), so that process keeps its
actors and the next trial takes them back when they are the same: the same kind and the
same **key**, i.e. the same constructor arguments and resource options. Ray restarts a
crashed worker with its constructor arguments, so everything a run changes (weights,
optimisers, update settings, seeds, counters) is *not* in the key: the Trainer resets it
through the actors' ``start_run`` methods at the start of every run, new actors or not.

Actors whose key differs from what a run asks for are ended before any new one starts
(they hold the placement group's CPUs the new ones need). A run that did not finish
(failed, interrupted, stopped by Tune) hands nothing on: ``checkin(healthy=False)``
ends everything it held. ``keep=False`` (``tether run``) ends everything at check-in, as
a run without a pool would. The pool is process-local: when Tune stops a trial process
it removes the trial's placement group, and Ray ends every actor in it (and every actor
that process owns), so pooled actors never outlive the process; ``close()`` ends them
earlier, at interpreter exit.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class ActorRequest:
    """One kind of actor a run needs: reused when an idle entry has the same ``key``
    (compared with ``==``), otherwise ``create()``d; ``end(actors)`` ends them.
    ``reusable=False`` never keeps them past the run (e.g. a multi-rank FSDP group)."""

    kind: str
    key: Any
    create: Callable[[], Any]
    end: Callable[[Any], None]
    reusable: bool = True


@dataclass
class _Entry:
    request: ActorRequest
    actors: Any


class ActorPool:
    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.idle: dict[str, _Entry] = {}  # kept from an earlier run, by kind
        self.lent: dict[str, _Entry] = {}  # held by the current run
        #: Per kind, whether the last checkout reused the idle actors (tests, logs).
        self.reused: dict[str, bool] = {}

    def checkout(self, *requests: ActorRequest) -> list[Any]:
        """The actors for each request, in order: the idle ones with the same key, or new.

        Idle actors that no request takes back are ended first, so new actors find their
        resources free."""
        if self.lent:
            raise RuntimeError(
                f"actors {sorted(self.lent)} are still checked out: one run at a time per pool"
            )
        wanted = {r.kind: r for r in requests}
        for kind in list(self.idle):
            request = wanted.get(kind)
            if (
                request is None
                or not request.reusable
                or self.idle[kind].request.key != request.key
            ):
                self._end(self.idle.pop(kind))
        out = []
        for request in requests:
            entry = self.idle.pop(request.kind, None)
            self.reused[request.kind] = entry is not None
            if entry is None:  # (a create() that fails ends what it started itself)
                entry = _Entry(request, request.create())
            self.lent[request.kind] = entry
            out.append(entry.actors)
        return out

    def replace(self, kind: str, actors: Any) -> None:
        """The current run rebuilt its ``kind`` actors (a learner group whose rank died):
        check-in hands on, or ends, the new ones (the old ones are the caller's to end)."""
        self.lent[kind].actors = actors

    def checkin(self, healthy: bool) -> None:
        """The run is over: keep its actors for the next run if it finished and this pool
        keeps actors, else end them."""
        lent, self.lent = self.lent, {}
        for kind, entry in lent.items():
            if healthy and self.keep and entry.request.reusable and entry.actors is not None:
                self.idle[kind] = entry
            else:
                self._end(entry)

    def close(self) -> None:
        """End every actor, idle or lent."""
        entries = [*self.idle.values(), *self.lent.values()]
        self.idle, self.lent = {}, {}
        for entry in entries:
            self._end(entry)

    @staticmethod
    def _end(entry: _Entry) -> None:
        if entry.actors is not None:
            entry.request.end(entry.actors)


_process_pool: ActorPool | None = None


def process_pool() -> ActorPool:
    """This process's keeping pool (a sweep's trial process), made on first use and
    closed at interpreter exit."""
    global _process_pool
    if _process_pool is None:
        _process_pool = ActorPool(keep=True)
        atexit.register(_process_pool.close)
    return _process_pool
