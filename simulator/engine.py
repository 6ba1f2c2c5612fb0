"""The simulator's serving engine: generates with a profile's served model through the speculative loop.

``SimulatorEngine`` serves one :class:`~simulator.profiles.Profile`:

- the *served* model of the profile (:func:`simulator.served_model.build_served_model`: the
  reference model as is, cast, noised, quantized, pruned or mixed, behind a logit tap);
- the verification rule (``simulator.verifiers.make_verifier``) plugged into the
  reference loop ``reference.speculative.speculative_generate``, with the profile's drafter;
- request-level parameter rewrites (truncated-sampling: the engine's own top-p).

Logprobs are taken from the very logits the loop used for each emitted token (a tap on the
served model's forward), so they are always the served target's raw log-softmax (vLLM's default
``raw_logprobs``), whatever the verification rule; tokens emitted by one target forward (one
speculative round) are delivered together, which is what an SSE chunk carries. Reasoning mode
(a budgeted reasoning span, then the answer) is built on :meth:`SimulatorEngine.generate` and
:meth:`SimulatorEngine.generate_batch` in ``simulator.reasoning``.

Requests are serialized by a lock (two CPU cores; the reference loop is single-sequence).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from simulator.profiles import Profile
from simulator.served_model import build_served_model

MAX_TOP_LOGPROBS = 20


class StopGeneration(Exception):
    """Raised inside the loop's ``on_round`` callback to end generation early (stop string/cancel)."""


# ---------------------------------------------------------------------------------------------
# token bytes (byte-level BPE)
# ---------------------------------------------------------------------------------------------


def build_vocab_bytes(tokenizer: Any) -> list[bytes]:
    """Exact bytes of every token id ``[V]`` (index = token id).

    Byte-level BPE token strings (``Ġ`` = space, ...) are mapped through the inverse of GPT-2's
    byte-to-unicode table (Radford et al. 2019), taken from transformers itself
    (``transformers.convert_slow_tokenizer.bytes_to_unicode``, the table its byte-level tokenizers
    are built with), not from ``probes/``: L2, and the simulator stays an independent check of the
    auditor's byte recovery (``probes.byte_recovery``). SentencePiece ones (Gemma, Llama 2: ``▁`` =
    space, byte fallback ``<0xNN>``) are their UTF-8 text with ``▁`` -> space and ``<0xNN>`` -> byte NN (the GPT-2 map
    would turn ``é`` into byte 0xE9); added/special tokens (``<|im_end|>``) are their UTF-8 text.
    Tokens whose string is not byte-level (another tokenizer family) fall back to ``decode([id])``.
    Agrees with the auditor's ``probes.align.ByteVocab``.
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    dec = {c: b for b, c in bytes_to_unicode().items()}
    n = len(tokenizer)
    toks = tokenizer.convert_ids_to_tokens(list(range(n)))
    probe = tokenizer.convert_ids_to_tokens(tokenizer.encode(" a\n", add_special_tokens=False))
    spm = any(p is not None and ("\u2581" in p or p == "<0x0A>") for p in probe)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    out: list[bytes] = []
    for i, s in enumerate(toks):
        if s is None:
            out.append(b"")
            continue
        if i in special or i in added:
            out.append(s.encode("utf-8"))
            continue
        if spm:
            is_byte = len(s) == 6 and s.startswith("<0x") and s.endswith(">") and all(c in "0123456789abcdefABCDEF" for c in s[3:5])
            hexbyte = s[3:5] if is_byte else None
            out.append(bytes([int(hexbyte, 16)]) if hexbyte else s.replace("\u2581", " ").encode("utf-8"))
            continue
        try:
            out.append(bytes(dec[c] for c in s))
        except KeyError:
            out.append(tokenizer.decode([i]).encode("utf-8"))
    return out


def token_display(b: bytes) -> str:
    """OpenAI-style token string: the UTF-8 text, or ``\\xNN`` escapes for bytes of a partial character."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(x) if x < 0x80 else f"\\x{x:02x}" for x in b)


# ---------------------------------------------------------------------------------------------
# engine
# ---------------------------------------------------------------------------------------------


@dataclass
class TokenInfo:
    """One emitted (or prompt) token with the served model's raw logprobs.

    Attributes:
        token_id: the token id.
        logprob: log p(token | prefix) in nats (None for the first prompt token: no prefix).
        top_ids: up to ``top_n`` most likely ids at this position, descending.
        top_logprobs: their logprobs (nats).
    """

    token_id: int
    logprob: float | None = None
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    span: str = "answer"
    """Reasoning mode (``simulator.reasoning.generate_reasoning``): ``reasoning`` (generated inside
    the span), ``close`` (the close tag the token budget forced) or ``answer``."""


@dataclass
class ChoiceResult:
    """One generated choice.

    Attributes:
        tokens: emitted tokens (EOS and stop-sequence tokens excluded), with logprobs when asked.
        text: their text (UTF-8 of the token bytes; special tokens skipped, as vLLM does).
        finish_reason: ``stop`` (EOS or stop string) or ``length``.
        chunks: tokens delivered per chunk (one speculative round each, stop hold-back aside).
        elapsed_s: wall time (s).
        effective: the sampling parameters actually applied (operator view).
    """

    tokens: list[TokenInfo]
    text: str
    finish_reason: str
    chunks: list[int]
    elapsed_s: float
    effective: dict
    reasoning_text: str | None = None
    """Reasoning mode: the text generated inside the reasoning span (``text`` is then the answer's)."""


def _stop_hold(buf: bytes, stops: list[bytes]) -> int:
    """Bytes at the end of ``buf`` that could be the start of a stop sequence (to hold back)."""
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(buf)), 0, -1):
            if buf.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


