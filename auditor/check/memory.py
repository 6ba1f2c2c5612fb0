"""Memory bounds of the audit's stages, and a clear refusal before a stage that would not fit.

Issue 41: the first gemma-3-270m audit (262,144-token vocabulary) was killed by the kernel at 23 GB
while measuring the noise floor, with nothing printed. Every stage is now bounded by a block of
rows, not by vocabulary × positions (docs/scale.md, "Memory per stage"), and before the two stages
whose working memory grows with the vocabulary — the noise floor and the reference scoring — the
audit compares what the stage will need (:func:`floor_need`, :func:`scoring_need`) with what the
machine has (:func:`available_bytes`) and, when it does not fit, refuses in one line with the fix
(:func:`ensure_fits` raises :class:`MemoryRefusal`, an ``AuditError``: exit 3; the run and its
probes stay stored, marked ``failed`` with that line, and ``--resume RUN_ID`` continues it).

The estimates are upper bounds of the *additional* memory of the stage (the reference weights are
already loaded and counted by the machine), in bytes:

- noise floor: the larger of decoding — a bfloat16 copy of the weights for the honest-bf16 variant
  when the reference is float32 (``2 × params``: each weight is cast as it is copied) and the
  decoding rows (``2 × max_new_tokens × V × 4``) — and scoring — one scoring chunk
  (``2 × logit_rows × V × 4``: the logits and the log-sum-exp work array) and one accumulator block
  (``64 × block_rows × V``); the copy is dropped before its variant is scored, so the two are never
  resident together; plus ~1.2 KB kept per floor position;
- reference scoring: one chunk (``2 × logit_rows × V × 4``), the forward's activations
  (``token_budget × (8 × hidden + 3 × intermediate) × 4`` plus the attention scores
  ``batch × heads × L² × 4``) and ~400 bytes kept per scored position (top-20 ids and logprobs).

Sources: /proc/meminfo ``MemAvailable`` (Linux; ``psutil.virtual_memory().available`` elsewhere when
psutil is installed); :data:`ENV_AVAILABLE` overrides it (a container whose /proc shows the host, and
the tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from auditor.check.errors import AuditError

__all__ = [
    "DEFAULT_FLOOR_BLOCK_ROWS",
    "ENV_AVAILABLE",
    "ENV_BLOCK_ROWS",
    "MemoryRefusal",
    "StageNeed",
    "available_bytes",
    "ensure_fits",
    "floor_block_rows",
    "floor_need",
    "model_shape",
    "release_freed_memory",
    "scoring_need",
]

#: Environment variable overriding the available memory (bytes, or a number with K/M/G/T, binary).
ENV_AVAILABLE = "SPEC_AUDITOR_MEMORY_AVAILABLE"
#: Environment variable setting the floor accumulator's block (rows of ``[rows, V]`` reduced at once).
ENV_BLOCK_ROWS = "SPEC_AUDITOR_FLOOR_BLOCK_ROWS"
#: Default block (``auditor.detectors.noise_floor.FLOOR_BLOCK_ROWS``, restated here for the estimate).
DEFAULT_FLOOR_BLOCK_ROWS = 16
#: Bytes kept per floor position and variant by the accumulator (float64 statistics; see
#: ``FloorAccumulator``: 528 shared + 641 per variant with the full KL, rounded up).
FLOOR_BYTES_PER_POSITION = 1_200
#: Bytes kept per scored position (top-20 ids int64 + logprobs float64, chosen logprob, tail; plus
#: the evidence arrays built from them), rounded up.
SCORING_BYTES_PER_POSITION = 400
_GIB = 1 << 30


class MemoryRefusal(AuditError):
    """A stage would need more memory than the machine has available; raised before it starts
    (exit code 3, one line with the fix; the run stays stored and can be resumed)."""


@dataclass(frozen=True)
class StageNeed:
    """What one stage will need beyond what is already loaded.

    Attributes:
        stage: the stage's name as the progress shows it (``noise floor``, ``reference scoring``).
        bytes: the estimate (upper bound) in bytes.
        detail: the terms behind it, in words (shown with the refusal).
    """

    stage: str
    bytes: int
    detail: str


def _parse_bytes(text: str) -> int:
    """``"123"``, ``"512M"``, ``"2.5G"`` → bytes (binary units). Raises ValueError naming the variable."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMGT" and t[-1:] else t
    try:
        value = float(num) * mult
    except ValueError:
        raise ValueError(f"{ENV_AVAILABLE}={text!r} is not a size; write bytes or e.g. 8G") from None
    if value < 0:
        raise ValueError(f"{ENV_AVAILABLE}={text!r} must be >= 0")
    return int(value)


