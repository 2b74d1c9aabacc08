"""The write path of an :class:`heedrank.index.store.Index`: adding (or replacing) and deleting
documents durably while it serves.

An add checks the documents, encodes them with no lock held, then under the write lock
(:attr:`~heedrank.index.store.Index.rw`) commits them to the document store in one
transaction and applies the change to the in-memory parts (:mod:`heedrank.index.updates`);
a delete does the same without encoding. Callers use
:meth:`~heedrank.index.store.Index.add_documents` and
:meth:`~heedrank.index.store.Index.delete_documents`, which delegate here; their docstrings
are the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.index import updates
from heedrank.types import Document

if TYPE_CHECKING:
    from heedrank.index.store import Index


def add_documents(index: Index, docs: Iterable[Document]) -> dict[str, Any]:
    """See :meth:`heedrank.index.store.Index.add_documents`."""
    index.check_writable()
    docs = list(docs)
    if not docs:
        return {"added": [], "replaced": [], "vids": {}}
    from heedrank.index.docstore import _check_unique, metadata_json

    _check_unique(docs)
    for d in docs:
        metadata_json(d)
    if index.bm25.avgdl is None:
        raise ValidationError("this index's BM25 has no build statistics; rebuild it to add documents")
    vecs = index.encode_documents(docs) if index.dense is not None else None
    with index.rw.write():
        result = index.docstore.upsert(docs, vecs)
        updates.apply_add(index, result, docs, vecs)
    return {
        "added": [d for d, _, old in result if old is None],
        "replaced": [d for d, _, old in result if old is not None],
        "vids": {d: vid for d, vid, _ in result},
    }


def delete_documents(index: Index, doc_ids: Sequence[str]) -> dict[str, Any]:
    """See :meth:`heedrank.index.store.Index.delete_documents`."""
    index.check_writable()
    wanted = list(dict.fromkeys(doc_ids))
    with index.rw.write():
        gone = index.docstore.delete(wanted)
        if gone:
            updates.drop_vids(index, np.array([v for _, v in gone], dtype=np.int64))
            index.clear_filter_cache()
    deleted = {d for d, _ in gone}
    return {"deleted": [d for d in wanted if d in deleted], "missing": [d for d in wanted if d not in deleted]}
