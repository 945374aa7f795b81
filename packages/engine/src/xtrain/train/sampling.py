"""Greedy continuations of ``eval.sample_prompts``, so that a person sees what the model writes, not only its loss.

Every rank decodes every prompt (a collective: FSDP gathers each layer's weights for every forward, and under
expert parallelism the ranks exchange tokens), always for ``eval.sample_tokens`` forwards, so the ranks call the
model the same number of times whatever they decode. All prompts share one packed row, each a document of its
own, so one forward extends every prompt by one token; a prompt whose continuation has ended stops growing.
There is no key-value cache: each forward runs the whole row again, which is cheap at the lengths samples have.
Only rank 0's continuations are written (ranks decode the same tokens up to rounding in how experts batch them).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from xtrain.config import TrainConfig
from xtrain.data.tokenizer import TokenizerFolder, load_tokenizer_folder
from xtrain.errors import ConfigError
from xtrain.model.documents import PackedDocuments
from xtrain.model.transformer import Transformer
from xtrain.train.sample_record import Sample


class Sampler:
    """The prompts, encoded once, and their greedy decoding with the model as it is now."""

    def __init__(self, config: TrainConfig, device: torch.device) -> None:
        self.folder = load_tokenizer_folder(config.data.tokenizer)
        self.eos = self.folder.token_id("eos_token")
        self.new_tokens = config.eval.sample_tokens
        self.device = device
        self.prompts = list(config.eval.sample_prompts)
        self.prompt_ids = [encode_prompt(self.folder, self.eos, prompt) for prompt in self.prompts]
        for index, ids in enumerate(self.prompt_ids):
            if not ids:
                raise ConfigError(f"eval.sample_prompts[{index}] encodes to no tokens with {self.folder.path}")

    def sample(self, model: Transformer) -> list[Sample]:
        """The continuations (a collective: every rank calls it; one host read per new token)."""
        written: list[list[int]] = [[] for _ in self.prompts]
        with torch.no_grad():
            for _ in range(self.new_tokens):
                rows = [ids + new for ids, new in zip(self.prompt_ids, written, strict=True)]
                next_ids = _next_tokens(model, rows, self.device).tolist()
                for new, token in zip(written, next_ids, strict=True):
                    if not self._ended(new):
                        new.append(int(token))
        return [self._sample(prompt, new) for prompt, new in zip(self.prompts, written, strict=True)]

    def _ended(self, new: list[int]) -> bool:
        return bool(new) and new[-1] == self.eos

    def _sample(self, prompt: str, new: list[int]) -> Sample:
        ended = self._ended(new)
        text_ids = new[:-1] if ended else new
        continuation = self.folder.tokenizer.decode(text_ids, skip_special_tokens=False)
        return Sample(prompt=prompt, continuation=continuation, tokens=new, ended=ended)


def encode_prompt(folder: TokenizerFolder, eos: int | None, prompt: str) -> list[int]:
    """The prompt's ids as pretraining text is encoded, without the eos token that closes a whole document."""
    ids = [int(token) for token in folder.tokenizer.encode(prompt, add_special_tokens=True).ids]
    while ids and ids[-1] == eos:
        ids.pop()
    return ids


def _next_tokens(model: Transformer, rows: list[list[int]], device: torch.device) -> Tensor:
    """The most likely next token of each row, from one forward of the rows packed into one."""
    lengths = [len(row) for row in rows]
    ids_1T = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long, device=device).unsqueeze(0)
    documents = PackedDocuments.from_lengths(lengths, device)
    last = torch.tensor(list(itertools.accumulate(lengths)), device=device) - 1

    def head(hidden_TD: Tensor, weight_VD: Tensor) -> Tensor:
        logits_NV = hidden_TD[last] @ weight_VD.to(hidden_TD.dtype).T
        return logits_NV.float().argmax(dim=-1)

    next_ids, _stats = model.forward_with_head(ids_1T, documents=documents, head=head)
    return next_ids
