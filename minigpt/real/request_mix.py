"""A broad, seeded mix of chat requests for distilling SmolLM2's drafters at scale (Lessons 09b and 10).

A draft guesses well what it has seen its target say, so the distillation requests should look like what a
chat assistant is asked: small talk and advice, explanations, code to write or change, text to rewrite,
summarise, extract from or translate, word problems, and second turns asked after the first answer exists.
:func:`request_mix` builds thousands of them offline, from templates written here and from text already on
the machine: the standard library's *training* files (:func:`minigpt.data.split_files`) give functions to
explain or change and docstrings to summarise, rewrite and translate. Nothing is downloaded.

None of them shares a text, or a run of :data:`NGRAM` words, with the benchmark's requests
(:data:`~minigpt.real.request_sets.REQUESTS`, :data:`~minigpt.real.request_sets.HELD_OUT_REQUESTS`) or with the
suffix-decoding streams (:mod:`minigpt.real.streams`): requests that would are dropped as the mix is drawn.

The mix is a sequence: ``request_mix(n)[:m] == request_mix(m)``, so a longer run extends a shorter one.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from ..data import cache_dir, read_text, split_files, stdlib_root
from . import streams
from .request_sets import CODE_TASKS, EXPLAIN_TOPICS, HELD_OUT_REQUESTS, REQUESTS, TIP_ACTIVITIES

KINDS = ("chat", "explain", "code", "rewrite", "summarise", "extract", "translate", "math", "followup")
WEIGHTS = dict(chat=0.14, explain=0.12, code=0.22, rewrite=0.08, summarise=0.08, extract=0.08, translate=0.06,
               math=0.08, followup=0.14)
NGRAM = 12  # words: no run this long in common with a protected text


@dataclass(frozen=True)
class MixRequest:
    """One request: its kind, the user's turns (a later turn is asked after the assistant has answered the one
    before), the template family it came from, and ``index``: its position among the mix's draws."""
    kind: str
    turns: tuple[str, ...]
    family: str
    index: int = -1


# ------------------------------------------------------------------------------------------ protected text

def protected_texts() -> list[str]:
    """Every text the mix must not share: the benchmark's requests and every message of the streams."""
    texts = [t for _, t in REQUESTS + HELD_OUT_REQUESTS]
    for kind in streams.KINDS:
        for split in ("dev", "held-out"):
            texts += [m["content"] for conv in streams.stream_messages(kind, split) for m in conv]
    return texts


