"""Make a tiny random Qwen2 model and a byte-level BPE tokenizer for the real-engine tier.

Runs in the SGLang venv (it has torch, transformers and tokenizers), never in the
project's: ``python make_model.py OUT_DIR --seed N [--max-positions P] [--vocab V]``. Nothing is
downloaded: the tokenizer is trained on the Python standard library's own sources, the
weights are random from *seed* (another seed gives the weights a weight update loads).
Writes OUT_DIR/DONE last, so a half-made model is never taken for a finished one.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

VOCAB = 2048
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def corpus(limit_bytes: int = 4_000_000) -> list[str]:
    """Text to train the tokenizer on: the standard library's sources, in a fixed order."""
    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="replace")
        texts.append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    return texts


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_weights(out: Path, seed: int, max_positions: int, vocab: int, tied: bool = True
                 ) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=tied,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0,
                         torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=VOCAB,
                        help="rows of the embedding (the tokenizer keeps its 2048 tokens; a "
                             "larger model takes the simulated replica's token ids)")
    parser.add_argument("--untied", action="store_true",
                        help="an output layer of its own (vLLM on CPU reloads a tied one "
                             "from the old weights)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    make_weights(args.out, args.seed, args.max_positions, max(args.vocab, VOCAB),
                 tied=not args.untied)
    make_tokenizer(args.out)
    (args.out / "DONE").write_text(f"seed {args.seed}\n")


if __name__ == "__main__":
    main()
