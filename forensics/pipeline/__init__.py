"""One run assembled once from a case, for the audit, the live loop, ``watch`` and the dashboard (docs/architecture.md).

:func:`forensics.pipeline.run_tables.assemble_run` is the one place the tables the rules read
(:class:`forensics.detect.base.RunTables`) are put together, so that every way into the tool judges the same run.
"""
