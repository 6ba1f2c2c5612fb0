"""A provider over time: recurring audits and what changed between them.

- ``scheduler`` — table-driven scheduled audits over the ``schedules`` table (runs
  ``auditor.check.pipeline.run_check``);
- ``alerts`` — verdict-change alerts (an ``alerts`` row, a printed line, an optional webhook);
- ``feed`` — the Atom feed of verdict changes;
- ``standing`` — a provider's combined standing over its recent audits (every suite, every cause).
"""
