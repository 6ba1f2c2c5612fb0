"""Issue 35 item 4: the simulator enforces or rejects sampling parameters as some official APIs do, and
``providers probe --write`` records what it observes into ``[providers.NAME.enforced]``."""

from __future__ import annotations

import asyncio
import tomllib

import pytest

from probes.config import ConfigError, EnforcedParams, ProviderConfig
from probes.discover import discover_capabilities
from probes.providers_file import parse_providers, write_capabilities
from simulator.server import ServerThread, create_app
from simulator.serving_options import parse_enforce

MSG = [{"role": "user", "content": "Write a list of ten random, unrelated words."}]


def _body(**kw):
    return {"model": "tiny", "messages": MSG, "max_tokens": 12, "logprobs": True, "top_logprobs": 5, **kw}


def test_enforced_temperature_samples_a_temperature_0_request(tiny_lm, client) -> None:
    honest = client(create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny"))
    kimi = client(create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny", enforce={"temperature": 1.0, "top_p": 0.95}))
    a, b = (kimi.post("/v1/chat/completions", json=_body(temperature=0.0)).json() for _ in range(2))
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]  # sampled, not greedy
    g = honest.post("/v1/chat/completions", json=_body(temperature=0.0)).json()
    toks = g["choices"][0]["logprobs"]["content"]
    assert all(t["logprob"] >= max(x["logprob"] for x in t["top_logprobs"]) for t in toks)  # greedy = own top-1


def test_rejected_parameter_is_a_400_naming_it(tiny_lm, client) -> None:
    c = client(create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny", enforce={"temperature": 1.0},
                          reject=("temperature", "seed")))
    r = c.post("/v1/chat/completions", json=_body(temperature=0.0))
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert "Only the default (1) value is supported" in r.json()["error"]["message"]
    assert c.post("/v1/chat/completions", json=_body(temperature=1.0)).status_code == 200  # the default itself
    r = c.post("/v1/chat/completions", json=_body(seed=3))
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    assert c.post("/v1/chat/completions", json=_body()).status_code == 200


def test_enforce_option_is_validated() -> None:
    assert parse_enforce("temperature=1.0, top_p=0.95") == {"temperature": 1.0, "top_p": 0.95}
    for bad, what in (("top_p=1.5", "top_p"), ("tempreature=1", "tempreature"), ("top_p", "PARAM=NUMBER")):
        with pytest.raises(ValueError, match=what):
            parse_enforce(bad)
    with pytest.raises(ValueError, match="reject"):
        create_app("honest-fp32", reject=("temp",))


def test_config_enforced_is_validated_naming_the_field() -> None:
    base = {"base_url": "http://x/v1", "model": "m"}
    with pytest.raises(ConfigError, match=r"providers\.p\.enforced\.top_p"):
        parse_providers({"providers": {"p": {**base, "enforced": {"top_p": 1.5}}}})
    with pytest.raises(ConfigError, match=r"providers\.p\.enforced\.rejected"):
        parse_providers({"providers": {"p": {**base, "enforced": {"rejected": ["temp"]}}}})
    e = parse_providers({"providers": {"p": {**base, "enforced": {"temperature": 1.0, "top_p": 0.95,
                                                                   "rejected": ["seed"]}}}})["p"].enforced
    body = e.apply({"temperature": 0.0, "top_p": 1.0, "seed": 4, "max_tokens": 3})
    assert body == {"temperature": 1.0, "top_p": 0.95, "max_tokens": 3}
    assert not e.greedy_possible() and e.unknown() == []
    assert EnforcedParams(overridden=["temperature"]).unknown() == ["temperature"]


@pytest.mark.parametrize(("enforce", "reject", "expected"), [
    ({"temperature": 1.0, "top_p": 0.95}, (), {"overridden": ["temperature"], "rejected": []}),
    ({"temperature": 1.0}, ("temperature", "seed"), {"temperature": 1.0, "overridden": [], "rejected": ["temperature", "seed"]}),
    ({}, (), {"overridden": [], "rejected": []}),
])
def test_probe_records_enforced_parameters(tiny_lm, tmp_path, enforce, reject, expected) -> None:
    app = create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny", enforce=enforce, reject=reject)
    with ServerThread(app, timeout=120) as srv:
        cfg = ProviderConfig(name="sim", base_url=srv.base_url, model="tiny")
        rep = asyncio.run(discover_capabilities(cfg))
    assert rep.error is None and rep.enforced is not None, rep.error
    got = {k: v for k, v in rep.enforced.model_dump().items() if v not in (None,)}
    assert {k: got.get(k) for k in expected} == expected, (got, [c.detail for c in rep.checks])
    path = tmp_path / "providers.toml"
    path.write_text('[providers.sim]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "tiny"\n'
                    '[providers.sim.enforced]\ntop_p = 0.95\n', encoding="utf-8")
    write_capabilities("sim", rep.capabilities, path, enforced=rep.enforced)
    written = tomllib.loads(path.read_text(encoding="utf-8"))["providers"]["sim"]["enforced"]
    assert written["top_p"] == 0.95  # declared by hand: kept
    assert written.get("overridden", []) == expected["overridden"] and written.get("rejected", []) == expected["rejected"]
