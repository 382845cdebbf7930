"""Write a tiny checkpoint with Megatron-LM's own ``save_checkpoint`` (megatron-core 0.19.2).

megatron-core >= 0.17 ships Megatron-LM's ``megatron.training`` package but needs Python >= 3.12,
for which PyPI's torch is the CUDA build (about 3 GB with its libraries), so the test suite does
not rebuild this checkpoint; it reads the one this script wrote, kept in
``tests/data/megatron_lm_0192``. To write it again (CPU is enough)::

    python3.12 -m venv /tmp/v312
    /tmp/v312/bin/pip install torch==2.13.0 megatron-core==0.19.2 transformers==5.24.0 \\
        einops psutil pyyaml
    /tmp/v312/bin/python tests/thirdparty/make_megatron_lm_checkpoint.py tests/data/megatron_lm_0192

The model: a 2-layer GPT (hidden 16, 2 heads, vocabulary 64 padded by Megatron-LM) with one MTP
layer, megatron-core's local layer spec, bf16, every parameter seeded random. The arguments are
Megatron-LM's real ones, from ``megatron.training.arguments.parse_args`` and ``validate_args``;
the save is ``megatron.training.checkpointing.save_checkpoint`` (torch_dist, common state inside
the checkpoint, as megatron-core 0.19 writes it). ``reference.safetensors`` beside it holds the
model's ``state_dict()`` (MTP inner layer renamed to its on-disk ``transformer_layer``).

CPU shims, here only: ``torch.cuda.current_device`` answers "cpu", ``synchronize`` does nothing
(megatron-core allocates buffers on, and waits for, the current CUDA device) and
``get_rng_state`` returns an empty state (collected on every save, not written with
``--no-save-rng``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

ARGV = [
    "--num-layers", "2",
    "--hidden-size", "16",
    "--ffn-hidden-size", "32",
    "--num-attention-heads", "2",
    "--seq-length", "32",
    "--max-position-embeddings", "32",
    "--micro-batch-size", "1",
    "--global-batch-size", "1",
    "--mtp-num-layers", "1",
    "--bf16",
    "--swiglu",
    "--normalization", "RMSNorm",
    "--disable-bias-linear",
    "--untie-embeddings-and-output-weights",
    "--position-embedding-type", "rope",
    "--vocab-size", "64",
    "--make-vocab-size-divisible-by", "32",
    "--tokenizer-type", "NullTokenizer",
    "--transformer-impl", "local",
    "--use-cpu-initialization",
    "--no-gradient-accumulation-fusion",
    "--no-persist-layer-norm",
    "--no-masked-softmax-fusion",
    "--no-bias-swiglu-fusion",
    "--no-rope-fusion",
    "--ckpt-format", "torch_dist",
    "--save", "",
    "--train-iters", "1",
    "--save-interval", "1",
    "--no-save-rng",
    "--no-save-optim",
    "--lr", "0.0",
]  # fmt: skip


def main() -> None:
    import torch

    out = Path(sys.argv[1]).resolve()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    # collected on every save, written only without --no-save-rng
    torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)  # type: ignore[assignment]
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)

    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.training import global_vars
    from megatron.training.arguments import (
        core_transformer_config_from_args,
        parse_args,
        validate_args,
    )
    from megatron.training.checkpointing import save_checkpoint

    args_list = list(ARGV)
    args_list[args_list.index("--save") + 1] = str(out)
    sys.argv = ["pretrain_gpt.py", *args_list]
    args = parse_args()
    validate_args(args)
    global_vars.set_global_variables(args, build_tokenizer=True)
    parallel_state.initialize_model_parallel()

    config = core_transformer_config_from_args(args)
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    torch.manual_seed(1234)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        mtp_block_spec=get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=False),
    )
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator).to(param.dtype))
    save_checkpoint(1, [model], None, None, 0)

    from safetensors.torch import save_file

    state = {
        k.replace(".mtp_model_layer.", ".transformer_layer."): v.detach().contiguous()
        for k, v in model.state_dict().items()
        if "_extra_state" not in k and v is not None
    }
    save_file(state, str(out / "reference.safetensors"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
