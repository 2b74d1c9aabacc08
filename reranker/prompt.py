"""Token-level prompt assembly shared by the attention rerankers.

Prompts are built from *pieces* tokenised separately and concatenated as token ids, so
that (a) every document's token span is known exactly, and (b) untrusted text (documents
and queries) is tokenised with ``split_special_tokens=True``: a document that contains
``<|im_end|>`` or any other special/chat-control string stays plain text and can never
produce a special token. Only the trusted template (chat wrapper, instructions) may
contain special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_PLACEHOLDER = "\x00HEEDRANK_USER_MESSAGE\x00"


@dataclass(frozen=True)
class ChatWrap:
    """Text before and after the user message in the model's chat template (empty for base models)."""

    prefix: str
    suffix: str


def chat_wrap(tokenizer: Any, use_chat_template: bool = True) -> ChatWrap:
    """Split the tokenizer's chat template around a user message.

    Returns ``ChatWrap("", "")`` when the tokenizer has no chat template or
    ``use_chat_template`` is false.
    """
    if not use_chat_template or not getattr(tokenizer, "chat_template", None):
        return ChatWrap("", "")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _PLACEHOLDER}], tokenize=False, add_generation_prompt=True
    )
    if _PLACEHOLDER not in text:  # pragma: no cover - exotic templates
        return ChatWrap("", "")
    before, after = text.split(_PLACEHOLDER, 1)
    return ChatWrap(before, after)


def encode_trusted(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text (special tokens in it are honoured; no BOS/EOS added)."""
    return list(tokenizer(text, add_special_tokens=False).input_ids) if text else []


def encode_untrusted(tokenizer: Any, text: str) -> list[int]:
    """Token ids of untrusted text: special-token strings are split into plain tokens."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids)


def bos_ids(tokenizer: Any, wrap: ChatWrap) -> list[int]:
    """The BOS token to start a prompt with, when the tokenizer adds one and the chat
    template does not already start with it."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or wrap.prefix.startswith(bos):
        return []
    probe = tokenizer("a").input_ids
    bos_id = tokenizer.bos_token_id
    return [bos_id] if probe and probe[0] == bos_id else []


def truncate(ids: list[int], max_tokens: int) -> tuple[list[int], bool]:
    """``ids`` cut to ``max_tokens``, and whether it was cut."""
    if len(ids) > max_tokens:
        return ids[:max_tokens], True
    return ids, False
