"""Hub repository names (``hf://ORG/NAME[@REVISION]``), told apart from local paths without
importing the HTTP client."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mtpcheck.errors import InputError

SCHEME = "hf://"

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class HubRef:
    """A repository and the revision asked for (None: the default branch)."""

    repo: str
    revision: str | None = None
    bare: bool = False
    """Named without ``hf://`` (then it was no local path either: errors say so)."""

    def __str__(self) -> str:
        return SCHEME + self.repo + (f"@{self.revision}" if self.revision else "")


def _names_a_local_path(text: str) -> bool:
    """``text`` exists here, or its first part is a local folder (a mistyped path such as
    ``fixtures/mimoo``: ``fixtures/`` is here, so no Hub repository is meant)."""
    return Path(text).exists() or Path(text.split("/", 1)[0]).is_dir()


def parse_ref(text: str) -> HubRef | None:
    """The Hub repository ``text`` names, or None when it names a local path."""
    bare = not text.startswith(SCHEME)
    if not bare:
        body = text[len(SCHEME) :]
    elif _REPO_ID.fullmatch(text.split("@", 1)[0]) and not _names_a_local_path(text):
        body = text
    else:
        return None
    repo, _, revision = body.partition("@")
    if not _REPO_ID.fullmatch(repo) or ".." in repo or (text.endswith("@") and not revision):
        raise InputError(text, "not a Hub repository: expected hf://ORG/NAME[@REVISION]")
    return HubRef(repo, revision or None, bare)
