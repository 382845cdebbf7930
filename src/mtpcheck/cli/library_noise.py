"""Keep third-party warnings and log records off stderr, which carries mtpcheck's own lines.

megatron-core warns on import that Transformer Engine and Apex are missing, and torch,
transformers and megatron log through :mod:`logging`; none of it is about the checkpoint.
``--debug`` leaves both alone.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

OWN_PACKAGE = "mtpcheck"


def wants_debug(argv: Sequence[str]) -> bool:
    """``--debug`` anywhere before a ``--`` separator."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--debug":
            return True
    return False


def silence_libraries() -> None:
    """Drop warnings raised outside mtpcheck and log records below ERROR."""
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=rf"{OWN_PACKAGE}(\.|$)")
    logging.disable(logging.WARNING)
    # no handler on the root logger means logging's last-resort handler prints to stderr
    logging.getLogger().addHandler(logging.NullHandler())
