"""JUnit XML: one testcase per check, so CI systems show each check as a test."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TextIO

from mtpcheck.model import Report
from mtpcheck.report.sections import sections_for


class JunitRenderer:
    """The JUnit XML report: a test suite of the sections' test cases."""

    name = "junit"

    def render(self, report: Report, stream: TextIO) -> None:
        """Write ``report`` to ``stream`` as one JUnit ``testsuite``."""
        cases = [c for s in sections_for(report) if s.junit is not None for c in s.junit(report)]
        suite = ET.Element(
            "testsuite",
            name=f"mtpcheck.{report.command}",
            tests=str(len(cases)),
            failures=str(sum(c.find("failure") is not None for c in cases)),
            skipped=str(sum(c.find("skipped") is not None for c in cases)),
        )
        suite.extend(cases)
        ET.indent(suite)
        stream.write('<?xml version="1.0" encoding="utf-8"?>\n')
        stream.write(ET.tostring(suite, encoding="unicode"))
        stream.write("\n")
