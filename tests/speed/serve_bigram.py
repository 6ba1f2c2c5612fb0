"""Serve the 4-token chain model (``bigram_lm``) on loopback in a separate process, for stream
timing tests: a client in the server's own process competes with it for the GIL, and the
resulting event-loop jitter is not what a provider's clients see.

    python tests/speed/serve_bigram.py [--forward-ms MS] NAME=DRAFTER:CHUNKING[:INTERVAL_MS] ...

``--forward-ms`` adds a fixed sleep to every target forward pass (default 8 ms), like a GPU whose
step time hardly depends on how many tokens it verifies; the bare tiny model steps in ~1 ms, too
close to the client's own per-chunk processing time to be a realistic provider.

prints one JSON line ``{NAME: base_url}`` when every server accepts connections, then serves until
stdin closes. Each server runs in operator mode (final chunks carry the server's tokens per round).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def build_bigram_lm(tokenizer):
    """tiny_lm's architecture with a 4-token output layer and no attention output: greedy decoding
    is a deterministic chain the n-gram drafter predicts after a few tokens."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from reference.models import LoadedModel
    from tests.conftest import make_tiny_model

    m = make_tiny_model(seed=0)
    g = torch.Generator().manual_seed(0)
    alphabet = torch.randperm(40000, generator=g)[:4] + 1000
    with torch.no_grad():
        w = torch.zeros(m.config.vocab_size, m.config.hidden_size)
        w[alphabet] = torch.randn(4, m.config.hidden_size, generator=g)
        m.lm_head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=False)
        m.lm_head.weight.copy_(w)
        m.config.tie_word_embeddings = False
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    m.eval()
    return LoadedModel(model=m, tokenizer=tokenizer, name="tiny-bigram", path="<tiny-bigram>",
                       revision="tiny-bigram", dtype=torch.float32, device=torch.device("cpu"))


def main(specs: list[str]) -> None:
    import time

    torch.set_num_threads(1)
    forward_s = 0.008
    if specs and specs[0] == "--forward-ms":
        forward_s, specs = float(specs[1]) / 1000.0, specs[2:]
    from transformers import AutoTokenizer

    from reference.models import pull_default_model
    from simulator.server import ServerThread, create_app

    lm = build_bigram_lm(AutoTokenizer.from_pretrained(str(pull_default_model())))
    if forward_s > 0:
        lm.model.register_forward_hook(lambda *_: time.sleep(forward_s))
    urls, servers = {}, []
    for spec in specs:
        name, cfg = spec.split("=", 1)
        parts = cfg.split(":")
        kw = {"stream_chunking": parts[1]}
        if len(parts) > 2:
            kw["stream_interval_ms"] = float(parts[2])
        app = create_app("honest-fp32", lm, drafter=parts[0], served_model_name="sim", expose_profile=True, **kw)
        servers.append(ServerThread(app).start())
        urls[name] = servers[-1].base_url
    print(json.dumps(urls), flush=True)
    sys.stdin.read()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
