"""A varied, deterministic set of chat prompts for distilling the draft model.

Built from templates × topics, so the set is reproducible without any data set download.
The bench prompts (engine/bench) are kept out of it: `training_prompts()` drops any of them.
"""

from __future__ import annotations

import random

CONCEPTS = [
    "photosynthesis", "inflation", "a hash table", "gravity", "the immune system", "compound interest",
    "machine learning", "the French Revolution", "plate tectonics", "a black hole", "recursion",
    "supply and demand", "the greenhouse effect", "DNA replication", "a neural network", "democracy",
    "the stock market", "electric current", "vaccines", "the Roman Empire", "climate change", "encryption",
    "a binary search", "the theory of evolution", "cloud computing", "blockchain", "the human heart",
    "volcanoes", "the internet", "a compiler", "sleep", "memory in the brain", "renewable energy",
    "the moon's phases", "tides", "rainbows", "earthquakes", "a database index", "operating systems",
    "the scientific method", "opportunity cost", "probability", "entropy", "nuclear fusion", "antibiotics",
    "the printing press", "jazz music", "impressionist painting", "the Silk Road", "a mortgage",
]
SUBJECTS = [
    "a dragon who is afraid of the dark", "a robot learning to paint", "a lost cat in a big city",
    "two friends on a camping trip", "a baker who discovers a magic oven", "a girl who can talk to birds",
    "an astronaut stranded on Mars", "a detective solving a stolen cake mystery", "a tree that grows money",
    "a shy student giving a speech", "a pirate looking for treasure", "a village flooded by rain",
    "a time traveler visiting ancient Egypt", "an old man and his garden", "a dog who wants to fly",
    "a ghost who is lonely", "a chef competing in a contest", "a family moving to a new country",
    "a knight and a clever fox", "a scientist who shrinks herself", "the last day of summer",
    "a city without electricity", "a musician who lost her voice", "a snowman that does not melt",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a sentence",
    "finds the largest number in a list", "removes duplicates from a list", "computes the factorial of n",
    "reads a CSV file and prints each row", "sorts a list of dictionaries by a key", "merges two sorted lists",
    "checks whether a string is a palindrome", "returns the Fibonacci numbers up to n",
    "converts Celsius to Fahrenheit", "flattens a nested list", "counts vowels in a string",
    "returns the second largest element of a list", "validates an email address with a regex",
    "computes the average of a list of numbers", "finds common elements of two lists",
    "capitalizes the first letter of every word", "groups words by their first letter",
]
LANGUAGES = ["Python", "JavaScript", "Python", "C", "Java", "Rust", "Go", "Python"]
SENTENCES = [
    "me and him goes to the store yesterday and buyed some apple.",
    "The meeting have been moved to next week because of the holiday.",
    "I think that we should maybe try to perhaps finish the report soon if possible.",
    "Their going to announce the results tomorrow, but nobody know the exact time.",
    "The new phone is very good and it is very fast and it has a very good camera.",
    "We was planning to visit the museum but it were closed on monday.",
    "Please send me the files as soon as you can because I need them for the presentation.",
    "The cat sat on the mat and looked out of the window at the birds in the garden.",
    "Our team finished the project two days early and under budget.",
    "It is important to drink water, sleep well and exercise every day.",
    "The restaurant was crowded, the food was cold and the waiter forgot our order.",
    "Learning a new language takes time, patience and a lot of practice.",
]
PARAGRAPHS = [
    "The city council voted on Tuesday to expand the bike lane network by forty kilometers over the next "
    "three years. Supporters said the plan would reduce traffic and pollution, while some shop owners "
    "worried that removing parking spaces would hurt their business. The first new lanes open in spring.",
    "Honeybees communicate the location of flowers through a movement called the waggle dance. The angle "
    "of the dance relative to the sun shows the direction, and its length shows the distance. Other bees "
    "watch the dance and then fly straight to the food source.",
    "The company reported that sales grew by twelve percent in the last quarter, driven mostly by online "
    "orders. However, costs rose faster than expected because of higher shipping prices, so profits were "
    "flat. The chief executive said the company would invest in new warehouses to cut delivery times.",
    "Sleep plays a key role in memory. During deep sleep the brain replays what it learned during the day "
    "and moves it into long-term storage. People who sleep less than six hours remember less and make "
    "more mistakes the next day.",
    "The old lighthouse on the northern cliff was built in 1871 and guided ships for more than a century. "
    "It was replaced by an automatic beacon in 1985, and volunteers later turned it into a small museum "
    "about the history of the coast and the keepers who lived there.",
    "Python lists are mutable sequences that can grow and shrink, while tuples are immutable. Because "
    "tuples cannot change, they can be used as dictionary keys and are slightly faster to create. Lists "
    "are better when the collection needs to be modified.",
]
PEOPLE = ["my manager", "a customer", "my landlord", "a teacher", "a colleague", "the team", "a new client"]
EMAIL_TOPICS = ["a delayed delivery", "taking a day off", "a broken heater", "a project update",
                "rescheduling a meeting", "a thank-you for their help", "a mistake in an invoice"]