def word_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The runs of ``n`` whitespace-separated words of ``text``, lower-cased."""
    words = text.lower().split()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@lru_cache(maxsize=1)
def _protected() -> tuple[frozenset[str], frozenset[tuple[str, ...]], tuple[str, ...]]:
    texts = protected_texts()
    short = tuple(f" {' '.join(t.lower().split())} " for t in texts if len(t.split()) < NGRAM)
    return frozenset(t.strip() for t in texts), frozenset(g for t in texts for g in word_ngrams(t)), short


def shares_protected_text(text: str) -> bool:
    """Whether ``text`` is a protected text, holds a run of :data:`NGRAM` words of one, or holds the whole of
    a protected text shorter than that (words compared lower-cased)."""
    exact, grams, short = _protected()
    if text.strip() in exact or not grams.isdisjoint(word_ngrams(text)):
        return True
    words = f" {' '.join(text.lower().split())} "
    return any(s in words for s in short)


# ------------------------------------------------------------------------------- the standard library's text

MATERIAL_VERSION = 2


def stdlib_material() -> dict:
    """From the standard library's training files: ``functions`` (source of 4-30-line functions and methods,
    dedented, and the names they assign), ``paragraphs`` (prose paragraphs of docstrings, 25-150 words) and
    ``api`` (``module.function`` of public module-level functions with a docstring). Parsing every file takes
    a while, so the result is kept in the minigpt cache folder (keyed by the library's path and this code's
    version)."""
    key = hashlib.sha1(f"{stdlib_root()}|{MATERIAL_VERSION}".encode()).hexdigest()[:12]
    path = cache_dir() / f"stdlib-material-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    material = _parse_material()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")   # one per process: several may build it at once
    tmp.write_text(json.dumps(material))
    tmp.replace(path)
    return material


def _is_prose(paragraph: str) -> bool:
    words = paragraph.split()
    if not 25 <= len(words) <= 150 or not paragraph.isascii() or ">>>" in paragraph:
        return False
    odd = sum(c in "{}[]()=<>*`|_\\:;" for c in paragraph)
    return odd <= len(paragraph) // 60 and paragraph[0].isupper() and paragraph.rstrip()[-1] in ".!?"


def _parse_material() -> dict:
    root = stdlib_root()
    functions, paragraphs, api = [], [], []
    for path in split_files("train"):
        try:
            source = read_text(path)
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        source_lines = source.splitlines()
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node) or ""
                for par in re.split(r"\n\s*\n", doc):
                    par = " ".join(par.split())
                    if _is_prose(par):
                        paragraphs.append(par)
            if not isinstance(node, ast.FunctionDef):
                continue
            if (node in tree.body and not node.name.startswith("_") and "." not in module.split(".")[-1]
                    and not module.split(".")[-1].startswith("_") and ast.get_docstring(node)):
                api.append(f"{module}.{node.name}")
            if not 4 <= node.end_lineno - node.lineno + 1 <= 30:
                continue
            lines = source_lines[node.lineno - 1:node.end_lineno]
            indent = len(lines[0]) - len(lines[0].lstrip())
            if any(line.strip() and not line.startswith(lines[0][:indent]) for line in lines):
                continue  # a string literal reaching left of the def: not cleanly dedented
            code = "\n".join(line[indent:] for line in lines)
            if len(code) > 1200 or not code.isascii():
                continue
            names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
            functions.append([code, names])
    seen: set[str] = set()
    paragraphs = [p for p in paragraphs if not (p in seen or seen.add(p))]
    return dict(functions=functions, paragraphs=paragraphs, api=sorted(set(api)))


# ---------------------------------------------------------------------------------------- the templates

# beside request_sets' topics (EXPLAIN_TOPICS, TIP_ACTIVITIES), which the mix uses too
TOPICS = [
    "why leaves change colour in autumn", "how vaccines train the immune system", "how airplane wings make lift",
    "how data travels across the internet", "what DNA does in a cell", "why exercise strengthens the heart",
    "how recycling paper works", "why bread dough rises", "how caffeine affects the body",
    "why plants need sunlight", "how a microwave oven heats food", "how a mortgage works", "how a car engine works",
    "why metals conduct electricity", "how the heart pumps blood", "what a supply chain is",
    "how a touch screen detects a finger", "why we have leap years", "how noise-cancelling headphones work",
    "what an electric circuit is", "how clouds form", "what a budget deficit is", "how antibiotics work",
    "why the Roman Empire fell", "how a printing press works", "what the water cycle is", "how a lock and key work",
    "what a galaxy is", "how sound travels", "why some materials are magnetic", "how a thermostat works",
    "what an allergy is", "how glass is made", "why stars twinkle", "how a hydroelectric dam makes power",
    "what a food chain is", "how fingerprints form", "how a camera lens focuses light", "what a credit score is",
    "how wind turbines work", "why volcanoes erupt", "what an ecosystem is", "how the stock market works",
    "how a 3D printer works", "why we get fevers", "how elections count votes", "what the speed of light means",
    "how a QR code stores data", "what a carbon footprint is", "how muscles grow after exercise",
    "how a washing machine cleans clothes", "why the Dead Sea is so salty", "what a time zone is",
    "how coral reefs form", "what interest rates do", "how a submarine dives and surfaces",
    "why onions make people cry", "how a smoke detector works", "what a calorie is", "how maps are drawn",
    "why the Earth has a magnetic field", "how a lightbulb makes light", "what a patent is", "how yeast makes beer",
    "why rivers bend", "how a hearing aid works",
]
TOPICS = EXPLAIN_TOPICS + TOPICS
CONCEPTS = [
    "recursion", "a hash table", "a linked list", "Big O notation", "a closure in Python", "a Python decorator",
    "a generator in Python", "list comprehensions", "object-oriented programming", "inheritance",
    "a REST API", "a race condition", "a deadlock", "garbage collection", "a binary search tree",
    "dynamic programming", "a unit test", "a virtual environment in Python", "a regular expression",
    "the difference between a process and a thread", "a cache", "a compiler", "an interpreter",
    "a stack and a queue", "a context manager in Python", "exceptions in Python", "type hints in Python",
    "a SQL join", "a primary key", "JSON", "a merge conflict in git", "a pull request", "continuous integration",
    "a hash function", "public-key cryptography", "a load balancer", "a container such as Docker",
    "an algorithm", "binary numbers", "floating-point rounding errors", "a pointer", "a callback function",
    "asynchronous programming", "a lambda function", "immutability", "a sorting algorithm", "a graph",
    "breadth-first search", "memoization", "a mutex", "an iterator in Python", "dependency injection",
    "the difference between == and is in Python", "a Python dictionary", "slicing in Python",
    "the *args and **kwargs syntax", "f-strings in Python", "a byte and a bit", "Unicode", "a file system",
]
EXPLAIN_TEMPLATES = ["Explain {}.", "Explain {} to a ten-year-old.", "Explain {} in three sentences.",
                     "Can you tell me {}?", "I never understood {}. Can you explain it simply?",
                     "Write a short paragraph that explains {}."]
CONCEPT_TEMPLATES = ["What is {}?", "Explain {} with a small example.", "Explain {} to a beginner programmer.",
                     "When should I use {}?", "Give me a simple explanation of {}, with an example."]
API_TEMPLATES = ["What does `{}` do in Python? Show a short example.", "How do I use `{}`?",
                 "Explain the Python function `{}` and when to use it."]

ACTIVITIES = [
    "falling asleep faster", "saving money on food", "cooking healthy meals on a budget", "travelling on a budget",
    "organising a birthday party", "taking better photos with a phone", "making new friends in a new city",
    "drinking more water", "studying for a maths exam", "learning to swim as an adult", "painting a room",
    "training a puppy", "writing a resume", "negotiating a salary", "learning the guitar", "keeping a journal",
    "meal prepping", "speaking up in meetings", "moving house", "camping for the first time", "cycling to work",
    "hosting a dinner party", "learning to draw", "becoming a morning person", "staying warm in winter",
    "teaching a child to ride a bike", "writing a speech for a wedding", "cleaning a cast iron pan",
    "making a small apartment feel bigger", "choosing a laptop", "learning touch typing", "running a book club",
]
ACTIVITIES = TIP_ACTIVITIES + ACTIVITIES
TIP_TEMPLATES = ["What are some good tips for {}?", "Give me five tips for {}.", "I need advice on {}.",
                 "What mistakes do people make when {}?", "How do I get better at {}?"]

SUBJECTS = [
    "the sea", "a rainy afternoon", "an old lighthouse", "a lost umbrella", "the first snow", "a city at night",
    "a cat watching birds", "autumn leaves", "a broken clock", "a train leaving the station", "the moon",
    "a cup of coffee", "a forgotten garden", "a paper boat", "the desert", "a thunderstorm", "a lonely robot",
    "a library at midnight", "a mountain lake", "a street market", "a kite", "a grandmother's kitchen",
    "a snail", "the last day of school", "a foggy morning", "a bicycle", "a dragon who is afraid of the dark",
    "a talking tree", "a spaceship", "a small island", "a busy bakery", "a shy penguin", "an old map",
    "a fox in the snow", "a school bus", "a sunflower", "a river", "a clock tower", "a pair of old shoes",
    "a garden gnome", "a rainy bus stop", "a haunted house", "a firefly", "the ocean floor", "a fisherman",
]
FORMS = ["Write a short poem about {}.", "Write a haiku about {}.", "Write a limerick about {}.",
         "Write a very short story about {}.", "Write a four-line rhyme about {}.",
         "Describe {} in three vivid sentences.", "Write a children's story about {} in under 150 words."]
RECIPIENTS = ["my manager", "a colleague", "my landlord", "a customer", "my neighbour", "a teacher",
              "a hiring manager", "my team", "a hotel", "a friend I have not seen for years"]
PURPOSES = ["asking for a day off next Friday", "saying I will be late to the meeting",
            "thanking them for their help last week", "asking about the status of my order",
            "reporting a broken heater", "inviting them to a small party", "apologising for a missed call",
            "asking for feedback on my report", "confirming a booking for two nights",
            "following up after a job interview", "asking to move our meeting to Tuesday",
            "explaining a delay in the project", "requesting a refund"]
PAIRS = [("a list", "a tuple in Python"), ("weather", "climate"), ("a virus", "a bacterium"), ("RAM", "storage"),
         ("git merge", "git rebase"), ("HTTP", "HTTPS"), ("a crocodile", "an alligator"), ("baking soda", "baking powder"),
         ("a latte", "a cappuccino"), ("speed", "velocity"), ("a simile", "a metaphor"), ("an LED", "a normal bulb"),
         ("TCP", "UDP"), ("a library", "a framework"), ("SQL", "NoSQL databases"), ("a fruit", "a vegetable"),
         ("affect", "effect"), ("a comet", "an asteroid"), ("mass", "weight"), ("a loan", "a grant"),
         ("a class", "an object"), ("a compiler", "an interpreter"), ("frost", "dew"), ("a lake", "a pond"),
         ("a hurricane", "a tornado"), ("a monkey", "an ape"), ("stocks", "bonds"), ("a CPU", "a GPU"),
         ("a democracy", "a republic"), ("a symphony", "a concerto"), ("Python 2", "Python 3")]
COMPARE_TEMPLATES = ["What is the difference between {} and {}?", "Compare {} and {} in a few sentences.",
                     "How is {} different from {}?"]
QUESTIONS = [
    "What is a good name for a pet goldfish?", "Can you suggest an easy dinner with rice and beans?",
    "How do I boil an egg so the yolk stays soft?", "Which houseplants are hard to kill?",
    "How many hours of sleep does a teenager need?", "What are the rules of tic-tac-toe?",
    "What can I do on a rainy Sunday?", "How do I remove a coffee stain from a shirt?",
    "What is a good way to start learning chess?", "Why do people yawn?", "What makes a good friend?",
    "Suggest a name for a small bookshop.", "What are some fun things to do in winter?",
    "How do I say no politely?", "What is the best way to memorise a poem?", "How can I be more patient?",
    "What should I bring to a picnic?", "Plan a one-week workout routine for a beginner.",
    "Write a riddle and give the answer.", "Tell me a joke about computers.", "Write a short motivational message.",
    "Suggest three board games for a family evening.", "What are healthy snacks for work?",
    "Write a toast for a friend's birthday.", "How do I make a paper aeroplane?", "What are the planets in order?",
    "Describe your perfect weekend.", "What questions should I ask when renting a flat?",
    "What is a good hobby for someone who likes being outside?", "How do I write a haiku?",
]
DESTINATIONS = ["Lisbon", "Kyoto", "the Scottish Highlands", "Rome", "a small seaside town", "Vienna", "Iceland",
                "the Alps", "Barcelona", "Istanbul", "a national park", "Prague", "the Greek islands", "Copenhagen",
                "Marrakesh", "New Zealand", "Vancouver", "a quiet countryside village", "Budapest", "Mexico City"]
DISHES = ["a vegetable soup", "pancakes", "a simple curry", "lentil salad", "banana bread", "tomato pasta",
          "fried rice", "a fruit crumble", "hummus", "a mushroom risotto", "scrambled eggs", "chocolate chip cookies",
          "a Greek salad", "potato gratin", "vegetable stir-fry", "lemonade", "porridge", "a quick pizza dough",
          "roasted carrots", "a bean chili"]
GENRES = ["science fiction", "mystery stories", "history", "comedy", "nature documentaries", "fantasy",
          "biographies", "puzzles", "cooking", "space exploration", "detective series", "classic novels"]
MEDIA = ["books", "films", "podcasts", "board games"]
SITUATIONS = ["my friend keeps cancelling our plans", "my neighbour plays loud music at night",
              "my colleague takes credit for my work", "I forgot my friend's birthday",
              "my roommate never does the dishes", "I have too much homework this week",
              "my child does not want to read", "I feel nervous before every exam",
              "I lent money to a friend who has not paid it back", "my team missed an important deadline",
              "I want to change careers but I am scared", "my dog barks whenever the doorbell rings"]
DEBATES = ["working from home", "electric cars", "social media", "school uniforms", "living in a big city",
           "learning two languages at once", "a four-day work week", "homework for young children",
           "online shopping", "keeping a pet", "renting instead of buying a home", "self-driving cars",
           "video games", "public transport", "nuclear power", "studying abroad", "smartphones for children",
           "reading e-books instead of paper books", "open-plan offices", "working night shifts"]
ANIMALS = ["octopus", "elephant", "honeybee", "penguin", "hedgehog", "blue whale", "owl", "chameleon", "ant",
           "wolf", "koala", "sea turtle", "bat", "crow", "dolphin", "giraffe", "frog", "jellyfish", "beaver", "camel"]
WORDS = ["serendipity", "ubiquitous", "ephemeral", "meticulous", "resilient", "candid", "pragmatic", "eloquent",
         "nostalgia", "ambiguous", "frugal", "tenacious", "benevolent", "lethargic", "verbose", "whimsical",
         "diligent", "obsolete", "plausible", "reluctant", "spontaneous", "tedious", "vivid", "zealous"]
HOWTO = ["read a file line by line", "sort a dictionary by its values", "remove duplicates from a list",
         "measure how long code takes to run", "read command-line arguments", "make an HTTP request",
         "format a date as text", "handle an exception", "write a class with a property", "merge two lists",
         "check if a file exists", "create a virtual environment", "split a string on commas",
         "round a number to two decimals", "loop over a dictionary", "reverse a list", "install a package",
         "write to a CSV file", "copy a file", "get the current date and time", "parse JSON text",
         "count items with a Counter", "run two functions at the same time", "debug a script with pdb",
         "generate random numbers", "work with paths using pathlib", "use a set to find common items",
         "write a simple unit test", "use enumerate in a loop", "convert a string to a number safely"]
NOTE_EVENTS = ["the team lunch", "the quarterly review", "the school concert", "the yoga class",
               "the book club meeting", "the open day", "the fire drill", "the product launch", "the training session"]
NOTE_REASONS = ["the main hall is being painted", "several people are travelling", "the heating is broken",
                "the speaker is ill", "the weather forecast is bad", "the room was double-booked"]
NOTE_ACTIONS = ["bring your own water bottle", "reply by Thursday if you cannot come", "arrive ten minutes early",
                "park behind the building", "bring a laptop", "tell your manager if you need a new time",
                "wear comfortable shoes", "check your email for the new link"]

CODE_EXTRA_TASKS = [
    "parses a query string into a dictionary", "finds the longest increasing subsequence", "checks a Sudoku row",
    "counts the frequency of each character", "returns the mode of a list", "removes vowels from a string",
    "converts a hexadecimal string to decimal", "computes the nth triangular number",
    "finds the k most frequent words in a text", "reverses the words in a sentence", "checks whether a number is even",
    "generates a multiplication table as a list of lists", "returns the maximum depth of a binary tree",
    "implements a stack with a list", "returns the difference between two dates in days",
    "sums all numbers in a nested list", "checks whether a string is a valid IPv4 address",
    "converts minutes to hours and minutes", "returns the first duplicate in a list",
    "implements run-length decoding", "merges two dictionaries", "finds all divisors of a number",
    "returns the product of a list", "finds the index of the smallest element", "computes simple interest",
    "converts kilometres to miles", "returns the number of days in a month", "checks whether a word is an isogram",
    "returns every other element of a list", "capitalises the first letter of a sentence",
    "counts the digits of an integer", "generates Pascal's triangle", "computes a moving sum over a window",
    "sorts a list of tuples by the second item", "checks whether two rectangles overlap",
    "returns the least common multiple of two numbers", "converts a list of words into a sentence",
    "returns the files in a folder that end with .txt", "reads a CSV file into a list of dictionaries",
    "counts the blank lines in a file", "implements a simple LRU cache", "implements a priority queue with heapq",
    "returns the prime factors of a number", "computes the BMI from weight and height",
    "normalises a list of numbers to the range 0 to 1", "checks whether a matrix is symmetric",
    "rounds a number to the nearest multiple of five", "removes None values from a dictionary",
    "returns the longest palindromic substring", "validates a password against simple rules",
]
CODE_TEMPLATES = ["Write a Python function that {}.", "Write a Python function that {}. Include a docstring.",
                  "Show me Python code that {}, and explain it briefly.", "Write a JavaScript function that {}.",
                  "Write a Python function that {}, with type hints and one example call.",
                  "How can I write a function that {}? Use Python.", "Write a short Python program that {}."]
FUNCTION_TEMPLATES = [
    ("Explain what this function does:\n```python\n{code}\n```", "explain"),
    ("Add type hints to this function and return the whole function.\n```python\n{code}\n```", "hints"),
    ("Add a docstring to this function. Return the complete function.\n```python\n{code}\n```", "docstring"),
    ("Rename the variable `{name}` to `{new}` in this function and show the full function.\n```python\n{code}\n```",
     "rename"),
    ("Write two pytest tests for this function:\n```python\n{code}\n```", "tests"),
    ("Add comments to this code:\n```python\n{code}\n```", "comments"),
    ("Can this function be simplified? Show the improved version.\n```python\n{code}\n```", "simplify"),
    ("Review this code and point out possible problems:\n```python\n{code}\n```", "review"),
    ("Summarise in one sentence what this code does.\n```python\n{code}\n```", "summary"),
]
NEW_NAMES = ["result", "value", "item", "count", "data", "output", "current", "entry", "total_sum", "element",
             "buffer", "record", "acc", "chunk", "node"]

REWRITE_TEMPLATES = [
    "Rewrite this paragraph in simpler words:\n\n{}", "Make this text sound more friendly:\n\n{}",
    "Rewrite this text as a short bulleted list:\n\n{}", "Shorten this paragraph to two sentences:\n\n{}",
    "Rewrite this for a reader who is not a programmer:\n\n{}", "Paraphrase the following text:\n\n{}",
    "Correct the spelling mistakes in this text:\n\n{}", "Rewrite this paragraph in the first person:\n\n{}",
]
SUMMARY_TEMPLATES = ["Summarise this text in one sentence:\n\n{}", "Give a two-sentence summary of this:\n\n{}",
                     "What is the main point of this paragraph?\n\n{}", "{}\n\nSummarise the text above briefly.",
                     "Write a title and a one-line summary for this text:\n\n{}"]
TRANSLATE_TEMPLATES = ["Translate into {lang}: {text}", "How do you say this in {lang}? \"{text}\"",
                       "Translate the following sentence into {lang}.\n\n{text}"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
PEOPLE = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Leo", "Maya",
          "Nils", "Omar", "Paula", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki", "Zoe"]
PLACES = ["the market", "the library", "the station", "the park", "school", "the office", "the beach", "the museum",
          "the garden", "the gym", "the harbour", "the cinema"]
THINGS = ["apples", "pencils", "tickets", "books", "cupcakes", "stickers", "marbles", "bottles of juice",
          "notebooks", "flowers", "cookies", "balloons"]
SENTENCE_PARTS = (
    ["I would like", "We need", "My sister wants", "Could you bring", "They forgot", "He is looking for"],
    ["a table for four", "two tickets to the museum", "a cup of tea", "the key to the garden", "a map of the city",
     "some fresh bread", "a quiet room", "the train timetable", "a warm coat", "an umbrella"],
    ["this evening", "before noon", "tomorrow morning", "for the weekend", "after the meeting", "as soon as possible"],
)
FOLLOWUPS_PROSE = ["Can you make that shorter?", "Now explain it as if I were five years old.",
                   "Give me a concrete example.", "Turn your answer into a bulleted list.",
                   "Summarise your answer in one sentence.", "What is a common misconception about this?",
                   "Translate your answer into Spanish.", "Say that again in a more formal tone.",
                   "Thanks! Where could I learn more about this?", "Can you add one more point to that?"]
FOLLOWUPS_CODE = ["Add type hints and a docstring.", "Now write two unit tests for it with pytest.",
                  "Can you make it handle empty input?", "Explain how your code works, step by step.",
                  "Rewrite it without using any imports.", "What is its time complexity?",
                  "Give the function a shorter name and show the code again.",
                  "Add input validation that raises ValueError for bad arguments."]
FOLLOWUPS_MATH = ["Can you check your answer another way?", "Explain the steps more simply.",
                  "Now write the calculation as a Python expression.", "What if all the numbers were doubled?"]


# ------------------------------------------------------------------------------------------ the kinds

def _chat(rng: random.Random, m: dict) -> list[MixRequest]:
    out = [("tips", t.format(a)) for a in ACTIVITIES for t in TIP_TEMPLATES]
    out += [("creative", f.format(s)) for s in SUBJECTS for f in FORMS]
    out += [("email", f"Write a short email to {r} {p}.") for r in RECIPIENTS for p in PURPOSES]
    out += [("compare", t.format(a, b)) for a, b in PAIRS for t in COMPARE_TEMPLATES]
    out += [("question", q) for q in QUESTIONS]
    out += [("travel", t.format(d)) for d in DESTINATIONS for t in
            ["Plan a three-day trip to {}.", "What should I see on a weekend in {}?", "What should I pack for {}?"]]
    out += [("recipe", t.format(d)) for d in DISHES for t in
            ["How do I make {}?", "Give me an easy recipe for {}.", "What goes well with {}?"]]
    out += [("recommend", f"Recommend {n} {m} for someone who likes {g}.") for m in MEDIA for g in GENRES
            for n in ["three", "five"]]
    out += [("advice", t.format(x)) for x in SITUATIONS for t in
            ["{}. What should I do?", "Help me: {}. How should I handle it?"]]
    out += [("debate", t.format(x)) for x in DEBATES for t in
            ["What are the pros and cons of {}?", "Is {} a good idea? Give both sides."]]
    out += [("animal", t.format(a)) for a in ANIMALS for t in
            ["Tell me three surprising facts about the {}.", "Where does the {} live and what does it eat?",
             "Write a short paragraph about the {} for a children's book."]]
    out += [("word", t.format(w)) for w in WORDS for t in
            ["What does the word \"{}\" mean? Use it in a sentence.", "Give me three synonyms for \"{}\"."]]
    return [MixRequest("chat", (text,), f"chat/{fam}") for fam, text in out]


def _explain(rng: random.Random, m: dict) -> list[MixRequest]:
    out = [("topic", t.format(x)) for x in TOPICS for t in EXPLAIN_TEMPLATES]
    out += [("concept", t.format(c)) for c in CONCEPTS for t in CONCEPT_TEMPLATES]
    out += [("howto", t.format(h)) for h in HOWTO for t in ["How do I {} in Python?", "What is the best way to {} "
                                                               "in Python? Show an example."]]
    out += [("api", rng.choice(API_TEMPLATES).format(name)) for name in m["api"]]
    return [MixRequest("explain", (text,), f"explain/{fam}") for fam, text in out]


def _code(rng: random.Random, m: dict) -> list[MixRequest]:
    out = [("write", t.format(task)) for task in CODE_TASKS + CODE_EXTRA_TASKS for t in CODE_TEMPLATES]
    for code, names in m["functions"]:
        template, fam = rng.choice([t for t in FUNCTION_TEMPLATES if names or t[1] != "rename"])
        new = next((x for x in rng.sample(NEW_NAMES, len(NEW_NAMES)) if x not in names), "renamed")
        out.append((fam, template.format(code=code, name=rng.choice(names) if names else "", new=new)))
    return [MixRequest("code", (text,), f"code/{fam}") for fam, text in out]


def _typos(text: str, rng: random.Random) -> str:
    """``text`` with a few adjacent letters swapped (for a spelling-correction request)."""
    words = text.split(" ")
    for i in rng.sample(range(len(words)), max(1, len(words) // 12)):
        w = words[i]
        if len(w) > 3 and w.isalpha():
            j = rng.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


def _note(rng: random.Random) -> str:
    """A made-up notice of three or four sentences."""
    event, reason, action = rng.choice(NOTE_EVENTS), rng.choice(NOTE_REASONS), rng.choice(NOTE_ACTIONS)
    day = rng.choice(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"])
    place = rng.choice(PLACES)
    length = rng.choice(["an hour", "two hours", "half an hour"])
    text = (f"Hello everyone, {event} planned for {day} will take place at {place} instead, because {reason}. "
            f"It starts at {rng.randint(8, 18)} o'clock and should last about {length}. Please {action}.")
    if rng.random() < 0.5:
        text += f" Questions can go to {rng.choice(PEOPLE)}, who is organising it this time."
    return text


def _rewrite(rng: random.Random, m: dict, n_notes: int = 1000) -> list[MixRequest]:
    texts = [("docstring", p) for p in m["paragraphs"][0::2]]  # the other half is summarised
    texts += [("note", _note(rng)) for _ in range(n_notes)]
    out = []
    for fam, par in texts:
        t = rng.choice(REWRITE_TEMPLATES)
        out.append(MixRequest("rewrite", (t.format(_typos(par, rng) if "spelling" in t else par),), f"rewrite/{fam}"))
    return out


def _summarise(rng: random.Random, m: dict, n_notes: int = 600) -> list[MixRequest]:
    texts = [("docstring", p) for p in m["paragraphs"][1::2]] + [("note", _note(rng)) for _ in range(n_notes)]
    return [MixRequest("summarise", (rng.choice(SUMMARY_TEMPLATES).format(p),), f"summarise/{fam}")
            for fam, p in texts]


def _record(rng: random.Random) -> tuple[str, str]:
    """A made-up order, appointment or event in prose, and what to extract from it."""
    who, where = rng.choice(PEOPLE), rng.choice(PLACES)
    n, price, day = rng.randint(2, 40), rng.randint(3, 90), rng.randint(1, 28)
    month = rng.choice(["March", "May", "June", "August", "October", "December"])
    kind = rng.randrange(3)
    if kind == 0:
        text = (f"{who} ordered {n} {rng.choice(THINGS)} at {price} dollars each on {month} {day}; the parcel "
                f"goes to {rng.choice(PEOPLE)} near {where}, order number {rng.randint(1000, 9999)}.")
        ask = "the customer, the item, the quantity, the unit price and the order number"
    elif kind == 1:
        text = (f"Reminder: {who} has a dentist appointment on {month} {day} at {rng.randint(8, 17)}:"
                f"{rng.choice(['00', '15', '30', '45'])} with Dr. {rng.choice(PEOPLE)}, room {rng.randint(1, 40)}.")
        ask = "the patient, the date, the time, the doctor and the room"
    else:
        text = (f"The {rng.choice(['chess', 'reading', 'film', 'hiking', 'baking'])} club meets at {where} on "
                f"{month} {day}; {n} members signed up and the fee is {price} dollars, paid to {who}.")
        ask = "the club, the place, the date, the number of members, the fee and who collects it"
    return text, ask


def _extract(rng: random.Random, m: dict, n: int = 3000) -> list[MixRequest]:
    out = []
    for _ in range(n):
        text, ask = _record(rng)
        form = rng.choice(["as a JSON object", "as a bulleted list", "as a table with two columns", "in one line"])
        out.append(("record", f"{text}\n\nExtract {ask} from the text above, {form}."))
    for code, _ in rng.sample(m["functions"], min(800, len(m["functions"]))):
        ask = rng.choice(["List the parameters of this function and their default values.",
                          "List every function or method that this code calls.",
                          "Which variables does this function assign? Answer with a list."])
        out.append(("code", f"{ask}\n```python\n{code}\n```"))
    return [MixRequest("extract", (text,), f"extract/{fam}") for fam, text in out]


def _translate(rng: random.Random, m: dict) -> list[MixRequest]:
    a, b, c = SENTENCE_PARTS
    sentences = [f"{x} {y} {z}." for x in a for y in b for z in c]
    sentences += [p.split(". ")[0].rstrip(".") + "." for p in m["paragraphs"] if len(p.split(". ")[0].split()) <= 22]
    return [MixRequest("translate", (rng.choice(TRANSLATE_TEMPLATES).format(lang=rng.choice(LANGUAGES), text=s),),
                       "translate/sentence") for s in sentences]


def _problem(rng: random.Random) -> str:
    p, q = rng.sample(PEOPLE, 2)
    a, b, c = rng.randint(2, 30), rng.randint(2, 12), rng.randint(1, 9)
    thing, place = rng.choice(THINGS), rng.choice(PLACES)
    return rng.choice([
        f"{p} buys {a} {thing} at {place} for {b} dollars each and pays with a {10 * (a * b // 10 + 1)} dollar "
        f"note. How much change does {p} get?",
        f"{p} has {a + b} {thing}. {p} gives {b} to {q} and then buys {c} more. How many does {p} have now?",
        f"A train leaves at 9:{10 + c} and the trip takes {a * 5} minutes. When does it arrive?",
        f"{p} reads {b} pages a day. How many days does a book of {a * b + c} pages take?",
        f"A recipe needs {c} eggs for {b} people. How many eggs are needed for {b * a} people?",
        f"What is {a * 5}% of {b * 40}?",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{p} walks {c} km in {b * 10} minutes. At that speed, how far does {p} walk in {a} hours?",
        f"{p} and {q} share {a * (b + c)} {thing} in the ratio {b}:{c}. How many does each get?",
        f"A shirt costs {a * 4} dollars and is {5 * c}% off. What is the sale price?",
        f"If {a} workers build a wall in {b * c} days, how long do {a * c} workers take?",
    ])


def _math(rng: random.Random, m: dict, n: int = 4000) -> list[MixRequest]:
    out = []
    for _ in range(n):
        text = _problem(rng)
        if rng.random() < 0.3:
            text += rng.choice([" Explain your steps.", " Show your work.", " Answer with one number."])
        out.append(MixRequest("math", (text,), "math/word-problem"))
    return out


def _followup(rng: random.Random, m: dict, n: int = 4000) -> list[MixRequest]:
    out = []
    tasks = CODE_TASKS + CODE_EXTRA_TASKS
    firsts = [(TOPICS, ["Tell me {}.", "Please explain {}.", "Could you describe {}?", "I would like to know {}."]),
              (CONCEPTS, ["What do you know about {}?", "Teach me about {}.", "I keep hearing about {}. What is it?",
                          "Explain {} briefly."]),
              (ACTIVITIES, ["Any advice on {}?", "Help me with {}.", "I am struggling with {}.",
                            "What is the secret to {}?"])]
    for _ in range(n):  # the first turns repeat now and then: the pools drop the repeats
        r = rng.random()
        if r < 0.35:
            first = rng.choice(["Can you write a Python function that {}?", "I need a Python function that {}.",
                                "Please write a function that {}.", "Help me write Python code that {}."]
                               ).format(rng.choice(tasks))
            out.append(MixRequest("followup", (first, rng.choice(FOLLOWUPS_CODE)), "followup/code"))
        elif r < 0.55:
            out.append(MixRequest("followup", (_problem(rng), rng.choice(FOLLOWUPS_MATH)), "followup/math"))
        else:
            things, templates = rng.choice(firsts)
            first = rng.choice(templates).format(rng.choice(things))
            out.append(MixRequest("followup", (first, rng.choice(FOLLOWUPS_PROSE)), "followup/prose"))
    return out


BUILDERS = dict(chat=_chat, explain=_explain, code=_code, rewrite=_rewrite, summarise=_summarise, extract=_extract,
                translate=_translate, math=_math, followup=_followup)


# ------------------------------------------------------------------------------------------------ the mix

@lru_cache(maxsize=2)
def _pools(seed: int) -> dict[str, list[MixRequest]]:
    """Every kind's requests, each first turn once (in the order of :data:`KINDS`), in a seeded shuffled order."""
    material = stdlib_material()
    pools, seen = {}, set()
    for i, kind in enumerate(KINDS):
        rng = random.Random(seed * 1000 + i)
        pool = [r for r in BUILDERS[kind](rng, material) if not (r.turns[0] in seen or seen.add(r.turns[0]))]
        rng.shuffle(pool)
        pools[kind] = pool
    return pools


def request_mix(n: int = 10000, seed: int = 0, kinds=KINDS) -> list[MixRequest]:
    """The requests of the first ``n`` draws of the mix: each draw picks a kind with :data:`WEIGHTS` (renormalised
    over ``kinds``, and over the kinds not yet used up) and takes that kind's next request (a seeded shuffled
    order; no first turn twice). A draw whose request shares a text, a run of :data:`NGRAM` words, or the whole
    of a shorter text with the benchmark or the streams (:func:`shares_protected_text`) is left out and its
    ``index`` stays empty, so the other requests keep their positions if those texts change. A prefix of a longer
    mix is the shorter mix."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown request kind {unknown[0]!r}; kinds: {', '.join(KINDS)}")
    pools = {k: iter(v) for k, v in _pools(seed).items() if k in kinds}
    rng = random.Random(seed)
    out: list[MixRequest] = []
    for i in range(n):
        req = None
        while req is None and pools:
            kind = rng.choices(list(pools), weights=[WEIGHTS[k] for k in pools])[0]
            req = next(pools[kind], None)
            if req is None:
                del pools[kind]
        if req is None:
            break
        if not any(shares_protected_text(t) for t in req.turns):
            out.append(replace(req, index=i))
    return out
