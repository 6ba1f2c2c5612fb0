"""The verdict rules: one audit's detector results → a verdict that names the cause, and what it
means for the buyer. Pure (layering rule L11): numpy, scipy, the standard library,
``auditor.detectors`` and ``auditor.util`` only (no store, check pipeline, reference, probes or torch),
so the store's query modules may sit above it.

Modules, in the order a verdict is made and read:

- ``decide`` — ``decide_verdict``: Holm across the detectors, then the decision rules in order;
- ``kinds`` — what a verdict is: ``VerdictKind``, ``Verdict``, ``EXIT_CODES``, ``UNDETERMINED_CAUSES`` (and the
  ``Cause`` / ``RuleContext`` the rule modules share);
- ``model_rules`` — the model side: is the declared model served at its precision (rules 2, 3, 3h, 4d, 2t);
- ``verification_rules`` — the verification side: strict verification, decoding compliance (rules 1, 3n, 4, 6);
- ``cause`` — the cause features the rules read (flip ratio, near-tie reason, findings);
- ``power`` — the power calculations behind PASS / INCONCLUSIVE;
- ``rules_out`` — what a PASS / INCONCLUSIVE rules out, per deviation class;
- ``questions`` — the buyer's two questions answered from a verdict.
"""
