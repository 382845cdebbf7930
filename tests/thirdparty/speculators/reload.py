"""Loads each shipped drafter back with speculators' own ``SpeculatorModel.from_pretrained``
(as `speculators train --from-pretrained` and the converters' validation do) and prints one
line per case: the class it resolved to, or the exception it stopped on.

    python reload.py CORPUS CASE...

The current directory is changed to CORPUS, where ``llama-target`` (the verifier every
EAGLE-3 / P-EAGLE / DFlash case names) lies; the MTP cases name ``fixtures/qwen3_next`` and
are loaded from the repository root.
"""

import os
import sys
import warnings

from speculators import SpeculatorModel


def main(corpus: str, *cases: str) -> None:
    warnings.simplefilter("ignore")
    root = os.getcwd()
    corpus = os.path.abspath(corpus)
    for case in cases:
        os.chdir(root if case.startswith("mtp-") else corpus)
        path = os.path.join(corpus, case)
        try:
            model = SpeculatorModel.from_pretrained(path)
            print(f"{case}: loads as {type(model).__name__}")
        except Exception as exc:  # noqa: BLE001 - the outcome is what is reported
            msg = " ".join(str(exc).split())
            print(f"{case}: {type(exc).__name__}: {msg[:300]}")
    os.chdir(root)


if __name__ == "__main__":
    main(*sys.argv[1:])
