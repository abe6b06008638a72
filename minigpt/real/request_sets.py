"""What SmolLM2 is asked (Lessons 09 and 09b): the benchmark's chat requests, and the requests its draft is
distilled from. Built offline and deterministically.

The benchmark's requests come in four kinds and two sets. *edit* returns a 10-30-line function whole with a
small change (a rename, a docstring pass, one line edited): the answer copies most of the request, prompt
lookup's best case. *document* repeats a paragraph or a short README with a small change. *code* writes new
code, *chat* is prose. :data:`REQUESTS` is the development set (lookup's settings were chosen on it);
:data:`HELD_OUT_REQUESTS` was never used to choose anything and is reported separately. The model is small:
the point is how fast it answers. :func:`real_prompts` tokenizes them in SmolLM2's chat format.

A draft is useful when it guesses what the *target* will say next, so the best training text for it is the
target's own answers to the kind of request it will serve (sequence-level distillation).
:func:`training_requests` writes the first, small set of those requests (the shipped draft and heads were
distilled from SmolLM2's answers to them; :mod:`minigpt.real.request_mix` is the broader mix that
:func:`minigpt.real.answers.make_answers` now answers) in three of the benchmark's kinds (*document* has no
counterpart): *edit* (a function from the standard library's training files with an instruction), *code* (write
a small function) and *chat* (short questions in prose). The benchmark's requests are not among them.
"""
from __future__ import annotations

import ast
import random
from functools import lru_cache

from ..data import read_text, split_files
from ..prompts import Prompt
from .smollm import encode_chat, load_smollm_tokenizer

# ------------------------------------------------------------------------------ the benchmark's requests

_PARSE_CONFIG = '''def parse_config_lines(lines):
    result = {}
    section = "main"
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            result.setdefault(section, {})
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        result.setdefault(section, {})[key.strip()] = value.strip()
    return result'''

_SCHEDULE = '''def assign_jobs(jobs, workers):
    if workers < 1:
        raise ValueError("need at least one worker")
    loads = [0.0] * workers
    plan = [[] for _ in range(workers)]
    for name, hours in sorted(jobs.items(), key=lambda item: -item[1]):
        least = min(range(workers), key=lambda w: loads[w])
        plan[least].append(name)
        loads[least] += hours
    busiest = max(loads)
    idle = [w for w, load in enumerate(loads) if load == 0]
    return plan, busiest, idle'''

_MOVING = '''def moving_average(values, window=3):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            averages.append(total / window)
    print("computed", len(averages), "averages")
    return averages'''

_INVENTORY = '''def merge_inventory(store, delivery):
    merged = dict(store)
    missing = []
    for item, count in delivery.items():
        if count < 0:
            missing.append(item)
            continue
        merged[item] = merged.get(item, 0) + count
    empty = [item for item, count in merged.items() if count == 0]
    for item in empty:
        del merged[item]
    report = {
        "items": len(merged),
        "units": sum(merged.values()),
        "rejected": missing,
    }
    return merged, report'''

_TOKENIZE = '''def tokenize_expression(text):
    tokens = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char.isspace():
            pos += 1
        elif char.isdigit():
            start = pos
            while pos < len(text) and (text[pos].isdigit() or text[pos] == "."):
                pos += 1
            tokens.append(("number", float(text[start:pos])))
        elif char.isalpha():
            start = pos
            while pos < len(text) and text[pos].isalnum():
                pos += 1
            tokens.append(("name", text[start:pos]))
        elif char in "+-*/()":
            tokens.append(("op", char))
            pos += 1
        else:
            raise SyntaxError(f"unexpected character {char!r} at {pos}")
    return tokens'''

_BUCKETS = '''def bucket_by_size(files, limits):
    limits = sorted(limits)
    buckets = {limit: [] for limit in limits}
    too_big = []
    for path, size in files:
        for limit in limits:
            if size <= limit:
                buckets[limit].append(path)
                break
        else:
            too_big.append(path)
    counts = {limit: len(paths) for limit, paths in buckets.items()}
    return buckets, counts, too_big'''

