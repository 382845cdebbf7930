"""``accept``: MTP acceptance per workload, offline, on vLLM, or on a running server.

Its parameters are generated from :class:`~mtpcheck.accept.options.AcceptOptions`, where each
option, its default and the rules between options are declared once.
"""

from __future__ import annotations

from typing import Any

from mtpcheck import api
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.cli.app import OutputOptions, cli, output_options, report_and_exit
from mtpcheck.cli.declared import built, declared_parameters


@cli.command()
@declared_parameters(AcceptOptions)
@output_options
def accept(opts: OutputOptions, **params: Any) -> None:
    """Offline MTP acceptance per workload: does the drafter earn its keep?

    One teacher-forced forward pass per sequence (k = 1): the MTP head's distribution q for
    token t+2 is scored against the main model's distribution p at t+1. Reports greedy
    acceptance, alpha = mean sum_v min(p, q) and 1 + alpha tokens per target pass. With
    several MTP layers, also the chain's acceptance per depth (k = D). With --online, also
    what real draft-then-verify decoding accepts at the positions it drafts.
    """
    options = built(AcceptOptions, params, opts)
    report_and_exit("accept", lambda: api.accept_with(options), opts)
