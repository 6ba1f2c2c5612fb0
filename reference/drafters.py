"""Drafters: strategies that propose up to k tokens for the target to verify.

Every drafter subclasses :class:`Drafter` (an ``abc.ABC``); the loop in ``reference.speculative``
reads exactly this interface and nothing else:

- ``propose(context_ids, k, *, sampling, generator) -> Proposal(ids [k'] int64, q [k', V] float32 | None)``
  with ``k' <= k`` (possibly 0). ``q`` is the draft distribution each draft was sampled from, after
  the *same* processing as the target's p (``logits_to_probs``); ``None`` means a deterministic
  drafter (one-hot q: n-gram lookup, greedy drafting, scripted drafts). ``propose`` is defined
  once, on the base class; each kind implements the hook ``_draft(context_ids, k, sampling, generator)``.
- ``cost_per_token``: the cost of drafting one token in units of one single-token target forward
  (the draft-length policy's cost model; 0 for n-gram lookup).
- ``reset()``: a new sequence starts (drop caches).

Kinds:
- ``NgramDrafter``: prompt lookup (Saxena 2023; vLLM ``prompt_lookup_min/max``), longest n-gram
  suffix match wins, latest occurrence; free to run.
- ``DraftModelDrafter``: a smaller causal LM sharing the tokenizer, with its own KV cache (it and
  ``SelfDrafter`` share ``_LMDrafter``: autoregressive drafting from an incrementally fed LM).
- ``SelfDrafter``: early exit (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023):
  the target's first L decoder layers + its final norm + LM head, with its own KV cache.
- ``ScriptedDrafter`` / ``SequenceDrafter``: fixed proposals for tests.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import numpy as np
import torch

from reference.sampling import SamplingParams, logits_to_probs, sample_from

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel

    from reference.models import LoadedModel

_EMPTY = torch.zeros(0, dtype=torch.long)


class Proposal(NamedTuple):
    """What a drafter returns (unpacks as ``ids, q``).

    Attributes:
        ids: ``[k']`` int64 draft token ids, ``0 <= k' <= k``.
        q: ``[k', V]`` float draft probabilities the drafts were sampled from, or None (one-hot q).
    """

    ids: torch.Tensor
    q: torch.Tensor | None


class Drafter(abc.ABC):
    """Base class of every drafter (see the module docstring for the contract the loop relies on).

    Attributes:
        name: short kind name (``ngram``, ``self``, ``draft-model``...).
        cost_per_token: drafting cost of one token in single-token target forwards (>= 0).
    """

    name: str = "drafter"
    cost_per_token: float = 0.0

    def propose(
        self,
        context_ids: Sequence[int],
        k: int,
        *,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        """Propose up to ``k`` tokens continuing ``context_ids`` (which ends with the pending token).

        Args:
            context_ids: prompt + emitted tokens so far (non-empty).
            k: maximum number of drafts (>= 0).
            sampling: the request's sampling parameters (None = greedy); sampled drafts use them for q.
            generator: source of every random draw of the drafter.

        Returns:
            ``Proposal(ids [k'] int64, q [k', V] | None)``.
        """
        return self._draft(context_ids, k, sampling, generator)

    @abc.abstractmethod
    def _draft(
        self, context_ids: Sequence[int], k: int, sampling: SamplingParams | None, generator: torch.Generator | None
    ) -> Proposal:
        """The kind's own drafting: :meth:`propose`'s arguments, positionally (subclasses implement this)."""

    def observe_output(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:  # noqa: B027
        """A generation finished with ``output_ids`` (EOS excluded); drafters that learn across
        requests (:class:`reference.suffix.SuffixDrafter`) record it. No-op by default."""

    def reset(self) -> None:  # noqa: B027 - a no-op default: stateless drafters need nothing
        """A new sequence starts: forget any per-sequence state (default: nothing to forget)."""


class NgramDrafter(Drafter):
    """Prompt-lookup drafter: continue the latest earlier occurrence of the context's suffix.

    For n from ``max_n`` down to ``min_n`` (longest match wins), find the latest position i < len-n
    with ``context[i:i+n] == context[-n:]`` and propose ``context[i+n : i+n+k]``. Deterministic
    (q is one-hot, returned as None). Mirrors vLLM's ``prompt_lookup_min``/``prompt_lookup_max``.
    With ``periodic`` (default), a span that reaches the end of the context is continued with the
    same period, so a repeating loop of period P yields k drafts instead of at most P.

    Args:
        min_n: shortest suffix to match (>= 1).
        max_n: longest suffix to match (>= min_n).
        periodic: extend spans that hit the end of the context periodically.

    Raises:
        ValueError: invalid n range.
    """

    name = "ngram"
    cost_per_token = 0.0  # a numpy scan of the context: nothing next to a target forward

    def __init__(self, min_n: int = 2, max_n: int = 4, periodic: bool = True):
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"NgramDrafter needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = int(min_n)
        self.max_n = int(max_n)
        self.periodic = bool(periodic)

    def find(self, context_ids: Sequence[int], k: int) -> list[int]:
        """Return the proposed continuation (list of ids, length 0..k)."""
        return self.match(context_ids, k)[1]

    def match(self, context_ids: Sequence[int], k: int) -> tuple[int, list[int]]:
        """``(n, continuation)``: the matched suffix length n (0 = no match) and up to k ids."""
        n_ctx = len(context_ids)
        if k <= 0 or n_ctx < self.min_n + 1:
            return 0, []
        arr = np.asarray(context_ids, dtype=np.int64)
        for n in range(min(self.max_n, n_ctx - 1), self.min_n - 1, -1):
            pattern = arr[n_ctx - n :]
            # candidate starts i in [0, n_ctx-n-1]: windows arr[i:i+n] strictly before the suffix
            win = np.lib.stride_tricks.sliding_window_view(arr[: n_ctx - 1], n)
            hits = np.flatnonzero((win == pattern).all(axis=1))
            if hits.size:
                i = int(hits[-1])
                out: list[int] = arr[i + n : i + n + k].tolist()
                if self.periodic:
                    # the copied span runs into the end of the context: keep copying with the same
                    # period (n_ctx - n - i), i.e. read on from the proposal itself (loops, "()()()")
                    src = list(context_ids[i + n :])
                    while len(out) < k:
                        out.append(int(src[len(out)]) if len(out) < len(src) else int(out[len(out) - len(src)]))
                return n, out
        return 0, []

    def _draft(
        self, context_ids: Sequence[int], k: int, sampling: SamplingParams | None, generator: torch.Generator | None
    ) -> Proposal:
        """Propose up to k tokens by prompt lookup; q is None (one-hot)."""
        ids = self.find(context_ids, k)
        if not ids:
            return Proposal(_EMPTY, None)
        return Proposal(torch.tensor(ids, dtype=torch.long), None)


#: a transformers causal LM, or the reference's ``LoadedModel`` wrapping one
ModelLike = Union["PreTrainedModel", "LoadedModel", torch.nn.Module]
#: ``forward_fn(input_ids [1, n] int64, cache) -> logits [1, m, V]`` (m >= 1 trailing positions)
ForwardFn = Callable[[torch.Tensor, "DynamicCache"], torch.Tensor]


class _IncrementalLM:
    """Keeps a KV cache in sync with a growing/rolled-back context for a forward function."""

    def __init__(self, model: PreTrainedModel, forward_fn: ForwardFn):
        self.model = model
        self.forward_fn = forward_fn
        self.cache: DynamicCache | None = None
        self.tokens: list[int] = []

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        self.cache = None
        self.tokens = []

    def sync(self, context_ids: Sequence[int]) -> torch.Tensor:
        """Make the cache hold ``context_ids`` and return the next-token logits ``[V]``.

        Raises:
            ValueError: empty context.
        """
        from transformers import DynamicCache

        ctx = list(context_ids)
        if not ctx:
            raise ValueError("drafter context is empty; the prompt must have at least one token")
        common = 0
        m = min(len(self.tokens), len(ctx))
        while common < m and self.tokens[common] == ctx[common]:
            common += 1
        keep = min(common, len(ctx) - 1)
        if self.cache is None or keep == 0:
            self.cache = DynamicCache(config=self.model.config)
            keep = 0
        elif keep < len(self.tokens):
            self.cache.crop(-(len(self.tokens) - keep))
        self.tokens = ctx[:keep]
        return self.feed(ctx[keep:])

    def feed(self, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to the cache; return logits ``[V]`` at the last fed position."""
        assert self.cache is not None, "sync() first"
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        logits = self.forward_fn(x, self.cache)
        self.tokens.extend(int(t) for t in ids)
        return logits[0, -1]


class _LMDrafter(Drafter):
    """A drafter that runs a causal LM (``_runner``) autoregressively, with its own KV cache.

    Subclasses set ``self._runner`` in ``__init__``. At temperature 0 drafts are the LM's argmax
    (q None); otherwise each draft is sampled from q = ``logits_to_probs(logits, same params as p)``
    and q is returned ``[k', V]`` float32 on CPU.
    """

    _runner: _IncrementalLM

    def _draft(
        self, context_ids: Sequence[int], k: int, sampling: SamplingParams | None, generator: torch.Generator | None
    ) -> Proposal:
        """Draft up to k tokens autoregressively with ``self._runner`` (see class doc)."""
        if k <= 0:
            return Proposal(_EMPTY, None)
        sampling = sampling or SamplingParams()
        with torch.inference_mode():
            logits = self._runner.sync(context_ids)
            ids: list[int] = []
            qs: list[torch.Tensor] = []
            for j in range(k):
                if sampling.greedy:
                    t = int(logits.argmax().item())
                else:
                    qj = logits_to_probs(logits.float(), sampling.temperature, sampling.top_k, sampling.top_p)
                    t = sample_from(qj, generator)
                    qs.append(qj)
                ids.append(t)
                if j < k - 1:
                    logits = self._runner.feed([t])
        q = torch.stack(qs).cpu() if qs else None
        return Proposal(torch.tensor(ids, dtype=torch.long), q)

    def reset(self) -> None:
        """Forget the KV cache (new sequence)."""
        self._runner.reset()


class DraftModelDrafter(_LMDrafter):
    """A separate (smaller) causal LM sharing the target's tokenizer, with its own KV cache.

    At temperature 0 drafts are the draft model's argmax (q None); otherwise drafts are sampled
    from q = ``logits_to_probs(draft logits, same params as p)`` and q is returned ``[k', V]``.

    Args:
        model: a transformers causal LM (or ``LoadedModel``) whose vocabulary matches the target's.
        cost_per_token: drafting one token in single-token target forwards; ``reference.drafter_specs.make_drafter`` passes
            the parameter-count ratio draft/target (a forward is memory-bound on CPU), default 0.35.

    Raises:
        ValueError: negative ``cost_per_token``.
    """

    name = "draft-model"

    def __init__(self, model: ModelLike, cost_per_token: float = 0.35):
        from reference.models import unwrap

        if not cost_per_token >= 0:
            raise ValueError(f"cost_per_token={cost_per_token!r} must be >= 0 (units of one target forward)")
        self.model: PreTrainedModel = unwrap(model)[0]
        self.model.eval()
        self.cost_per_token = float(cost_per_token)
        draft = self.model

        def fwd(x: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
            logits: torch.Tensor = draft(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits
            return logits

        self._runner = _IncrementalLM(self.model, fwd)



def early_exit_forward(
    model: PreTrainedModel,
    n_layers: int,
    input_ids: torch.Tensor,
    cache: DynamicCache | None,
    logits_to_keep: int = 1,
) -> torch.Tensor:
    """Run the first ``n_layers`` decoder layers of a Llama-style model, then its final norm and LM head.

    Args:
        model: a ``*ForCausalLM`` with ``.model.{embed_tokens, rotary_emb, layers, norm}`` and ``.lm_head``.
        n_layers: number of decoder layers to run (1..num_hidden_layers).
        input_ids: ``[1, n]`` int64 new tokens.
        cache: a ``DynamicCache`` holding only this early-exit model's past (positions continue from it).
        logits_to_keep: number of trailing positions to project through the LM head.

    Returns:
        ``[1, logits_to_keep, V]`` logits (model dtype).
    """
    from transformers.masking_utils import create_causal_mask

    base: Any = model.model  # a Llama-style decoder (``LlamaModel`` and kin share no typed base)
    emb = base.embed_tokens(input_ids)
    past = cache.get_seq_length() if cache is not None else 0
    pos = torch.arange(past, past + input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    mask = create_causal_mask(
        config=base.config, inputs_embeds=emb, attention_mask=None, cache=cache, position_ids=pos
    )
    pe = base.rotary_emb(emb, position_ids=pos)
    h = emb
    for layer in base.layers[:n_layers]:
        h = layer(h, attention_mask=mask, position_embeddings=pe, position_ids=pos, cache=cache, use_cache=True)
    h = base.norm(h[:, -logits_to_keep:])
    out: torch.Tensor = model.lm_head(h)
    return out


class SelfDrafter(_LMDrafter):
    """Self-speculative early-exit drafter: the target's first ``n_layers`` layers + final norm + LM head.

    Keeps its own ``DynamicCache`` (only the first ``n_layers`` layers are filled). Greedy at
    temperature 0 (q None), else samples from processed q and returns it. ``cost_per_token`` is
    ``n_layers / num_hidden_layers`` (the LM head, shared by both, is not counted).

    Args:
        model: the target (``LoadedModel`` or a Llama-style ``*ForCausalLM``).
        n_layers: early-exit depth L, 1 <= L < num_hidden_layers (L == num_hidden_layers is allowed
            for tests: the drafter then equals the target).

    Raises:
        ValueError: L out of range or the model lacks the Llama-style layout.
    """

    name = "self"

    def __init__(self, model: ModelLike, n_layers: int):
        from reference.models import unwrap

        self.model: PreTrainedModel = unwrap(model)[0]
        base: Any = getattr(self.model, "model", None)
        for attr in ("embed_tokens", "rotary_emb", "layers", "norm"):
            if base is None or not hasattr(base, attr):
                raise ValueError(f"self-draft needs a Llama-style model (missing model.{attr}); use --drafter ngram")
        if not hasattr(self.model, "lm_head"):
            raise ValueError("self-draft needs a model with lm_head; use --drafter ngram")
        n_total = len(base.layers)
        if not (1 <= int(n_layers) <= n_total):
            raise ValueError(f"self-draft layers L={n_layers} must be in 1..{n_total}")
        self.n_layers = int(n_layers)
        self.n_total = n_total
        self.cost_per_token = self.n_layers / n_total
        target, depth = self.model, self.n_layers

        def fwd(x: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
            return early_exit_forward(target, depth, x, cache)

        self._runner = _IncrementalLM(self.model, fwd)



#: one scripted proposal: ids, or ``(ids, q | None)``
ScriptEntry = Sequence[int] | torch.Tensor | tuple[Sequence[int] | torch.Tensor, torch.Tensor | None]


class ScriptedDrafter(Drafter):
    """Test drafter: proposals come from a function or a fixed list, consumed in order.

    Args:
        script: either ``fn(context_ids, k) -> ids | (ids, q | None)`` or a list of such entries used
            one per call (empty proposals once exhausted). Proposals longer than k are truncated to
            k (q rows likewise).
        cost_per_token: cost model value reported to the loop (default 0, like n-gram lookup).
    """

    name = "scripted"

    def __init__(
        self,
        script: Callable[[list[int], int], ScriptEntry] | Sequence[ScriptEntry],
        cost_per_token: float = 0.0,
    ):
        self.script = script
        self.cost_per_token = float(cost_per_token)
        self.calls = 0

    def _draft(
        self, context_ids: Sequence[int], k: int, sampling: SamplingParams | None, generator: torch.Generator | None
    ) -> Proposal:
        """Return the next scripted proposal, truncated to k."""
        out: ScriptEntry
        if callable(self.script):
            out = self.script(list(context_ids), k)
        elif self.calls < len(self.script):
            out = self.script[self.calls]
        else:
            out = ([], None)
        self.calls += 1
        raw, q = out if isinstance(out, tuple) else (out, None)
        ids = torch.as_tensor(raw if torch.is_tensor(raw) else list(raw), dtype=torch.long).reshape(-1)[: max(k, 0)]
        if q is not None:
            q = q[: ids.numel()]
        return Proposal(ids, q)

    def reset(self) -> None:
        """Restart the script."""
        self.calls = 0


class SequenceDrafter(Drafter):
    """Test drafter that proposes the next k tokens of a known full sequence (prompt + continuation).

    With the target's own greedy output as ``sequence`` every draft is accepted (oracle); with a
    corrupted sequence drafts are rejected where it differs. Proposes nothing past its end.
    """

    name = "sequence"

    def __init__(self, sequence: Sequence[int]):
        self.sequence = list(sequence)

    def _draft(
        self, context_ids: Sequence[int], k: int, sampling: SamplingParams | None, generator: torch.Generator | None
    ) -> Proposal:
        """Propose ``sequence[len(context) : len(context)+k]`` (q None)."""
        n = len(context_ids)
        ids = self.sequence[n : n + max(k, 0)]
        return Proposal(torch.tensor(ids, dtype=torch.long), None)
