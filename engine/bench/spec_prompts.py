"""Prompt sets of the speculative-decoding benches (kept out of the draft's training prompts)."""

from engine.bench import CHAT_PROMPTS

# Ordinary, open-ended chat: nothing to copy from the prompt.
DRAFT_PROMPTS = CHAT_PROMPTS + [
    "How does a microwave oven heat food?",
    "Write a short poem about autumn leaves.",
    "What should I pack for a weekend hiking trip?",
    "Explain the difference between a virus and a bacterium.",
    "Give me a simple recipe for pancakes.",
    "Why do people procrastinate, and how can they stop?",
]

_CODE = '''def total_price(items, tax):
    total = 0
    for item in items:
        total = total + item["price"] * item["quantity"]
    total = total + total * tax
    return total


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
'''

_ARTICLE = (
    "The town of Millbrook opened its new public library on Saturday after two years of construction. "
    "The building has three floors, a children's reading room and a rooftop garden. \"We wanted a place "
    "where everyone feels welcome,\" said the head librarian, Maria Lopez. The library cost 12 million "
    "dollars, most of it paid by a state grant. Opening hours are 9 a.m. to 8 p.m. every day except Sunday. "
    "More than two thousand people visited on the first day, and the library issued 450 new library cards."
)

_TYPOS = (
    "Our compnay is pleased to anounce that the new ofice will open on Monday. All employes should bring "
    "there badges and arrive before nine oclock. Parking is avalable behind the bulding, and lunch will be "
    "provided in the main hall. If you have any questons, please contact the front desk."
)

# Copy-heavy: the reply repeats long spans of the prompt (edit, summarise with quotes, rewrite code).
# Phrased so that the right answer copies ("change nothing else"); the bundled 135M model
# paraphrases looser requests, and then there is little to look up.
LOOKUP_PROMPTS = [
    f"Correct the spelling of the misspelled words in this text. Keep every other word exactly the same "
    f"and return the whole text:\n\n{_TYPOS}",
    f"Rewrite this text, replacing \"Millbrook\" with \"Oakdale\" and changing nothing else:\n\n{_ARTICLE}",
    f"Quote the first three sentences of this article word for word, then summarize the rest in one "
    f"sentence:\n\n{_ARTICLE}",
    f"Repeat the following text exactly, then add one sentence at the end:\n\n{_ARTICLE}",
    f"Rename the function `cheapest` to `lowest_price` in this code. Return the complete code with "
    f"nothing else changed:\n\n```python\n{_CODE}```",
    f"Copy this Python code exactly and add a one-line comment above each function:\n\n```python\n{_CODE}```",
]

BENCH_PROMPTS = DRAFT_PROMPTS + LOOKUP_PROMPTS
