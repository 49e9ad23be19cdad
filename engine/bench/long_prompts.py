"""The long prompt set: the notes of a small bakery (`bench kv`'s chat, `bench peer`'s history) and a
~1,400-token chat history of them, closed by one of several questions (`bench kv --kv-dtypes`)."""

from __future__ import annotations

ARTICLE = (
    "Our team runs a small bakery in a coastal town. We open at six, bake three kinds of bread, croissants "
    "and a seasonal fruit tart, and we close at two in the afternoon. Last year we added a second oven, "
    "hired two apprentices and started selling to four cafes nearby. Sales grew by a third, but so did our "
    "costs: flour and butter prices rose sharply, the new oven uses more electricity than we planned, and "
    "the apprentices need a lot of supervision in their first months. Customers love the sourdough and the "
    "tart, but the croissants sell out by nine and we throw away about a fifth of the rye loaves every day. "
    "The cafes pay late, often after sixty days, which makes buying flour in bulk hard. We are thinking "
    "about three changes for next year: opening on Sunday mornings, baking fewer rye loaves and more "
    "croissants, and asking the cafes to pay within thirty days or pay a little more. We also wonder "
    "whether to offer a bread subscription, where regular customers pay monthly and pick up a loaf each "
    "morning, which would give us steady income and tell us how much to bake. Our worries are burnout, "
    "because the two owners already work six days a week, and losing the cafes if we push them too hard "
    "on payment terms. The town gets many tourists in summer and few in winter, so sales swing a lot "
    "between seasons, and in January we sometimes sell half of what we sell in July."
)

LONG_ASKS = (
    "Give us a plan for next year in three bullets.",
    "Which of our worries is the most serious, and what would you do about it?",
    "Write a two-sentence note to our staff about the changes.",
    "What should we measure each week to know whether the plan works?",
    "List the costs that rose last year, most serious first.",
)


def long_prompts(n: int = len(LONG_ASKS)) -> list[list[dict]]:
    """The first `n` long prompts as chat messages: the notes four times over, each with a short reply, then an ask."""
    history = []
    for i, ask in enumerate(("Summarize the main problems.", "Which change would you try first?",
                             "How could we waste less bread?", "What are the risks of Sunday opening?")):
        history += [{"role": "user", "content": f"Notes, part {i + 1}:\n\n{ARTICLE}\n\n{ask}"},
                    {"role": "assistant", "content": "Here is a short answer based on the notes above."}]
    return [history + [{"role": "user", "content": ask}] for ask in LONG_ASKS[:n]]
