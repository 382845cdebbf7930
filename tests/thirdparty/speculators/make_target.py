"""Writes the tiny Llama target that the speculators drafters pair with.

    python make_target.py OUT [VOCAB_SIZE]

OUT receives what transformers' own ``LlamaForCausalLM(config).save_pretrained`` writes
(config.json, model.safetensors; float32, seeded init) and a byte-level tokenizer of exactly
256 tokens (one per byte, no merges, no special tokens) trained with the ``tokenizers``
library and saved through transformers' ``PreTrainedTokenizerFast.save_pretrained``.
VOCAB_SIZE (default 256) changes only the config's vocab_size (and so the embedding and head
rows); regenerate.sh uses 300 for the target the wrong-vocabulary drafter is trained against.
"""

import sys

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# A few lines of text for the tokenizer trainer; with vocab_size 256 a byte-level BPE keeps
# its 256-byte alphabet and learns no merge, so the text only has to exist.
TEXT = [
    "A drafter proposes tokens and the target verifies them.",
    "Multi-token prediction layers sit beside the main model.",
]


def main(out: str, vocab_size: int = 256) -> None:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TEXT, vocab_size=256, min_frequency=1, show_progress=False)
    assert tok.get_vocab_size() == 256, tok.get_vocab_size()
    PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
