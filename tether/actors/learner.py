"""Learner ranks: state (policy, critic, frozen reference, optimisers) around the pure update.

One ``Learner`` actor is one rank of the learner group (``learner_group.py``). With
world size 1 it holds plain models, exactly the single learner. With world size W
> 1 the W actors form one ``torch.distributed`` process group (gloo on CPU, NCCL on
GPU) and shard the policy, the critic and the frozen reference with FSDP2
(``fully_shard`` over a 1-D device mesh); every method is then a collective that
all ranks run together, and rank 0's return value speaks for the group.

With LoRA (``model.lora``, `tether.policy.lora`) the policy is the base model with peft
adapters injected: only the adapters are trained (and sharded with their blocks), the
KL reference is that same module under ``disable_adapter()`` (no reference copy is
loaded), and ``state_dict`` (the weight sync) merges the adapters into the base
weights under the base model's parameter names.
"""

from __future__ import annotations

import gc
import math
import socket
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import ray
import torch

from ..algos.batch import TrajectoryBatch
from ..algos.update import UpdateSettings, autocast, lr_factor, policy_update, prepare_batch
from ..policy.critic import ValueModel
from ..policy.load import load_model, load_tokenizer
from ..policy.lora import LoraConfig, add_lora, merged_state_dict
from ..policy.precision import resolve_autocast
from .memory import peak_rss_gb, release_free_memory


