"""SmolLM2's streams of similar requests (Lesson 14, ``python -m minigpt.bench --stream --model smollm2``).

Three kinds of work a deployed assistant does over and over, each as a development stream (to tune suffix
decoding's settings on) and a held-out stream (only ever reported). All written for this course; none shares a
text with the benchmark's requests (:mod:`minigpt.real.request_sets`) or the course's prompts:

* ``json``     -- structured extraction: the same instruction, a different short text each time; every answer
  repeats the same JSON skeleton, which only earlier *answers* hold (the prompt holds the keys, not the format);
* ``edit``     -- the same edit applied to a series of functions: each answer copies its function from the
  prompt and makes the change the previous answers made;
* ``followup`` -- a second turn that asks the assistant to restate its earlier answer with a change: the answer
  repeats the first turn's (in the prompt), in the words the previous follow-ups used;
* ``open``     -- the control: open questions on unrelated topics, where neither the request nor earlier answers
  hold what comes next (where suffix decoding should not help).

The first turns' assistant answers of ``followup`` are written here, not generated, so the requests are fixed.
"""
from __future__ import annotations

from ..prompts import Prompt
from ..streams import Stream, check_split
from .smollm import STOP, encode_chat, load_smollm_tokenizer

KINDS = ("json", "edit", "followup", "open")

_JSON_ASK = ("Text: {}\n\nReturn a JSON object with the keys \"name\", \"age\", \"city\" and \"job\" for the person "
             "in the text above.")

_JSON_TEXTS = {
    "dev": [
        "Marta Ruiz is 34 and has lived in Valencia for ten years, where she repairs bicycles in a small shop "
        "near the harbour.",
        "After moving to Leeds at the age of 27, Tom Becker found work as a night nurse at the city hospital.",
        "The new librarian in Graz, Anna Hofer, turned 45 last week and still cycles to work every morning.",
        "Kenji Sato, a 52-year-old carpenter from Sapporo, builds furniture from fallen trees.",
        "At 29, Priya Nair teaches chemistry at a secondary school in Pune and coaches its chess club.",
    ],
    "held-out": [
        "Lucas Moreau, 41, drives a delivery van in Lyon and plays the trumpet in a brass band on weekends.",
        "Olga Ivanova moved to Tallinn when she was 30; three years later she opened a bakery there.",
        "The town's only vet, 58-year-old Samuel Okafor, has worked in Enugu since the late nineties.",
        "Elena Costa is a 23-year-old software tester in Porto who spends her evenings learning Japanese.",
        "Jonas Lind, aged 37, guides kayak tours along the coast near Bergen every summer.",
    ],
}

_EDIT_ASK = ("Here is a function:\n```python\n{}\n```\nRewrite it with the parameter `data` renamed to `records`. "
             "Keep every other line as it is and return the complete function.")

_EDIT_FUNCTIONS = {
    "dev": [
        '''def count_active(data):
    total = 0
    for row in data:
        if row.get("active"):
            total += 1
    return total''',
        '''def newest_entry(data):
    if not data:
        return None
    best = data[0]
    for entry in data[1:]:
        if entry["date"] > best["date"]:
            best = entry
    return best''',
        '''def group_by_city(data):
    groups = {}
    for person in data:
        city = person["city"]
        groups.setdefault(city, []).append(person["name"])
    return groups''',
        '''def total_weight(data, unit="kg"):
    weight = sum(item["weight"] for item in data)
    if unit == "g":
        weight = weight * 1000
    return round(weight, 2)''',
        '''def drop_empty(data):
    kept = []
    for line in data:
        if line.strip():
            kept.append(line.strip())
    print("dropped", len(data) - len(kept), "lines")
    return kept''',
    ],
    "held-out": [
        '''def average_score(data):
    if len(data) == 0:
        return 0.0
    scores = [player["score"] for player in data]
    return sum(scores) / len(scores)''',
        '''def find_duplicates(data):
    seen = set()
    repeated = []
    for value in data:
        if value in seen:
            repeated.append(value)
        seen.add(value)
    return repeated''',
        '''def longest_name(data):
    name = ""
    for record in data:
        if len(record["name"]) > len(name):
            name = record["name"]
    return name''',
        '''def split_by_sign(data):
    positive, negative = [], []
    for number in data:
        if number >= 0:
            positive.append(number)
        else:
            negative.append(number)
    return positive, negative''',
        '''def cheapest_items(data, limit=3):
    ordered = sorted(data, key=lambda item: item["price"])
    names = [item["name"] for item in ordered[:limit]]
    print("found", len(names), "items")
    return names''',
    ],
}

_FOLLOWUP_ASK = "Repeat your list exactly, but add a fourth point at the end."