_RETRY = '''import time


def call_with_retry(func, attempts=4, delay=0.5):
    last_error = None
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except ConnectionError as error:
            last_error = error
            if attempt == attempts:
                break
            print(f"attempt {attempt} failed, waiting {delay:.1f} s")
            time.sleep(delay)
            delay = delay * 2
    raise RuntimeError(f"gave up after {attempts} attempts") from last_error'''

_ORDERS = '''def summarize_orders(orders, currency):
    totals = {}
    largest = None
    for order in orders:
        customer = order["customer"]
        amount = order["quantity"] * order["unit_price"]
        totals[customer] = totals.get(customer, 0) + amount
        if largest is None or amount > largest[1]:
            largest = (customer, amount)
    lines = [f"{name}: {value:.2f} {currency}" for name, value in sorted(totals.items())]
    if largest is not None:
        lines.append(f"largest order: {largest[0]} ({largest[1]:.2f} {currency})")
    return "\\n".join(lines)'''

_GARDEN = ("The Linden Street community garden opens for the season on the first Saturday of April. Members "
           "can collect their plot keys from the shed between nine and noon, and the water taps will be turned "
           "on the same morning. Tools are shared: please clean them and hang them back on the rack after use. "
           "Compost goes in the left bin only, and the right bin is for weeds with seeds. Our monthly meeting is "
           "held on the second Tuesday at seven in the evening in the library's back room, and new members are "
           "always welcome.")

_TIDY_README = '''# tidyfiles

tidyfiles sorts the files in a folder into subfolders by type: images, documents, audio, archives and other.

## Installation

    pip install tidyfiles

## Usage

    tidyfiles ~/Downloads            # sort the folder in place
    tidyfiles ~/Downloads --dry-run  # only show what would move

tidyfiles never deletes a file. When two files have the same name, the second one gets a number added.

## License

MIT'''

_NOTICE = ("Dear residents, the water supply in buildings A and B will be interrupted on Monday, 14 October, "
           "from 8:00 to 13:00 while the main pipe under the courtyard is replaced. Please fill a few bottles "
           "the evening before. The lifts will keep working, but the laundry room will be closed for the whole "
           "day. If you have questions, call the caretaker's office at 555-0142. Thank you for your patience.")

_BAKERY = ("Our bakery on Mill Road bakes its sourdough every night in a wood-fired oven. The dough rests for "
           "eighteen hours before it is shaped by hand, which gives the bread its open crumb and its thick crust. "
           "Every morning we also make rye rolls, cinnamon buns and a seasonal fruit tart. The shop opens at "
           "seven, and the first loaves usually sell out before nine, so we keep a shelf of reserved bread for "
           "customers who order the day before. On Sundays we close at one in the afternoon.")

_PIXELGRID_README = '''# pixelgrid

pixelgrid draws simple pixel art from a text file in which every character is one pixel.

## Requirements

- Python 3.9 or newer
- Pillow 9 or newer

## Quick start

    pip install pixelgrid
    pixelgrid draw heart.txt --scale 8 --out heart.png

Each character in the file maps to a colour listed in palette.toml. A dot is a transparent pixel.

## Contributing

Open an issue before sending a large change, and run the tests with pytest.'''

_TRIP = ("On the first day of the trip we walked from the harbour to the old lighthouse, about six kilometres "
         "along the cliffs. The path was narrow in places and the wind was strong, but the views over the bay "
         "were worth it. We had lunch on a bench near the lighthouse and watched the fishing boats come back. "
         "In the afternoon it started to rain, so we took the bus back to the village and spent the evening in "
         "a small cafe that served fish soup and fresh bread.")

