"""LangChain's ``CohereRerank`` against a running heedrank service: the obvious cases of
`/rerank` (one relevant document among 1, 2, 4 and 9 off-topic ones, in every position).

``langchain-cohere`` pins a Cohere SDK (5.x) that cannot be installed beside the project's
pinned one (7.3.1), so this runs in a venv of its own::

    python3 -m venv /tmp/lc && /tmp/lc/bin/pip install langchain-cohere
    heedrank serve --index indexes/nfcorpus --port 8766 &
    /tmp/lc/bin/python bench/langchain_rerank.py --url http://localhost:8766 --model rerank-v3.5

Prints each miss and the count of lists whose answer came first (docs/results/default.md, "LangChain").
"""

from __future__ import annotations

import argparse

ANSWER = "Water boils at 100 degrees Celsius at sea level; at altitude the boiling point of water is lower."
OFF_TOPIC = [
    "Tide tables list the times of high and low water at a harbour.",
    "The stock market closed higher on Friday after strong earnings reports.",
    "A sonnet is a poem of fourteen lines with a fixed rhyme scheme.",
    "Basketball teams have five players on the court at a time.",
    "The Great Wall of China is visible from many mountain passes.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The violin has four strings tuned in perfect fifths.",
    "Mount Everest is the highest mountain above sea level.",
    "Coffee beans are the roasted seeds of the Coffea plant.",
]
QUERY = "At what temperature does water boil?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://localhost:8766")
    parser.add_argument("--model", default="rerank-v3.5")
    args = parser.parse_args()
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(model=args.model, cohere_api_key="unused", base_url=args.url, top_n=3)
    first = total = 0
    for n in (2, 3, 5, 10):
        for pos in range(n):
            docs = OFF_TOPIC[: n - 1]
            docs = docs[:pos] + [ANSWER] + docs[pos:]
            out = reranker.compress_documents([Document(page_content=d) for d in docs], QUERY)
            total += 1
            if out[0].page_content == ANSWER:
                first += 1
            else:
                print(f"miss: {n} documents, answer sent at {pos}:",
                      [(d.page_content[:24], round(d.metadata["relevance_score"], 3)) for d in out])
    print(f"LangChain CohereRerank(model={args.model!r}): the answer first in {first}/{total} lists")


if __name__ == "__main__":
    main()
