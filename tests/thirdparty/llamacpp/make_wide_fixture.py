"""A GLM-4.5 checkpoint wide enough for llama.cpp's K-quants, for the K-quant corpus.

``llama-quantize`` stores a matrix as ``Q4_K`` / ``Q6_K`` only when its rows hold a multiple of
256 elements (``QK_K``); the shipped fixtures are 16 wide, so every matrix would fall back to
F16. This builds the ``glm4_moe`` fixture the way ``fixtures/make_fixtures.py`` does (the real
``Glm4MoeForCausalLM`` saved by transformers, then a nextn layer with its shared copies), at
width 256 and with two routed experts::

    python tests/thirdparty/llamacpp/make_wide_fixture.py tests/data/llamacpp_kquant
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from fixtures import make_fixtures as mf  # noqa: E402

WIDTH = 256
NAME = "glm4_moe_wide"


def main(out_root: Path) -> Path:
    mf.HIDDEN = WIDTH  # the nextn projection is [HIDDEN, 2 * HIDDEN]
    (glm,) = [f for f in mf.families() if f.name == "glm4_moe"]
    kwargs = {
        **glm.config_kwargs,
        "hidden_size": WIDTH,
        "intermediate_size": WIDTH,
        "moe_intermediate_size": WIDTH,
        "head_dim": WIDTH // 2,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
    }
    mf.transformers.utils.logging.set_verbosity_error()
    return mf.build_family(replace(glm, name=NAME, config_kwargs=kwargs), out_root)


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
