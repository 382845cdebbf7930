"""Machine-readable JSON report: its JSON Schema ships beside it as ``report.schema.json``,
and docs/report.md describes its fields. The sections give the keys; this module adds the
header and writes them."""

from __future__ import annotations

import json
from typing import Any, TextIO

from mtpcheck import __version__
from mtpcheck.model import CheckName, Report
from mtpcheck.report.sections import sections_for

SCHEMA_VERSION = 2
"""The ``schema_version`` of every JSON report; raised when a field changes meaning."""

SCHEMA_FILE = "report.schema.json"
"""The schema's file name in this package (``importlib.resources.files("mtpcheck.report")``)."""


def check_name_schema() -> dict[str, Any]:
    """A check's ``name`` in the schema (its ``$defs/check_name``), generated from the registry
    of check names: one of them, or ``acceptance/WORKLOAD``. ``tests/test_check_names.py``
    keeps the shipped file in step (``python tests/test_check_names.py`` rewrites it)."""
    plain = [n.value for n in CheckName if n is not CheckName.ACCEPTANCE]
    return {
        "description": "A check's name (mtpcheck.CheckName); accept's are acceptance/WORKLOAD.",
        "anyOf": [
            {"enum": plain},
            {"type": "string", "pattern": f"^{CheckName.ACCEPTANCE.value}/."},
        ],
    }


def _header(command: str, ok: bool) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mtpcheck", "version": __version__},
        "command": command,
        "ok": ok,
    }


def report_dict(report: Report) -> dict[str, Any]:
    """The JSON report as a dictionary: the header, the keys of the sections every command
    reports, then (``accept`` only) those of the acceptance sections."""
    result = _header(report.command, report.ok)
    groups = (False, True) if report.command == "accept" else (False,)
    for accept_only in groups:
        for section in sections_for(report):
            if section.json is not None and section.accept_only is accept_only:
                result.update(section.json(report))
    return result


def error_dict(command: str, path: str, reason: str) -> dict[str, Any]:
    """The JSON printed instead of a report when an input cannot be read (exit 2)."""
    return {**_header(command, False), "error": {"path": path, "reason": reason}}


class JsonRenderer:
    """The JSON report."""

    name = "json"

    def render(self, report: Report, stream: TextIO) -> None:
        """Write ``report`` to ``stream`` as indented JSON."""
        json.dump(report_dict(report), stream, indent=2)
        stream.write("\n")
