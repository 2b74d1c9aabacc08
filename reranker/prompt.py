"""Token-level prompt assembly shared by the attention rerankers.

Prompts are built from *pieces* tokenised separately and concatenated as token ids, so
that (a) every document's token span is known exactly, and (b) untrusted text (documents
and queries) is tokenised with ``split_special_tokens=True``: a document that contains
``<|im_end|>`` or any other special/chat-control string stays plain text and can never
produce a special token. Only the trusted template (chat wrapper, instructions) may
contain special tokens.

Thread safety (:class:`TokenEncoder`): a ``transformers`` fast tokenizer is not safe to call
from two threads at once. Each call first writes its options into the one Rust tokenizer it
wraps (``encode_special_tokens`` for ``split_special_tokens``, truncation, padding) and then
encodes, so a call that runs between another's write and its encoding uses the other's options:
a query block's ``<|im_end|>`` split into plain tokens, or a document's special-token string
honoured. Two rerank passes tokenising at once did this (scores moved by 0.27 to 1.1). So every
tokenisation here goes through :func:`token_encoder`: two private copies of the Rust tokenizer,
one that splits special-token strings and one that honours them, configured once and never
written again, which any number of threads may read at once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class TokenEncoder:
    """Thread-safe tokenisation of one tokenizer's trusted and untrusted text.

    Attributes:
        tokenizer: The ``transformers`` tokenizer (for what the copies cannot do: BOS, decoding).
        trusted: A private copy of its Rust tokenizer that honours special-token strings, or
            ``None`` (a slow tokenizer: every call then holds :attr:`lock`).
        untrusted: A private copy that splits them into plain tokens, or ``None``.
        lock: Held around every call of :attr:`tokenizer` itself (its options are written
            per call); the copies are never written after construction and need none.
    """

    tokenizer: Any
    trusted: Any
    untrusted: Any
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, tokenizer: Any) -> TokenEncoder:
        """The encoder of ``tokenizer`` (its Rust tokenizer copied twice through its JSON form,
        without truncation or padding)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_special_tokens"):
            return cls(tokenizer, None, None)
        from tokenizers import Tokenizer

        copies = []
        for split in (False, True):
            copy = Tokenizer.from_str(backend.to_str())
            copy.no_truncation()
            copy.no_padding()
            copy.encode_special_tokens = split
            copies.append(copy)
        return cls(tokenizer, copies[0], copies[1])

    def ids(self, texts: Sequence[str], *, trusted: bool) -> list[list[int]]:
        """Token ids of each text, no special tokens added (trusted: special-token strings are
        honoured; untrusted: split into plain tokens); ``[]`` for an empty text."""
        if not texts:
            return []
        backend = self.trusted if trusted else self.untrusted
        if backend is not None:
            return [list(e.ids) for e in backend.encode_batch(list(texts), add_special_tokens=False)]
        with self.lock:
            enc = self.tokenizer(list(texts), add_special_tokens=False, split_special_tokens=not trusted).input_ids
        return [list(ids) for ids in enc]

    def offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Untrusted ``text``'s token ids and each token's ``(start, end)`` character range.

        Raises:
            NotImplementedError: a slow tokenizer (no offsets).
        """
        if self.untrusted is not None:
            e = self.untrusted.encode(text, add_special_tokens=False)
            return list(e.ids), [tuple(o) for o in e.offsets]
        with self.lock:
            enc = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
        return list(enc.input_ids), [tuple(o) for o in enc.offset_mapping]

    def call(self, text: str) -> list[int]:
        """``tokenizer(text).input_ids`` with its own defaults (special tokens added), under :attr:`lock`."""
        with self.lock:
            return list(self.tokenizer(text).input_ids)


_ENCODERS: weakref.WeakKeyDictionary[Any, TokenEncoder] = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def token_encoder(tokenizer: Any) -> TokenEncoder:
    """The one :class:`TokenEncoder` of ``tokenizer`` (made on first use, kept while it lives)."""
    try:
        return _ENCODERS[tokenizer]
    except (KeyError, TypeError):
        pass
    with _ENCODERS_LOCK:
        encoder = _ENCODERS.get(tokenizer)
        if encoder is None:
            encoder = TokenEncoder.of(tokenizer)
            _ENCODERS[tokenizer] = encoder
        return encoder


def encode_trusted(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text (special tokens in it are honoured; no BOS/EOS added)."""
    return token_encoder(tokenizer).ids([text], trusted=True)[0] if text else []


def encode_untrusted(tokenizer: Any, text: str) -> list[int]:
    """Token ids of untrusted text: special-token strings are split into plain tokens."""
    return token_encoder(tokenizer).ids([text], trusted=False)[0] if text else []


def encode_untrusted_batch(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """:func:`encode_untrusted` of each text, in one batched call of the Rust tokenizer."""
    return token_encoder(tokenizer).ids(texts, trusted=False)


def bos_ids(tokenizer: Any, wrap: ChatWrap) -> list[int]:
    """The BOS token to start a prompt with, when the tokenizer adds one and the chat
    template does not already start with it."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or wrap.prefix.startswith(bos):
        return []
    probe = token_encoder(tokenizer).call("a")
    bos_id = tokenizer.bos_token_id
    return [bos_id] if probe and probe[0] == bos_id else []


def truncate(ids: list[int], max_tokens: int) -> tuple[list[int], bool]:
    """``ids`` cut to ``max_tokens``, and whether it was cut."""
    if len(ids) > max_tokens:
        return ids[:max_tokens], True
    return ids, False
