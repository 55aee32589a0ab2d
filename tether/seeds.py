"""Every random stream of a run, derived from the run seed (``experiment.seed``) here.

A stream is a named function of the run seed and the coordinates that must give it
fresh values (iteration, collection round, worker, turn).  The multipliers are primes
larger than the coordinate added to them in practice (fewer than 131 workers, 7919
turns, 100 003 iterations), so nearby run seeds do not share streams.  One overlap is
known and kept: a dynamic-sampling round r of iteration i draws with the seed of
iteration i + 7r's own collection (their levels differ, so their episodes do too).
Changing a formula changes every run's numbers: the equality tests and a fixed-seed
quickstart pin them.

Streams owned elsewhere: each environment draws its level from the seed it is reset
with (``envs.base``), the learner seeds torch once per run (``actors.learner``) and
shuffles minibatches by its update count, and the rollout engine seeds each
generation call with the seed it is given (``sampling_turn``).

    training_levels(run_seed, position, n, limit)    env level seeds of training groups
    collection(run_seed, iteration, resample_round)  one collection of an iteration
    worker_share(collection_seed, worker)            one worker's share of a collection
    sampling_turn(episode_seed, turn)                one generation call of an episode loop
    validation(run_seed)                             held-out validation episodes
    diagnostics(run_seed, iteration)                 pair sampling and resampling of the MI proxies
    probe_levels(first_held_out, n)                  the probe set's levels (no run seed: fixed per env)
    probe(run_seed, iteration)                       the probe set's first turns at one diagnostic point
    demonstrations(run_seed)                         the warm start's solver demonstrations
    engine_request(call_seed, index)                 one request of a batched engine call
"""

from __future__ import annotations

#: Training levels: consecutive positions of the run's level sequence land this far
#: apart per unit of run seed (then wrap below the validation offset).
LEVEL_STRIDE = 1_000_003
#: Collections: per unit of run seed (an iteration adds 1, a dynamic-sampling round 7).
COLLECTION_STRIDE = 100_003
#: Dynamic-sampling round r of an iteration collects with seed + ROUND_STEP * r.
ROUND_STEP = 7
#: Workers of one collection: per unit of the collection seed (worker k adds k).
WORKER_STRIDE = 131
#: Generation calls of one episode loop: per unit of its seed (turn t adds t).
TURN_STRIDE = 7919
#: Validation collects with the run seed plus this offset.
VALIDATION_OFFSET = 99_991
#: The probe set's levels: held-out seeds first_held_out + (k * PROBE_MULTIPLIER) % PROBE_SPAN
#: for k = 1..n (the multiplier is coprime with the span, so the n levels are distinct).
PROBE_MULTIPLIER = 7_919 * 104_729
PROBE_SPAN = 1_000_000
#: The probe's collection at iteration i uses the run seed plus this offset plus i.
PROBE_OFFSET = 77_777
#: The warm start's demonstrations use the run seed plus this offset.
DEMONSTRATION_OFFSET = 10_000_000
#: Requests of one batched engine call (vLLM): per unit of the call's seed.
REQUEST_STRIDE = 1_000_003


def training_levels(run_seed: int, position: int, n: int, limit: int) -> list[int]:
    """The env seeds of ``n`` training levels from ``position`` on, all below ``limit``
    (the first validation seed)."""
    return [(run_seed * LEVEL_STRIDE + position + k) % limit for k in range(n)]


def collection(run_seed: int, iteration: int, resample_round: int = 0) -> int:
    """Seed of iteration ``iteration``'s collection (``resample_round`` r > 0: the r-th
    dynamic-sampling re-collection)."""
    return run_seed * COLLECTION_STRIDE + iteration + ROUND_STEP * resample_round


def worker_share(collection_seed: int, worker: int) -> int:
    """Seed of worker ``worker``'s share of a collection."""
    return collection_seed * WORKER_STRIDE + worker


def sampling_turn(episode_seed: int, turn: int) -> int:
    """Seed of the generation call for turn ``turn`` (1-based) of an episode loop."""
    return episode_seed * TURN_STRIDE + turn


def validation(run_seed: int) -> int:
    """Seed of the validation collections."""
    return run_seed + VALIDATION_OFFSET


def diagnostics(run_seed: int, iteration: int) -> int:
    """Seed of iteration ``iteration``'s collapse diagnostics (pairs, bootstrap, null)."""
    return run_seed + iteration


def probe_levels(first_held_out: int, n: int) -> list[int]:
    """The env seeds of the diagnostic probe set: ``n`` distinct held-out levels, a
    function of the first held-out seed (``env.val_seed_offset``) alone, so every run, arm
    and run seed of an env sees the same ones (docs/methods.md, section 2)."""
    if not 1 <= n <= PROBE_SPAN:
        raise ValueError(f"the probe set holds 1 to {PROBE_SPAN} levels, got {n}")
    return [first_held_out + (k * PROBE_MULTIPLIER) % PROBE_SPAN for k in range(1, n + 1)]


def probe(run_seed: int, iteration: int) -> int:
    """Seed of the probe set's collection at iteration ``iteration``."""
    return run_seed + PROBE_OFFSET + iteration


def demonstrations(run_seed: int) -> int:
    """Seed of the warm start's demonstration episodes."""
    return run_seed + DEMONSTRATION_OFFSET


def engine_request(call_seed: int, index: int) -> int:
    """Seed of request ``index`` of one batched engine call."""
    return call_seed * REQUEST_STRIDE + index