_FOLLOWUP_TURNS = {
    "dev": [
        ("Give me three tips for keeping a sourdough starter healthy.",
         "1. Feed it at the same time every day with equal weights of flour and water.\n"
         "2. Keep it in a clean jar at room temperature, away from direct sunlight.\n"
         "3. Discard part of it before each feeding so it does not grow too acidic."),
        ("Give me three tips for learning to juggle.",
         "1. Start with one ball and throw it from hand to hand at eye level.\n"
         "2. Add the second ball only when your throws land in the same place every time.\n"
         "3. Practise over a bed so you do not have to bend down for dropped balls."),
        ("Give me three tips for keeping a tidy kitchen.",
         "1. Wash the dishes right after each meal instead of letting them pile up.\n"
         "2. Wipe the counters every evening with a damp cloth.\n"
         "3. Keep only the tools you use every week within reach."),
        ("Give me three tips for writing a short story.",
         "1. Begin as close to the main event as you can.\n"
         "2. Give your main character one clear wish and one obstacle.\n"
         "3. Cut every scene that does not move the story forward."),
        ("Give me three tips for a long train journey.",
         "1. Bring a refillable bottle of water and a few simple snacks.\n"
         "2. Download films and music before you leave, since the signal may drop.\n"
         "3. Stand up and walk through the carriages every hour or so."),
    ],
    "held-out": [
        ("Give me three tips for growing tomatoes on a balcony.",
         "1. Choose a pot of at least twenty litres with holes in the bottom.\n"
         "2. Water the soil, not the leaves, early in the morning.\n"
         "3. Tie the main stem to a stick as soon as the plant is knee high."),
        ("Give me three tips for a first piano lesson.",
         "1. Sit at a height where your forearms are level with the keys.\n"
         "2. Learn where middle C is and find it without looking.\n"
         "3. Play slowly and evenly rather than fast and with mistakes."),
        ("Give me three tips for saving energy at home.",
         "1. Turn the heating down by one degree and wear a jumper.\n"
         "2. Switch devices off at the wall instead of leaving them on standby.\n"
         "3. Wash clothes at thirty degrees and dry them on a line."),
        ("Give me three tips for taking care of a houseplant.",
         "1. Water it only when the top of the soil feels dry.\n"
         "2. Put it near a window that gets bright but indirect light.\n"
         "3. Turn the pot a quarter turn every week so it grows evenly."),
        ("Give me three tips for running a good meeting.",
         "1. Send a short agenda to everyone the day before.\n"
         "2. Start on time, even if someone is missing.\n"
         "3. End by writing down who will do what, and by when."),
    ],
}


_OPEN = {
    "dev": ["Write a short poem about a lighthouse in winter.", "Why do onions make people cry?",
            "Suggest a name for a small bookshop and explain it in one sentence.",
            "What is the difference between a violin and a viola?", "Describe the smell of rain to someone."],
    "held-out": ["Write a short poem about a fox crossing a snowy field.", "Why do cats knock things off tables?",
                 "Suggest a name for a bicycle repair shop and explain it in one sentence.",
                 "What is the difference between a lake and a pond?", "Describe the taste of a lemon to someone."],
}


def stream_messages(kind: str, split: str) -> list[list[dict]]:
    """The chat messages of every request of one stream, in arrival order."""
    check_split(split)
    if kind == "json":
        return [[{"role": "user", "content": _JSON_ASK.format(t)}] for t in _JSON_TEXTS[split]]
    if kind == "edit":
        return [[{"role": "user", "content": _EDIT_ASK.format(f)}] for f in _EDIT_FUNCTIONS[split]]
    if kind == "followup":
        return [[{"role": "user", "content": q}, {"role": "assistant", "content": a},
                 {"role": "user", "content": _FOLLOWUP_ASK}] for q, a in _FOLLOWUP_TURNS[split]]
    if kind == "open":
        return [[{"role": "user", "content": q}] for q in _OPEN[split]]
    raise ValueError(f"unknown stream kind {kind!r}; kinds: {', '.join(KINDS)}")


def smollm2_stream(kind: str, split: str = "held-out", max_new_tokens: int = 96, n: int | None = None) -> Stream:
    """One of SmolLM2's streams, tokenized in its chat format (each request a
    :class:`~minigpt.prompts.Prompt` with ``kind`` and ``split``); answers end at ``<|im_end|>``. ``n``: the
    first n requests only."""
    enc = load_smollm_tokenizer()
    messages = stream_messages(kind, split)[:n]
    requests = [Prompt(encode_chat(enc, m), f"{kind}-{split}-{i + 1}", kind, split=split)
                for i, m in enumerate(messages)]
    return Stream(f"smollm2-{kind}-{split}", kind, split, requests, max_new_tokens,
                  enc.encode_single_token(STOP))


def smollm2_streams(split: str = "held-out", kinds=KINDS, max_new_tokens: int = 96, n: int | None = None
                    ) -> list[Stream]:
    """:func:`smollm2_stream` of every kind in ``kinds``."""
    return [smollm2_stream(k, split, max_new_tokens, n) for k in kinds]
