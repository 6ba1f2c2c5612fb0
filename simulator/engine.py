"""The simulator's serving engine: builds the served model for a profile and generates with it.

``SimulatorEngine`` turns a :class:`~simulator.profiles.Profile` into:

- the *served* model (the one whose distribution p the provider samples from and whose logprobs
  it reports): the reference model as is (honest-fp32), cast to bfloat16 (honest-bf16), wrapped
  with kernel/batch-order logit noise (honest-noisy), weight-only quantized (int8/int4/fp8,
  ``simulator.quantize``), or pruned to fewer layers (substituted);
- the verification rule (``simulator.verifiers.make_verifier``) plugged into the
  reference loop ``reference.speculative.speculative_generate``, with the profile's drafter;
- request-level parameter rewrites (truncated-sampling: the engine's own top-p).

Logprobs are taken from the very logits the loop used for each emitted token (a tap on the
served model's forward), so they are always the served target's raw log-softmax (vLLM's default
``raw_logprobs``), whatever the verification rule; tokens emitted by one target forward (one
speculative round) are delivered together, which is what an SSE chunk carries.

Requests are serialized by a lock (two CPU cores; the reference loop is single-sequence).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from simulator.profiles import Profile, get_profile, mix_selects, recorded_of, resolve_substitute_layers

MAX_TOP_LOGPROBS = 20


#: Reasoning mode: the opener the simulator's template puts after the generation prompt (the model
#: writes inside it) and the close tag a token budget forces, DeepSeek-R1's format
#: (``<think>\\n`` opened by the template; vLLM v0.11 ``deepseek_r1`` reasoning parser).
REASONING_OPENER = "<think>\n"
REASONING_CLOSE = "</think>"


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
# the served model wrapper: logit tap (+ deterministic kernel noise)
# ---------------------------------------------------------------------------------------------


class ServedModel(torch.nn.Module):
    """Wraps a causal LM: records the last forward's logits and optionally adds kernel noise.

    Noise model (honest-noisy): on real GPUs the logits of the same prefix change slightly with
    batch composition and reduction order. We add ``sigma * N(0, 1)`` to every logit, drawn from a
    generator seeded by ``(nonce, absolute position)``: the same position in the same request always
    sees the same perturbation (a fixed batch), a different request (``nonce``) sees another one.
    ``sigma`` in nats; 0 disables.

    The wrapper is a drop-in for the model in ``speculative_generate`` and ``score_continuations``
    (forwards every keyword, exposes ``config``/``generation_config``/``parameters()``).
    """

    def __init__(self, inner: Any, sigma: float = 0.0):
        super().__init__()
        self.inner = inner
        self.sigma = float(sigma)
        self.nonce = 0
        self.last_logits: torch.Tensor | None = None  # [n, V] of the last forward's first sequence

    @property
    def config(self):
        """The inner model's config."""
        return self.inner.config

    @property
    def generation_config(self):
        """The inner model's generation config."""
        return getattr(self.inner, "generation_config", None)

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the inner model's weights."""
        return next(self.inner.parameters()).dtype

    def _noise(self, positions: torch.Tensor, V: int, device: torch.device) -> torch.Tensor:
        """``[*positions.shape, V]`` float32 noise keyed by (nonce, position)."""
        flat = positions.reshape(-1).tolist()
        cache: dict[int, torch.Tensor] = {}
        rows = []
        for pos in flat:
            if pos not in cache:
                h = hashlib.blake2b(f"{self.nonce}:{pos}".encode(), digest_size=8).digest()
                g = torch.Generator().manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))
                cache[pos] = torch.randn(V, generator=g, dtype=torch.float32)
            rows.append(cache[pos])
        return (torch.stack(rows) * self.sigma).reshape(*positions.shape, V).to(device)

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any):
        """Run the inner model; perturb and record its logits (see class doc)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        out = self.inner(input_ids=input_ids, **kwargs)
        logits = out.logits
        if self.sigma > 0:
            n_out = logits.shape[1]
            pos_ids = kwargs.get("position_ids")
            if pos_ids is not None:
                positions = pos_ids[:, -n_out:].cpu()
            else:
                assert input_ids is not None  # without position_ids the caller passes input_ids
                n_in = input_ids.shape[1]
                positions = (torch.arange(past + n_in - n_out, past + n_in)).unsqueeze(0).expand(logits.shape[0], -1)
            noise = self._noise(positions, logits.shape[-1], logits.device)
            logits = (logits.float() + noise).to(logits.dtype)
            out.logits = logits
        self.last_logits = logits[0].detach()
        return out


# ---------------------------------------------------------------------------------------------
# building the served model
# ---------------------------------------------------------------------------------------------


def prune_layers_(model: Any, keep: Sequence[int]) -> None:
    """Keep only decoder layers ``keep`` of a Llama-style model, in place (renumbers ``layer_idx``).

    Raises:
        ValueError: the model lacks ``model.layers``.
    """
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers"):
        raise ValueError("substituted profile needs a Llama-style model with model.layers")
    layers = [base.layers[i] for i in keep]
    base.layers = torch.nn.ModuleList(layers)
    for j, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = j
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = j
    cfg = model.config
    lt = getattr(cfg, "layer_types", None)
    if lt:
        cfg.layer_types = [lt[i] for i in keep]
    cfg.num_hidden_layers = len(layers)


#: The simulator's operator log (``auditor serve`` prints its INFO records on stderr).
log = logging.getLogger("simulator")


def _quant_progress(done: int, total: int, elapsed_s: float) -> None:
    """Quantization progress in the operator log, every tenth of the matrices (the port is closed meanwhile)."""
    if done == total or done % max(1, total // 10) == 0:
        log.info("  quantized %d/%d weight matrices (%.0f s)", done, total, elapsed_s)


@dataclass
class BuildInfo:
    """Operator-facing facts about how the served model was built.

    Attributes:
        model_name: reference model name; revision: its weights revision; dtype: served dtype.
        load_s: seconds to load/copy the model; quant: ``QuantReport`` dict for quantized profiles.
        layers: decoder layers served (substituted: fewer than the reference).
        n_params: parameters of the served model.
    """

    model_name: str
    revision: str
    dtype: str
    load_s: float = 0.0
    quant: dict | None = None
    layers: int | None = None
    n_params: int = 0


def build_served_model(profile: Profile, lm: Any, copy_model: bool = True, *,
                       quant_cache_dir: Path | None = None) -> tuple[Any, BuildInfo]:
    """Return ``(LoadedModel with a ServedModel inside, BuildInfo)`` for ``profile``.

    Args:
        profile: the serving recipe.
        lm: a ``reference.models.LoadedModel`` of the reference (float32) model.
        copy_model: deep-copy the model before changing dtype/weights/layers (the caller's ``lm``
            stays intact); False modifies it in place (saves memory in ``auditor serve``).
        quant_cache_dir: cache the quantized weights of a weight-quantized profile here (the next
            start reads them in seconds; issue 38, item 11) and print quantization progress on stderr;
            None (tests, calibration) quantizes silently without a cache.

    Returns:
        (served LoadedModel, BuildInfo). The served ``LoadedModel.model`` is a :class:`ServedModel`.

    Raises:
        ValueError: the profile cannot be applied to this model (message names the field).
    """
    from reference.models import LoadedModel

    if recorded_of(profile) is not None:
        raise ValueError(f"profile {profile.name!r} replays outputs a real engine recorded (calibration only); "
                         "there is no model to serve: choose a simulator profile (auditor serve --list-profiles)")
    if profile.mix_with is not None:  # issue 14: mix-PROFILE:F (MixtureServedModel below)
        return build_mixture_served_model(profile, lm, copy_model)
    t0 = time.perf_counter()
    model = lm.model
    mutates = (profile.dtype != "float32" or profile.weight_quant or profile.substitute_layers is not None
               or profile.kv_cache_dtype or profile.act_quant)
    if mutates and copy_model:
        model = copy.deepcopy(model)
    info = BuildInfo(model_name=lm.name, revision=lm.revision, dtype=profile.dtype)
    if profile.substitute_layers is not None:
        n_total = len(model.model.layers)
        keep = resolve_substitute_layers(profile, n_total)
        assert keep is not None  # substitute_layers is set
        prune_layers_(model, keep)
    if profile.weight_quant:
        from simulator.quantize import quantize_model_weights

        if next(model.parameters()).dtype != torch.float32:
            model = model.float()
        cache_file = None
        if quant_cache_dir is not None and profile.substitute_layers is None:
            from simulator.quantize import quant_cache_file

            cache_file = quant_cache_file(quant_cache_dir, lm.name, lm.revision, profile.weight_quant,
                                          profile.group_size)
            if not cache_file.is_file():
                log.info("quantizing %s's weights to %s (first start only, a few minutes on 2 CPU cores; cached in %s)",
                         lm.name, profile.weight_quant, cache_file)
        rep = quantize_model_weights(model, profile.weight_quant, group_size=profile.group_size,
                                     cache_file=cache_file,
                                     progress=_quant_progress if quant_cache_dir is not None else None)
        info.quant = {
            "scheme": rep.scheme,
            "group_size": rep.group_size,
            "n_matrices": rep.n_matrices,
            "n_params": rep.n_params,
            "seconds": round(rep.seconds, 3),
            "mean_rel_error": rep.mean_rel_error,
            "backend": rep.backend,
            "errors": rep.errors,
            "cached": rep.cached,
        }
    if profile.kv_cache_dtype or profile.act_quant:  # issue 14: kv-fp8, w8a8 (simulator.quantize)
        from simulator.quantize import apply_runtime_quant

        info.quant = {**(info.quant or {}), **apply_runtime_quant(model, profile, lm.tokenizer)}
    if profile.dtype in ("bfloat16", "float16"):
        model = model.to(getattr(torch, profile.dtype))
        # 16-bit GEMMs accumulate in float32, as on a GPU (and 4-6x faster here than native CPU kernels)
        from simulator.quantize import install_fp32_accumulation

        install_fp32_accumulation(model)
    model.eval()
    served = ServedModel(model, sigma=profile.logit_noise)
    served.eval()
    info.layers = len(getattr(getattr(model, "model", None), "layers", []) or []) or None
    info.n_params = int(sum(p.numel() for p in model.parameters()))
    info.load_s = time.perf_counter() - t0
    dtype = getattr(torch, profile.dtype)
    slm = LoadedModel(
        model=served, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision, dtype=dtype,
        device=lm.device,
    )
    return slm, info


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
    """Reasoning mode (:meth:`SimulatorEngine.generate_reasoning`): ``reasoning`` (generated inside
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
            span: ``reasoning`` while generating a reasoning span (:meth:`generate_reasoning`):
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

    def generate_reasoning(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        budget: int,
        seed: int | None = None,
        top_n: int | None = None,
        on_chunk: Callable[[list[TokenInfo]], None] | None = None,
        cancel: threading.Event | None = None,
        **sampling: Any,
    ) -> ChoiceResult:
        """Reasoning mode: the model writes a reasoning span, a token budget closes it, then the answer.

        ``prompt_ids`` already end with the reasoning opener (:data:`REASONING_OPENER`, put there by
        the server's template, as DeepSeek-R1's template opens ``<think>``). The model generates up to
        ``budget`` tokens (or until it ends the turn itself); the close tag (:data:`REASONING_CLOSE`)
        is then forced, as engines with a thinking budget force it (its tokens carry the served
        model's logprobs at their positions, ``span = "close"``), and the answer is generated after
        it from the same served model, with the remaining ``max_tokens``. Stop strings apply to the
        answer only.

        Args:
            prompt_ids: templated prompt ids ending with the opener; max_tokens: >= 1 tokens in all
                (reasoning, close tag, answer); budget: >= 1 reasoning tokens at most.
            seed: choice seed (the answer's is derived from it); top_n, on_chunk, cancel: as
                :meth:`generate`; sampling: temperature, top_p, top_k, stop.

        Returns:
            ChoiceResult whose tokens are reasoning + close + answer (each with its ``span``),
            ``text`` the answer, ``reasoning_text`` the reasoning; ``finish_reason`` ``length``
            when the budget of ``max_tokens`` ran out before the answer.

        Raises:
            ValueError: budget < 1, or from :meth:`generate`.
        """
        if budget < 1:
            raise ValueError(f"budget={budget} must be >= 1")
        if seed is None or self.profile.ignore_seed:
            seed = self.next_seed()
        stop = sampling.pop("stop", ())

        def tagged(span: str) -> Callable[[list[TokenInfo]], None] | None:
            def cb(part: list[TokenInfo]) -> None:
                for t in part:
                    t.span = span
                if on_chunk is not None:
                    on_chunk(part)
            return cb

        t0 = time.perf_counter()
        r = self.generate(prompt_ids, max_tokens=min(budget, max_tokens), seed=seed, top_n=top_n,
                          on_chunk=tagged("reasoning"), cancel=cancel, span="reasoning", **sampling)
        for t in r.tokens:
            t.span = "reasoning"
        reasoning_ids = [t.token_id for t in r.tokens]
        close_ids = list(self.tokenizer.encode(REASONING_CLOSE, add_special_tokens=False))
        room = int(max_tokens) - len(reasoning_ids) - len(close_ids)
        done = ChoiceResult(tokens=list(r.tokens), text="", finish_reason="length", chunks=list(r.chunks),
                            elapsed_s=time.perf_counter() - t0, effective=r.effective,
                            reasoning_text=self.text_of(reasoning_ids))
        if room < 1 or (cancel is not None and cancel.is_set()):
            return done
        prefix = [int(x) for x in prompt_ids] + reasoning_ids
        if top_n is None:
            forced = [TokenInfo(i) for i in close_ids]
        else:
            forced = self.score_prompt(prefix + close_ids, top_n, nonce=seed)[len(prefix):]
        cb = tagged("close")
        if cb is not None:
            cb(forced)
        a = self.generate(prefix + close_ids, max_tokens=room, seed=self.choice_seed(seed, 1 << 20), top_n=top_n,
                          stop=stop, on_chunk=tagged("answer"), cancel=cancel, **sampling)
        for t in a.tokens:
            t.span = "answer"
        return ChoiceResult(tokens=done.tokens + forced + a.tokens, text=a.text, finish_reason=a.finish_reason,
                            chunks=done.chunks + [len(forced)] + a.chunks, elapsed_s=time.perf_counter() - t0,
                            effective=a.effective, reasoning_text=done.reasoning_text)

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

    def generate_reasoning_batch(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: Sequence[int],
        budget: int,
        temperature: float,
        seeds: Sequence[int],
        top_n: int | None = None,
    ) -> list[ChoiceResult]:
        """:meth:`generate_reasoning` for many requests at once (:meth:`generate_batch` for the reasoning, then for
        the answers after the forced close tag): row b is ``generate_reasoning(prompts[b], max_tokens=max_tokens[b],
        budget=budget, seed=seeds[b], temperature=temperature, top_n=top_n)``, no stop strings. For offline
        collection (the calibration's ``think:PROFILE`` pools).

        Raises:
            ValueError: budget < 1, or from :meth:`generate_batch`.
        """
        if budget < 1:
            raise ValueError(f"budget={budget} must be >= 1")
        seeds = [self.next_seed() if self.profile.ignore_seed else int(s) for s in seeds]
        first = self.generate_batch(prompts, max_tokens=[min(budget, int(m)) for m in max_tokens],
                                    temperature=temperature, seeds=seeds, top_n=top_n, span="reasoning")
        close_ids = list(self.tokenizer.encode(REASONING_CLOSE, add_special_tokens=False))
        out: list[ChoiceResult] = []
        todo: list[tuple[int, list[int], int]] = []  # (row, prefix + close tag, room)
        for b, r in enumerate(first):
            for t in r.tokens:
                t.span = "reasoning"
            reasoning_ids = [t.token_id for t in r.tokens]
            room = int(max_tokens[b]) - len(reasoning_ids) - len(close_ids)
            out.append(ChoiceResult(tokens=list(r.tokens), text="", finish_reason="length", chunks=list(r.chunks),
                                    elapsed_s=r.elapsed_s, effective=r.effective,
                                    reasoning_text=self.text_of(reasoning_ids)))
            if room >= 1:
                todo.append((b, [int(x) for x in prompts[b]] + reasoning_ids + close_ids, room))
        if not todo:
            return out
        answers = self.generate_batch([p for _, p, _ in todo], max_tokens=[m for *_, m in todo], temperature=temperature,
                                      seeds=[self.choice_seed(seeds[b], 1 << 20) for b, *_ in todo], top_n=top_n)
        for (b, prefix, _), a in zip(todo, answers, strict=True):
            n_close = len(close_ids)
            forced = ([TokenInfo(i) for i in close_ids] if top_n is None
                      else self.score_prompt(prefix, top_n, nonce=seeds[b])[len(prefix) - n_close:])
            for t in forced:
                t.span = "close"
            for t in a.tokens:
                t.span = "answer"
            d = out[b]
            out[b] = ChoiceResult(tokens=d.tokens + forced + a.tokens, text=a.text, finish_reason=a.finish_reason,
                                  chunks=d.chunks + [n_close] + a.chunks, elapsed_s=d.elapsed_s + a.elapsed_s,
                                  effective=a.effective, reasoning_text=d.reasoning_text)
        return out

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


def mean_kl(p_logprobs: torch.Tensor, q_logprobs: torch.Tensor) -> float:
    """Mean over rows of KL(p || q) in nats; inputs ``[n, V]`` log-probabilities."""
    p = p_logprobs.double()
    q = q_logprobs.double()
    kl = (p.exp() * (p - q)).sum(-1)
    return float(kl.mean()) if kl.numel() else math.nan


__all__ = [
    "ChoiceResult",
    "ServedModel",
    "SimulatorEngine",
    "TokenInfo",
    "build_served_model",
    "build_vocab_bytes",
    "mean_kl",
    "prune_layers_",
    "token_display",
]


# ------------------------------------------------------------------------------------------ mixtures
# ``mix-PROFILE:F`` profiles: a provider that serves a fraction F of requests with another profile.
#
# Models load-dependent routing to a cheaper replica, published as randomized model substitution
# (issue 14, item 4; ``../shared/REFERENCES.md``). Each request is routed by its (choice) seed:
# ``mix_selects(seed, F)`` hashes the seed with BLAKE2b to a uniform in [0, 1) and routes the
# request to the other profile when it falls below F, so the choice is deterministic per request and
# the fraction of routed requests is Binomial(n, F) over independent seeds.
#
# What is mixed: the served model (weights, dtype, KV/activation quantization, pruning, logit noise)
# and the verification rule (``simulator.verifiers.make_verifier(profile, request_seed=...)``).
# Request rewrites of the other profile (forced top-p/top-k, compliance faults) and its drafter are
# not mixed: the drafter stays the primary's (only speed and acceptance, not the output law under a
# strict rule, depend on it).
# (mix_selects, the routing rule, lives in simulator.profiles beside mix_fraction.)


class MixtureServedModel(ServedModel):
    """A :class:`ServedModel` that switches its inner model per request (on ``nonce`` = request seed).

    Args:
        primary: the served model for most requests (a ServedModel).
        alternate: the served model for a fraction of requests (a ServedModel).
        fraction: probability in [0, 1] that a request (nonce) is routed to ``alternate``.
    """

    def __init__(self, primary: ServedModel, alternate: ServedModel, fraction: float):
        super().__init__(primary.inner, primary.sigma)
        self.primary_inner = primary.inner
        self.alternate_inner = alternate.inner
        self.__dict__["_sigmas"] = (primary.sigma, alternate.sigma)
        self.__dict__["_fraction"] = float(fraction)
        self.n_routed = 0
        self.nonce = 0

    @property
    def nonce(self) -> int:
        """The current request's seed; setting it routes the request (see class doc)."""
        return self.__dict__.get("_nonce", 0)

    @nonce.setter
    def nonce(self, value: int) -> None:
        self.__dict__["_nonce"] = value
        if "_fraction" not in self.__dict__:  # during ServedModel.__init__
            return
        alt = mix_selects(int(value), self.__dict__["_fraction"])
        self.inner = self.alternate_inner if alt else self.primary_inner
        self.sigma = self.__dict__["_sigmas"][1 if alt else 0]
        self.routed_alternate = alt

    @property
    def fraction(self) -> float:
        """The routed fraction F."""
        return self.__dict__["_fraction"]


def build_mixture_served_model(profile: Profile, lm: Any, copy_model: bool = True) -> tuple[Any, BuildInfo]:
    """Build ``(LoadedModel with a MixtureServedModel, BuildInfo)`` for a ``mix-PROFILE:F`` profile.

    The primary is the profile without its mixture (honest-fp32 for ``mix-*``), the alternate is
    ``get_profile(profile.mix_with)``, always built on a copy (so ``lm`` is never modified).

    Raises:
        ValueError: ``profile.mix_with`` is None, or the alternate cannot be applied to the model.
        KeyError: unknown alternate profile.
    """
    from reference.models import LoadedModel

    if profile.mix_with is None:
        raise ValueError(f"profile {profile.name!r} has no mix_with; use build_served_model")
    base = dataclasses.replace(profile, mix_with=None, mix_fraction=0.0)
    p_lm, p_info = build_served_model(base, lm, copy_model=copy_model)
    a_lm, a_info = build_served_model(get_profile(profile.mix_with), lm, copy_model=True)
    served = MixtureServedModel(p_lm.model, a_lm.model, profile.mix_fraction)
    served.eval()
    info = dataclasses.replace(p_info)
    info.load_s = p_info.load_s + a_info.load_s
    info.quant = {"mix_with": profile.mix_with, "mix_fraction": profile.mix_fraction, "alternate": dict(a_info.__dict__)}
    slm = LoadedModel(model=served, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision,
                      dtype=p_lm.dtype, device=lm.device)
    return slm, info
