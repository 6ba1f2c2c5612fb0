"""Noise-floor calibration: measured on honest variants, merged, cached (tiny model)."""

from __future__ import annotations

import json

import numpy as np

from auditor.check.measured_floors import (
    HONEST_BY_REFERENCE,
    FloorSet,
    floor_prompts,
    get_floors,
    merge_floors,
)
from auditor.detectors import compute_noise_floor


def _floor(scale: float, seed: int, name: str):
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(60, 50)) * 3
    honest = ref + rng.normal(size=ref.shape) * scale
    return compute_noise_floor(ref, honest, prompt_ids=np.repeat(np.arange(6), 10), variant_names=[name])


def test_merge_keeps_the_most_lenient_floor() -> None:
    a, b = _floor(0.01, 0, "quiet"), _floor(0.2, 1, "loud")
    m = merge_floors([a, b])
    assert m.variants == ["quiet", "loud"]
    assert m.margin_band == max(a.margin_band, b.margin_band) > a.margin_band
    for k in a.kl:
        assert m.kl[k].variant == "loud" and m.kl[k].mean_kl == b.kl[k].mean_kl
    assert merge_floors([a]) is a


def test_floor_prompts_cover_every_workload(tiny_lm) -> None:
    names, ids = floor_prompts(tiny_lm.tokenizer, 8)
    assert len(names) == len(ids) == 8
    assert {n.split("-")[0] for n in names} == {"code", "math", "chat", "repetition"}
    assert all(len(x) > 5 for x in ids)


def test_default_floor_is_measured_on_every_prompt_an_audit_can_send(tiny_lm) -> None:
    """The default floor's prompts are every distinct greedy/logprob prompt of the shipped suites
    (issue 14: on 16 prompts the floor mean's own sampling variance was as large as a 500-token
    audit's, and the 0.999 margin quantile was the sample maximum)."""
    from auditor.check.measured_floors import FLOOR_PROMPTS
    from probes.suites import load_suite
    from reference.scoring import encode_prompt

    names, ids = floor_prompts(tiny_lm.tokenizer)
    assert len(names) == FLOOR_PROMPTS == len({tuple(x) for x in ids})
    chat = bool(getattr(tiny_lm.tokenizer, "chat_template", None))
    floor_ids = {tuple(x) for x in ids}
    for suite in ("default", "precision", "code", "math", "chat", "repetition", "smoke"):
        for p in load_suite(suite).probes:
            if p.mode in ("greedy", "logprob"):
                enc = encode_prompt(tiny_lm.tokenizer, p.chat_messages() if chat else p.prompt_text(), chat=chat)
                assert tuple(enc) in floor_ids, (suite, p.id)


def test_get_floors_measures_then_caches(tiny_lm, tmp_path) -> None:
    from auditor.check.measured_floors import floor_is_cached

    calls = []
    before, path = floor_is_cached({"float32": tiny_lm}, tmp_path, n_prompts=3, max_new_tokens=6)
    assert before is False and path.parent == tmp_path  # the audit says "measuring ... first audit only"
    fs = get_floors({"float32": tiny_lm}, n_prompts=3, max_new_tokens=6, cache_dir=tmp_path,
                    progress=lambda stage, d, t: calls.append((stage, d, t)))
    assert fs.meta["cached"] is False and list(fs.floors) == ["float32"]
    fl = fs.floors["float32"]
    assert set(fl.variants) == set(HONEST_BY_REFERENCE["float32"])
    assert fl.n_prompts == 3 and fl.n_positions > 0 and fl.margin_band > 0
    # the honest variants really differ from the reference: bf16 and logit noise have nonzero KL,
    # the float32 variant (same weights, another computation path) is nearly exact
    ck = fs.cross_kl["float32"]
    assert ck["honest-fp32"] < 1e-6 < ck["honest-noisy"] and ck["honest-bf16"] > 1e-6
    assert {s.split(": ")[1] for s, _d, _t in calls} == set(HONEST_BY_REFERENCE["float32"])
    # each variant's stage counts its own prompts, 1..n, and ends at its total: a stage's bar is not
    # left part-way (it was, when done/total ran over all variants together)
    per_stage: dict[str, list[tuple[int, int]]] = {}
    for s, d, t in calls:
        per_stage.setdefault(s, []).append((d, t))
    assert all(dt == [(i + 1, fl.n_prompts) for i in range(fl.n_prompts)] for dt in per_stage.values()), per_stage
    _assert_bars_finish(calls)
    assert floor_is_cached({"float32": tiny_lm}, tmp_path, n_prompts=3, max_new_tokens=6) == (True, path)
    assert fs.meta["path"] == str(path)
    again = get_floors({"float32": tiny_lm}, n_prompts=3, max_new_tokens=6, cache_dir=tmp_path)
    assert again.meta["cached"] is True and again.key == fs.key
    assert json.loads(again.to_json())["floors"] == json.loads(fs.to_json())["floors"]
    assert FloorSet.from_json(fs.to_json()).summary()["references"] == fs.summary()["references"]
    other = get_floors({"float32": tiny_lm}, n_prompts=2, max_new_tokens=6, cache_dir=tmp_path)
    assert other.key != fs.key and other.meta["cached"] is False  # the key covers the prompt set


