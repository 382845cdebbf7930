"""Acceptance profiles: a run's figures per workload and position, saved
(``accept --save-profile``) and held to by a later run (``accept --profile``).

A profile is JSON: the settings that make two runs comparable (temperature, prompt and new
tokens, k), and per workload each position's share with its standard error over requests.
A later run fails a workload where a position's share lies below the profile's by more than
both runs' spread allows: the one-sided test of :func:`mtpcheck.accept.stats.shortfall`,
Bonferroni-corrected over every (workload, position) held.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpcheck.accept.stats import Shortfall, shortfall
from mtpcheck.errors import InputError
from mtpcheck.model import ServerAcceptance, Share

#: The profile format this mtpcheck writes and reads.
PROFILE_VERSION = 1
#: Settings two runs must share to be compared.
SETTINGS = ("temperature", "prompt_tokens", "new_tokens", "k")


@dataclass(frozen=True)
class Held:
    """One (workload, position) of a run held to the profile; position 0 is the token-level
    acceptance, used where the engine gives no positions."""

    workload: str
    position: int
    result: Shortfall


def _share(share: Share) -> dict[str, Any]:
    return {"value": share.estimate.value, "error": share.error}


def _settings(result: ServerAcceptance) -> dict[str, Any]:
    return {name: getattr(result, name) for name in SETTINGS}


def profile_of(results: tuple[ServerAcceptance, ...]) -> dict[str, Any]:
    """The JSON object ``--save-profile`` writes."""
    first = results[0]
    return {
        "mtpcheck_profile": PROFILE_VERSION,
        "engine": first.engine,
        "model": first.model,
        "settings": _settings(first),
        "workloads": {
            r.workload: {
                "requests": r.requests,
                "drafts": r.drafts,
                "draft_tokens": r.draft_tokens,
                "accepted_per_position": list(r.accepted_per_position),
                "by_position": [_share(s) for s in r.by_position],
                "acceptance": _share(r.acceptance),
            }
            for r in results
        },
    }


def save_profile(results: tuple[ServerAcceptance, ...], path: Path) -> None:
    """Write the profile whole or not at all (a temporary file renamed into place)."""
    text = json.dumps(profile_of(results), indent=2) + "\n"
    directory = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_profile(path: Path) -> dict[str, Any]:
    """Read and check a profile; anything else is one line naming the file (exit 2)."""
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise InputError(path, "no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(path, f"cannot read it ({e})") from e
    except json.JSONDecodeError as e:
        raise InputError(path, f"not JSON ({e.msg}, line {e.lineno})") from e
    if not isinstance(profile, dict) or "mtpcheck_profile" not in profile:
        raise InputError(path, "not an mtpcheck acceptance profile (--save-profile writes one)")
    if profile["mtpcheck_profile"] != PROFILE_VERSION:
        raise InputError(
            path,
            f"profile format {profile['mtpcheck_profile']!r}; this mtpcheck reads "
            f"{PROFILE_VERSION}",
        )
    if not isinstance(profile.get("workloads"), dict) or not isinstance(
        profile.get("settings"), dict
    ):
        raise InputError(path, "a profile needs 'settings' and 'workloads' objects")
    return profile


def _figure(entry: Any, path: Path, where: str) -> tuple[float, float | None]:
    ok = isinstance(entry, dict) and isinstance(entry.get("value"), (int, float))
    error = entry.get("error") if isinstance(entry, dict) else None
    if not ok or not (error is None or isinstance(error, (int, float))):
        raise InputError(path, f"{where}: expected {{value, error}} numbers")
    return float(entry["value"]), None if error is None else float(error)


def hold_to_profile(
    results: tuple[ServerAcceptance, ...], profile: dict[str, Any], path: Path
) -> tuple[list[Held], list[str]]:
    """Every (workload, position) the profile and the run share, tested; and the workloads
    the profile does not hold. Different settings make the runs incomparable (exit 2)."""
    theirs, ours = profile["settings"], _settings(results[0])
    differing = [f"{k} {theirs.get(k)!r} here {ours[k]!r}" for k in SETTINGS if theirs.get(k)
                 != ours[k]]  # fmt: skip
    if differing:
        raise InputError(
            path,
            "the profile was measured with other settings, so its figures do not "
            f"compare: {'; '.join(differing)}",
        )
    pairs = []
    absent = []
    for r in results:
        entry = profile["workloads"].get(r.workload)
        if not isinstance(entry, dict):
            absent.append(r.workload)
            continue
        if r.by_position:
            saved = entry.get("by_position", [])
            if not isinstance(saved, list):
                raise InputError(path, f"workload {r.workload}: 'by_position' is not a list")
            for i, (share, kept) in enumerate(zip(r.by_position, saved, strict=False), 1):
                pairs.append((r.workload, i, share, _figure(kept, path, f"{r.workload} {i}")))
        else:
            kept = _figure(entry.get("acceptance"), path, f"{r.workload} acceptance")
            pairs.append((r.workload, 0, r.acceptance, kept))
    held = [
        Held(name, i, shortfall(s.estimate.value, s.error, value, error, len(pairs)))
        for name, i, s, (value, error) in pairs
    ]
    return held, absent
