"""CLI command: ``auditor serve`` — the OpenAI-compatible provider simulator.

    auditor serve --profile NAME [--host 127.0.0.1] [--port P] [--model M] [--served-model-name N]
                  [--drafter ngram|self:L|none] [--k K] [--seed S] [--faults RATE] [--fault-delay S]
                  [--accept-threshold-single S] [--accept-threshold-acc A] [--greedy-flip-rate R]
                  [--forced-top-p P] [--logit-noise SIGMA] [--expose-profile] [--list-profiles]
                  [--ignore-seed] [--server-top-k K] [--inject-system-prompt TEXT]   # compliance faults
                  [--reasoning field|field-reasoning|inline] [--reasoning-logprobs both|answer]
                  [--reasoning-budget N]                                              # reasoning mode
                  [--enforce temperature=T,top_p=P,...] [--reject temperature,top_p,...]  # fixed parameters

Loopback by default (FastAPI + uvicorn, as vLLM and SGLang serve). Exit code 3 on usage errors.
"""

from __future__ import annotations

import typer

from auditor.cli.common import console as out_console


def _fail(message: str, code: int = 3) -> typer.Exit:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)


def serve_cmd(
    profile: str = typer.Option("honest-fp32", "--profile", help="Serving profile (see --list-profiles)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0 = pick a free one)."),
    model: str | None = typer.Option(None, "--model", help="Reference model name or local dir (default: SmolLM2-135M-Instruct)."),
    served_model_name: str | None = typer.Option(None, "--served-model-name", help="Name clients send and /v1/models lists (default: the model's short name)."),
    drafter: str | None = typer.Option(None, "--drafter", help="ngram[:MIN:MAX] | suffix[:MIN:MAX] | self:L | none (default: the profile's, ngram)."),
    k: int = typer.Option(4, "--k", min=0, help="Maximum drafts per speculative round."),
    seed: int | None = typer.Option(0, "--seed", help="Server RNG seed (requests without seed, fault decisions)."),
    faults: float = typer.Option(0.0, "--faults", min=0.0, max=1.0, help="Probability per request of an injected fault (429, 500, slow, truncated, malformed)."),
    fault_delay: float = typer.Option(30.0, "--fault-delay", min=0.0, help="Delay of a 'slow' fault, seconds."),
    accept_threshold_single: float | None = typer.Option(None, "--accept-threshold-single", help="relaxed-threshold: s (accept d if p(d) >= s)."),
    accept_threshold_acc: float | None = typer.Option(None, "--accept-threshold-acc", help="relaxed-threshold: a (else accept w.p. min(1, p(d)/a))."),
    greedy_flip_rate: float | None = typer.Option(None, "--greedy-flip-rate", help="decode-noncompliant: rate of 2nd-ranked tokens at T=0."),
    forced_top_p: float | None = typer.Option(None, "--forced-top-p", help="truncated-sampling: the engine's own top_p."),
    logit_noise: float | None = typer.Option(None, "--logit-noise", help="honest-noisy: logit noise std (nats)."),
    ignore_seed: bool = typer.Option(False, "--ignore-seed", help="Compliance fault: ignore the request's seed."),
    server_top_k: int | None = typer.Option(None, "--server-top-k", min=1, help="Compliance fault: the engine's own top-k on sampling requests without top_k."),
    inject_system_prompt: str | None = typer.Option(None, "--inject-system-prompt", help="Compliance fault: a hidden system prompt put in front of every chat prompt."),
    max_tokens_default: int = typer.Option(256, "--max-tokens-default", min=1, help="Completion length when a chat request gives no max_tokens."),
    expose_profile: bool = typer.Option(False, "--expose-profile", help="Operator mode: x-simulator-profile header, system_fingerprint, /v1/models metadata."),
    list_profiles: bool = typer.Option(False, "--list-profiles", help="List the profiles and exit."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    stream_chunking: str = typer.Option("round", "--stream-chunking", help="SSE chunks: round (one per speculative round) | token (one per token) | time (every --stream-interval-ms)."),
    stream_interval_ms: float = typer.Option(50.0, "--stream-interval-ms", min=0.001, help="Interval of --stream-chunking time (ms)."),
    reasoning: str | None = typer.Option(None, "--reasoning", help="Reasoning mode of chat completions: field (message.reasoning_content) | field-reasoning (message.reasoning) | inline (<think>…</think> in content). The template opens <think>; --reasoning-budget closes it. Audit with reasoning_opener = \"<think>\\n\" in the provider's config."),
    reasoning_logprobs: str = typer.Option("both", "--reasoning-logprobs", help="What logprobs.content covers in reasoning mode: both (reasoning, close tag, answer) | answer (field modes only)."),
    reasoning_budget: int | None = typer.Option(None, "--reasoning-budget", min=1, help="Reasoning tokens at most before the close tag is forced (default: simulator.profiles.DEFAULT_REASONING_BUDGET, 32)."),
    device: str | None = typer.Option(None, "--device", help="Where the served model runs: auto (CUDA when available) | cpu | cuda | cuda:N (default: cpu)."),
    logprob_convention: str = typer.Option("openai", "--logprob-convention", help="Chat logprobs spelled as: openai (ranked top-k, raw partial bytes) | vllm (sampled token first, empty-then-whole-character tokens)."),
    enforce: str | None = typer.Option(None, "--enforce", help="Sampling parameters applied whatever the request asks, e.g. temperature=1.0,top_p=0.95 (as APIs that fix them do)."),
    reject: str | None = typer.Option(None, "--reject", help="Parameters refused with HTTP 400 when sent, comma-separated: temperature, top_p, top_k, seed (sending an --enforce'd value itself is accepted)."),
) -> None:
    """Serve the reference model over the OpenAI API, honestly or with one named degradation."""

    from simulator.profiles import DEFAULT_REASONING_BUDGET, get_profile, reasoning_of
    from simulator.profiles import list_profiles as _list

    console = out_console()
    if list_profiles:
        from rich.table import Table

        t = Table(title="simulator profiles")
        for col in ("profile", "family", "expected verdict", "recipe"):
            t.add_column(col, overflow="fold")
        for p in _list():
            t.add_row(p.name, p.family, p.expected_verdict, p.summary)
        console.print(t)
        return
    try:
        prof = get_profile(
            profile,
            accept_threshold_single=accept_threshold_single,
            accept_threshold_acc=accept_threshold_acc,
            greedy_flip_rate=greedy_flip_rate,
            forced_top_p=forced_top_p,
            logit_noise=logit_noise,
            ignore_seed=ignore_seed or None,
            forced_top_k=server_top_k,
            inject_system_prompt=inject_system_prompt,
        )
    except KeyError as e:
        raise _fail(str(e.args[0]) + " (see auditor serve --list-profiles)") from None
    except ValueError as e:
        raise _fail(str(e)) from None
    if reasoning is None and reasoning_of(prof) is not None:
        reasoning = "field"  # think:PROFILE is served in reasoning mode (simulator.profiles.reasoning_of)
    if reasoning_budget is None:
        reasoning_budget = reasoning_of(prof) or DEFAULT_REASONING_BUDGET
    if device is not None:
        from reference.models import resolve_device

        try:
            resolve_device(device)  # CUDA asked without a GPU → exit 3 before the model loads
        except ValueError as e:
            raise _fail(str(e).replace("device=", "--device ", 1)) from None
    import logging
    import sys
    import time

    import uvicorn

    from reference.loopback import free_port
    from reference.models import ModelNotAvailableError
    from simulator.server import create_app
    from simulator.serving_options import parse_enforce

    sim_log = logging.getLogger("simulator")  # model build progress (quantization) on stderr
    if not sim_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        sim_log.addHandler(handler)
    sim_log.setLevel(logging.INFO)
    t0 = time.perf_counter()
    try:
        enforced = parse_enforce(enforce)
        rejected = tuple(x.strip() for x in (reject or "").split(",") if x.strip())
        app = create_app(
            prof,
            model=model,
            served_model_name=served_model_name,
            drafter=drafter,
            k=k,
            seed=seed,
            faults=faults,
            fault_delay=fault_delay,
            expose_profile=expose_profile,
            max_tokens_default=max_tokens_default,
            stream_chunking=stream_chunking,
            stream_interval_ms=stream_interval_ms,
            device=device,
            logprob_convention=logprob_convention,
            reasoning=reasoning,
            reasoning_logprobs=reasoning_logprobs,
            reasoning_budget=reasoning_budget,
            enforce=enforced,
            reject=rejected,
        )
    except (ModelNotAvailableError, ValueError) as e:
        raise _fail(str(e)) from None
    sim = app.state.sim
    port = port or free_port(host)
    quant = sim.engine.build_info.quant
    console.print(
        f"serving [bold]{sim.name}[/bold] on http://{host}:{port}/v1 "
        f"(profile hidden from clients{'; exposed to operator' if expose_profile else ''}; "
        f"ready in {time.perf_counter() - t0:.1f}s"
        + (f"; {quant['scheme']} quantization {quant['seconds']:.1f}s via {quant['backend']}"
           + (" (cached weights)" if quant.get("cached") else "") if quant and "scheme" in quant else "")
        + ")",
        highlight=False,
    )
    console.print(f"operator: profile={prof.name} drafter={sim.engine.drafter_spec} k={k} faults={faults}",
                  highlight=False, style="dim")
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    """Attach ``serve`` to the root ``auditor`` app."""
    app.command("serve")(serve_cmd)