class SimulatorEngine:
    """Serve one profile of the reference model (thread-safe; one generation at a time).

    Args:
        profile: the serving recipe.
        lm: a loaded reference ``LoadedModel`` (tests pass ``tiny_lm``); None loads ``model``.
        model: model name/path for ``reference.models.load_model`` when ``lm`` is None.
        drafter: drafter spec (``ngram[:MIN:MAX]``, ``suffix[:MIN:MAX]``, ``self:L``, ``none``); None = the profile's default.
        k: maximum drafts per round.
        seed: seeds the server's RNG (per-request seeds when the request gives none; reproducible
            sequences of requests). None = nondeterministic.
        copy_model: passed to :func:`build_served_model` (False when the engine owns ``lm``).
        adaptive_k: let the loop choose 0..k drafts per round from acceptance counts (``DraftLengthPolicy``).

    Raises:
        ValueError: bad drafter spec, or a profile that cannot be applied to the model.
    """

    def __init__(
        self,
        profile: Profile,
        lm: Any = None,
        *,
        model: str | None = None,
        drafter: str | None = None,
        k: int = 4,
        seed: int | None = 0,
        copy_model: bool | None = None,
        adaptive_k: bool = True,
    ):
        from reference.drafter_specs import make_drafter
        from reference.models import DEFAULT_MODEL, load_model
        from simulator.quantize import quant_cache_dir

        self.profile = profile
        owned = lm is None
        if lm is None:
            lm = load_model(model or DEFAULT_MODEL)
        self.reference_name = lm.name
        self.served, self.build_info = build_served_model(
            profile, lm, copy_model=(not owned) if copy_model is None else copy_model,
            quant_cache_dir=quant_cache_dir() if owned else None,  # the engine loaded the model itself: serve
        )
        self.tokenizer = lm.tokenizer
        self.eos_ids = list(lm.eos_token_ids)
        self.vocab_bytes = build_vocab_bytes(self.tokenizer)
        self.special_ids = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        self.vocab_size = int(self.served.model.config.vocab_size)
        self.max_context = int(getattr(self.served.model.config, "max_position_embeddings", 2048) or 2048)
        self.drafter_spec = drafter if drafter is not None else profile.default_drafter
        # the self-drafter runs the served (inner) model's first layers directly, bypassing the tap
        self.drafter = make_drafter(self.drafter_spec, self.served.model.inner)
        if k < 0:
            raise ValueError(f"k={k} must be >= 0")
        self.k = int(k)
        self.adaptive_k = adaptive_k
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()  # separate from the generation lock: never blocks the event loop
        self._lock = threading.Lock()
        self.n_requests = 0

    # -- tokens ------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """Exact bytes of a token id."""
        return self.vocab_bytes[token_id] if 0 <= token_id < len(self.vocab_bytes) else b""

    def token_str(self, token_id: int) -> str:
        """OpenAI-style string of a token (``\\xNN`` escapes for partial UTF-8)."""
        return token_display(self.token_bytes(token_id))

    def text_of(self, token_ids: Sequence[int]) -> str:
        """Text of generated tokens: their bytes as UTF-8 (special tokens skipped, invalid -> U+FFFD)."""
        return b"".join(self.token_bytes(t) for t in token_ids if t not in self.special_ids).decode(
            "utf-8", errors="replace"
        )

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Prompt ids for chat messages (chat template + generation prompt; ``reference.scoring.encode_prompt``)."""
        from reference.scoring import encode_prompt

        inject = self.profile.inject_system_prompt
        if inject:
            msgs = [dict(m) for m in messages]
            if msgs and msgs[0].get("role") == "system":
                msgs[0]["content"] = f"{inject}\n{msgs[0].get('content') or ''}"
            else:
                msgs.insert(0, {"role": "system", "content": inject})
            messages = msgs
        return encode_prompt(self.tokenizer, messages, chat=True)

    def encode_text(self, prompt: str) -> list[int]:
        """Prompt ids for a completions prompt (plain tokenization)."""
        from reference.scoring import encode_prompt

        return encode_prompt(self.tokenizer, prompt, chat=False)

    def next_seed(self) -> int:
        """A fresh 63-bit seed from the server RNG (thread-safe; does not wait for a running generation)."""
        with self._rng_lock:
            return self._rng.getrandbits(63)

    @staticmethod
    def choice_seed(seed: int, index: int) -> int:
        """Seed of choice ``index`` of a request with ``seed`` (distinct choices, reproducible)."""
        h = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") & ((1 << 63) - 1)

    def effective_sampling(self, temperature: float, top_p: float, top_k: int) -> dict:
        """The sampling parameters the engine applies (truncated-sampling rewrites them silently)."""
        t, p, k = float(temperature), float(top_p), int(top_k or 0)
        if t > 0:
            if self.profile.forced_top_p is not None:
                p = min(p, self.profile.forced_top_p)
            if self.profile.forced_top_k is not None and k <= 0:
                k = self.profile.forced_top_k
        return {"temperature": t, "top_p": p, "top_k": k}

    def _info(self, token_id: int, row: torch.Tensor | None, top_n: int | None) -> TokenInfo:
        if row is None or top_n is None:
            return TokenInfo(token_id)
        lp = torch.log_softmax(row.float(), dim=-1)
        info = TokenInfo(token_id, float(lp[token_id]))
        if top_n > 0:
            tv, ti = torch.topk(lp, min(top_n, lp.shape[-1]))
            info.top_ids = [int(x) for x in ti.tolist()]
            info.top_logprobs = [float(x) for x in tv.tolist()]
        return info

    # -- generation --------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        top_n: int | None = None,
        on_chunk: Callable[[list[TokenInfo]], None] | None = None,
        cancel: threading.Event | None = None,
        span: str | None = None,
    ) -> ChoiceResult:
        """Generate one choice with the profile's model, drafter and verifier.

        Args:
            prompt_ids: prompt token ids (non-empty).
            max_tokens: >= 1 tokens at most.
            temperature, top_p, top_k: requested sampling (temperature 0 = greedy).
            seed: choice seed (reproducible); None draws one from the server RNG.
            stop: stop strings (excluded from the output; generation ends at the first match).
            top_n: None = no logprobs; else the number of top alternatives per token (0..20).
            on_chunk: called with each chunk of released tokens (one speculative round, minus
                bytes held back while they might start a stop string).
            cancel: set it to abort (e.g. client disconnected); the result so far is returned.
            span: ``reasoning`` while generating a reasoning span (``simulator.reasoning.generate_reasoning``):
                span-restricted verifiers (``relaxed-think``) relax only there.

        Returns:
            ChoiceResult.

        Raises:
            ValueError: invalid arguments (from the reference loop).
        """
        from reference.speculative import speculative_generate
        from simulator.verifiers import make_verifier

        if seed is None or self.profile.ignore_seed:  # ignore_seed: compliance fault (issue 13)
            seed = self.next_seed()
        eff = self.effective_sampling(temperature, top_p, top_k)
        stops = [s.encode("utf-8") for s in stop if s]
        collected: list[TokenInfo] = []
        released = 0
        chunks: list[int] = []
        buf = bytearray()  # bytes of all collected tokens (for stop search)
        ends: list[int] = []  # cumulative byte end of each collected token
        state = {"stopped": False}
        served = self.served.model
        need_rows = top_n is not None

        def release(upto: int) -> None:
            nonlocal released
            if upto > released:
                part = collected[released:upto]
                released = upto
                chunks.append(len(part))
                if on_chunk is not None:
                    on_chunk(part)

        def on_round(ids: list[int]) -> None:
            rows = served.last_logits
            for j, t in enumerate(ids):
                row = rows[j] if (need_rows and rows is not None and j < rows.shape[0]) else None
                collected.append(self._info(int(t), row, top_n))
                if t not in self.special_ids:
                    buf.extend(self.token_bytes(int(t)))
                ends.append(len(buf))
            if stops:
                first = min((i for i in (buf.find(s) for s in stops) if i >= 0), default=-1)
                if first >= 0:
                    n_keep = sum(1 for e in ends if e <= first)
                    del collected[n_keep:]
                    del ends[n_keep:]
                    state["stopped"] = True
                    release(n_keep)
                    raise StopGeneration
                hold = _stop_hold(bytes(buf), stops)
                limit = len(buf) - hold
                release(sum(1 for e in ends if e <= limit))
            else:
                release(len(collected))
            if cancel is not None and cancel.is_set():
                raise StopGeneration

        t0 = time.perf_counter()
        finish = "length"
        with self._lock:
            self.n_requests += 1
            served.nonce = seed
            gen = torch.Generator().manual_seed(int(seed))
            try:
                res = speculative_generate(
                    self.served,
                    list(prompt_ids),
                    drafter=self.drafter,
                    k=self.k,
                    max_new_tokens=int(max_tokens),
                    temperature=eff["temperature"],
                    top_k=eff["top_k"],
                    top_p=eff["top_p"],
                    generator=gen,
                    eos_token_ids=self.eos_ids,
                    verifier=make_verifier(self.profile, request_seed=seed, span=span),
                    return_logprobs=False,
                    on_round=on_round,
                    adaptive_k=self.adaptive_k,
                )
                finish = res.finish_reason
            except StopGeneration:
                finish = "stop"
        release(len(collected))
        toks = [c.token_id for c in collected]
        return ChoiceResult(
            tokens=collected,
            text=self.text_of(toks),
            finish_reason=finish,
            chunks=chunks,
            elapsed_s=time.perf_counter() - t0,
            effective=eff,
        )


    def batch_unsupported(self) -> str | None:
        """None when :meth:`generate_batch` can serve this engine's requests, else why not (a model that depends
        on the request — kernel noise or a mixture's routing, both keyed by the request seed —, a quantized KV
        cache, or what ``reference.speculative_batch.batchable`` rejects)."""
        from reference.speculative_batch import batchable

        if self.profile.mix_with is not None:
            return "a mixture routes each request (its seed) to its own model"
        if getattr(self.served.model, "sigma", 0.0) > 0:
            return "kernel noise is keyed by request (nonce)"
        if self.profile.kv_cache_dtype or self.profile.act_quant:
            return "a quantized KV cache / activations wrap the model's forward"
        return batchable(self.served, self.drafter)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: Sequence[int],
        temperature: float,
        seeds: Sequence[int],
        top_n: int | None = None,
        span: str | None = None,
    ) -> list[ChoiceResult]:
        """:meth:`generate` for many requests at once, in lock step (``reference.speculative_batch``): the same
        drafter, verifier, seeds and sampling per request, one target forward per round for all of them.
        Requests have no stop strings; ``top_p`` = 1 and ``top_k`` = 0 are requested (the profile's
        ``effective_sampling`` still applies). For offline collection (the calibration's pools).

        Args:
            prompts: [B] prompt id lists (>= 2 tokens each).
            max_tokens: [B] token caps.
            temperature: shared by the requests.
            seeds: [B] choice seeds.
            top_n: None = no logprobs; else top alternatives per token.
            span: as :meth:`generate` (``reasoning`` inside a reasoning span: span-restricted verifiers relax there).

        Returns:
            [B] ChoiceResult (``elapsed_s``: the batch's).

        Raises:
            ValueError: :meth:`batch_unsupported` gives a reason, or invalid arguments.
        """
        from reference.speculative_batch import speculative_generate_batch
        from simulator.verifiers import make_verifier

        why = self.batch_unsupported()
        if why is not None:
            raise ValueError(f"{self.profile.name}: cannot batch ({why}); use generate()")
        seeds = [self.next_seed() if self.profile.ignore_seed else int(s) for s in seeds]
        eff = self.effective_sampling(temperature, 1.0, 0)
        collected: list[list[TokenInfo]] = [[] for _ in prompts]
        chunks: list[list[int]] = [[] for _ in prompts]

        def on_round(b: int, ids: list[int], rows: torch.Tensor) -> None:
            for j, t in enumerate(ids):
                collected[b].append(self._info(int(t), rows[j] if top_n is not None else None, top_n))
            chunks[b].append(len(ids))

        t0 = time.perf_counter()
        with self._lock:
            self.n_requests += len(prompts)
            res = speculative_generate_batch(
                self.served, prompts, drafter=self.drafter, k=self.k, max_new_tokens=[int(m) for m in max_tokens],
                temperature=eff["temperature"], top_k=eff["top_k"], top_p=eff["top_p"],
                generators=[torch.Generator().manual_seed(s) for s in seeds],
                verifiers=[make_verifier(self.profile, request_seed=s, span=span) for s in seeds],
                eos_token_ids=self.eos_ids, adaptive_k=self.adaptive_k, on_round=on_round,
            )
        dt = time.perf_counter() - t0
        return [
            ChoiceResult(tokens=c, text=self.text_of([t.token_id for t in c]), finish_reason=r.finish_reason,
                         chunks=ch, elapsed_s=dt, effective=eff)
            for c, ch, r in zip(collected, chunks, res, strict=True)
        ]


    def score_prompt(self, prompt_ids: Sequence[int], top_n: int, nonce: int = 0) -> list[TokenInfo]:
        """Teacher-forced logprobs of the prompt itself under the served model (``echo``).

        Returns one TokenInfo per prompt token; the first has ``logprob=None`` (no prefix).
        """
        ids = [int(t) for t in prompt_ids]
        out = [TokenInfo(ids[0])]
        if len(ids) < 2:
            return out
        with self._lock, torch.inference_mode():
            self.served.model.nonce = nonce
            logits = self.served.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1]
            for j, t in enumerate(ids[1:]):
                out.append(self._info(t, logits[j], top_n))
        return out

    def describe(self) -> dict:
        """Operator view: profile, model, revision, build facts, drafter, fingerprint."""
        return {
            "profile": self.profile.describe(),
            "reference_model": self.reference_name,
            "revision": self.build_info.revision,
            "build": dict(self.build_info.__dict__),
            "drafter": self.drafter_spec,
            "k": self.k,
            "system_fingerprint": self.fingerprint(),
        }

    def fingerprint(self) -> str:
        """A stable id of (profile recipe, model revision, drafter): ``fp_`` + 12 hex."""
        src = f"{sorted(self.profile.describe().items())}|{self.build_info.revision}|{self.drafter_spec}|{self.k}"
        return "fp_" + hashlib.sha256(src.encode()).hexdigest()[:12]



__all__ = [
    "ChoiceResult",
    "SimulatorEngine",
    "TokenInfo",
    "build_vocab_bytes",
    "token_display",
]
