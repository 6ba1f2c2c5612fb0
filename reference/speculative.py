"""Speculative decoding loop and the plain autoregressive baseline.

Stages follow gpt-fast's shape: prefill -> rounds of (draft -> one target forward over
``[pending] + drafts`` -> verify -> KV rollback with ``DynamicCache.crop``). Every emitted token
goes through a ``Verifier`` (default ``StrictVerifier``, Leviathan et al. 2023 Alg. 1), including
plain steps with zero drafts, so lossy verifiers plugged in by the simulator see every token.

Statistics are returned beside the tokens: tokens per round, accept-count histogram, mean
accepted length (tokens per target forward), wall time, tokens/s.

Adaptive k (``adaptive_k=True``): a small cost model picks, each round, the number of drafts to
verify that maximises expected tokens per second, ``E[tokens](k, a) / (k*c_draft + c_fwd(k+1))``,
with ``E[tokens] = (1 - a^(k+1)) / (1 - a)`` (Leviathan et al. 2023, eq. 1), ``a`` a decayed
estimate of the per-draft acceptance rate and the costs measured online (priors: verifying n tokens
costs ``1 + 0.1 (n-1)`` single steps on CPU, REFERENCES.md). ``k = 0`` means a plain step, so
speculation with a poor drafter falls back to plain decoding instead of slowing it down.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from reference.models import LoadedModel, eos_token_ids_of, unwrap
from reference.sampling import SamplingParams, logits_to_probs
from reference.verify import StrictVerifier, Verifier


@dataclass
class GenerationResult:
    """Tokens and statistics of one generation.

    Attributes:
        token_ids: generated ids (excluding the prompt and excluding the EOS token that stopped it).
        text: ``tokenizer.decode(token_ids, skip_special_tokens=True)`` when a tokenizer is known.
        rounds: tokens emitted per target forward (each 1..k+1; the EOS token counts; plain: all 1).
        accept_counts: histogram, ``accept_counts[j]`` = rounds in which j drafts were accepted (len k+1).
        mean_accepted_length: mean of ``rounds`` (tokens per target forward).
        elapsed_s: wall time in seconds, prefill included.
        tokens_per_s: ``len(token_ids) / elapsed_s``.
        finish_reason: ``"stop"`` (EOS) or ``"length"`` (max_new_tokens).
        logprobs: ``[n, V]`` float32 raw log-softmax of the target (temperature 1, no top-k/p) at each
            emitted token position (rows align with ``token_ids``), when ``return_logprobs``.
        n_drafted: drafts sent to verification; ``n_accepted``: drafts accepted.
        acceptance_rate: ``n_accepted / n_drafted`` (nan when nothing was drafted).
        stop_token_id: the EOS id that ended generation, if any.
        k_history: drafts verified per round (0 = plain step).
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

    def to_dict(self, include_logprobs: bool = False) -> dict:
        """JSON-friendly dict (logprobs omitted unless asked; then as nested lists)."""
        d = {
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
        }
        if include_logprobs and self.logprobs is not None:
            d["logprobs"] = self.logprobs.tolist()
        return d