def available_bytes() -> int | None:
    """Memory available to a new stage now, in bytes, or None when it cannot be read (then nothing
    is refused). :data:`ENV_AVAILABLE`, else ``MemAvailable`` of /proc/meminfo, else psutil.

    Raises:
        ValueError: :data:`ENV_AVAILABLE` is set to something that is not a size.
    """
    env = os.environ.get(ENV_AVAILABLE)
    if env:
        return _parse_bytes(env)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # type: ignore[import-untyped]  # optional: not a dependency (comes with accelerate)
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def release_freed_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim(0)``); call it after
    dropping large objects whose memory was allocated in pieces below glibc's mmap threshold (up to
    32 MiB: e.g. the per-layer weights of the floor's bf16 copy), which ``free`` keeps resident when
    a live allocation sits above them in the heap.

    Issue 41: the first gemma-3-270m audit kept ~300 MiB of the dropped bf16 copy resident through
    the honest-bf16 variant's scoring (floor stage peak 2,906 MiB instead of ~2,600; docs/scale.md).

    Returns:
        True when ``malloc_trim`` ran and released memory; False when nothing was released or the C
        library is not glibc (nothing done; never raises).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): no malloc_trim
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))


def floor_block_rows() -> int:
    """The floor accumulator's block: :data:`ENV_BLOCK_ROWS`, else :data:`DEFAULT_FLOOR_BLOCK_ROWS`.

    Raises:
        ValueError: the variable is not an integer >= 1.
    """
    env = os.environ.get(ENV_BLOCK_ROWS)
    if not env:
        return DEFAULT_FLOOR_BLOCK_ROWS
    try:
        rows = int(env)
    except ValueError:
        rows = 0
    if rows < 1:
        raise ValueError(f"{ENV_BLOCK_ROWS}={env!r} must be an integer >= 1 (rows reduced at once, e.g. 4)")
    return rows


@dataclass(frozen=True)
class ModelShape:
    """What the estimates read from a model: vocabulary, parameters, widths (from its config)."""

    vocab_size: int
    n_params: int
    hidden: int
    intermediate: int
    heads: int
    param_bytes: int


def model_shape(lm: Any) -> ModelShape:
    """:class:`ModelShape` of a ``reference.models.LoadedModel`` (or a bare transformers model)."""
    model = getattr(lm, "model", lm)
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    n_params = 0
    param_bytes = 4
    for p in model.parameters():
        n_params += int(p.numel())
        param_bytes = int(p.element_size())
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    return ModelShape(
        vocab_size=int(cfg.vocab_size),
        n_params=n_params,
        hidden=hidden,
        intermediate=int(getattr(cfg, "intermediate_size", 0) or 4 * hidden),
        heads=int(getattr(cfg, "num_attention_heads", 0) or 1),
        param_bytes=param_bytes,
    )


def _chunk_bytes(vocab_size: int) -> int:
    from reference.scoring import logit_rows_for

    return 2 * logit_rows_for(vocab_size) * vocab_size * 4