REQUESTS = [
    ("edit", "Rename the function `parse_config_lines` to `read_settings` and the variable `result` to "
             f"`settings`. Return the whole function.\n```python\n{_PARSE_CONFIG}\n```"),
    ("edit", f"Add a short docstring to this function. Return the whole function, otherwise unchanged.\n"
             f"```python\n{_SCHEDULE}\n```"),
    ("edit", f"Replace the print call with logging.info and show me the complete function.\n"
             f"```python\n{_MOVING}\n```"),
    ("edit", "In this function rename the parameter `delivery` to `shipment` everywhere. Reply with the full "
             f"function.\n```python\n{_INVENTORY}\n```"),
    ("document", f"Repeat this paragraph exactly, but change \"second Tuesday\" to \"second Thursday\".\n\n{_GARDEN}"),
    ("document", "Here is a README. Rename the project from tidyfiles to neatdir everywhere and return the "
                 f"whole README.\n\n{_TIDY_README}"),
    ("document", f"Rewrite this notice with the date changed to Wednesday, 16 October. Keep everything else "
                 f"the same.\n\n{_NOTICE}"),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("code", "Write a Python function that returns the n-th Fibonacci number."),
    ("code", "Write a Python class for a stack with push, pop and peek methods."),
    ("chat", "Explain in two sentences why the sky is blue."),
    ("chat", "What are three tips for writing clear emails?"),
    ("chat", "Give me a short summary of what a CPU does."),
]

HELD_OUT_REQUESTS = [
    ("edit", "Rename the variable `pos` to `index` in the following function and give back the whole "
             f"function.\n```python\n{_TOKENIZE}\n```"),
    ("edit", f"Please add a docstring that explains the arguments and the return value, and return the full "
             f"function.\n```python\n{_BUCKETS}\n```"),
    ("edit", "Change this code so that the delay grows by a factor of 1.5 instead of 2. Show the whole "
             f"code.\n```python\n{_RETRY}\n```"),
    ("edit", f"Rename `summarize_orders` to `order_report` and return the complete function.\n"
             f"```python\n{_ORDERS}\n```"),
    ("document", "Copy this text, replacing \"Mill Road\" with \"Station Street\". Do not change anything "
                 f"else.\n\n{_BAKERY}"),
    ("document", "Update this README so that it requires Python 3.10 or newer, and return the whole README."
                 f"\n\n{_PIXELGRID_README}"),
    ("document", f"XX\n\n{_TRIP}"),
    ("code", "Write a Python function that turns a list of (key, value) pairs into a dictionary, keeping the "
             "last value when a key repeats."),
    ("code", "Write a Python function that counts the words in a text file."),
    ("chat", "Describe in three sentences how the gears of a bicycle work."),
    ("chat", "What should I pack for a one-day hike?"),
]

KINDS = ("edit", "document", "code", "chat")
SPLITS = {"dev": REQUESTS, "held-out": HELD_OUT_REQUESTS}