class AdaptiveK:
    """Online cost model choosing how many drafts to verify each round (see module docstring).

    Args:
        k_max: upper bound on drafts per round.
        draft_cost_prior: prior cost of drafting one token, in units of one target step (0 for n-gram).
        alpha_prior: prior per-draft acceptance rate; ``prior_strength`` pseudo-observations.
        decay: per-round decay of the acceptance evidence (recent rounds weigh more; while not
            drafting the estimate drifts back to the prior, which re-triggers a probe).
        fwd_slope_prior: prior extra cost per extra token in a verify forward, relative to one step.
    """

    def __init__(
        self,
        k_max: int,
        draft_cost_prior: float = 0.0,
        alpha_prior: float = 0.6,
        prior_strength: float = 1.0,
        decay: float = 0.9,
        fwd_slope_prior: float = 0.1,
    ):
        self.k_max = int(k_max)
        self.alpha_prior = alpha_prior
        self.prior_strength = prior_strength
        self.decay = decay
        self.slope_prior = fwd_slope_prior
        self.draft_cost_prior = draft_cost_prior
        self.S = 0.0  # decayed accepted drafts
        self.F = 0.0  # decayed rejections
        self.t_fwd: dict[int, float] = {}  # n tokens -> EMA seconds of a target forward
        self.t_draft: float | None = None  # EMA seconds per drafted token
        self.ema = 0.3

    @property
    def alpha(self) -> float:
        """Current per-draft acceptance estimate in (0, 1)."""
        a0 = self.alpha_prior * self.prior_strength
        b0 = (1 - self.alpha_prior) * self.prior_strength
        return min(max((self.S + a0) / (self.S + self.F + a0 + b0), 1e-3), 0.999)

    def _upd(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.ema) * old + self.ema * new

    def observe_forward(self, n_tokens: int, seconds: float) -> None:
        """Record the wall time of a target forward over ``n_tokens`` new tokens."""
        self.t_fwd[n_tokens] = self._upd(self.t_fwd.get(n_tokens), seconds)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        """Record the wall time of drafting ``n_tokens`` tokens."""
        if n_tokens > 0:
            self.t_draft = self._upd(self.t_draft, seconds / n_tokens)

    def observe_accept(self, n_accepted: int, n_drafted: int) -> None:
        """Record one verification (or a plain step: n_drafted == 0)."""
        self.S *= self.decay
        self.F *= self.decay
        if n_drafted > 0:
            self.S += n_accepted
            self.F += 1.0 if n_accepted < n_drafted else 0.0

    def _step(self) -> float | None:
        if 1 in self.t_fwd:
            return self.t_fwd[1]
        for n, t in self.t_fwd.items():
            return t / (1 + self.slope_prior * (n - 1))
        return None

    def fwd_cost(self, n: int) -> float:
        """Cost of a target forward over n tokens, in single-step units."""
        t1 = self._step()
        if t1 and n in self.t_fwd and 1 in self.t_fwd:
            return max(self.t_fwd[n] / t1, 1.0)
        return 1.0 + self.slope_prior * (n - 1)

    def draft_cost(self) -> float:
        """Cost of drafting one token, in single-step units."""
        t1 = self._step()
        if self.t_draft is not None and t1:
            return self.t_draft / t1
        return self.draft_cost_prior

    def value(self, k: int, include_draft: bool = True) -> float:
        """Expected tokens per single-step time unit when verifying k drafts."""
        a = self.alpha
        expected = (1 - a ** (k + 1)) / (1 - a)
        cost = self.fwd_cost(k + 1) + (k * self.draft_cost() if include_draft else 0.0)
        return expected / cost

    def plan(self, limit: int) -> int:
        """k to draft (drafting cost counted), 0..min(k_max, limit)."""
        ks = range(max(0, min(self.k_max, limit)) + 1)
        return max(ks, key=lambda k: (self.value(k), -k))

    def truncate(self, n_proposed: int) -> int:
        """How many of ``n_proposed`` already-drafted tokens to verify (drafting cost is sunk)."""
        ks = range(n_proposed + 1)
        return max(ks, key=lambda k: (self.value(k, include_draft=False), -k))