ACTIVITIES = ["studying for exams", "saving money", "learning to cook", "staying focused at work",
              "running a first marathon", "keeping houseplants alive", "public speaking", "writing a resume",
              "traveling on a budget", "learning to program", "sleeping better", "starting a garden"]
PAIRS = [("cats", "dogs"), ("Python", "JavaScript"), ("trains", "planes"), ("tea", "coffee"),
         ("renting", "buying a home"), ("SQL", "NoSQL databases"), ("summer", "winter"),
         ("electric cars", "petrol cars"), ("books", "movies"), ("TCP", "UDP"), ("lists", "arrays")]
THINGS = ["fruits that are red", "countries in South America", "programming languages", "musical instruments",
          "famous scientists", "healthy breakfast ideas", "board games for families", "ways to reduce waste",
          "planets in the solar system", "common interview questions", "words that rhyme with light"]
QUESTIONS = [
    "What is the capital of Australia?", "Why is the sky blue?", "How many legs does a spider have?",
    "Who wrote Romeo and Juliet?", "What causes the seasons on Earth?", "How does a bicycle stay upright?",
    "What is the boiling point of water at sea level?", "Why do leaves change color in autumn?",
    "How far is the moon from the Earth?", "What is the difference between weather and climate?",
    "Why do we have leap years?", "What does a CPU do?", "How do airplanes fly?", "What is a prime number?",
    "How do magnets work?", "Why is the ocean salty?", "What is the speed of light?",
    "How does the heart pump blood?", "What is an API?", "Why do cats purr?",
]


def _templates(rng: random.Random) -> list[str]:
    out = []
    for c in CONCEPTS:
        out += [f"Explain {c} in simple terms.", f"What is {c}? Give an example.",
                f"Explain {c} to a ten-year-old.", f"Write three short paragraphs about {c}."]
    for s in SUBJECTS:
        out += [f"Write a short story about {s}.", f"Write a poem about {s}.", f"Write a haiku about {s}."]
    for t in CODE_TASKS:
        out += [f"Write a {rng.choice(LANGUAGES)} function that {t}.",
                f"How do I write code that {t}? Explain step by step."]
    for s in SENTENCES:
        out += [f"Fix the grammar in this sentence: {s}", f"Rewrite this sentence to sound more formal: {s}",
                f"Translate into French: {s}", f"Repeat this sentence exactly, then explain it: {s}"]
    for p in PARAGRAPHS:
        out += [f"Summarize this text in two sentences:\n\n{p}", f"Give this text a title and summarize it:\n\n{p}",
                f"Rewrite this text in simpler words:\n\n{p}", f"List the key facts in this text:\n\n{p}",
                f"Quote the most important sentence of this text and explain why:\n\n{p}"]
    for p in PEOPLE:
        for t in EMAIL_TOPICS:
            out.append(f"Write a short email to {p} about {t}.")
    for a in ACTIVITIES:
        out += [f"Give me five tips for {a}.", f"What are common mistakes people make when {a}?"]
    for a, b in PAIRS:
        out += [f"Compare {a} and {b}.", f"What are the pros and cons of {a} versus {b}?"]
    for t in THINGS:
        out += [f"List five {t}.", f"Name some {t} and say one thing about each."]
    out += QUESTIONS
    return out


def training_prompts(n: int | None = None, seed: int = 0, exclude: tuple[str, ...] = ()) -> list[str]:
    """Up to `n` varied prompts, in a fixed shuffled order; `exclude` (bench prompts) left out."""
    rng = random.Random(seed)
    prompts = [p for p in dict.fromkeys(_templates(rng)) if p not in set(exclude)]
    rng.shuffle(prompts)
    return prompts[:n] if n else prompts
