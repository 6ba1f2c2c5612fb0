"""Speculative decoding loop and the plain autoregressive baseline.

Stages follow gpt-fast's shape (``generate.py``: prefill, decode_n_tokens, speculative_decode), one
small function each: :func:`_prefill` fills the target's KV cache with the prompt; every round
:func:`_propose` asks the drafter for up to k tokens (k chosen by the draft-length policy),
:func:`_verify_step` runs one target forward over ``[pending] + drafts`` and applies the
``Verifier`` (default ``StrictVerifier``, Leviathan et al. 2023 Alg. 1), :func:`_commit` rolls the
rejected drafts out of the cache (``DynamicCache.crop``) and records the round, and
:func:`_finish` assembles the result. Every emitted token goes through the verifier, including
plain steps with zero drafts, so lossy verifiers plugged in by the simulator see every token.

Draft length (``adaptive_k=True``): :class:`DraftLengthPolicy` picks, each round, the number of
drafts ``k`` that maximises the expected tokens per unit of cost,
``E[tokens](k, a) / (c_fwd(k+1) + k * c_draft)`` with ``E[tokens] = (1 - a^(k+1)) / (1 - a)``
(Leviathan et al. 2023, eq. 1), ``a`` a decayed estimate of the per-draft acceptance rate from the
*counts* of accepted and rejected drafts, and fixed costs in units of one single-token target
forward (:class:`CostModel`; verifying n >= 2 tokens costs the measured ``forward_costs[n - 1]``, a plain
step 1, drafting one token ``drafter.cost_per_token``). No clock enters a decision, so a seed
reproduces the same tokens on a busy machine as on an idle one. ``k = 0`` is a plain step: when the drafts stop paying the policy
falls back to plain decoding within a few rounds, and probes again after a backoff (4, 8, ... 64
rounds), after which its evidence restarts from the prior.

Why the n-gram drafter once lost to plain decoding on a busy 2-core machine (issue 15, measured with
SmolLM2-135M on the copy-a-passage prompt): the former policy priced k from measured forward times;
under load one sample put a 2-token forward at 5.5x a 1-token one and an 8-token forward at 1.2x, so
k swung between 2 and 8 and the mean accepted length fell from 6.3 (k = 8) to 5.7 and lower. The
cache crop costs about 0.2 ms a round (negligible); a full sort of 9 x 49,152 probabilities for
top-p cost 354 ms under load (more than a forward) and is now a partial sort (18 ms,
``reference.sampling``). Two intra-op threads on an oversubscribed 2-core machine made every forward
5-10x slower than one thread (``benchmarks/spec_decode.py --threads 1``).

Why chat prompts ran at 0.85x with only a dozen short probes (issue 15, measured one thread): not the
loop's per-round work -- the same loop with a drafter that never proposes runs at 1.00x plain
(median of 4 interleaved rounds, chat-0 and chat-1), and the n-gram lookups cost 0.3 ms a round
(~0.5%) -- but the price of a verify forward: n = 2 tokens cost 1.3-1.9 single forwards (matrix-
matrix instead of matrix-vector kernels), not the 1.15 the former linear cost model assumed, so each
mostly rejected 1-2 draft probe lost most of a forward. Re-measured in session 7 on a quiet machine and
beside a burner (one and two threads, medians of 9 interleaved forwards), n = 2 costs 1.03-1.11: the
1.3-1.9 had been read under a load average of ~9, where single timings swing by that much. The
cost model is now that measured table (:data:`CPU_FORWARD_COSTS`); the jump sits at n = 4 (~1.55).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

import torch

from reference.drafters import Drafter
from reference.models import LoadedModel, eos_token_ids_of, unwrap
from reference.sampling import SamplingParams, logits_to_probs
from reference.verify import StrictVerifier, Verifier

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

#: the target: the reference's ``LoadedModel`` or a bare transformers causal LM
TargetLike = Union[LoadedModel, "PreTrainedModel", torch.nn.Module]


@dataclass
class GenerationResult:
    """Tokens and statistics of one generation.

    Attributes:
        token_ids: generated ids (excluding the prompt and excluding the EOS token that stopped it).
        text: ``tokenizer.decode(token_ids, skip_special_tokens=True)`` when a tokenizer is known.
        rounds: tokens emitted per target forward (each 1..k+1; the EOS token counts; plain: all 1).
        accept_counts: histogram, ``accept_counts[j]`` = rounds in which j drafts were accepted (len k+1).
        mean_accepted_length: mean of ``rounds`` (tokens per target forward).
        elapsed_s: wall time in seconds, prefill included (reported only; never used for a decision).
        tokens_per_s: ``len(token_ids) / elapsed_s``.
        finish_reason: ``"stop"`` (EOS) or ``"length"`` (max_new_tokens).
        logprobs: ``[n, V]`` float32 raw log-softmax of the target (temperature 1, no top-k/p) at each
            emitted token position (rows align with ``token_ids``), when ``return_logprobs``.
        n_drafted: drafts sent to verification; ``n_accepted``: drafts accepted.
        acceptance_rate: ``n_accepted / n_drafted`` (nan when nothing was drafted).
        stop_token_id: the EOS id that ended generation, if any.
        k_history: drafts verified per round (0 = plain step).
        draft_policy: how k was chosen: ``"plain"`` (no drafter), ``"fixed"`` (always k) or the
            :class:`DraftLengthPolicy` description (``"counts(...)"``).
    """

    token_ids: list[int]
    text: str | None
    rounds: list[int]
    accept_counts: list[int]
    mean_accepted_length: float
    elapsed_s: float
    tokens_per_s: float
    finish_reason: str
    logprobs: torch.Tensor | None = None
    n_drafted: int = 0
    n_accepted: int = 0
    acceptance_rate: float = float("nan")
    stop_token_id: int | None = None
    k_history: list[int] = field(default_factory=list)
    draft_policy: str = "plain"

    def to_dict(self, include_logprobs: bool = False) -> dict[str, object]:
        """JSON-friendly dict (logprobs omitted unless asked; then as nested lists)."""
        d: dict[str, object] = {
            "token_ids": self.token_ids,
            "text": self.text,
            "n_tokens": len(self.token_ids),
            "rounds": self.rounds,
            "accept_counts": self.accept_counts,
            "mean_accepted_length": self.mean_accepted_length,
            "elapsed_s": self.elapsed_s,
            "tokens_per_s": self.tokens_per_s,
            "finish_reason": self.finish_reason,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": None if self.acceptance_rate != self.acceptance_rate else self.acceptance_rate,
            "stop_token_id": self.stop_token_id,
            "k_history": self.k_history,
            "draft_policy": self.draft_policy,
        }
        if include_logprobs and self.logprobs is not None:
            d["logprobs"] = self.logprobs.tolist()
        return d


# ---- the draft-length policy (counts only) ------------------------------------------------------


#: Forward cost of n = 1, 2, ... 9 fed tokens relative to n = 1 (one decode step), measured for
#: SmolLM2-135M fp32 on torch 2.13's CPU build (issue 15, session 7; ``benchmarks/spec_decode.py``
#: ``--forward-costs``): medians of 9 interleaved forwards over a KV cache of 120 / 200 / 500 tokens,
#: one and two intra-op threads, quiet and beside a CPU-burning process -- every condition within
#: +-0.08 of these values (the table is the upper side at n = 7-9). n = 2-3 stays a memory-bound pass
#: (1.03-1.19); at n = 4 the GEMM kernel changes and the cost jumps to ~1.55. Beyond n = 9 the model
#: adds 0.1 a token: measured n = 13 costs 2.6 (model 2.52) and n = 17 2.2-2.3 (model 2.92), so the
#: policy is conservative about 16-draft rounds (it then needs a higher acceptance rate, never less
#: safe).
CPU_FORWARD_COSTS: tuple[float, ...] = (1.0, 1.08, 1.14, 1.57, 1.64, 1.70, 2.0, 2.05, 2.12)


@dataclass(frozen=True)
class CostModel:
    """Cost of one round in units of one single-token target forward (fixed: no clock is read).

    A plain step (k = 0) costs 1; verifying k drafts costs the forward over n = k + 1 tokens,
    ``forward_costs[n - 1]`` (``extra_per_token`` more per token beyond the table), plus
    ``k * draft_cost`` for drafting. The default table is measured (:data:`CPU_FORWARD_COSTS`).
    An earlier linear model (``1 + 0.6 + 0.08 k``, fitted under a load average of ~9) priced a
    one-draft verify at 1.68 forwards where it costs 1.08 on a quiet machine and beside a burner
    alike, so the policy refused cheap short drafts that pay at a per-draft acceptance above ~8 %
    (issue 15: the replayed HumanEval ratio moved from 1.11 to 1.17 with the table alone).

    Attributes:
        forward_costs: forward cost of n = 1..len fed tokens (first entry 1.0, non-decreasing).
            Larger values make the policy more reluctant to draft, never less safe: outputs
            do not depend on it.
        extra_per_token: cost of each fed token beyond the table (forward units).
        draft_cost: cost of drafting one token (the drafter's ``cost_per_token``).

    Raises:
        ValueError: an empty or decreasing table, a first entry other than 1.0, or a negative field
            (name and value in the message).
    """

    forward_costs: tuple[float, ...] = CPU_FORWARD_COSTS
    extra_per_token: float = 0.1
    draft_cost: float = 0.0

    def __post_init__(self) -> None:
        fc = tuple(float(x) for x in self.forward_costs)
        if not fc or fc[0] != 1.0 or any(not b >= a for a, b in itertools.pairwise(fc)):
            raise ValueError(
                f"CostModel needs forward_costs starting at 1.0 and non-decreasing (n = 1, 2, ... tokens), got {fc}"
            )
        object.__setattr__(self, "forward_costs", fc)
        for name in ("extra_per_token", "draft_cost"):
            v = getattr(self, name)
            if not v >= 0:
                raise ValueError(f"CostModel needs {name} >= 0, got {v}; pass a non-negative cost in forward units")

    @classmethod
    def linear(cls, overhead: float, slope: float, draft_cost: float = 0.0, n_max: int = 17) -> CostModel:
        """A linear verify cost ``1 + overhead + slope * k`` for k >= 1 drafts (tests, other machines).

        Raises:
            ValueError: a negative overhead, slope or draft cost, or n_max < 2.
        """
        if not (overhead >= 0 and slope >= 0) or n_max < 2:
            raise ValueError(
                f"CostModel.linear needs overhead >= 0, slope >= 0 and n_max >= 2, got {overhead}, {slope}, {n_max}"
            )
        table = (1.0,) + tuple(1.0 + overhead + slope * k for k in range(1, n_max))
        return cls(forward_costs=table, extra_per_token=slope, draft_cost=draft_cost)

    def forward_cost(self, n: int) -> float:
        """Cost of one target forward over n >= 1 fed tokens (forward units)."""
        fc = self.forward_costs
        n = max(int(n), 1)
        return fc[n - 1] if n <= len(fc) else fc[-1] + self.extra_per_token * (n - len(fc))

    def round_cost(self, k: int, include_draft: bool = True) -> float:
        """Cost of drafting k tokens (unless sunk) and verifying them in one forward of k+1 tokens."""
        if k <= 0:
            return 1.0
        return self.forward_cost(k + 1) + (k * self.draft_cost if include_draft else 0.0)


class DraftLengthPolicy:
    """Chooses the number of drafts per round from acceptance counts (see the module docstring).

    Each round it asks for the k in ``0..min(k_max, limit)`` that maximises :meth:`value`. When that
    is 0 (drafting does not pay) it falls back to plain decoding for ``backoff`` rounds, then lets
    the evidence decide again from the prior (the counts are cleared when the fallback ends, so a
    merely decayed estimate does not hold the next probe back): a probe. Each fallback doubles ``backoff`` (4, 8,
    ... up to 64 rounds) and a fully accepted round resets it, so a drafter that never pays costs at
    most a few probes of 1-3 drafts per hundred tokens. Deterministic: the same sequence of
    ``observe`` calls gives the same sequence of ``plan`` answers on any machine under any load.

    Args:
        k_max: upper bound on drafts per round (>= 0).
        cost: the cost model (forward-pass units).
        alpha_prior: prior per-draft acceptance rate, worth ``prior_strength`` pseudo-drafts.
        decay: per-round decay of the acceptance evidence (recent rounds weigh more); the evidence
            is cleared at the end of each fallback, so the next round probes from the prior.
        backoff: plain rounds after the first fallback; ``max_backoff`` caps the doubling.

    Raises:
        ValueError: k_max < 0, alpha_prior outside (0, 1), prior_strength <= 0, decay outside (0, 1],
            or backoff < 1 / max_backoff < backoff.
    """

    def __init__(
        self,
        k_max: int,
        cost: CostModel | None = None,
        alpha_prior: float = 0.6,
        prior_strength: float = 1.0,
        decay: float = 0.9,
        backoff: int = 4,
        max_backoff: int = 64,
    ):
        if k_max < 0:
            raise ValueError(f"k_max={k_max} must be >= 0")
        if not (0 < alpha_prior < 1 and prior_strength > 0 and 0 < decay <= 1):
            raise ValueError(
                f"DraftLengthPolicy needs 0 < alpha_prior < 1, prior_strength > 0, 0 < decay <= 1; "
                f"got {alpha_prior}, {prior_strength}, {decay}"
            )
        if not 1 <= backoff <= max_backoff:
            raise ValueError(f"DraftLengthPolicy needs 1 <= backoff <= max_backoff, got {backoff}, {max_backoff}")
        self.k_max = int(k_max)
        self.cost = cost or CostModel()
        self.alpha_prior = alpha_prior
        self.prior_strength = prior_strength
        self.decay = decay
        self.first_backoff = int(backoff)
        self.max_backoff = int(max_backoff)
        self.accepted = 0.0  # decayed count of accepted drafts
        self.rejected = 0.0  # decayed count of rejections (at most one per round)
        self.backoff = self.first_backoff  # length of the next fallback, in rounds
        self.waiting = 0  # plain rounds left in the current fallback

    def describe(self) -> str:
        """One-line description recorded in ``GenerationResult.draft_policy``."""
        c = self.cost
        return (
            f"counts(k_max={self.k_max}, forward_costs={','.join(f'{x:g}' for x in c.forward_costs)}"
            f"+{c.extra_per_token:g}/token, "
            f"draft_cost={c.draft_cost:g}, "
            f"alpha_prior={self.alpha_prior:g}, decay={self.decay:g}, "
            f"backoff={self.first_backoff}..{self.max_backoff})"
        )

    @property
    def alpha(self) -> float:
        """Current per-draft acceptance estimate, clipped to [0.001, 0.999]."""
        a0 = self.alpha_prior * self.prior_strength
        b0 = (1 - self.alpha_prior) * self.prior_strength
        est = (self.accepted + a0) / (self.accepted + self.rejected + a0 + b0)
        return min(max(est, 1e-3), 0.999)

    def value(self, k: int, include_draft: bool = True) -> float:
        """Expected tokens per forward-pass unit when verifying k drafts."""
        a = self.alpha
        expected = (1 - a ** (k + 1)) / (1 - a)
        return expected / self.cost.round_cost(k, include_draft)

    def best(self, limit: int) -> int:
        """The k in 0..min(k_max, limit) of highest :meth:`value` (drafting cost counted; ties: fewer)."""
        ks = range(max(0, min(self.k_max, limit)) + 1)
        return max(ks, key=lambda k: (self.value(k), -k))

    def plan(self, limit: int) -> int:
        """Drafts to ask for this round, in 0..min(k_max, limit); 0 during a fallback."""
        if self.waiting > 0 or limit <= 0:
            return 0
        k = self.best(limit)
        if k == 0:  # drafting stopped paying: fall back to plain decoding for a while
            self.waiting = self.backoff
            self.backoff = min(2 * self.backoff, self.max_backoff)
        return k

    def truncate(self, n_proposed: int) -> int:
        """How many of ``n_proposed`` drafts to verify (their drafting cost is already spent)."""
        return max(range(n_proposed + 1), key=lambda k: (self.value(k, include_draft=False), -k))

    def observe(self, n_accepted: int, n_drafted: int) -> None:
        """Record one round (a plain step has ``n_drafted == 0`` and only decays the evidence)."""
        self.accepted *= self.decay
        self.rejected *= self.decay
        if self.waiting > 0:
            self.waiting -= 1
            if self.waiting == 0:  # the fallback is over: probe from the prior, not from stale evidence
                self.accepted = self.rejected = 0.0
        if n_drafted > 0:
            self.accepted += n_accepted
            self.rejected += 1.0 if n_accepted < n_drafted else 0.0
            if n_accepted == n_drafted:
                self.backoff = self.first_backoff


# ---- one generation, in stages ------------------------------------------------------------------


@dataclass
class _Decode:
    """Everything one generation needs and accumulates (the loop's state between stages)."""

    model: PreTrainedModel
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    eos: set[int]
    verifier: Verifier
    max_new_tokens: int
    return_logprobs: bool
    on_round: Callable[[list[int]], None] | None
    k: int
    policy: DraftLengthPolicy | None
    out: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)
    accept_counts: list[int] = field(default_factory=list)
    lp_rows: list[torch.Tensor] = field(default_factory=list)
    n_drafted: int = 0
    n_accepted: int = 0
    finish: str = "length"
    stop_id: int | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


def _prefill(run: _Decode) -> DynamicCache:
    """Fill a fresh KV cache with all prompt tokens but the last (each round feeds ``[pending] + drafts``)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=run.model.config)
    # sliding-window layers (Gemma 2/3, Mistral) drop keys beyond the window at once and then refuse
    # ``crop`` (RuntimeError); recording the past keeps them until the round's crop in _commit
    cache.activate_past_recording()  # type: ignore[no-untyped-call]  # untyped in transformers
    if len(run.prompt) > 1:
        x = torch.tensor([run.prompt[:-1]], dtype=torch.long, device=run.device)
        run.model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def _propose(run: _Decode, drafter: Drafter | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drafts for this round: ``([nd] int64 CPU, [nd, V] float32 CPU | None)``; nd = 0 is a plain step."""
    limit = min(run.k, run.max_new_tokens - len(run.out) - 1)  # the round also emits one target token
    empty = torch.zeros(0, dtype=torch.long)
    if drafter is None or limit <= 0:
        return empty, None
    k_plan = run.policy.plan(limit) if run.policy is not None else limit
    if k_plan <= 0:
        return empty, None
    ids, q = drafter.propose(run.prompt + run.out, k_plan, sampling=run.params, generator=run.generator)
    drafts = torch.as_tensor(ids, dtype=torch.long).reshape(-1).cpu()[:k_plan]
    if run.policy is not None and drafts.numel():
        drafts = drafts[: run.policy.truncate(int(drafts.numel()))]
    if q is None or drafts.numel() == 0:
        return drafts, None
    return drafts, q[: drafts.numel()].float().cpu()


def _target_probs(run: _Decode, logits: torch.Tensor) -> torch.Tensor:
    """``[n, V]`` logits -> ``[n, V]`` float32 CPU p as the verifier expects (softmax when greedy)."""
    x = logits.float()
    if run.params.greedy:
        return torch.softmax(x, dim=-1).cpu()
    return logits_to_probs(x, run.params.temperature, run.params.top_k, run.params.top_p).cpu()


def _verify_step(
    run: _Decode, cache: DynamicCache, pending: int, drafts: torch.Tensor, q: torch.Tensor | None
) -> tuple[int, int, torch.Tensor]:
    """One target forward over ``[pending] + drafts`` and the verifier's decision.

    Returns:
        ``(n_accepted, next_token, logits [nd+1, V])``.

    Raises:
        RuntimeError: the verifier returned an accepted count outside ``0..nd``.
    """
    nd = int(drafts.numel())
    feed = torch.cat([torch.tensor([pending], dtype=torch.long), drafts]).unsqueeze(0).to(run.device)
    logits = run.model(input_ids=feed, cache=cache, use_cache=True).logits[0]  # [nd+1, V]
    res = run.verifier.verify(_target_probs(run, logits), q, drafts, run.generator, run.params.greedy)
    n_acc = int(res.n_accepted)
    if not 0 <= n_acc <= nd:
        raise RuntimeError(f"verifier returned n_accepted={n_acc} outside 0..{nd}")
    return n_acc, int(res.next_token), logits


def _commit(run: _Decode, cache: DynamicCache, drafts: torch.Tensor, n_acc: int) -> None:
    """Roll the rejected drafts out of the KV cache and record the round's counts."""
    nd = int(drafts.numel())
    # always crop: ``crop(0)`` is a no-op on full layers and trims recorded sliding-window layers to the window
    cache.crop(-(nd - n_acc))
    _record_round(run, nd, n_acc)


def _record_round(run: _Decode, nd: int, n_acc: int) -> None:
    """The round's counts: the draft-length policy's evidence, drafted / accepted totals, histories."""
    if run.policy is not None:
        run.policy.observe(n_acc, nd)
    run.n_drafted += nd
    run.n_accepted += n_acc
    run.accept_counts[n_acc] += 1
    run.k_history.append(nd)


def _emit(run: _Decode, new: list[int], logits: torch.Tensor) -> bool:
    """Append the round's tokens up to EOS / max_new_tokens; return True when generation is finished."""
    shown: list[int] = []
    done = False
    used = 0
    for j, t in enumerate(new):
        used += 1
        if t in run.eos:
            run.finish, run.stop_id, done = "stop", t, True
            break
        run.out.append(t)
        shown.append(t)
        if run.return_logprobs:
            run.lp_rows.append(torch.log_softmax(logits[j].float(), dim=-1).cpu())
        if len(run.out) >= run.max_new_tokens:
            run.finish, done = "length", True
            break
    run.rounds.append(used)  # tokens this forward produced that count (up to EOS / max_new_tokens)
    if run.on_round is not None and shown:
        run.on_round(shown)
    return done


def _finish(run: _Decode, elapsed: float, tok: PreTrainedTokenizerBase | None, policy_name: str) -> GenerationResult:
    """Assemble the result (text, statistics, logprob rows)."""
    out = run.out
    logprobs = None
    if run.return_logprobs:
        logprobs = torch.stack(run.lp_rows) if run.lp_rows else torch.zeros(0, int(run.model.config.vocab_size))
    return GenerationResult(
        token_ids=out,
        text=str(tok.decode(out, skip_special_tokens=True)) if tok is not None else None,
        rounds=run.rounds,
        accept_counts=run.accept_counts,
        mean_accepted_length=(sum(run.rounds) / len(run.rounds)) if run.rounds else 0.0,
        elapsed_s=elapsed,
        tokens_per_s=len(out) / elapsed if elapsed > 0 else float("inf"),
        finish_reason=run.finish,
        logprobs=logprobs,
        n_drafted=run.n_drafted,
        n_accepted=run.n_accepted,
        acceptance_rate=(run.n_accepted / run.n_drafted) if run.n_drafted else float("nan"),
        stop_token_id=run.stop_id,
        k_history=run.k_history,
        draft_policy=policy_name,
    )


def _new_run(
    lm: TargetLike,
    input_ids: Sequence[int],
    *,
    drafter: Drafter | None,
    k: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    generator: torch.Generator | None,
    eos_token_ids: Sequence[int] | None,
    verifier: Verifier | None,
    return_logprobs: bool,
    on_round: Callable[[list[int]], None] | None,
    adaptive_k: bool,
    policy: DraftLengthPolicy | None,
    tokenizer: PreTrainedTokenizerBase | None,
) -> tuple[_Decode, PreTrainedTokenizerBase | None, str]:
    """One generation's validated state (:func:`speculative_generate`'s arguments), its tokenizer and the
    draft-length policy's name; the drafter is reset. One home for the sequential and the batched loop
    (``reference.speculative_batch``).

    Raises:
        ValueError: empty prompt, max_new_tokens < 1, k < 0.
    """
    model, tok = unwrap(lm)
    tok = tok or tokenizer
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty; the prompt needs at least one token")
    if max_new_tokens is None or int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be >= 1")
    if k is None or int(k) < 0:
        raise ValueError(f"k={k!r} must be >= 0")
    k = int(k) if drafter is not None else 0
    if generator is None:
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(int(seed))
        else:
            generator.seed()
    if drafter is None:
        policy, policy_name = None, "plain"
    elif not adaptive_k:
        policy, policy_name = None, "fixed"
    else:
        policy = policy or DraftLengthPolicy(k, CostModel(draft_cost=drafter.cost_per_token))
        policy_name = policy.describe()
    run = _Decode(
        model=model,
        prompt=prompt,
        params=SamplingParams(float(temperature), int(top_k), float(top_p)),
        generator=generator,
        eos={int(e) for e in (eos_token_ids if eos_token_ids is not None else eos_token_ids_of(model, tok))},
        verifier=verifier or StrictVerifier(),
        max_new_tokens=int(max_new_tokens),
        return_logprobs=return_logprobs,
        on_round=on_round,
        k=k,
        policy=policy,
        accept_counts=[0] * (k + 1),
        device=next(model.parameters()).device,
    )
    if drafter is not None:
        drafter.reset()
    return run, tok, policy_name


def speculative_generate(
    lm: TargetLike,
    input_ids: Sequence[int],
    *,
    drafter: Drafter | None = None,
    k: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_ids: Sequence[int] | None = None,
    verifier: Verifier | None = None,
    return_logprobs: bool = False,
    on_round: Callable[[list[int]], None] | None = None,
    adaptive_k: bool = True,
    policy: DraftLengthPolicy | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> GenerationResult:
    """Generate with speculative decoding (lossless with the default ``StrictVerifier``).

    Args:
        lm: ``LoadedModel`` or a transformers causal LM (target p).
        input_ids: prompt token ids (non-empty).
        drafter: a :class:`reference.drafters.Drafter`, or None for plain decoding.
        k: maximum drafts per round (>= 0).
        max_new_tokens: hard cap on generated tokens (never exceeded), >= 1.
        temperature, top_k, top_p: sampling parameters applied identically to p and q
            (``logits_to_probs``); temperature 0 = greedy.
        seed: seeds a fresh CPU ``torch.Generator`` (ignored when ``generator`` is given).
        generator: source of every random draw (drafter sampling, verification, bonus tokens).
        eos_token_ids: ids that stop generation; default the model's/tokenizer's eos; ``[]`` disables.
        verifier: acceptance rule (``Verifier`` protocol); default ``StrictVerifier()``.
        return_logprobs: also return raw target log-softmax rows ``[n, V]`` for the emitted tokens.
        on_round: callback with the token ids emitted by each target forward (EOS excluded; not called
            for empty lists) — e.g. one SSE chunk per round.
        adaptive_k: let the draft-length policy choose 0..k drafts per round from acceptance counts
            (deterministic); False = always ask for k.
        policy: a custom :class:`DraftLengthPolicy` (its ``k_max`` is used as given); default one
            built from ``k`` and the drafter's ``cost_per_token``. Ignored when ``adaptive_k`` is False.
        tokenizer: for ``text`` when ``lm`` is a bare model.

    Returns:
        GenerationResult (``k_history`` and ``draft_policy`` record the draft lengths and how they
        were chosen).

    Raises:
        ValueError: empty prompt, max_new_tokens < 1, k < 0, or invalid sampling parameters.
        RuntimeError: the verifier returned an accepted count outside ``0..k``.
    """
    run, tok, policy_name = _new_run(
        lm, input_ids, drafter=drafter, k=k, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, seed=seed, generator=generator, eos_token_ids=eos_token_ids, verifier=verifier,
        return_logprobs=return_logprobs, on_round=on_round, adaptive_k=adaptive_k, policy=policy, tokenizer=tokenizer,
    )
    prompt = run.prompt
    t_start = time.perf_counter()
    try:
        with torch.inference_mode():
            cache = _prefill(run)
            pending = prompt[-1]
            done = False
            while not done:
                drafts, q = _propose(run, drafter)
                n_acc, pending, logits = _verify_step(run, cache, pending, drafts, q)
                _commit(run, cache, drafts, n_acc)
                done = _emit(run, drafts[:n_acc].tolist() + [pending], logits)
    finally:  # also when on_round stops the generation (stop string, cancel): the tokens so far are the target's
        if drafter is not None and run.out:
            drafter.observe_output(prompt, list(run.out))  # drafters that learn across requests (suffix)
    return _finish(run, time.perf_counter() - t_start, tok, policy_name)


def autoregressive_generate(
    lm: TargetLike,
    input_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_ids: Sequence[int] | None = None,
    verifier: Verifier | None = None,
    return_logprobs: bool = False,
    on_round: Callable[[list[int]], None] | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> GenerationResult:
    """Plain autoregressive decoding (one target forward per token): the baseline.

    Same arguments and result as :func:`speculative_generate` without a drafter; every round
    emits exactly one token (``rounds`` all 1, ``accept_counts == [n_rounds]``).
    """
    return speculative_generate(
        lm,
        input_ids,
        drafter=None,
        k=0,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        generator=generator,
        eos_token_ids=eos_token_ids,
        verifier=verifier,
        return_logprobs=return_logprobs,
        on_round=on_round,
        adaptive_k=False,
        tokenizer=tokenizer,
    )
