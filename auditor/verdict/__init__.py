"""The verdict rules: one audit's detector results → a verdict that names the cause, and what it
means for the buyer. Pure (layering rule L11): numpy, scipy, the standard library,
``auditor.detectors`` and ``auditor.util`` only (no store, check pipeline, reference, probes or torch),
so the store's query modules may sit above it.

Modules, in the order a verdict is made and read:

- ``decide`` — Holm across the detectors, the decision rules, ``Verdict`` (``decide_verdict``);
- ``cause`` — the cause features the rules read (flip ratio, near-tie reason, findings);
- ``power`` — the power calculations behind PASS / INCONCLUSIVE;
- ``rules_out`` — what a PASS / INCONCLUSIVE rules out, per deviation class;
- ``questions`` — the buyer's two questions answered from a verdict.
"""
