"""CLI commands: ``auditor reference generate|score`` (ground truth from the reference model).

JSON contract (``--json``):
- generate: ``token_ids``, ``text``, ``elapsed_s``, ``tokens_per_s``, ``mean_accepted_length``,
  ``accept_counts`` (+ ``rounds``, ``finish_reason``, ``acceptance_rate``, ``model``, ``revision``...).
- score: ``positions``: per position ``token_id``, ``token``, ``logprob`` (nats), ``top_logprobs``
  (list of ``{token_id, token, logprob}``), plus ``token_ids``, ``prompt_ids``, ``model``, ``revision``.
"""

from __future__ import annotations

import json

import typer

from auditor.cli.options import JsonFlag
from reference import DEFAULT_MODEL

EXIT_USAGE = 3


def _load(model: str, dtype: str, device: str, device_map: str | None = None):
    from reference.models import ModelNotAvailableError, load_model

    if device_map not in (None, "auto"):
        typer.echo(f"error: --device-map {device_map!r} is not supported; use auto (or omit it)", err=True)
        raise typer.Exit(EXIT_USAGE)
    try:
        return load_model(model, dtype=dtype, device=device, device_map=device_map)
    except (ValueError, ModelNotAvailableError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None


ref_app = typer.Typer(help="Reference decoding and teacher-forced scoring on the local model.", no_args_is_help=True)


#: The model-loading and output options every reference command shares (one declaration each).
_MODEL_OPT = typer.Option(DEFAULT_MODEL, "--model", help="smollm2-135m-instruct | gemma-3-270m | local dir | .gguf | HF id.")
_DTYPE_OPT = typer.Option("float32", "--dtype", help="float32 | bfloat16 | float16")
_DEVICE_OPT = typer.Option("auto", "--device", help="auto (CUDA when available) | cpu | cuda | cuda:N")
_DEVICE_MAP_OPT = typer.Option(None, "--device-map", help="auto: spread the model over every visible GPU.")
_PROMPT_OPT = typer.Option(..., "--prompt", help="Prompt text.")


@ref_app.command("generate")
def generate(
    prompt: str = _PROMPT_OPT,
    chat: bool = typer.Option(False, "--chat", help="Apply the chat template (as a chat completions server)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="Maximum generated tokens."),
    drafter: str = typer.Option("none", "--drafter", help="none | ngram[:MIN:MAX] | suffix[:MIN:MAX] | self:L | model:PATH"),
    k: int = typer.Option(4, "--k", min=0, help="Maximum drafts per round."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus mass in (0, 1]."),
    top_k: int = typer.Option(0, "--top-k", help="Top-k filter (0 = off)."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling and verification draws."),
    no_adaptive: bool = typer.Option(False, "--fixed-k", help="Always verify k drafts (no adaptive k)."),
    model: str = _MODEL_OPT,
    dtype: str = _DTYPE_OPT,
    device: str = _DEVICE_OPT,
    device_map: str = _DEVICE_MAP_OPT,
    as_json: JsonFlag = False,
) -> None:
    """Generate with (speculative) decoding; prints tokens and speed statistics."""
    from reference.drafter_specs import make_drafter
    from reference.scoring import encode_prompt
    from reference.speculative import speculative_generate

    lm = _load(model, dtype, device, device_map)
    try:
        d = make_drafter(drafter, lm, dtype=dtype, device=device)
        ids = encode_prompt(lm.tokenizer, prompt, chat)
        res = speculative_generate(
            lm, ids, drafter=d, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, adaptive_k=not no_adaptive,
        )
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    out = res.to_dict()
    out.update(
        {"model": lm.name, "revision": lm.revision, "dtype": str(lm.dtype).replace("torch.", ""),
         "drafter": drafter, "k": k, "prompt_ids": ids, "temperature": temperature, "top_p": top_p,
         "top_k": top_k, "seed": seed}
    )
    if as_json:
        typer.echo(json.dumps(out))
    else:
        typer.echo(res.text)
        typer.echo(
            f"-- {len(res.token_ids)} tokens, {res.elapsed_s:.2f}s, {res.tokens_per_s:.1f} tok/s, "
            f"mean accepted length {res.mean_accepted_length:.2f}, accept counts {res.accept_counts}, "
            f"finish {res.finish_reason}",
            err=True,
        )


@ref_app.command("score")
def score(
    prompt: str = _PROMPT_OPT,
    continuation: str = typer.Option(..., "--continuation", help="Continuation text to teacher-force."),
    chat: bool = typer.Option(False, "--chat", help="Apply the chat template to the prompt."),
    top_k: int = typer.Option(5, "--top-k", min=0, help="Alternatives per position."),
    model: str = _MODEL_OPT,
    dtype: str = _DTYPE_OPT,
    device: str = _DEVICE_OPT,
    device_map: str = _DEVICE_MAP_OPT,
    as_json: JsonFlag = False,
) -> None:
    """Teacher-forced logprobs of a continuation after a prompt (one forward pass)."""
    from reference.scoring import encode_prompt, score_continuations

    lm = _load(model, dtype, device, device_map)
    try:
        ids = encode_prompt(lm.tokenizer, prompt, chat)
        cont = list(lm.tokenizer(continuation, add_special_tokens=False)["input_ids"])
        sc = score_continuations(lm, [ids], [cont], top_k=top_k)[0]
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    out = sc.to_dict(lm.tokenizer)
    out.update({"prompt_ids": ids, "model": lm.name, "revision": lm.revision,
                "dtype": str(lm.dtype).replace("torch.", ""), "sum_logprob": float(sc.logprobs.sum())})
    if as_json:
        typer.echo(json.dumps(out))
    else:
        for row in out["positions"]:
            alts = ", ".join(f"{a['token']!r}:{a['logprob']:.3f}" for a in row["top_logprobs"])
            typer.echo(f"{row['position']:4d} {row['token']!r:>16} {row['logprob']:9.4f}   {alts}")
        typer.echo(f"-- sum logprob {out['sum_logprob']:.4f} nats over {len(cont)} tokens", err=True)


def register(app: typer.Typer) -> None:
    """Attach ``reference generate`` and ``reference score`` to the root auditor app."""
    app.add_typer(ref_app, name="reference")