def _assert_bars_finish(calls: list[tuple[str, int, int]]) -> None:
    """The audit's rich bars (``auditor.check.pipeline._Stage``) fed these progress calls: one bar per
    stage, every one complete when its stage is done."""
    import io

    from rich.console import Console

    from auditor.check.pipeline import _Stage

    with _Stage(progress=True, console=Console(file=io.StringIO(), width=100)) as stage:
        for call in calls:
            stage.update(*call)
        tasks = list(stage._bar.tasks)
    assert len(tasks) == len({s for s, _d, _t in calls}) > 0
    assert all(t.finished and t.completed == t.total for t in tasks), [(t.description, t.completed, t.total) for t in tasks]


def test_floor_measurement_is_deterministic(tiny_lm, tmp_path, monkeypatch) -> None:
    """Two measurements give identical numbers, with a steady wall clock during one and a wildly
    jumping one (a loaded machine) during the other: no timing-dependent choice (the draft length
    per verify forward, which the old clock-based AdaptiveK took from wall-clock times) and every random draw seeded."""
    import random
    import time

    import reference.drafter_specs
    import reference.speculative

    # the honest profiles' n-gram drafter never fires on the tiny random model's text; a self-drafter
    # (the model's first layer) drafts every round, so the split into verify forwards matters
    make = reference.drafter_specs.make_drafter
    monkeypatch.setattr(reference.drafter_specs, "make_drafter", lambda spec, lm=None, **kw: make("self:1", lm))
    generate = reference.speculative.speculative_generate
    rounds: list[list[list[int]]] = []

    def recording(*a, **k):  # tokens per target forward of every generation
        res = generate(*a, **k)
        rounds[-1].append(list(res.rounds))
        return res

    monkeypatch.setattr(reference.speculative, "speculative_generate", recording)
    rng = random.Random(7)
    now = [time.perf_counter()]

    def steady_clock() -> float:  # every forward "takes" 1 ms, whatever its size
        now[0] += 1e-3
        return now[0]

    def jumpy_clock() -> float:  # forward passes "take" 0..2 s at random
        now[0] += rng.uniform(0.0, 2.0)
        return now[0]

    kw = {"n_prompts": 3, "max_new_tokens": 16}
    runs = []
    for name, clock in (("a", steady_clock), ("b", jumpy_clock)):
        rounds.append([])
        with monkeypatch.context() as m:
            m.setattr(time, "perf_counter", clock)
            runs.append(get_floors({"float32": tiny_lm}, cache_dir=tmp_path / name, **kw))
    first, second = runs
    assert first.meta["cached"] is False and second.meta["cached"] is False
    assert second.key == first.key
    assert rounds[0] == rounds[1] and any(max(r) > 1 for r in rounds[0])  # same forwards, drafts accepted
    a, b = json.loads(first.to_json()), json.loads(second.to_json())
    assert a["floors"] == b["floors"]  # every number, bit for bit (JSON floats round-trip exactly)
    assert a["cross_kl"] == b["cross_kl"]
    assert first.meta["positions"] == second.meta["positions"] and sum(first.meta["positions"].values()) > 0
    assert first.meta["adaptive_k"] is False and first.meta["seed"] == second.meta["seed"]


def test_tests_never_use_the_user_floor_cache(noise_dir, monkeypatch, tmp_path) -> None:
    """The session's floor directory wins over ``$SPEC_AUDITOR_HOME`` and the user cache."""
    from auditor.check.measured_floors import noise_cache_dir

    assert noise_cache_dir() == noise_dir
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    assert noise_cache_dir() == noise_dir
    monkeypatch.delenv("SPEC_AUDITOR_NOISE_DIR")
    assert noise_cache_dir() == tmp_path / "noise"


def test_first_floor_note_says_what_why_how_long_and_where() -> None:
    """Issue 38 item 10: before the first floor measurement the audit prints one line saying what is
    measured, why, for how long, and where it is cached (bars render nothing in a log until they stop)."""
    import io

    from rich.console import Console

    from auditor.check.pipeline import FIRST_FLOOR_NOTE, _Stage

    msg = FIRST_FLOOR_NOTE.format(model="smollm2-135m-instruct", path="/x/noise")
    for word in ("noise floor", "smollm2-135m-instruct", "minutes", "cached in /x/noise", "reuse"):
        assert word in msg
    seen: list[tuple[str, int, int]] = []
    _Stage(progress=lambda s, d, t: seen.append((s, d, t))).note(msg)
    assert seen == [(msg, 0, 0)]
    buf = io.StringIO()
    with _Stage(progress=True, console=Console(file=buf, width=400)) as stage:
        stage.note(msg)
    assert "measuring the honest noise floor of smollm2-135m-instruct" in buf.getvalue()
    _Stage().note(msg)  # no progress asked: silent, never raises
