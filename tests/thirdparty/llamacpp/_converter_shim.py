"""Run llama.cpp's unmodified ``convert_hf_to_gguf.py`` with at most one runtime patch.

Usage (inside the llamacpp venv; convert.py calls it):

    python _converter_shim.py CONVERTER_ROOT PATCH_LOG_JSON -- <convert_hf_to_gguf.py args>

The only patch, enabled by the environment variable ``MTPCHECK_TOKPRE_FALLBACK=<name>``:
``conversion.base.TextModel.get_vocab_base_pre`` is wrapped so that when the original raises
``NotImplementedError("BPE pre-tokenizer was not recognized ...")`` (always the case for the
fixtures' synthetic WordLevel tokenizers, whose chktxt hash is not in llama.cpp's table) it
returns ``<name>`` instead, which is written as ``tokenizer.ggml.pre``.  A recognised hash is
left untouched.  Every firing of the patch is recorded in PATCH_LOG_JSON.  No source file of
the converter is edited.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    patch_log = Path(sys.argv[2])
    assert sys.argv[3] == "--"
    conv_args = sys.argv[4:]
    fired: list[dict] = []
    patch_log.write_text(json.dumps({"patches": [], "fired": fired}, indent=2))

    sys.path.insert(0, str(root))
    sys.path.insert(1, str(root / "gguf-py"))

    fallback = os.environ.get("MTPCHECK_TOKPRE_FALLBACK", "")
    patches = []
    if fallback:
        import conversion.base as base  # noqa: PLC0415

        original = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):  # type: ignore[no-untyped-def]
            try:
                return original(self, tokenizer)
            except NotImplementedError as exc:
                fired.append(
                    {
                        "patch": "get_vocab_base_pre",
                        "original_error": str(exc),
                        "returned": fallback,
                    }
                )
                patch_log.write_text(json.dumps({"patches": patches, "fired": fired}, indent=2))
                base.logger.warning("mtpcheck shim: unknown pre-tokenizer hash, using %r", fallback)
                return fallback

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre
        patches.append(
            f"conversion.base.TextModel.get_vocab_base_pre: on NotImplementedError "
            f"return {fallback!r}"
        )
    patch_log.write_text(json.dumps({"patches": patches, "fired": fired}, indent=2))

    script = root / "convert_hf_to_gguf.py"
    sys.argv = [str(script), *conv_args]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
