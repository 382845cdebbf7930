"""JUnit XML: one testcase per check, so CI systems show each check as a test."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TextIO

from mtpcheck.model import Report, Status


class JunitRenderer:
    name = "junit"

    def render(self, report: Report, stream: TextIO) -> None:
        suite = ET.Element(
            "testsuite",
            name=f"mtpcheck.{report.command}",
            tests=str(len(report.checks)),
            failures=str(sum(c.status is Status.FAIL for c in report.checks)),
            skipped=str(sum(c.status is Status.SKIP for c in report.checks)),
        )
        subjects = ", ".join(s.path for s in report.inputs)
        for check in report.checks:
            case = ET.SubElement(
                suite, "testcase", classname=f"mtpcheck.{report.command}", name=check.name
            )
            lines = "\n".join(
                f"[{f.status.value}] {f.subject}: {f.message}" for f in check.findings
            )
            if check.status is Status.FAIL:
                first = next(f for f in check.findings if f.status is Status.FAIL)
                failure = ET.SubElement(
                    case, "failure", message=f"{first.subject}: {first.message}"
                )
                failure.text = lines
            elif check.status is Status.SKIP:
                ET.SubElement(case, "skipped", message=check.findings[0].message)
            else:
                out = ET.SubElement(case, "system-out")
                out.text = lines
            case.set("file", subjects)
        ET.indent(suite)
        stream.write('<?xml version="1.0" encoding="utf-8"?>\n')
        stream.write(ET.tostring(suite, encoding="unicode"))
        stream.write("\n")
