"""LoRA on the policy (peft): the ``model.lora`` section, adding the adapters, and the
merged weights the rollout engines load.

With ``model.lora`` set the learner trains low-rank adapters only: each targeted linear
layer ``W`` of the transformer blocks becomes ``W x + s B A x`` with ``A`` [r, in],
``B`` [out, r] (``B`` starts at 0, so the initial policy is the base model exactly) and
``s = alpha / r``.  Three consequences the learner builds on:

- the reference policy of the KL term is the *same* module with the adapters disabled
  (peft's ``disable_adapter()``): the base weights never change, so no second copy;
- the rollout engines get merged weights ``W + s B A`` under the base model's own
  parameter names (``merged_state_dict``), so an engine loads them unchanged;
- checkpoints hold the adapted module's own state (base weights, adapters, AdamW state
  of the adapters), so resume restores exactly what was trained.

This module's top level imports neither torch nor peft (the config validates without
them); the functions import what they use.
"""

from __future__ import annotations

from pydantic import Field

from ..sections import StrictSection

#: peft's name of the one adapter the learner trains (the keys' ``lora_A.<name>.``).
ADAPTER = "default"

#: The projections of a Qwen2 / Llama-style decoder block (attention and MLP).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(StrictSection):
    """``model.lora``: null (the default) trains every parameter; set (e.g.
    ``model.lora.r=8``) trains rank-r adapters on the named linear layers only."""

    r: int = Field(8, ge=1, description="Adapter rank r (A is r x in, B is out x r).")
    alpha: float = Field(
        16.0, gt=0.0, description="LoRA alpha: the adapter's output is scaled by alpha / r."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapter's input during the update (0 = none; with "
        "learner_world_size > 1 each rank draws its own masks, so only 0 gives the "
        "world-size-1 update exactly).",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        min_length=1,
        description="Names of the linear layers inside the transformer blocks that get "
        "adapters (the last part of the module path, e.g. q_proj, v_proj); a name the "
        "model does not have is refused at start with the valid ones listed.",
    )

    @property
    def scaling(self) -> float:
        """s = alpha / r, the factor on B A."""
        return self.alpha / self.r


def block_linear_names(model) -> set[str]:
    """The last path component of every ``nn.Linear`` inside the model's transformer
    blocks (its ``_no_split_modules`` classes, e.g. ``Qwen2DecoderLayer``)."""
    import torch

    blocks = set(getattr(model, "_no_split_modules", None) or ())
    names = set()
    for block in model.modules():
        if type(block).__name__ in blocks:
            for path, module in block.named_modules():
                if path and isinstance(module, torch.nn.Linear):
                    names.add(path.rsplit(".", 1)[-1])
    return names


def check_targets(lora: LoraConfig, model) -> None:
    """ValueError naming ``model.lora.target_modules`` when a name is not a linear layer
    of the model's blocks (peft would refuse it with a traceback, or, for the tied
    output head, adapt a weight the engines cannot load merged)."""
    available = block_linear_names(model)
    unknown = [name for name in lora.target_modules if name not in available]
    if unknown:
        raise ValueError(
            f"model.lora.target_modules: {', '.join(map(repr, unknown))} "
            f"{'is not a linear layer' if len(unknown) == 1 else 'are not linear layers'} "
            f"of the model's transformer blocks; choose from {sorted(available)}"
        )


def check_targets_for_path(lora: LoraConfig, model_path: str) -> None:
    """``check_targets`` on the model at ``model_path`` built on the meta device (its
    config only: no weights are read), for the driver to refuse before anything starts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    check_targets(lora, skeleton)


def add_lora(model, lora: LoraConfig):
    """The peft model wrapping ``model`` (changed in place: its targeted layers now carry
    adapters, and only the adapters require gradients).  The adapters get the base
    weights' dtype (peft would lift bfloat16 ones to float32; the learner keeps one
    dtype, ``model.dtype``, and FSDP2 shards one dtype per block).  The model keeps its
    train/eval mode (the new dropout modules would start in train mode: an eval-mode
    policy would then drop adapter inputs when scoring)."""
    import peft

    check_targets(lora, model)
    training = model.training
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
    )
    wrapper = peft.get_peft_model(model, config, adapter_name=ADAPTER, autocast_adapter_dtype=False)
    model.train(training)
    return wrapper


def merged_state_dict(state: dict, scaling: float) -> dict:
    """The base model's state dict with every adapter merged in: for each adapted layer
    ``p``, ``p.weight = p.base_layer.weight + scaling * (B @ A)`` (computed in float32,
    stored in the base weight's dtype), ``p.base_layer.bias`` renamed ``p.bias``, the
    adapter tensors dropped.  ``state`` is the adapted module's state dict (unsharded);
    a state without adapters is returned unchanged.  The adapters themselves are not
    touched (peft's ``merge_and_unload`` would fold them into the live module)."""
    lora_a, lora_b = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"
    merged = {}
    for key, value in state.items():
        if key.endswith((lora_a, lora_b)):
            continue
        prefix, sep, leaf = key.rpartition(".base_layer.")
        if not sep:
            merged[key] = value
            continue
        name = f"{prefix}.{leaf}"
        if leaf == "weight":
            a = state[prefix + lora_a].float()  # [r, in]
            b = state[prefix + lora_b].float()  # [out, r]
            value = (value.float() + scaling * (b @ a)).to(value.dtype)  # [out, in]
        merged[name] = value
    return merged
