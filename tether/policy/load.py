"""Where the policy comes from: a user's Hugging Face model, or the tiny model that
Tether builds, warm-starts and caches on first use."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .. import seeds
from .precision import resolve_autocast
from .warmstart import (
    build_tokenizer,
    demonstration_episodes,
    encode_episode,
    state_turn_sequences,
    supervised_finetune,
)

# The modelling code (transformers' model classes pull in torch._dynamo and DTensor:
# ~2 s of imports) is imported where a model is built or loaded, so a process that only
# needs the tokenizer (the driver, a sweep's trial) starts without it.

#: Bump when what a cached warm start was built from changes, so stale caches are not
#: reused: the recipe, the tokenizer's rules, or an env's observation or demonstration
#: text (none of which is in the cache key).  3: map rows one token per cell, FrozenLake
#: lists its holes; 4: punctuation is not a map symbol (2026-11-25).
RECIPE_VERSION = 4


def recipe(model_cfg, env_cfg, seed: int, max_reply_tokens: int) -> dict:
    ws = model_cfg.warm_start
    # ``warm_start.seed`` replaces the run's seed and is left out of the dump, so a cache
    # built with it equals the one built by a run of that experiment.seed.
    return {
        "version": RECIPE_VERSION,
        "env": env_cfg.id,
        "env_kwargs": env_cfg.kwargs,
        "size": model_cfg.size,
        "max_context": model_cfg.max_context,
        "max_reply_tokens": max_reply_tokens,
        "seed": seed if ws.seed is None else ws.seed,
        # Settings added after caches existed are dumped only when set away from their
        # default, so recipes without them keep their keys (and their caches).
        "warm_start": ws.model_dump(
            mode="json",
            exclude={"seed"} | {k for k, v in LATER_WARM_START.items() if getattr(ws, k) == v},
        ),
    }


#: warm-start settings added after caches were built, with their defaults (see ``recipe``)
LATER_WARM_START = {
    "autocast": "none",
    "input_free_fraction": 0.0,
    "weigh": False,
    "state_turn_prompt": "state",
    "weight_decay": 0.0,
}


def recipe_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def resolve_policy(
    model_cfg, env_cfg, seed: int, max_reply_tokens: int, progress=None, isolation: str = "auto"
) -> Path:
    """A directory holding a HF model + tokenizer: ``model.path`` or the cached tiny model.
    ``isolation`` (``sandbox.isolation``) is how a code env's demonstrations are run; it
    does not change the model, so it is not part of the cache key."""
    if model_cfg.path is not None:
        return (
            Path(model_cfg.path).expanduser()
            if Path(model_cfg.path).expanduser().exists()
            else model_cfg.path
        )  # a hub id, resolved by transformers
    spec = recipe(model_cfg, env_cfg, seed, max_reply_tokens)
    target = Path(model_cfg.cache_dir).expanduser() / f"{spec['size']}-{recipe_key(spec)}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "recipe.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            stats = build_warm_model(spec, tmp, progress, isolation)
            (tmp / "recipe.json").write_text(json.dumps({**spec, "stats": stats}, indent=1))
            os.replace(tmp, target)  # atomic: a crash never leaves a half-written cache entry
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_warm_model(spec: dict, out_dir: Path, progress=None, isolation: str = "auto") -> dict:
    """Tokenizer + tiny model + supervised warm start on demonstrations, saved to ``out_dir``."""
    from ..envs import runs_untrusted_code

    ws = {**LATER_WARM_START, **spec["warm_start"]}  # a recipe leaves out their defaults
    n_demo = max(ws["episodes"], 64)
    env_kwargs = dict(spec["env_kwargs"])
    if runs_untrusted_code(spec["env"]):
        env_kwargs["isolation"] = isolation
    episodes = demonstration_episodes(
        spec["env"],
        env_kwargs,
        n_demo,
        ws["noise"],
        seed=seeds.demonstrations(spec["seed"]),
        max_reply_tokens=spec["max_reply_tokens"],
        restate=ws.get("restate", False),
        weigh=ws["weigh"],
        input_free=ws["input_free_fraction"],
    )
    tokenizer = build_tokenizer(episodes, ws["vocab_size"], ws.get("numerals", "digits"))
    from ..agent.chat import ChatFormatter
    from .tiny import TINY_SIZES, build_tiny_model, tiny_config
    from .tokenizer import pad_vocabulary

    fixed_vocab = TINY_SIZES[spec["size"]].vocab_size
    if fixed_vocab is not None:  # a real-size vocabulary: the project's tokenizer, padded
        tokenizer = pad_vocabulary(tokenizer, fixed_vocab)

    formatter = ChatFormatter(tokenizer)
    sequences = [encode_episode(formatter, e) for e in episodes]
    sequences = [s for s in sequences if len(s[0]) <= spec["max_context"]]
    vocab = max(ws["vocab_size"], len(tokenizer))
    config = tiny_config(
        spec["size"],
        vocab_size=vocab,
        max_context=spec["max_context"],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = build_tiny_model(config, seed=spec["seed"])
    stats = {
        "demo_success": float(sum(e.success for e in episodes) / len(episodes)),
        "demo_episodes": len(sequences),
    }
    if ws["episodes"] > 0:
        ws = {**ws, "autocast": resolve_autocast(ws["autocast"], "cpu")}
        stats["autocast"] = ws["autocast"]
        stats.update(
            warm_start_stages(model, formatter, episodes, sequences, ws, spec["seed"], progress)
        )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return stats


def warm_start_stages(
    model, formatter, episodes, sequences, ws: dict, seed: int, progress=None
) -> dict:
    """SFT on the full episodes, after (``state_turn_epochs`` > 0) a first stage on every
    turn alone as a short sequence (`state_turn_sequences`); one progress count over both."""
    ws = {**LATER_WARM_START, **ws}
    pad = formatter.tokenizer.pad_token_id
    turns = (
        state_turn_sequences(formatter, episodes, ws["state_turn_prompt"])
        if ws.get("state_turn_epochs", 0)
        else []
    )
    first_steps = ws.get("state_turn_epochs", 0) * math.ceil(
        len(turns) / ws["state_turn_batch_size"]
    )
    total = first_steps + ws["epochs"] * math.ceil(len(sequences) / ws["batch_size"])

    def counted(offset):
        return progress and (lambda step, _, loss: progress(offset + step, total, loss))

    def stage(data, epochs, batch_size, offset):
        return supervised_finetune(
            model,
            data,
            pad,
            epochs,
            batch_size,
            ws["lr"],
            seed,
            counted(offset),
            ws["autocast"],
            ws["weight_decay"],
        )

    stats = {}
    if turns:
        first = stage(turns, ws["state_turn_epochs"], ws["state_turn_batch_size"], 0)
        stats.update({f"state_turn_{k}": v for k, v in first.items()})
    stats.update(stage(sequences, ws["epochs"], ws["batch_size"], first_steps))
    return stats


def weights_sha256(path) -> str:
    """A model directory's weights by content: two warm starts are the same model when these
    match (a seed's build can differ by machine or thread count)."""
    return hashlib.sha256(Path(path, "model.safetensors").read_bytes()).hexdigest()


def load_model(path, dtype: str = "float32"):
    """Load a causal LM from a directory or hub id, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype).eval()


def load_model_and_tokenizer(path, dtype: str = "float32"):
    """Load a causal LM (``load_model``) and its tokenizer (``load_tokenizer``)."""
    return load_model(path, dtype), load_tokenizer(path)


#: ``tokenizer_class`` of a tokenizer saved as a plain ``tokenizers`` object (Tether's own).
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path):
    """The tokenizer of a model directory or hub id, with a pad token (EOS if it has none).

    A directory whose tokenizer was saved as a plain ``tokenizers`` object (Tether's own,
    `tether.policy.tokenizer`) is loaded as exactly that.  ``AutoTokenizer`` would pick
    the tokenizer class of the model's type instead (``Qwen2Tokenizer`` for the tiny
    Qwen2 model), which rebuilds the pre-tokenizer as Qwen2's: prompts would then be cut
    differently from the warm start's demonstrations (a coordinate ``(2,3)`` into five
    tokens where the model learned one)."""
    local = Path(str(path)).expanduser() / "tokenizer_config.json"
    declared = json.loads(local.read_text()).get("tokenizer_class") if local.is_file() else None
    if declared in PLAIN_TOKENIZER_CLASSES:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