def _accepts_kwargs(fn: Callable) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return "sampling" in sig.parameters or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def speculative_generate(
    lm: LoadedModel | Any,
    input_ids: Sequence[int],
    *,
    drafter: Any = None,
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
    tokenizer: Any = None,
) -> GenerationResult:
    """Generate with speculative decoding (lossless with the default ``StrictVerifier``).

    Args:
        lm: ``LoadedModel`` or a transformers causal LM (target p).
        input_ids: prompt token ids (non-empty).
        drafter: a ``Drafter`` (see ``reference.drafters``) or None for plain decoding.
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
        adaptive_k: let ``AdaptiveK`` choose the drafts to verify per round (0..k); False = always k.
        tokenizer: for ``text`` when ``lm`` is a bare model.

    Returns:
        GenerationResult.

    Raises:
        ValueError: empty prompt, max_new_tokens < 1, k < 0, or invalid sampling parameters.
    """
    from transformers import DynamicCache

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
    params = SamplingParams(float(temperature), int(top_k), float(top_p))
    greedy = params.greedy
    if generator is None:
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(int(seed))
        else:
            generator.seed()
    eos = {int(e) for e in (eos_token_ids if eos_token_ids is not None else eos_token_ids_of(model, tok))}
    verifier = verifier or StrictVerifier()
    device = next(model.parameters()).device

    if drafter is not None and hasattr(drafter, "reset"):
        drafter.reset()
    pass_kwargs = drafter is not None and _accepts_kwargs(drafter.propose)
    ctrl = AdaptiveK(k, draft_cost_prior=float(getattr(drafter, "cost_per_token", 0.35)))
    # model drafters: start with one plain step to measure the cost of a target step
    force_plain = drafter is not None and float(getattr(drafter, "cost_per_token", 0.35)) > 0 and adaptive_k

    out: list[int] = []
    rounds: list[int] = []
    k_hist: list[int] = []
    accept_counts = [0] * (k + 1)
    lp_rows: list[torch.Tensor] = []
    n_drafted = n_acc_total = 0
    finish = "length"
    stop_id = None

    def process(logits: torch.Tensor) -> torch.Tensor:  # [n, V] -> [n, V] float32 on CPU
        x = logits.float()
        probs = torch.softmax(x, dim=-1) if greedy else logits_to_probs(x, params.temperature, params.top_k, params.top_p)
        return probs.cpu()

    def emit(new: list[int], logits_rows: torch.Tensor) -> bool:
        """Append tokens; return True when generation is finished."""
        nonlocal finish, stop_id
        shown: list[int] = []
        done = False
        used = 0
        for j, t in enumerate(new):
            used += 1
            if t in eos:
                finish, stop_id, done = "stop", t, True
                break
            out.append(t)
            shown.append(t)
            if return_logprobs:
                lp_rows.append(torch.log_softmax(logits_rows[j].float(), dim=-1).cpu())
            if len(out) >= max_new_tokens:
                finish, done = "length", True
                break
        rounds.append(used)  # tokens this forward produced that count (up to EOS / max_new_tokens)
        if on_round is not None and shown:
            on_round(shown)
        return done

    t_start = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        if len(prompt) > 1:  # prefill all but the last prompt token; every round feeds [pending] + drafts
            x = torch.tensor([prompt[:-1]], dtype=torch.long, device=device)
            model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
        pending = prompt[-1]
        done = False
        while not done:
            remaining = max_new_tokens - len(out)
            limit = min(k, remaining - 1)
            drafts = torch.zeros(0, dtype=torch.long)
            q = None
            if drafter is not None and limit > 0 and not force_plain:
                k_plan = ctrl.plan(limit) if adaptive_k else limit
                if k_plan > 0:
                    ctx = prompt + out  # ends with the pending token
                    t0 = time.perf_counter()
                    if pass_kwargs:
                        drafts, q = drafter.propose(ctx, k_plan, sampling=params, generator=generator)
                    else:
                        drafts, q = drafter.propose(ctx, k_plan)
                    drafts = torch.as_tensor(drafts, dtype=torch.long).reshape(-1).cpu()[:k_plan]
                    if drafts.numel() and getattr(drafter, "cost_per_token", None) != 0.0:
                        _sync(device)
                        ctrl.observe_draft(int(drafts.numel()), time.perf_counter() - t0)
                    if adaptive_k and drafts.numel():
                        keep = ctrl.truncate(int(drafts.numel()))
                        drafts = drafts[:keep]
                    if q is not None:
                        q = q[: drafts.numel()].float().cpu()
                        if drafts.numel() == 0:
                            q = None
            force_plain = False
            nd = int(drafts.numel())
            feed = torch.cat([torch.tensor([pending], dtype=torch.long), drafts]).unsqueeze(0).to(device)
            t0 = time.perf_counter()
            logits = model(input_ids=feed, cache=cache, use_cache=True).logits[0]  # [nd+1, V]
            p = process(logits)
            _sync(device)
            ctrl.observe_forward(nd + 1, time.perf_counter() - t0)
            res = verifier.verify(p, q, drafts, generator, greedy)
            n_acc = int(res.n_accepted)
            if not 0 <= n_acc <= nd:
                raise RuntimeError(f"verifier returned n_accepted={n_acc} outside 0..{nd}")
            if nd > n_acc:
                cache.crop(-(nd - n_acc))
            ctrl.observe_accept(n_acc, nd)
            if drafter is not None and hasattr(drafter, "update"):
                drafter.update(prompt + out, n_acc, nd)
            n_drafted += nd
            n_acc_total += n_acc
            accept_counts[n_acc] += 1
            k_hist.append(nd)
            pending = int(res.next_token)
            new = drafts[:n_acc].tolist() + [pending]
            done = emit(new, logits)
    elapsed = time.perf_counter() - t_start
    text = tok.decode(out, skip_special_tokens=True) if tok is not None else None
    return GenerationResult(
        token_ids=out,
        text=text,
        rounds=rounds,
        accept_counts=accept_counts,
        mean_accepted_length=(sum(rounds) / len(rounds)) if rounds else 0.0,
        elapsed_s=elapsed,
        tokens_per_s=len(out) / elapsed if elapsed > 0 else float("inf"),
        finish_reason=finish,
        logprobs=torch.stack(lp_rows) if (return_logprobs and lp_rows) else (
            torch.zeros(0, model.config.vocab_size) if return_logprobs else None
        ),
        n_drafted=n_drafted,
        n_accepted=n_acc_total,
        acceptance_rate=(n_acc_total / n_drafted) if n_drafted else float("nan"),
        stop_token_id=stop_id,
        k_history=k_hist,
    )


def autoregressive_generate(
    lm: LoadedModel | Any,
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
    tokenizer: Any = None,
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
