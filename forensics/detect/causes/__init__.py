"""Causes: the findings one explanation covers, told as one story, and the verdict over them.

:mod:`~forensics.detect.causes.grouping` joins findings into causes (the same event on several metrics, the same
samples spiking again) and gives each a stable ``key``; :mod:`~forensics.detect.causes.verdict` says in one sentence
what the audit found. Both read findings only, so the audit and the live loop tell the same story.
"""