def real_prompts(kinds=KINDS, per_kind: int | None = None, split: str = "dev") -> list[Prompt]:
    """Requests in SmolLM2's chat format, tokenized, as Prompts with ``kind`` and ``split`` set.

    split: "dev" (:data:`REQUESTS`, named ``kind-i``), "held-out" (:data:`HELD_OUT_REQUESTS`, named
    ``kind-held-i``) or "all" (both, dev first). per_kind: at most this many of each kind from each set."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, all; got {split!r}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown request kind {unknown[0]!r}; kinds: {', '.join(KINDS)}")
    enc = load_smollm_tokenizer()
    out = []
    for name in (SPLITS if split == "all" else (split,)):
        seen: dict[str, int] = {}
        for kind, text in SPLITS[name]:
            if kind not in kinds or (per_kind is not None and seen.get(kind, 0) >= per_kind):
                continue
            seen[kind] = seen.get(kind, 0) + 1
            label = f"{kind}-{seen[kind]}" if name == "dev" else f"{kind}-held-{seen[kind]}"
            out.append(Prompt(encode_chat(enc, [{"role": "user", "content": text}]), label, kind, split=name))
    return out


# ----------------------------------------------------------------------------- the distillation requests

CODE_TASKS = [
    "reverses a string", "counts the vowels in a string", "returns the largest number in a list",
    "removes duplicates from a list while keeping the order", "checks whether a number is prime",
    "computes the factorial of a number", "flattens a nested list", "merges two sorted lists",
    "returns the second largest element of a list", "counts how often each word appears in a text",
    "converts Celsius to Fahrenheit", "checks whether two strings are anagrams", "finds the median of a list",
    "returns the greatest common divisor of two numbers", "computes the sum of the digits of an integer",
    "capitalizes the first letter of every word", "splits a list into chunks of size n",
    "rotates a list by k positions", "checks whether a year is a leap year", "converts a binary string to an integer",
    "returns all even numbers from a list", "computes the average of a list of numbers",
    "finds the longest word in a sentence", "transposes a matrix given as a list of lists",
    "checks whether a list is sorted", "returns the index of an item using binary search",
    "sorts a list of dictionaries by a key", "reads a text file and returns its number of lines",
    "writes a list of strings to a file, one per line", "parses a date string like 2024-01-31",
    "returns the n first prime numbers", "computes the power set of a list", "checks balanced parentheses",
    "converts a Roman numeral to an integer", "converts an integer to a Roman numeral",
    "counts the lines of a CSV file that match a condition", "returns the intersection of two lists",
    "implements bubble sort", "implements insertion sort", "implements merge sort", "implements quicksort",
    "computes the dot product of two vectors", "generates a random password", "validates an email address",
    "removes punctuation from a string", "returns the most common element of a list",
    "computes the running total of a list", "groups words by their first letter",
    "returns a dictionary with the length of each word", "converts a dictionary to a list of tuples",
    "inverts a dictionary", "finds the missing number in a list from 1 to n", "computes the area of a circle",
    "returns the Collatz sequence of a number", "checks whether a number is a perfect square",
    "counts the set bits of an integer", "converts a string to snake_case", "converts a string to camelCase",
    "truncates a string to n characters with an ellipsis", "returns the unique characters of a string",
    "computes compound interest", "simulates rolling two dice", "shuffles a list in place",
    "finds all pairs in a list that sum to a target", "returns the cumulative product of a list",
    "checks whether a string contains only digits", "pads a number with leading zeros",
    "formats a number of seconds as hours, minutes and seconds", "computes the Levenshtein distance",
    "returns the longest common prefix of a list of strings", "counts the uppercase letters in a string",
    "memoizes a function with a dictionary", "retries a function three times on error",
    "measures how long a function takes", "reads a JSON file into a dictionary", "writes a dictionary to JSON",
    "downloads nothing and just validates a URL string", "computes the mean and standard deviation",
    "returns the words that appear in both of two sentences", "implements a queue with two stacks",
    "implements a linked list with append and find", "implements a binary search tree insert",
    "computes the depth of a nested dictionary", "zips two lists into a dictionary",
    "filters a list of numbers greater than a threshold", "returns the squares of the numbers in a list",
    "checks whether a number is an Armstrong number", "prints a multiplication table",
    "finds the first non-repeating character in a string", "compresses a string like aaabb into a3b2",
    "splits a full name into first and last name", "returns the n largest items of a list",
    "converts a list of strings to integers, skipping bad ones", "computes the distance between two points",
    "checks whether a point is inside a rectangle", "returns the day of the week for a date",
    "counts the number of words in a file", "creates a simple counter class", "implements a simple timer class",
]

EXPLAIN_TOPICS = [
    "why leaves change color in autumn", "how a refrigerator keeps food cold", "why the ocean is salty",
    "how vaccines work", "what causes the seasons", "how airplanes stay in the air", "what a black hole is",
    "why we need sleep", "how a rainbow forms", "what inflation is", "how the internet works",
    "what photosynthesis is", "why the moon has phases", "how a battery stores energy", "what DNA does",
    "why ice floats on water", "how a compass works", "what an API is", "what a database index is",
    "why exercise is good for the heart", "how recycling helps the environment", "what a neural network is",
    "how a bicycle stays upright", "what causes thunder", "why bread rises", "how solar panels make electricity",
    "what a variable is in programming", "why the sky turns red at sunset", "what a virus is", "how tides work",
    "what machine learning is", "how a search engine ranks pages", "what an operating system does",
    "why cats purr", "how coffee keeps people awake", "what a recursive function is", "how GPS finds a location",
    "what cloud computing is", "why plants need water", "what compound interest is", "how earthquakes happen",
    "what a hash table is", "why we have time zones", "how a microwave heats food", "what encryption is",
    "how bees make honey", "what the greenhouse effect is", "why it is important to back up files",
    "how a loan works", "what version control is",
]
TIP_ACTIVITIES = [
    "learning a new language", "staying focused while studying", "sleeping better", "saving money",
    "giving a good presentation", "writing a cover letter", "starting to run", "cooking healthy meals",
    "managing time at work", "learning to program", "keeping a plant alive", "reducing stress",
    "preparing for a job interview", "writing readable code", "traveling on a budget", "reading more books",
    "organizing a small event", "working from home", "taking better photos", "keeping a tidy desk",
    "debugging a program", "writing good commit messages", "learning to cook", "making new friends",
    "staying hydrated", "planning a road trip", "studying for an exam", "reviewing someone's code",
    "keeping passwords safe", "starting a vegetable garden",
]
SUMMARY_THINGS = [
    "what a GPU does", "what RAM is", "what a compiler does", "what the French Revolution was",
    "what a hard drive does", "what the water cycle is", "what a programming language is",
    "what the Roman Empire was", "what a router does", "what the Industrial Revolution was",
    "what a spreadsheet is", "what the immune system does", "what a web browser does", "what Python is",
    "what the Renaissance was", "what a keyboard shortcut is", "what an electric car is",
    "what the stock market is", "what a smartphone sensor does", "what a file system is",
    "what the solar system is", "what a transistor is", "what a library is in programming",
    "what the Moon landing was", "what a cache is in a computer", "what a network switch does",
    "what the printing press changed", "what a unit test is", "what an email server does",
    "what a recipe for bread needs",
]
OPEN_QUESTIONS = [
    "What is the difference between a list and a tuple in Python?", "How do I read a file line by line in Python?",
    "What is the capital of Australia?", "What should I pack for a weekend hike?",
    "How many planets are in the solar system?", "What is a good name for a pet turtle?",
    "Can you suggest a simple dinner recipe?", "What is the difference between weather and climate?",
    "How do I center text in HTML?", "What does HTTP stand for?", "Why is Python popular?",
    "How do I make a good cup of tea?", "What are the primary colors?", "What is a haiku? Write one about rain.",
    "Write a short poem about the sea.", "Write a thank-you note to a colleague.",
    "Write a short story about a robot who learns to paint.", "What is the boiling point of water?",
    "How do I sort a dictionary by value in Python?", "What is the difference between git merge and git rebase?",
    "How can I improve my handwriting?", "What is a prime number?", "Translate 'good morning' into Spanish.",
    "What are the benefits of walking every day?", "Write a limerick about a cat.",
    "Describe a sunset in three sentences.", "What is the Pythagorean theorem?",
    "How does a for loop work in Python?", "What is the difference between RAM and storage?",
    "Write an email asking for a day off.",
]

EXPLAIN_TEMPLATES = ["Explain in two sentences {}.", "Explain {} to a ten-year-old.", "Briefly explain {}."]
TIP_TEMPLATES = ["What are three tips for {}?", "Give me some advice on {}.", "List a few tips for {}."]
SUMMARY_TEMPLATES = ["Give me a short summary of {}.", "In a few sentences, describe {}."]
CODE_TEMPLATES = ["Write a Python function that {}.", "Write a short Python function that {}. Reply with code only.",
                  "Show me how to write a Python function that {}."]
EDIT_TEMPLATES = [
    "Add type hints to this function. Reply with the code only.\n```python\n{code}\n```",
    "Add a docstring to this function and return the whole function:\n```python\n{code}\n```",
    "Rename the variable `{name}` to `{new}` in this function and return the whole function:\n```python\n{code}\n```",
    "Rewrite this function so that it is easier to read:\n```python\n{code}\n```",
    "Explain what this function does:\n```python\n{code}\n```",
    "Add comments to this code:\n```python\n{code}\n```",
    "Is there a bug in this function? Show a corrected version.\n```python\n{code}\n```",
]
NEW_NAMES = ["result", "value", "item", "count", "data", "output", "current", "entry", "total_sum", "element"]


@lru_cache(maxsize=4)
def w8a8_calibration() -> list[list[int]]:
    """The text the w8a8 path's smoothing is calibrated on (:func:`minigpt.precision.reduce_precision`): the
    development requests as token id lists, never the held-out ones. One recipe for the bench, the chat,
    :mod:`minigpt.quality` and Lesson 13b."""
    return [list(p) for p in real_prompts(split="dev")]


def stdlib_functions(min_lines: int = 4, max_lines: int = 14, limit: int = 2000) -> tuple[tuple[str, list[str]], ...]:
    """Small functions and methods of the standard library's *training* files: (source, names of their local
    variables), in a fixed order. Parsing the files takes a while, so the result is kept."""
    out = []
    for path in split_files("train"):
        try:
            source = read_text(path)
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
                continue
            code = ast.get_source_segment(source, node, padded=True)
            if not code or len(code) > 600 or not code.isascii():
                continue
            lines = code.splitlines()
            indent = len(lines[0]) - len(lines[0].lstrip())
            code = "\n".join(line[indent:] for line in lines)
            names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
            out.append((code, names))
            if len(out) >= limit:
                return tuple(out)
    return tuple(out)


def training_requests(n_edit: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """(kind, text) chat requests for distillation: every code task, explanation, tip, summary and open
    question with each of its templates, and ``n_edit`` edit requests on standard-library functions.
    Shuffled with ``seed``; none is one of the benchmark's requests (:data:`REQUESTS` and
    :data:`HELD_OUT_REQUESTS`)."""
    rng = random.Random(seed)
    reqs = [("code", t.format(task)) for task in CODE_TASKS for t in CODE_TEMPLATES]
    reqs += [("chat", t.format(x)) for x in EXPLAIN_TOPICS for t in EXPLAIN_TEMPLATES]
    reqs += [("chat", t.format(x)) for x in TIP_ACTIVITIES for t in TIP_TEMPLATES]
    reqs += [("chat", t.format(x)) for x in SUMMARY_THINGS for t in SUMMARY_TEMPLATES]
    reqs += [("chat", q) for q in OPEN_QUESTIONS]
    functions = stdlib_functions()
    for code, names in rng.sample(functions, min(n_edit, len(functions))):
        template = rng.choice(EDIT_TEMPLATES if names else [t for t in EDIT_TEMPLATES if "{name}" not in t])
        name = rng.choice(names) if names else ""
        new = next((x for x in rng.sample(NEW_NAMES, len(NEW_NAMES)) if x not in names), "renamed")
        reqs.append(("edit", template.format(code=code, name=name, new=new)))
    held_out = {text for _, text in REQUESTS + HELD_OUT_REQUESTS}
    reqs = [r for r in reqs if r[1] not in held_out]
    rng.shuffle(reqs)
    return reqs
