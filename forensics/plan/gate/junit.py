"""The gate's result as a JUnit XML file, which CI systems show as test results without a plugin."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from forensics.plan.gate.result import GateResult
from forensics.plan.gate.wording import summary


def write_junit(result: GateResult, path: str | Path) -> None:
    """A JUnit XML file CI systems show as test results: one test case per check, a ``failure`` when it failed."""
    cases = [
        ("batch composition varies across epochs", result.composition_failures),
        ("every sample once per epoch", result.coverage_failures),
    ]
    if result.threshold.min_padding_efficiency is not None:
        cases.append(("padding efficiency", result.padding_failures))
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="forensics check-plan",
        tests=str(len(cases)),
        failures=str(sum(bool(f) for _, f in cases)),
        errors="0",
    )
    for name, failures in cases:
        case = ET.SubElement(suite, "testcase", classname="forensics.check_plan", name=name)
        if failures:
            fail = ET.SubElement(case, "failure", message=failures[0], type="BatchCompositionError")
            fail.text = "\n".join(failures)
    out = ET.SubElement(suite, "system-out")
    out.text = summary(result)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
