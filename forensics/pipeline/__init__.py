"""The pipeline that runs an audit, from a case to its findings (docs/architecture.md).

- :mod:`~forensics.pipeline.run_tables`: one run assembled once from a case (:func:`assemble_run`: the tables the
  rules read, :class:`forensics.detect.base.RunTables`), for the audit, the live loop, ``watch`` and the dashboard,
  so that every way into the tool judges the same run.
- :mod:`~forensics.pipeline.audit`: the audit of a finished run (sources, plan, tags, rules, causes, verdict) and
  ``validate``'s loading of a case.
- :mod:`~forensics.pipeline.replay_loop`: ``audit --replay``: replay the top causes within a budget and merge the
  verdicts into the findings.
"""