def floor_need(shape: ModelShape, *, n_positions: int, max_new_tokens: int, needs_bf16_copy: bool,
               block_rows: int | None = None) -> StageNeed:
    """Upper bound of the noise floor's extra memory (module docstring), in bytes.

    Args:
        shape: the reference (:func:`model_shape`); n_positions: floor positions per variant
            (prompts × max_new_tokens at most); max_new_tokens: tokens decoded per prompt;
        needs_bf16_copy: the honest-bf16 variant casts a copy of float32 weights;
        block_rows: accumulator block (default :func:`floor_block_rows`).
    """
    v = shape.vocab_size
    rows = floor_block_rows() if block_rows is None else int(block_rows)
    cast = 2 * shape.n_params if needs_bf16_copy else 0
    decode = 2 * (max_new_tokens + 8) * v * 4
    chunk = _chunk_bytes(v)
    block = 64 * rows * v + rows * v * 4
    kept = FLOOR_BYTES_PER_POSITION * n_positions
    # the copy decodes, then is dropped before its variant's scoring (auditor.check.measured_floors.compute_floors):
    # it is never resident beside the scoring chunk and block
    total = max(cast + decode, chunk + block) + kept
    detail = (f"max(bf16 copy {cast / _GIB:.2f} GiB + decoding rows {decode / _GIB:.2f} GiB, scoring chunk "
              f"{chunk / _GIB:.2f} GiB + {rows}-row block {block / _GIB:.2f} GiB) + kept {kept / _GIB:.2f} GiB "
              f"(V = {v:,})")
    return StageNeed("noise floor", int(total), detail)


def scoring_need(shape: ModelShape, *, n_positions: int, token_budget: int, batch_size: int,
                 longest: int) -> StageNeed:
    """Upper bound of the reference scoring's extra memory (module docstring), in bytes.

    Args:
        shape: the reference; n_positions: positions scored in all; token_budget: padded tokens per
            forward; batch_size: sequences per forward; longest: the longest prompt + continuation.
    """
    v = shape.vocab_size
    chunk = _chunk_bytes(v)
    tokens = min(token_budget, batch_size * longest) if longest > 0 else token_budget
    act = tokens * (8 * shape.hidden + 3 * shape.intermediate) * 4
    attn = batch_size * shape.heads * longest * longest * 4
    kept = SCORING_BYTES_PER_POSITION * n_positions
    total = chunk + act + attn + kept
    detail = (f"scoring chunk {chunk / _GIB:.2f} GiB + activations {(act + attn) / _GIB:.2f} GiB + kept "
              f"{kept / _GIB:.2f} GiB for {n_positions:,} positions (V = {v:,})")
    return StageNeed("reference scoring", int(total), detail)


def ensure_fits(need: StageNeed, *, provider: str | None = None, run_id: str | None = None,
                available: int | None = None) -> None:
    """Refuse a stage that would not fit in the available memory, before it starts.

    Args:
        need: the stage's estimate; provider, run_id: named in the refusal (the run can be resumed);
        available: bytes available (default :func:`available_bytes`; None there: nothing refused).

    Raises:
        MemoryRefusal: ``need.bytes > available``; the message is one line naming the stage, both
            figures and the fixes (a smaller block, fewer tokens, a GPU reference).
    """
    avail = available_bytes() if available is None else available
    if avail is None or need.bytes <= avail:
        return
    resume = f"; then `auditor check --provider {provider} --resume {run_id}` continues this run" if (
        provider and run_id) else ""
    raise MemoryRefusal(
        f"not enough memory for the {need.stage}: it needs about {need.bytes / _GIB:.2f} GiB "
        f"({need.detail}), {avail / _GIB:.2f} GiB are available. Fix: free memory, or set "
        f"{ENV_BLOCK_ROWS}=4 (a smaller block), or audit fewer tokens (--budget-tokens), or use a GPU reference "
        f"(device = \"cuda\" in its [references.NAME] table){resume}",
        provider=provider, run_id=run_id,
    )
