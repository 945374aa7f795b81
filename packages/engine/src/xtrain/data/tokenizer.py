"""A local Hugging Face tokenizer folder: the ``tokenizers`` model, its special tokens and its chat template.

Nothing is downloaded: the folder must hold ``tokenizer.json`` (the tokenizers library's file) and
``tokenizer_config.json`` (special tokens by name and the optional ``chat_template``), as saved by
``transformers``' ``save_pretrained``.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from xtrain.errors import DataError

# The named special tokens Hugging Face passes to a chat template as variables (``bos_token``, ``eos_token``, ...).
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class TokenizerFolder:
    """A loaded tokenizer folder."""

    path: Path
    tokenizer: Tokenizer
    special_tokens: dict[str, str]
    """The named special tokens set in tokenizer_config.json (``eos_token`` -> ``"<|endoftext|>"``)."""
    chat_template: str | None
    """The Jinja chat template of tokenizer_config.json, None when it has none."""
    fingerprint: str
    """Hex digest of tokenizer.json and tokenizer_config.json: a cache built with another tokenizer never matches."""

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def token_id(self, name: str) -> int | None:
        """Id of a named special token (``eos_token``), None when the folder does not define it."""
        token = self.special_tokens.get(name)
        if token is None:
            return None
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise DataError(
                f"{self.path / 'tokenizer_config.json'}: {name} {token!r} is not in tokenizer.json's vocabulary"
            )
        return int(token_id)


def load_tokenizer_folder(path: Path) -> TokenizerFolder:
    """Load ``path/tokenizer.json`` and ``path/tokenizer_config.json``; DataError names what is missing or broken."""
    tokenizer_file = path / "tokenizer.json"
    config_file = path / "tokenizer_config.json"
    if not path.is_dir():
        raise DataError(f"{path}: the tokenizer folder does not exist (data.tokenizer)")
    if not tokenizer_file.is_file():
        raise DataError(f"{tokenizer_file}: missing; data.tokenizer must be a folder with tokenizer.json")
    tokenizer_bytes = tokenizer_file.read_bytes()
    try:
        tokenizer = Tokenizer.from_str(tokenizer_bytes.decode("utf-8"))
    except Exception as error:  # the tokenizers library raises plain Exceptions for bad files
        raise DataError(f"{tokenizer_file}: not a tokenizers file ({error})") from None
    config_bytes = config_file.read_bytes() if config_file.is_file() else b"{}"
    try:
        config = json.loads(config_bytes)
    except json.JSONDecodeError as error:
        raise DataError(f"{config_file}: invalid JSON ({error})") from None
    if not isinstance(config, dict):
        raise DataError(f"{config_file}: expected a JSON object")
    chat_template = config.get("chat_template")
    if chat_template is not None and not isinstance(chat_template, str):
        # Several named templates (a list of {name, template}) are a transformers feature we do not follow.
        raise DataError(f"{config_file}: chat_template must be one template string")
    digest = hashlib.blake2b(digest_size=16)
    for part in (tokenizer_bytes, config_bytes):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return TokenizerFolder(
        path=path,
        tokenizer=tokenizer,
        special_tokens=_named_special_tokens(config),
        chat_template=chat_template,
        fingerprint=digest.hexdigest(),
    )


def _named_special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """Named special tokens as strings; tokenizer_config.json may spell one as a string or as an AddedToken dict."""
    tokens: dict[str, str] = {}
    for name in NAMED_SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens
