"""The learner group: W ``Learner`` rank actors that the driver talks to as one learner.

    group = LearnerGroup.start(model_path, settings, ..., world_size=2, num_cpus=1)
    # or, for a group a pool may reuse: LearnerGroup.launch(...) once, then per run
    group.start_run(settings, lr=..., critic_lr=..., seed=...)
    batch = group.prepare(batch, recompute_old_logprobs=False)
    metrics = group.update(batch)
    weights = group.state_dict()      # an ObjectRef: rollout workers fetch it from the
                                      # Ray object store (the CPU weight sync); with
                                      # LoRA (lora=...) the merged weights

Every call goes to all ranks at once (they run collectives together) with the
batch put into the object store once; rank 0's answer is the group's. With world
size 1 there is one rank, no process group and no sharding: the single learner.
"""

from __future__ import annotations

import types
from typing import Any

import ray

from ..algos.batch import TrajectoryBatch
from ..algos.update import UpdateSettings
from ..policy.lora import LoraConfig
from .learner import Learner


class LearnerDied(RuntimeError):
    """A learner rank's process died (the group is broken: the driver rebuilds it)."""

    def __init__(self, method: str, ranks: list[int], cause: BaseException) -> None:
        first = str(cause).strip().splitlines()
        super().__init__(
            f"learner rank{'s' if len(ranks) > 1 else ''} "
            f"{', '.join(map(str, ranks))} died during {method} "
            f"({type(cause).__name__}{': ' + first[0][:200] if first else ''})"
        )
        self.method, self.ranks = method, ranks


class _Collective:
    """A ``Learner`` method that every rank of a group runs at once with the same
    arguments (``LearnerGroup._all``): the group's attribute of the same name."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, group, owner=None):
        return self if group is None else types.MethodType(self, group)

    def __call__(self, group: LearnerGroup, *args, **kwargs):
        """``group.update(batch)`` and ``LearnerGroup.update(group, batch)`` alike."""
        return group._all(self.name, *args, **kwargs)


class LearnerGroup:
    def __init__(self, ranks: list) -> None:
        self.ranks = ranks

    @classmethod
    def start(
        cls,
        model_path: str,
        settings: UpdateSettings,
        *,
        lr: float,
        critic_lr: float,
        seed: int,
        **launch_args: Any,
    ) -> LearnerGroup:
        """``launch(model_path, **launch_args)`` then ``start_run``: a group ready for one
        run."""
        group = cls.launch(model_path, **launch_args)
        try:
            group.start_run(settings, lr=lr, critic_lr=critic_lr, seed=seed)
        except BaseException:
            group.shutdown()
            raise
        return group

    @classmethod
    def launch(
        cls,
        model_path: str,
        *,
        use_critic: bool,
        use_reference: bool,
        threads: int,
        dtype: str = "float32",
        world_size: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        lora: LoraConfig | None = None,
    ) -> LearnerGroup:
        """Start the ranks (``num_cpus``/``num_gpus`` each) and form the process group.
        The arguments are all a pool compares; a run's own state comes with ``start_run``."""
        ranks = [
            Learner.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(
                model_path,
                use_critic,
                threads,
                dtype,
                use_reference=use_reference,
                rank=rank,
                world_size=world_size,
                lora=lora,
            )
            for rank in range(world_size)
        ]
        group = cls(ranks)
        try:
            init_method = ray.get(ranks[0].rendezvous.remote()) if world_size > 1 else None
            group.backend = group._all("setup", init_method)
        except BaseException:
            group.shutdown()
            raise
        return group

    def start_run(
        self, settings: UpdateSettings, *, lr: float, critic_lr: float, seed: int
    ) -> None:
        """Per-run state on every rank (``Learner.start_run``): weights from the model path,
        fresh optimisers, this run's settings and seed."""
        self._all("start_run", settings, lr, critic_lr, seed)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def _all(self, method: str, *args, **kwargs):
        """Call ``method`` on every rank (large arguments go to the object store once)
        and return rank 0's result."""
        if self.world_size > 1:
            shared = (TrajectoryBatch, list, dict)
            args = tuple(ray.put(a) if isinstance(a, shared) else a for a in args)
            kwargs = {k: ray.put(a) if isinstance(a, shared) else a for k, a in kwargs.items()}
        calls = [getattr(rank, method).remote(*args, **kwargs) for rank in self.ranks]
        return self._gather(method, calls)[0]

    def _gather(self, method: str, refs: list) -> list:
        """The ranks' results, in rank order; LearnerDied when a rank's process died.

        Results are taken as they come: a rank that died fails at once, and a survivor
        whose collective lost its peer fails soon after (it is then asked whether the
        others are alive) or stays blocked (``dead_after_s``: the group counts as dead).
        An error every rank survived (a bug, bad data) is raised as it is."""
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                raise LearnerDied(method, [refs.index(ready[0])], exc) from exc
            except ray.exceptions.RayTaskError as exc:
                dead = self._dead_ranks(refs)
                if dead:
                    raise LearnerDied(method, dead, exc) from exc
                raise
        return ray.get(refs)

    def check_alive(self, method: str) -> None:
        """LearnerDied if a rank's process is gone (e.g. while ``method``'s result, which
        others fetch, was being made)."""
        self._gather(method, [rank.__ray_ready__.remote() for rank in self.ranks])

    def _dead_ranks(self, refs: list, dead_after_s: float = 60.0) -> list[int]:
        """The ranks whose call ended in the actor's death (or never ended)."""
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=dead_after_s)
        dead = [k for k, ref in enumerate(refs) if ref not in ready]
        for k, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    dead.append(k)
                except ray.exceptions.RayTaskError:
                    pass
        return sorted(dead)

    # Learner methods every rank runs with the same arguments, rank 0's answer the group's
    # (``Learner``'s own signatures and docs apply).
    prepare = _Collective()
    update = _Collective()
    diagnose = _Collective()
    probe = _Collective()
    grad_snr = _Collective()
    dtype_effective = _Collective()
    diagnostics_precision = _Collective()
    full_state = _Collective()
    load_full_state = _Collective()
    save = _Collective()
    adjust = _Collective()

    def peak_rss_gb(self) -> list[float]:
        """Each rank's peak resident memory (GiB) since the previous call."""
        return self._gather("peak_rss_gb", [rank.peak_rss_gb.remote() for rank in self.ranks])

    def state_dict(self) -> ray.ObjectRef:
        """The full policy weights as an object-store reference (rank 0 gathers them)."""
        refs = [rank.state_dict.remote() for rank in self.ranks]
        self._gather("state_dict", refs[1:])  # the other ranks' part of the gather (and errors)
        return refs[0]

    def shutdown(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)
