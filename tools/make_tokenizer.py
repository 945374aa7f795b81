"""Train the small byte-level BPE tokenizer shipped in examples/tokenizer/ (vocabulary 512, ChatML tokens).

    python tools/make_tokenizer.py            # rewrite examples/tokenizer/
    python tools/make_tokenizer.py --check    # retrain into a temporary folder and compare (exit 1 on a difference)

Trained on the "text" of tools/demo_data/sample.jsonl; the result is deterministic, so the check reproduces the
shipped files byte for byte. The folder is what transformers' AutoTokenizer.from_pretrained and xtrain's data
pipeline both read: tokenizer.json plus tokenizer_config.json with the special tokens and a ChatML chat template
whose {% generation %} marks give the assistant tokens.
"""

import argparse
import filecmp
import json
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tools" / "demo_data" / "sample.jsonl"
TARGET = REPO / "examples" / "tokenizer"
VOCAB_SIZE = 512  # the debug model's vocab_size
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML. Unknown roles are refused through raise_exception; the assistant's reply and its <|im_end|> carry loss.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer() -> Tokenizer:
    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def write_folder(folder: Path) -> None:
    tokenizer = train_tokenizer()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="retrain and compare with the shipped folder")
    parser.add_argument("--out", type=Path, default=TARGET, help="folder to write (default: examples/tokenizer)")
    args = parser.parse_args()
    if not args.check:
        write_folder(args.out)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        write_folder(Path(scratch))
        names = ["tokenizer.json", "tokenizer_config.json"]
        _, mismatch, errors = filecmp.cmpfiles(Path(scratch), args.out, names, shallow=False)
    if mismatch or errors:
        print(f"{args.out} differs from a fresh training run: {mismatch + errors}", file=sys.stderr)
        return 1
    print(f"{args.out} reproduces")
    return 0


if __name__ == "__main__":
    sys.exit(main())
