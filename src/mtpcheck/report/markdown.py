"""Markdown summary, e.g. for ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

from typing import TextIO

from mtpcheck.model import Estimate, Report, Status

ICON = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.WARN: "⚠️",
    Status.SKIP: "⏭️",
    Status.INFO: "ℹ️",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ci(e: Estimate, fmt: str = ".3f") -> str:
    shown = format(e.value, fmt)
    return shown if e.low is None or e.high is None else f"{shown} [{e.low:{fmt}}, {e.high:{fmt}}]"


def _acceptance(report: Report, stream: TextIO) -> None:
    temperature = report.acceptance[0].temperature
    stream.write(
        f"\n**MTP acceptance** (k=1, teacher-forced, T={temperature:g}, 95% CI over sequences)\n\n"
        "| workload | checkpoint | positions | greedy | α | tokens/pass |\n"
        "|---|---|---|---|---|---|\n"
    )
    deltas = {d.workload: d for d in report.acceptance_deltas}
    for workload in dict.fromkeys(r.workload for r in report.acceptance):
        for r in report.acceptance:
            if r.workload != workload:
                continue
            greedy = _ci(r.greedy) if r.drafter else "no drafter"
            stream.write(
                f"| {_cell(workload)} | `{_cell(r.checkpoint)}` | {r.positions} | {greedy} | "
                f"{_ci(r.alpha)} | {r.tokens_per_pass:.2f} |\n"
            )
        d = deltas.get(workload)
        if d is not None:
            stream.write(
                f"| {_cell(workload)} | B − A | | "
                f"{_ci(d.greedy, '+.3f')} | "
                f"{_ci(d.alpha, '+.3f')} | "
                f"{d.tokens_per_pass:+.2f} |\n"
            )


def _chain(report: Report, stream: TextIO) -> None:
    chained = [r for r in report.acceptance if r.chain is not None]
    hidden = chained[0].chain.hidden if chained[0].chain else ""
    stream.write(
        f"\n**MTP acceptance by depth** (chained, {hidden} hidden state; drafts 1..d all "
        f"accepted; teacher-forced, T={chained[0].temperature:g}, 95% CI over sequences)\n\n"
        "| workload | checkpoint | positions | d | greedy | α | tokens/pass |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    for r in chained:
        assert r.chain is not None
        for d in r.chain.depths:
            stream.write(
                f"| {_cell(r.workload)} | `{_cell(r.checkpoint)}` | {r.chain.positions} | "
                f"{d.depth} | {_ci(d.greedy)} | "
                f"{_ci(d.alpha)} | {d.tokens_per_pass:.2f} |\n"
            )


def _shares(values: tuple[float, ...]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def _online(report: Report, stream: TextIO) -> None:
    stream.write(
        f"\n**MTP acceptance online** ({report.online[0].engine_title}, "
        f"k={report.online[0].k}, "
        f"T={report.online[0].temperature:g}), at the drafted positions\n\n"
        "| workload | checkpoint | passes | online | teacher-forced | agree | tokens/pass |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    for o in report.online:
        agree = f"{o.agreeing} / {o.drafts}" if o.agreeing is not None else "—"
        stream.write(
            f"| {_cell(o.workload)} | `{_cell(o.checkpoint)}` | {o.drafts} | "
            f"{_shares(o.online_by_depth)} | "
            f"{_shares(o.teacher_forced_by_depth)} | {agree} | "
            f"{o.tokens_per_pass:.2f} |\n"
        )


def _engine(report: Report, stream: TextIO) -> None:
    first = report.engine[0]
    stream.write(
        f"\n**MTP acceptance in {first.engine}** ({first.parallel}, k={first.k}, "
        f"T={first.temperature:g}, 95% CI over requests; position i: steps with drafts 1..i "
        "accepted)\n\n"
        "| workload | checkpoint | steps | per position | mean acceptance length | "
        "teacher-forced |\n|---|---|---|---|---|---|\n"
    )
    for e in report.engine:
        tf = _shares(e.teacher_forced) if e.teacher_forced else "—"
        stream.write(
            f"| {_cell(e.workload)} | `{_cell(e.checkpoint)}` | {e.drafts} | "
            f"{' / '.join(_ci(p) for p in e.by_position)} | "
            f"{_ci(e.mean_acceptance_length, '.2f')} | {tf} |\n"
        )
    for d in report.engine_deltas:
        stream.write(
            f"| {_cell(d.workload)} | B − A | | {_ci(d.first_position, '+.3f')} | "
            f"{_ci(d.mean_acceptance_length, '+.2f')} | |\n"
        )


def _server(report: Report, stream: TextIO) -> None:
    first = report.server[0]
    stream.write(
        f"\n**MTP acceptance served by {first.engine}** (`{_cell(first.server)}`, model "
        f"`{_cell(first.model)}`, k={first.k if first.k is not None else '?'}, "
        f"T={first.temperature:g}, 95% CI over requests)\n\n"
        "| workload | steps | per position | offline | mean acceptance length |\n"
        "|---|---|---|---|---|\n"
    )
    for r in report.server:
        shares = r.by_position or (r.acceptance,)
        offline = " / ".join(_ci(s.estimate) for s in r.expected) or "—"
        length = r.mean_acceptance_length
        stream.write(
            f"| {_cell(r.workload)} | {r.drafts if r.drafts is not None else '—'} | "
            f"{' / '.join(_ci(s.estimate) for s in shares)} | {offline} | "
            f"{_ci(length, '.2f') if length is not None else '—'} |\n"
        )


class MarkdownRenderer:
    name = "markdown"

    def render(self, report: Report, stream: TextIO) -> None:
        verdict = Status.PASS if report.ok else Status.FAIL
        stream.write(f"## mtpcheck {report.command}: {ICON[verdict]} {verdict.value.upper()}\n\n")
        stream.write("| input | format | family | declared MTP | MTP layers (complete/present) |\n")
        stream.write("|---|---|---|---|---|\n")
        for s in report.inputs:
            complete = sum(1 for layer in s.mtp_layers if layer.complete and layer.present)
            present = sum(1 for layer in s.mtp_layers if layer.present)
            stream.write(
                f"| `{_cell(s.path)}` | {s.format} | {_cell(s.family_display)} | "
                f"{s.declared_mtp if s.declared_mtp is not None else '—'} "
                f"({_cell(s.declared_by)}) | {complete}/{present} |\n"
            )
        if report.acceptance:
            _acceptance(report, stream)
        if any(r.chain is not None for r in report.acceptance):
            _chain(report, stream)
        if report.online:
            _online(report, stream)
        if report.engine:
            _engine(report, stream)
        if report.server:
            _server(report, stream)
        stream.write("\n| | check | subject | finding |\n|---|---|---|---|\n")
        for check in report.checks:
            for f in check.findings:
                subject = _cell(f.subject)
                stream.write(
                    f"| {ICON[f.status]} | {check.name} | `{subject}` | {_cell(f.message)} |\n"
                )
