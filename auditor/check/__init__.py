"""The ``check`` pipeline (``auditor check``, the scheduler, ``auditor demo``): probe a provider,
score it against the reference, test, decide, store.

:mod:`auditor.check.pipeline` (``run_check``) runs the stages below in this order, each module
entered once on the way down (tests/audit/test_pipeline.py traces it at run time):

1. ``planning`` — provider config, suite, budget;
2. ``reference_setup`` — device and chat-template checks, the reference (before any probe);
3. ``runner`` — the probes sent, every attempt stored (``attempt_writer``, on the runner's writer
   thread), each response normalized once there (``usage_estimate``: prompt tokens when the provider
   sends no ``usage``); ``run_progress`` shows the session's progress;
4. ``preflight`` — the parameter-compliance requests and the run's probe failures;
5. ``reference_path`` — echo requests on the reference's own greedy continuations (rule 2's cause);
6. ``measured_floors`` — the noise floors measured on the simulator, cached per model and machine
   (the floor's statistics are ``auditor.detectors.noise_floor``);
7. ``observations`` — the stored tokens aligned to the reference;
8. ``reference_scoring`` — the reference teacher-forced at the provider's prefixes
   (the scoring itself is ``reference.scoring``);
9. ``evidence`` — one ``EvidenceBatch`` per reference precision, tokenizer evidence;
10. ``run_detectors`` — every detector (``auditor.detectors``) against each batch;
11. the verdict (``auditor.verdict``), then ``summary`` — speed and headline figures;
12. store → report (``auditor.report``).

``auto_budget`` runs the pipeline in looks for ``--budget-tokens auto`` (group-sequential stopping;
simulated by ``auditor.calibration.sequential``); ``errors`` holds the pipeline's errors.
"""
