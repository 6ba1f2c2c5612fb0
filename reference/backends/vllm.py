"""``vllm`` reference backend: a trusted vLLM server run by the auditor's owner.

The auditor never starts the engine: the owner runs ``vllm serve <original weights>`` (one GPU,
``--tensor-parallel-size``, or multi-node with Ray, see docs/scale.md) and points a
``[references.NAME]`` table at it (``kind = "vllm"``, ``base_url``, ``model``, ``api_key_env``).

Wire format followed (vLLM's OpenAI-compatible ``POST /v1/completions`` extensions, read from
vLLM's own protocol code, ``vllm/entrypoints/openai/completion/protocol.py`` at commit
``002032ee2b18e1f7bd924ec47b62504ba3866063`` (2026); the same fields live in
``vllm/entrypoints/openai/protocol.py`` of the v0.10/v0.11 releases):

- ``prompt`` as a list of token ids (or a list of such lists, one choice per prompt, ``index`` =
  prompt position). Token-id prompts are used verbatim: no BOS is added (``add_special_tokens``
  only affects text prompts), so the ids we send are exactly the ids scored.
- **Teacher forcing**: ``prompt = prompt_ids + continuation_ids``, ``prompt_logprobs = k``,
  ``max_tokens = 1``. ``choices[i].prompt_logprobs`` is ``list[dict[token_id, Logprob] | None]``
  with one entry per prompt position (the first is ``null``); each dict holds the top-k ids
  (``rank`` 1..k) plus the actual prompt token (with its own ``rank``, possibly > k); a
  ``Logprob`` serializes as ``{"logprob": float, "rank": int, "decoded_token": str}``; ``-inf`` is
  sent as ``-9999.0`` (``clamp_prompt_logprobs``). Values are raw log-softmax (nats) under the
  server's default ``--logprobs-mode raw_logprobs``; ``k`` is capped by the server's
  ``--max-logprobs`` (default 20).
- **Greedy**: ``temperature = 0``, ``max_tokens = n``, ``return_token_ids = true`` (the choice's
  ``token_ids``), with ``logprobs = 0`` and ``return_tokens_as_token_ids = true`` as a fallback
  for servers without ``return_token_ids`` (tokens arrive as ``"token_id:<id>"``).

HTTP through httpx with tenacity retries on connection errors, 429 and 5xx; every malformed reply
raises :class:`reference.backends.base.ReferenceError` naming the endpoint and the field.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import tenacity

from reference.backends.base import ReferenceBackend, ReferenceError
from reference.scoring import ScoredContinuation, check_score_args

#: vLLM's default ``--max-logprobs``: the largest ``prompt_logprobs`` a stock server accepts.
VLLM_DEFAULT_MAX_LOGPROBS = 20


class _Retryable(Exception):
    pass


class VLLMBackend(ReferenceBackend):
    """Teacher forcing and greedy decoding through a trusted vLLM server.

    Args:
        base_url: API root up to ``/v1`` (e.g. ``http://gpu-box:8000/v1``).
        model: the served model name (``--served-model-name`` or the weights path).
        tokenizer: the reference tokenizer (transformers), used by the audit to align the
            provider's tokens; must be the served model's tokenizer.
        api_key: bearer token (read by the caller from the env var named by ``api_key_env``).
        timeout_s: per-request deadline. max_prompts: prompts per request.
        token_budget: prompt tokens per request. concurrency: requests in flight.
        retries: attempts on connection errors / 429 / 5xx.
        client: an ``httpx.Client`` to use (tests); created when None.
        revision: pins the reference in cache keys (default ``vllm:<model>@<base_url>``).
    """

    kind = "vllm"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: Any = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_prompts: int = 32,
        token_budget: int = 16384,
        concurrency: int = 4,
        retries: int = 3,
        client: httpx.Client | None = None,
        revision: str | None = None,
    ):
        if not str(base_url).startswith(("http://", "https://")):
            raise ReferenceError(f"base_url={base_url!r} must start with http:// or https:// (e.g. http://host:8000/v1)")
        self.base_url = str(base_url).rstrip("/")
        self.name = model
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = "server"
        self.revision = revision or f"vllm:{model}@{self.base_url}"
        self.max_prompts = max(1, int(max_prompts))
        self.token_budget = max(1, int(token_budget))
        self.concurrency = max(1, int(concurrency))
        self.retries = max(1, int(retries))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._own_client = client is None
        self.client = client or httpx.Client(timeout=timeout_s, headers=headers)

    # ------------------------------------------------------------------ HTTP
    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/completions"

        def once() -> dict[str, Any]:
            try:
                r = self.client.post(url, json=body)
            except httpx.HTTPError as exc:
                raise _Retryable(f"{url} does not answer ({type(exc).__name__}: {exc})") from exc
            if r.status_code == 429 or r.status_code >= 500:
                raise _Retryable(f"{url} answered HTTP {r.status_code}: {r.text[:300]}")
            if r.status_code != 200:
                raise ReferenceError(f"{url} refused the request (HTTP {r.status_code}): {r.text[:500]}. "
                                     "Fix: check model name, --max-logprobs and that the server is vLLM.")
            try:
                data = r.json()
            except ValueError:
                raise ReferenceError(f"{url} answered a body that is not JSON: {r.text[:200]!r}") from None
            if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
                raise ReferenceError(f"{url} answered without a 'choices' list: {str(data)[:200]}")
            return data

        try:
            for attempt in tenacity.Retrying(
                stop=tenacity.stop_after_attempt(self.retries),
                wait=tenacity.wait_exponential(multiplier=0.2, max=5.0),
                retry=tenacity.retry_if_exception_type(_Retryable),
                reraise=True,
            ):
                with attempt:
                    return once()
        except _Retryable as exc:
            raise ReferenceError(f"the vLLM reference server {exc}. Fix: start it (vllm serve ...) or fix base_url.") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def check(self) -> None:
        """Verify the endpoint answers and supports ``prompt_logprobs`` (one tiny request).

        Raises:
            ReferenceError: no answer, or a reply without ``prompt_logprobs``.
        """
        ids = self._probe_ids()
        data = self._post({"model": self.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 1,
                           "temperature": 1.0})
        ch = data["choices"][0] if data["choices"] else {}
        if not isinstance(ch, dict) or not isinstance(ch.get("prompt_logprobs"), list):
            raise ReferenceError(
                f"{self.base_url}/completions answered without 'prompt_logprobs': it is not a vLLM server "
                "(or too old). Fix: point the reference at vLLM's OpenAI server (vllm serve MODEL)."
            )

    def _probe_ids(self) -> list[int]:
        tok: Any = self.tokenizer  # a transformers tokenizer (untyped library)
        if tok is not None:
            ids = list(tok("Hello world")["input_ids"])
            if len(ids) >= 2:
                return ids
        return [1, 2]

    # ------------------------------------------------------------------ scoring
    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, top_k: int = 20
    ) -> list[ScoredContinuation]:
        """Teacher-forced scores from ``prompt_logprobs`` (see :meth:`ReferenceBackend.score`).

        Several prompts go in one request (``prompt`` = list of id lists), bounded by
        ``max_prompts`` and ``token_budget``; ``concurrency`` requests run at once.
        """
        items = check_score_args(prompts, continuations, top_k, None)
        out: list[ScoredContinuation | None] = [None] * len(items)
        todo = []
        for i, (_, co) in enumerate(items):
            if co:
                todo.append(i)
            else:
                out[i] = ScoredContinuation([], np.zeros(0), np.zeros((0, top_k), np.int64), np.zeros((0, top_k)),
                                            None, np.zeros(0))
        groups: list[list[int]] = []
        cur: list[int] = []
        used = 0
        for i in todo:
            n = len(items[i][0]) + len(items[i][1])
            if cur and (len(cur) >= self.max_prompts or used + n > self.token_budget):
                groups.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += n
        if cur:
            groups.append(cur)

        def run(group: list[int]) -> list[tuple[int, ScoredContinuation]]:
            body = {"model": self.model, "prompt": [items[i][0] + items[i][1] for i in group], "max_tokens": 1,
                    "prompt_logprobs": int(top_k), "temperature": 1.0}
            data = self._post(body)
            choices = data["choices"]
            by_index = {c.get("index"): c for c in choices if isinstance(c, dict)}
            res = []
            for j, i in enumerate(group):
                ch = by_index.get(j)
                if ch is None:
                    raise ReferenceError(f"{self.base_url}/completions: no choice with index {j} for prompt {j} of the batch")
                res.append((i, self._parse_prompt_logprobs(ch, items[i][0], items[i][1], top_k)))
            return res

        if len(groups) <= 1 or self.concurrency == 1:
            results = [run(g) for g in groups]
        else:
            with ThreadPoolExecutor(self.concurrency) as ex:
                results = list(ex.map(run, groups))
        for res in results:
            for i, sc in res:
                out[i] = sc
        return out  # type: ignore[return-value]

    def _parse_prompt_logprobs(self, ch: dict[str, Any], pr: list[int], co: list[int], top_k: int) -> ScoredContinuation:
        where = f"{self.base_url}/completions choices[{ch.get('index')}].prompt_logprobs"
        plp = ch.get("prompt_logprobs")
        n = len(pr) + len(co)
        if not isinstance(plp, list):
            raise ReferenceError(f"{where} is missing: the server does not support prompt_logprobs (not vLLM?)")
        if len(plp) != n:
            raise ReferenceError(f"{where} has {len(plp)} entries for a prompt of {n} tokens")
        T = len(co)
        chosen = np.empty(T)
        top_ids = np.zeros((T, top_k), np.int64)
        top_lp = np.full((T, top_k), -np.inf)
        for t in range(T):
            entry = plp[len(pr) + t]
            if not isinstance(entry, dict):
                raise ReferenceError(f"{where}[{len(pr) + t}] is not an object: {entry!r}")
            rows = []
            for key, val in entry.items():
                try:
                    tid = int(key)
                    lp = float(val["logprob"]) if isinstance(val, dict) else float(val)
                    rank = val.get("rank") if isinstance(val, dict) else None
                except (TypeError, ValueError, KeyError):
                    raise ReferenceError(f"{where}[{len(pr) + t}]: malformed entry {key!r}: {val!r}") from None
                if lp <= -9999.0 or math.isnan(lp):
                    lp = -math.inf
                rows.append((tid, lp, rank if isinstance(rank, int) else None))
            own = [r for r in rows if r[0] == co[t]]
            if not own:
                raise ReferenceError(f"{where}[{len(pr) + t}] lacks the prompt token {co[t]} itself")
            chosen[t] = own[0][1]
            ranked = sorted(rows, key=lambda r: (r[2] if r[2] is not None else 10**9, -r[1]))
            tops = [r for r in ranked if r[2] is None or r[2] <= top_k][:top_k]
            if len(tops) < top_k:
                raise ReferenceError(f"{where}[{len(pr) + t}] has {len(tops)} ranked alternatives, expected {top_k}")
            top_ids[t] = [r[0] for r in tops]
            top_lp[t] = [r[1] for r in tops]
        tail = np.clip(1.0 - np.exp(top_lp).sum(axis=1), 0.0, None) if top_k else np.ones(T)
        return ScoredContinuation(list(co), chosen, top_ids, top_lp, None, tail)

    # ------------------------------------------------------------------ greedy
    def greedy(self, prompt: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True) -> list[int]:
        """Greedy continuation by ``temperature = 0`` on a token-id prompt (see module docstring)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        ((pr, _),) = check_score_args([prompt], [[]], 0, None)
        body = {"model": self.model, "prompt": pr, "max_tokens": int(max_new_tokens), "temperature": 0.0,
                "return_token_ids": True, "logprobs": 0, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False, "ignore_eos": not stop_at_eos}
        data = self._post(body)
        if not data["choices"] or not isinstance(data["choices"][0], dict):
            raise ReferenceError(f"{self.base_url}/completions answered an empty 'choices' list")
        ch = data["choices"][0]
        ids = ch.get("token_ids")
        if isinstance(ids, list) and all(isinstance(x, int) for x in ids):
            return list(ids)
        toks = ((ch.get("logprobs") or {}).get("tokens")) if isinstance(ch.get("logprobs"), dict) else None
        if isinstance(toks, list) and all(isinstance(s, str) and s.startswith("token_id:") for s in toks):
            return [int(s.split(":", 1)[1]) for s in toks]
        raise ReferenceError(f"{self.base_url}/completions returned neither 'token_ids' nor 'token_id:N' tokens; "
                             "use a vLLM version with return_token_ids or return_tokens_as_token_ids")

    def close(self) -> None:
        """Close the HTTP client when this backend created it."""
        if self._own_client:
            self.client.close()


def api_key_from_env(name: str | None) -> str | None:
    """The API key in env var ``name`` (None when ``name`` is None).

    Raises:
        ReferenceError: the variable is named but unset or empty (message names it).
    """
    if not name:
        return None
    v = os.environ.get(name)
    if not v:
        raise ReferenceError(f"api_key_env={name!r} names an environment variable that is unset or empty. "
                             f"Fix: export {name}=... before running the audit.")
    return v