def shard_with_fsdp(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """FSDP2: one parameter group per transformer block (the model's ``_no_split_modules``
    classes, e.g. ``Qwen2DecoderLayer``), then the root (embeddings, tied head, norms)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    hf_model = getattr(model, "backbone", model)  # the critic wraps a backbone
    block_names = set(getattr(hf_model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in block_names:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Sum, don't average, over ranks: each rank's loss already carries the
            # whole minibatch's denominator (algos/update.py).
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


@ray.remote(max_restarts=0)
class Learner:
    """The constructor takes what the process is (model path, dtype, which models, rank):
    a pool reuses the actor for a run with the same arguments.  What a run is (weights,
    optimisers, update settings, seed) comes with ``start_run``, called for every run."""

    def __init__(
        self,
        model_path: str,
        use_critic: bool,
        threads: int,
        dtype: str = "float32",
        use_reference: bool = False,
        rank: int = 0,
        world_size: int = 1,
        lora: LoraConfig | None = None,
    ) -> None:
        torch.set_num_threads(max(1, math.ceil(threads)))
        self.model_path, self.dtype, self.lora = model_path, dtype, lora
        self.use_critic, self.use_reference = use_critic, use_reference
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(
            "cuda" if torch.cuda.is_available() and ray.get_gpu_ids() else "cpu"
        )
        self.tokenizer = load_tokenizer(model_path)
        self.mesh = None  # the FSDP device mesh (world size > 1), made by setup()
        self.model = self.critic = self.reference = None
        self.peft = None  # the peft wrapper of ``model`` (LoRA), for disable_adapter()
        self.optimizer = self.critic_optimizer = None
        self.full_model = None  # rank 0's unsharded copy for the diagnostics (world size > 1)
        self.full_peft = None  # its peft wrapper (LoRA)

    # -- the group --------------------------------------------------------------------
    def rendezvous(self) -> str:
        """A ``tcp://host:port`` on this (rank 0's) node for the process group to meet at."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def setup(self, init_method: str | None) -> str:
        """Join the process group (world size > 1), once per actor.  Returns the process
        group's backend ("none" at world size 1)."""
        backend = "none"
        if self.device.type == "cuda":
            torch.cuda.set_device(0)  # Ray shows each actor only its own GPU(s)
        if self.world_size > 1:
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(
                backend, init_method=init_method, rank=self.rank, world_size=self.world_size
            )
            self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        return backend

    def _load_policy(self):
        """(the policy module, its peft wrapper or None) as loaded from the model path:
        with LoRA the base model with fresh adapters injected (``B = 0``: the policy
        starts as the base model exactly)."""
        model = load_model(self.model_path, self.dtype)
        if self.lora is None:
            return model, None
        wrapper = add_lora(model, self.lora)
        return wrapper.get_base_model(), wrapper  # the same HF module, adapters inside

    def start_run(self, settings: UpdateSettings, lr: float, critic_lr: float, seed: int) -> None:
        """Everything a run owns, the same whether this actor is new or served a run before:
        the torch RNG seeded, the policy (critic, reference) loaded from the model path and
        sharded, fresh optimisers with this run's learning rates, this run's update
        settings, the update counter and the analysis caches cleared.  With LoRA the
        optimiser holds the adapters only and no reference copy is loaded."""
        self.model = self.critic = self.reference = self.full_model = None  # free memory first
        self.peft = self.full_peft = None
        self.optimizer = self.critic_optimizer = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        torch.manual_seed(seed)
        self.settings = self._resolved(settings)
        self.model, self.peft = self._load_policy()
        self.critic = ValueModel(self.model_path, self.dtype) if self.use_critic else None
        #: The frozen initial policy, for the KL regulariser (LoRA: the policy itself with
        #: its adapters disabled, see ``prepare``).
        if self.use_reference and self.peft is None:
            self.reference = load_model(self.model_path, self.dtype)
            self.reference.requires_grad_(False)
        for name in ("model", "critic", "reference"):
            module = getattr(self, name)
            if module is not None:
                module = module.to(self.device)
                setattr(
                    self, name, module if self.mesh is None else shard_with_fsdp(module, self.mesh)
                )
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: adapters
        self.optimizer = torch.optim.AdamW(
            trainable, lr=lr, eps=settings.adam_eps, weight_decay=0.0
        )
        self.critic_optimizer = (
            torch.optim.AdamW(self.critic.parameters(), lr=critic_lr)
            if self.critic is not None
            else None
        )
        self.updates = 0
        self.lr = lr  # the base rate; each update takes its share of it (``lr_factor``)
        self.extractor = None

    def _resolved(self, settings: UpdateSettings) -> UpdateSettings:
        """``settings`` with ``autocast: auto`` decided for this process's device."""
        return replace(settings, autocast=resolve_autocast(settings.autocast, self.device.type))

    def adjust(self, settings: UpdateSettings, lr: float) -> None:
        """New update settings and policy learning rate mid-run (an act-mode alarm's
        response).  A KL coefficient raised from 0 loads the reference policy (the run's
        initial weights) the first time (LoRA: nothing to load, the base weights are it)."""
        self.settings = self._resolved(settings)
        self.lr = lr
        self._set_lr()
        if settings.kl_coef > 0 and self.reference is None and self.peft is None:
            reference = load_model(self.model_path, self.dtype).to(self.device)
            reference.requires_grad_(False)
            self.reference = (
                reference if self.mesh is None else shard_with_fsdp(reference, self.mesh)
            )

    def _sum_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rows computed on different ranks (zeros elsewhere), joined by summing."""
        if self.world_size > 1:
            import torch.distributed as dist

            tensor = tensor.to(self.device)
            dist.all_reduce(tensor)
        return tensor.cpu()

    def _gather_metrics(self, metrics: dict[str, list[float]]) -> dict[str, list[float]]:
        if self.world_size == 1:
            return metrics
        import torch.distributed as dist

        per_rank: list = [None] * self.world_size
        dist.all_gather_object(per_rank, metrics)
        return {
            k: [v for m in per_rank for v in m.get(k, [])]
            for k in dict.fromkeys(k for m in per_rank for k in m)
        }

    # -- training ---------------------------------------------------------------------
    def prepare(self, batch: TrajectoryBatch, recompute_old_logprobs: bool) -> TrajectoryBatch:
        """Old-policy log-probs, reference log-probs and critic values (``prepare_batch``).
        With LoRA and a KL term the reference log-probs come from the policy module with
        its adapters disabled: the base weights, which the update never changes."""
        reference, scope = self.reference, nullcontext
        if self.peft is not None and self.settings.kl_coef > 0:
            reference, scope = self.model, self.peft.disable_adapter
        return prepare_batch(
            batch,
            self.model,
            self.settings,
            recompute_old_logprobs,
            reference=reference,
            critic=self.critic,
            rank=self.rank,
            world_size=self.world_size,
            join=self._sum_over_ranks,
            reference_scope=scope,
        )

    def _set_lr(self) -> float:
        """The optimiser's rate for the next update: the base rate times the schedule's
        factor (``lr_factor``), so a checkpoint's optimiser state holds the rate in force."""
        lr = self.lr * lr_factor(self.settings.lr_schedule, self.updates, self.settings.lr_horizon)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def update(self, batch: TrajectoryBatch) -> dict[str, float]:
        lr = self._set_lr()
        metrics = policy_update(
            self.model,
            self.optimizer,
            batch,
            self.settings,
            seed=self.updates,
            critic=self.critic,
            critic_optimizer=self.critic_optimizer,
            rank=self.rank,
            world_size=self.world_size,
            gather_metrics=self._gather_metrics,
        )
        self.updates += 1
        release_free_memory()  # this update's activations, of this batch's shapes
        return {**metrics, "actor/lr": lr}

    # -- analyses (on the whole policy) -----------------------------------------------
    def _analysis_model(self):
        """The policy as one module: itself, or (world size > 1) rank 0's unsharded copy
        refreshed from the gathered weights; None on the other ranks.  The diagnostics
        take gradients and build KV caches on the whole model, which FSDP's sharded
        parameters do not allow."""
        if self.world_size == 1:
            return self.model
        state = self._full_weights()  # collective: every rank takes part
        if self.rank != 0:
            return None
        if self.full_model is None:
            with torch.random.fork_rng(devices=[]):  # LoRA's init draws: not this rank's RNG
                self.full_model, self.full_peft = self._load_policy()
            self.full_model.to(self.device)
        self.full_model.load_state_dict(state)
        return self.full_model

    def diagnostics_precision(self, setting: str) -> str:
        """``diagnostics.autocast`` as decided for this process's device: none or bfloat16."""
        return resolve_autocast(setting, self.device.type)

    def _scoring_model(self):
        """The analysis model (None off rank 0), with the span extractor the
        cross-scoring reads turns through built on first use."""
        from ..agent.chat import ChatFormatter
        from ..agent.pairs import SpanExtractor

        model = self._analysis_model()
        if model is not None and self.extractor is None:
            self.extractor = SpanExtractor(ChatFormatter(self.tokenizer))
        return model

    def diagnose(
        self,
        trajectories,
        diagnostics_cfg,
        ema_state: dict | None,
        seed: int,
        keep_matrices: bool,
        information_chain: bool = True,
    ):
        """Cross-score MI proxies with the current (pre-update) policy."""
        from ..diagnostics.runner import collapse_diagnostics

        return self._scored(
            diagnostics_cfg,
            lambda model: collapse_diagnostics(
                model,
                trajectories,
                self.extractor,
                diagnostics_cfg.samplings,
                diagnostics_cfg.max_pairs,
                self.settings.temperature,
                ema_state,
                seed,
                information_chain,
                diagnostics_cfg.method,
                keep_matrices,
                max_cells=diagnostics_cfg.max_cells,
                uncertainty=diagnostics_cfg.uncertainty(),
                chunk_tokens=self.settings.logprob_chunk_tokens,
            ),
        )

    def probe(self, trajectories, diagnostics_cfg, ema_state: dict | None, seed: int):
        """Cross-score the probe set's first turns with the current (pre-update) policy."""
        from ..diagnostics.runner import probe_diagnostics

        return self._scored(
            diagnostics_cfg,
            lambda model: probe_diagnostics(
                model,
                trajectories,
                self.extractor,
                self.settings.temperature,
                ema_state,
                seed,
                diagnostics_cfg.method,
                diagnostics_cfg.probe_uncertainty(),
                self.settings.logprob_chunk_tokens,
            ),
        )

    def _scored(self, diagnostics_cfg, score):
        """``score(model)`` with the policy that scores (None where this rank holds none),
        without gradients, at the diagnostics' precision."""
        model = self._scoring_model()
        if model is None:
            return None
        with torch.no_grad(), autocast(model, self.diagnostics_precision(diagnostics_cfg.autocast)):
            return score(model)

    def grad_snr(self, batch: TrajectoryBatch, n_buckets: int) -> dict[str, float] | None:
        from ..diagnostics.runner import gradient_snr

        model = self._analysis_model()
        return None if model is None else gradient_snr(model, batch, self.settings, n_buckets)

    # -- what the process used --------------------------------------------------------
    def peak_rss_gb(self) -> float:
        """Peak resident memory (GiB) since the previous call (`memory.peak_rss_gb`)."""
        return peak_rss_gb(reset=True)

    def dtype_effective(self) -> str:
        """The dtype the policy's parameters really have (``model.dtype`` as loaded), and
        the autocast its forwards run in (``algo.autocast`` as decided here), if any."""
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        precision = getattr(getattr(self, "settings", None), "autocast", "none")
        if precision != "none":
            return f"{dtype} ({precision} autocast)"
        return dtype

    # -- weights and checkpoints ------------------------------------------------------
    def state_dict(self) -> dict:
        """The policy's full (unsharded) weights on CPU for the rollout engines: rank 0
        has them, others get {}.  With LoRA the adapters merged into the base weights,
        under the base model's parameter names (`lora.merged_state_dict`)."""
        state = self._full_weights()
        if self.lora is None or not state:
            return state
        return merged_state_dict(state, self.lora.scaling)

    def _full_weights(self) -> dict:
        """The policy module's own full state (with LoRA: base weights and adapters)."""
        if self.world_size == 1:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def save(self, path: str) -> str | None:
        """The policy as a plain HF model directory (LoRA: the merged weights, plus the
        adapters alone in ``<path>/adapter`` for peft's ``PeftModel.from_pretrained``)."""
        model = self._analysis_model()
        if model is None:
            return None
        Path(path).mkdir(parents=True, exist_ok=True)
        if self.lora is not None:
            (self.peft if self.world_size == 1 else self.full_peft).save_pretrained(
                str(Path(path) / "adapter")
            )
            plain = load_model(self.model_path, self.dtype)
            plain.load_state_dict(merged_state_dict(model.state_dict(), self.lora.scaling))
            model = plain
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path

    def full_state(self) -> dict:
        """Everything a checkpoint needs to resume the learner (full, unsharded tensors,
        optimiser state keyed by parameter name), the same at every world size."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {"updates": self.updates, "torch_rng": torch.get_rng_state()}
        state["model"], state["optimizer"] = get_state_dict(
            self.model, self.optimizer, options=options
        )
        if self.critic is not None:
            state["critic"], state["critic_optimizer"] = get_state_dict(
                self.critic, self.critic_optimizer, options=options
            )
        return state

    def load_full_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        options = StateDictOptions(full_state_dict=True)
        trained = [(self.model, self.optimizer, "model", "optimizer")]
        if self.critic is not None and "critic" in state:
            trained.append((self.critic, self.critic_optimizer, "critic", "critic_optimizer"))
        for module, optimizer, module_key, optimizer_key in trained:
            set_state_dict(
                module,
                optimizer,
                model_state_dict=state[module_key],
                optim_state_dict=state[optimizer_key],
                options=options,
            )
        self.updates = state["updates"]
        torch.set_rng_state(state["torch_rng"])
