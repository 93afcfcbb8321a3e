"""Builds eagle3-prompts.jsonl, the embedded default's open prompt set (Apache-2.0).

Every prompt is written here from templates x topics (no text comes from
another dataset), in the open-perfectblend schema:
{"conversations": [{"from": "human"|"gpt", "value": ...}], "source": "eagle3-prompts/<category>"}.
Multi-turn rows carry assistant turns whose answers this script computes, so
they are correct; the pipeline regenerates every assistant turn anyway.

Deterministic: `python data/prompts/build_prompts.py` rewrites the file
byte-identically; tests/test_prompts.py checks the shipped file against it.
"""

import itertools
import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("eagle3-prompts.jsonl")
SEED = 20261130

SKILLS = [
    "public speaking",
    "cooking",
    "chess",
    "drawing",
    "touch typing",
    "running long distances",
    "writing clearly",
    "learning Spanish",
    "playing the guitar",
    "photography",
    "time management",
    "gardening",
    "negotiating a salary",
    "swimming",
    "budgeting",
    "mental arithmetic",
    "job interviews",
    "sleeping well",
    "meditation",
    "baking bread",
    "remembering names",
    "reading faster",
    "saving money",
    "making friends in a new city",
    "staying focused",
]
CONCEPTS = [
    "inflation",
    "photosynthesis",
    "compound interest",
    "machine learning",
    "the greenhouse effect",
    "vaccines",
    "blockchain",
    "supply and demand",
    "black holes",
    "the immune system",
    "electric cars",
    "recycling",
    "the stock market",
    "DNA",
    "gravity",
    "the water cycle",
    "credit scores",
    "the internet",
    "encryption",
    "climate change",
    "evolution",
    "tides",
    "rainbows",
    "jet lag",
    "caffeine",
    "a mortgage",
    "an index fund",
    "the placebo effect",
    "plate tectonics",
    "solar panels",
    "the speed of light",
    "antibiotics",
    "cloud computing",
    "interest rates",
    "the seasons",
    "jet streams",
    "a refrigerator",
    "batteries",
    "GPS",
]
HOW_QUESTIONS = [
    "How do airplanes stay in the air?",
    "Why is the sky blue?",
    "How does a refrigerator keep food cold?",
    "How does GPS know where I am?",
    "Why do we have leap years?",
    "How do noise-cancelling headphones work?",
    "Why does ice float?",
    "How does a microwave heat food?",
    "Why do onions make you cry?",
    "How do vaccines train the immune system?",
    "Why do we dream?",
    "How does a touchscreen detect my finger?",
]
PAIRS = [
    ("a virus", "a bacterium"),
    ("weather", "climate"),
    ("a stock", "a bond"),
    ("RAM", "storage"),
    ("baking soda", "baking powder"),
    ("a crocodile", "an alligator"),
    ("affect", "effect"),
    ("a latte", "a cappuccino"),
    ("TCP", "UDP"),
    ("a Roth IRA", "a traditional IRA"),
    ("empathy", "sympathy"),
    ("a comet", "an asteroid"),
    ("Python lists", "Python tuples"),
    ("a lake", "a pond"),
    ("HTTP", "HTTPS"),
    ("a psychologist", "a psychiatrist"),
    ("a debit card", "a credit card"),
    ("LED bulbs", "incandescent bulbs"),
    ("mass", "weight"),
    ("a cold", "the flu"),
    ("a frog", "a toad"),
    ("speed", "velocity"),
    ("leasing a car", "buying a car"),
    ("renting", "buying a home"),
    ("git merge", "git rebase"),
    ("a router", "a modem"),
    ("a hurricane", "a tornado"),
    ("yeast", "sourdough starter"),
]
SITUATIONS = [
    "a first day at a new job",
    "a long flight",
    "moving to a new apartment",
    "a job interview over video",
    "hosting a dinner party",
    "studying for a final exam",
    "a road trip with kids",
    "working from home",
    "a first marathon",
    "camping in the rain",
    "a difficult conversation with a coworker",
    "learning to code as an adult",
    "planning a wedding on a budget",
    "a week of healthy lunches",
    "starting a small vegetable garden",
    "adopting a rescue dog",
    "keeping a houseplant alive",
    "traveling abroad for the first time",
    "giving a toast at a friend's wedding",
    "decluttering a small bedroom",
    "staying productive in winter",
    "preparing for a power outage",
    "writing a thesis",
    "running an effective meeting",
    "a visit to a museum with teenagers",
]
RECOMMEND = [
    ("books", "someone who wants to get into science fiction"),
    ("board games", "a family with young children"),
    ("hobbies", "someone who works at a desk all day"),
    ("podcasts", "a long commute"),
    ("vegetarian dinners", "a busy weeknight"),
    ("exercises", "people who cannot go to a gym"),
    ("houseplants", "a dark apartment"),
    ("gift ideas", "a friend who loves cooking"),
    ("movies", "a rainy Sunday afternoon"),
    ("snacks", "a long hike"),
    ("apps", "learning a new language"),
    ("ways to relax", "the evening before an exam"),
    ("weekend activities", "a small town"),
    ("questions to ask", "the end of a job interview"),
    ("ice-breaker games", "a team meeting"),
    ("breakfast ideas", "someone with very little time"),
    ("skills to learn", "a recent graduate"),
    ("stretches", "people with a stiff back"),
    ("travel destinations", "a first trip to Europe"),
]
CHAT_TEMPLATES = {
    "skill": [
        "How can I get better at {x}?",
        "What are the most common mistakes beginners make in {x}?",
        "Give me a four-week plan to improve at {x}.",
        "I have 20 minutes a day. How should I practice {x}?",
        "What is the single most useful tip for {x}?",
        "Why do so many people struggle with {x}?",
    ],
    "concept": [
        "Explain {x} in simple terms.",
        "Can you explain {x} to a ten-year-old?",
        "What is {x}, and why does it matter?",
        "Give me a short summary of {x}.",
        "What is a common misconception about {x}?",
        "Explain {x} using an everyday analogy.",
    ],
    "pair": [
        "What is the difference between {a} and {b}?",
        "How do I tell {a} apart from {b}?",
        "Compare {a} and {b} in a short table.",
        "Is {a} the same thing as {b}?",
    ],
    "situation": [
        "Give me some tips for {x}.",
        "How should I prepare for {x}?",
        "Make me a checklist for {x}.",
        "What should I avoid during {x}?",
        "I'm nervous about {x}. Any advice?",
    ],
    "recommend": [
        "Can you recommend some {a} for {b}?",
        "Suggest five {a} for {b} and say why each one fits.",
        "What are good {a} for {b}?",
    ],
}
EVERYDAY = [
    "What should I make for dinner tonight if I only have eggs, rice and spinach?",
    "How do I remove a coffee stain from a white shirt?",
    "What is a polite way to decline a party invitation?",
    "How often should I water a cactus?",
    "Why does my bread come out dense?",
    "How do I unclog a kitchen sink?",
    "What's a good morning routine for someone who hates mornings?",
    "How can I fall asleep faster?",
    "How do I ask my manager for a day off?",
    "What can I do on a rainy day with two kids?",
    "How long should I boil an egg for a runny yolk?",
    "Is it better to stretch before or after running?",
    "How do I start journaling?",
    "What are some easy ways to drink more water?",
    "How do I fix a squeaky door?",
    "How do I keep cut avocado from turning brown?",
    "What is a good way to split rent with roommates?",
    "How do I make my phone battery last longer?",
    "What should I pack for a weekend at the beach?",
    "How can I be more confident when speaking in meetings?",
    "How do I make cold brew coffee at home?",
    "What's the best way to learn vocabulary in a new language?",
    "How do I clean a cast iron pan?",
    "Why do cats knock things off tables?",
    "How do I politely end a conversation that's going on too long?",
    "What are some cheap date ideas?",
    "How do I get rid of fruit flies?",
    "How can I stop procrastinating?",
    "Hi! Can you help me plan my week?",
    "Tell me a fun fact about octopuses.",
    "What's a good name for a goldfish?",
    "Tell me a joke about programmers.",
    "Write a short motivational message for a Monday morning.",
]


def chat_prompts(rng: random.Random) -> list[str]:
    prompts = list(EVERYDAY) + HOW_QUESTIONS
    prompts += [f"{question} Keep it short." for question in HOW_QUESTIONS]
    for template in CHAT_TEMPLATES["skill"]:
        prompts += [template.format(x=x) for x in SKILLS]
    for template in CHAT_TEMPLATES["concept"]:
        prompts += [template.format(x=x) for x in CONCEPTS]
    for template in CHAT_TEMPLATES["pair"]:
        prompts += [template.format(a=a, b=b) for a, b in PAIRS]
    for template in CHAT_TEMPLATES["situation"]:
        prompts += [template.format(x=x) for x in SITUATIONS]
    for template in CHAT_TEMPLATES["recommend"]:
        prompts += [template.format(a=a, b=b) for a, b in RECOMMEND]
    return prompts


NAMES = [
    "Alice",
    "Ben",
    "Chloe",
    "Dev",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jamal",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
]
TRAITS = [
    ("taller", ("tallest", "shortest")),
    ("older", ("oldest", "youngest")),
    ("faster", ("fastest", "slowest")),
    ("heavier", ("heaviest", "lightest")),
    ("stronger", ("strongest", "weakest")),
]
CATEGORIES = [
    ("dogs", "mammals", "animals"),
    ("roses", "flowers", "plants"),
    ("oaks", "trees", "plants"),
    ("sparrows", "birds", "animals"),
    ("violins", "string instruments", "instruments"),
    ("sedans", "cars", "vehicles"),
    ("salmon", "fish", "animals"),
    ("squares", "rectangles", "polygons"),
]


def reasoning_prompts(rng: random.Random) -> list[str]:
    prompts = []
    for a, b, c in CATEGORIES:
        prompts += [
            f"All {a} are {b}, and all {b} are {c}. Are all {a} {c}? Explain your reasoning.",
            f"All {a} are {b}. Some {b} are small. Does it follow that some {a} are small? Explain.",
            f"If no {c} can fly and all {a} are {c}, what can we conclude about {a}? Explain step by step.",
        ]
    for _ in range(120):
        people = rng.sample(NAMES, 3)
        trait, extremes = rng.choice(TRAITS)
        prompts.append(
            f"{people[0]} is {trait} than {people[1]}, and {people[1]} is {trait} than {people[2]}. "
            f"Who is the {rng.choice(extremes)}? Explain your reasoning."
        )
    for _ in range(80):
        people = rng.sample(NAMES, 4)
        prompts.append(
            f"{', '.join(people[:3])} and {people[3]} sit in a row. {people[0]} is not at either end, "
            f"{people[1]} sits directly right of {people[2]}, and {people[3]} is at the left end. "
            "Find one seating order that works and check every condition."
        )
    for _ in range(80):
        n = rng.randint(3, 9)
        legs = rng.randint(2 * n + 2, 4 * n - 2) // 2 * 2
        prompts.append(
            f"A farmer has chickens and cows, {n} animals in total with {legs} legs. "
            "How many of each are there? Show your reasoning."
        )
    for _ in range(60):
        start = rng.choice(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"])
        days = rng.randint(3, 200)
        prompts.append(
            f"If today is {start}, what day of the week will it be in {days} days? Explain how you worked it out."
        )
    riddles = [
        "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?",
        "If it takes 5 machines 5 minutes to make 5 widgets, how long would 100 machines take to make 100 widgets?",
        "You have a 3-litre jug and a 5-litre jug. How can you measure exactly 4 litres of water?",
        "A lily pad patch doubles in size every day and covers a lake in 48 days. When does it cover half the lake?",
        "Is it possible for a father to be the same age as his son? Explain.",
        "Which is heavier: a kilogram of feathers or a kilogram of iron? Why do people get this wrong?",
        "If you rearrange the letters of 'listen', can you make another English word? Which one?",
        "A clock shows 3:15. What is the angle between the hour and minute hands?",
        "Why can't you use the same argument to prove that all horses are the same colour? Explain the flaw.",
        "Three boxes are labelled apples, oranges and mixed, and every label is wrong. You may pick one fruit "
        "from one box. How do you relabel them correctly?",
    ]
    return prompts + riddles


def math_prompts(rng: random.Random) -> list[str]:
    prompts = []
    items = ["apples", "notebooks", "tickets", "pencils", "cupcakes", "stamps", "marbles", "books"]
    for _ in range(120):
        name, item = rng.choice(NAMES), rng.choice(items)
        a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(1, 20)
        prompts.append(
            f"{name} has {a} {item}, buys {b} packs of {c} more, then gives away {rng.randint(1, a)}. "
            f"How many {item} does {name} have now?"
        )
    for _ in range(100):
        price, pct = rng.randint(12, 480), rng.choice([5, 10, 15, 20, 25, 30, 35, 40, 60])
        prompts.append(
            rng.choice(
                [
                    f"A jacket costs ${price}. It is on sale for {pct}% off. What is the sale price?",
                    f"What is {pct}% of {price}? Show the calculation.",
                    f"A price rose from ${price} to ${price + price * pct // 100}. By what percentage did it rise?",
                ]
            )
        )
    for _ in range(120):
        a, x, b = rng.randint(2, 12), rng.randint(-15, 25), rng.randint(-30, 30)
        prompts.append(f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {a * x + b}. Show each step.")
    for _ in range(80):
        w, h = rng.randint(2, 40), rng.randint(2, 40)
        prompts.append(
            rng.choice(
                [
                    f"What is the area and perimeter of a rectangle that is {w} cm by {h} cm?",
                    f"A right triangle has legs of {w} and {h}. How long is the hypotenuse?",
                    f"What is the area of a circle with radius {w} m? Use pi = 3.14.",
                ]
            )
        )
    for _ in range(80):
        values = [rng.randint(1, 100) for _ in range(rng.randint(4, 8))]
        prompts.append(f"Find the mean, median and range of these numbers: {', '.join(map(str, values))}.")
    for _ in range(60):
        p, q, r, s = rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12)
        prompts.append(f"Calculate {p}/{q} + {r}/{s} and simplify the result.")
    for _ in range(60):
        speed, hours = rng.randint(30, 120), rng.randint(2, 9)
        prompts.append(
            f"A train travels at {speed} km/h for {hours} hours and then at {speed - 10} km/h for 1 hour. "
            "How far does it go, and what is its average speed?"
        )
    for _ in range(40):
        start, step = rng.randint(1, 20), rng.randint(2, 9)
        seq = [start + step * i for i in range(5)]
        prompts.append(f"What are the next two numbers in the sequence {', '.join(map(str, seq))}? What is the rule?")
    return prompts


TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "removes duplicates from a list while keeping order",
    "merges two sorted lists",
    "checks whether a string is a palindrome",
    "finds the largest element in a list without using max",
    "converts Celsius to Fahrenheit",
    "flattens a nested list",
    "counts word frequencies in a text",
    "validates an email address with a simple rule",
    "computes the factorial of a number iteratively",
    "returns the second largest number in a list",
    "capitalizes the first letter of every word",
    "checks whether two strings are anagrams",
    "sums the digits of an integer",
    "implements binary search",
    "groups a list of words by their first letter",
    "rotates a list by k positions",
    "finds the GCD of two numbers",
    "parses a date string like 2024-03-15 into its parts",
    "chunks a list into pieces of size n",
    "returns all even numbers from a list",
    "computes a running average of a list",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust", "Java", "C"]
SNIPPETS = [
    "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]",
    "const add = (a) => (b) => a + b;\nconsole.log(add(2)(3));",
    "for i in range(3):\n    for j in range(i):\n        print(i, j)",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 5;",
    "def memo(fn):\n    cache = {}\n    def inner(n):\n        if n not in cache:\n            cache[n] = fn(n)\n      "
    "  return cache[n]\n    return inner",
    "x = [1, 2, 3]\ny = x\ny.append(4)\nprint(x)",
    "while (n != 1) { n = n % 2 == 0 ? n / 2 : 3 * n + 1; steps++; }",
    "with open('data.txt') as fh:\n    lines = [line.strip() for line in fh if line.strip()]",
]
BUGGY = [
    "def average(xs):\n    return sum(xs) / len(xs) - 1",
    "def is_even(n):\n    return n % 2 == 1",
    "def last(xs):\n    return xs[len(xs)]",
    "function max(arr) {\n  let m = 0;\n  for (const x of arr) if (x > m) m = x;\n  return m;\n}",
    "def count_a(s):\n    count = 0\n    for ch in s:\n        if ch == 'a':\n            count =+ 1\n    return count",
    "def append_item(item, items=[]):\n    items.append(item)\n    return items",
]
HOWTO = [
    "read a file line by line",
    "make an HTTP GET request",
    "sort a list of objects by a field",
    "handle errors",
    "write a unit test",
    "parse JSON",
    "run tasks concurrently",
    "format a date",
]


def code_prompts(rng: random.Random) -> list[str]:
    prompts = []
    for task, language in itertools.product(TASKS, LANGUAGES[:4]):
        prompts.append(
            rng.choice(
                [
                    f"Write a {language} function that {task}.",
                    f"In {language}, how would I write a function that {task}? Include a short example.",
                ]
            )
        )
    for snippet in SNIPPETS:
        prompts.append(f"Explain what this code does:\n\n```\n{snippet}\n```")
        prompts.append(f"How could this code be improved?\n\n```\n{snippet}\n```")
    for snippet in BUGGY:
        prompts.append(f"Find the bug in this code and fix it:\n\n```\n{snippet}\n```")
    for how, language in itertools.product(HOWTO, LANGUAGES):
        prompts.append(f"How do I {how} in {language}?")
    prompts += [
        "What is the difference between a process and a thread?",
        "Explain Big-O notation with examples.",
        "When should I use a hash map instead of a list?",
        "What is recursion? Give a simple example.",
        "Explain what a REST API is.",
        "What does `git stash` do?",
        "How do I undo the last git commit?",
        "What is a race condition and how do I avoid one?",
        "Explain the difference between SQL JOIN types.",
        "What is dependency injection?",
        "Why is floating point arithmetic imprecise?",
    ]
    return prompts


FORMS = [
    "haiku",
    "short poem",
    "limerick",
    "two-sentence story",
    "short story opening",
    "product description",
    "tweet",
    "riddle",
]
WRITING_TOPICS = [
    "the ocean at night",
    "a lost umbrella",
    "the first snow of winter",
    "a robot learning to paint",
    "morning coffee",
    "a city bus",
    "an old library",
    "a lighthouse keeper",
    "a cat on a windowsill",
    "moving to a new country",
    "a thunderstorm",
    "a forgotten birthday",
    "a mountain hike",
    "autumn leaves",
    "a friendly dragon",
    "the last day of school",
    "a garden in spring",
    "a long train journey",
    "a bakery at dawn",
    "a chess match",
]
MESSAGES = [
    ("my landlord", "report a leaking faucet"),
    ("a coworker", "thank them for covering my shift"),
    ("a client", "say the project will be two days late"),
    ("my team", "announce a new weekly meeting time"),
    ("a neighbor", "ask them to keep the noise down at night"),
    ("a professor", "ask for a deadline extension"),
    ("a friend", "congratulate them on their new job"),
    ("a hotel", "ask for a late checkout"),
    ("my manager", "propose working from home on Fridays"),
    ("a customer", "apologize for a delayed order"),
]
SENTENCES = [
    "we cant make it to the meeting tomorow sorry",
    "The report was wrote by the team in a hurry and it have errors.",
    "I want to say thanks for the help you gave me with the thing last week.",
    "Our product is good and people like it and it is cheap.",
    "pls send me the files asap",
    "The meeting which was scheduled for Monday has been moved to Tuesday due to the fact that the room was booked.",
]
PARAGRAPHS = [
    "Remote work has changed how many teams operate. Without a shared office, people rely on written updates, "
    "video calls and shared documents. Some workers report better focus and less commuting, while others miss "
    "spontaneous conversations and find it harder to separate work from home life.",
    "Honeybees communicate the location of flowers through a waggle dance. The direction of the dance relative "
    "to the vertical shows the direction of the food relative to the sun, and the length of the waggle run "
    "indicates the distance. Other bees follow the dancer and then fly out to find the flowers.",
    "Cities are planting more trees to cope with hotter summers. Trees shade streets and buildings, and water "
    "evaporating from their leaves cools the air. Studies show that neighbourhoods with more tree cover can be "
    "several degrees cooler on hot afternoons.",
]


def writing_prompts(rng: random.Random) -> list[str]:
    prompts = [f"Write a {form} about {topic}." for form, topic in itertools.product(FORMS, WRITING_TOPICS)]
    for who, what in MESSAGES:
        prompts += [
            f"Write a short email to {who} to {what}.",
            f"Write a friendly text message to {who} to {what}.",
            f"Write a formal letter to {who} to {what}.",
        ]
    for sentence in SENTENCES:
        prompts += [
            f'Rewrite this sentence to be clearer and grammatically correct: "{sentence}"',
            f'Make this more formal: "{sentence}"',
            f'Make this sound friendlier: "{sentence}"',
        ]
    for paragraph in PARAGRAPHS:
        prompts += [
            f"Summarize this paragraph in one sentence:\n\n{paragraph}",
            f"Write three quiz questions about this text:\n\n{paragraph}",
            f"Give this paragraph a catchy title:\n\n{paragraph}",
        ]
    return prompts


WORDS = [
    "banana",
    "window",
    "planet",
    "garden",
    "rocket",
    "silver",
    "candle",
    "forest",
    "mirror",
    "pencil",
    "harbor",
    "lantern",
    "meadow",
    "puzzle",
    "thunder",
    "velvet",
    "whisper",
    "orchard",
    "compass",
    "glacier",
]


def multi_turn(rng: random.Random) -> list[list[tuple[str, str]]]:
    """Conversations whose assistant turns are computed here, so every answer shown is correct."""
    conversations = []
    for _ in range(110):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        conversations.append(
            [
                ("human", f"What is {a} times {b}?"),
                ("gpt", f"{a} × {b} = {a * b}."),
                (
                    "human",
                    rng.choice(
                        [
                            "How could I check that in my head?",
                            "Can you show the steps?",
                            "And what is that divided by 3?",
                            "Is the result even or odd, and why?",
                        ]
                    ),
                ),
            ]
        )
    for _ in range(90):
        words = rng.sample(WORDS, rng.randint(4, 7))
        conversations.append(
            [
                ("human", f"Sort these words alphabetically: {', '.join(words)}."),
                ("gpt", ", ".join(sorted(words)) + "."),
                (
                    "human",
                    rng.choice(
                        [
                            "Now sort them by length.",
                            "Which of them has the most vowels?",
                            "Use three of them in one sentence.",
                            "Now in reverse order, please.",
                        ]
                    ),
                ),
            ]
        )
    for _ in range(70):
        hours = rng.randint(1, 12) + rng.choice([0, 0.25, 0.5, 0.75])
        conversations.append(
            [
                ("human", f"How many minutes are in {hours:g} hours?"),
                ("gpt", f"{hours:g} hours is {hours * 60:g} minutes."),
                (
                    "human",
                    rng.choice(
                        [
                            "And how many seconds is that?",
                            "What fraction of a day is that?",
                            "If I spend that long reading every day, how many hours is that per week?",
                        ]
                    ),
                ),
            ]
        )
    for _ in range(60):
        word = rng.choice(WORDS)
        conversations.append(
            [
                ("human", f"Spell the word '{word}' backwards."),
                ("gpt", f"'{word}' backwards is '{word[::-1]}'."),
                (
                    "human",
                    rng.choice(
                        [
                            "Now write a short poem that uses the original word.",
                            "How many letters does it have?",
                            "Give me a word that rhymes with it.",
                            f"Now do the same for '{rng.choice(WORDS)}'.",
                        ]
                    ),
                ),
            ]
        )
    for _ in range(50):
        celsius = rng.randint(-20, 40)
        conversations.append(
            [
                ("human", f"Convert {celsius} °C to Fahrenheit."),
                ("gpt", f"{celsius} °C is {celsius * 9 / 5 + 32:g} °F."),
                (
                    "human",
                    rng.choice(
                        [
                            "Is that warm or cold for a walk outside?",
                            "What formula did you use?",
                            "What would I wear in that weather?",
                        ]
                    ),
                ),
            ]
        )
    return conversations


def build() -> list[dict]:
    rng = random.Random(SEED)
    rows, seen = [], set()
    single = {
        "chat": chat_prompts(rng),
        "reasoning": reasoning_prompts(rng),
        "math": math_prompts(rng),
        "code": code_prompts(rng),
        "writing": writing_prompts(rng),
    }
    for category, prompts in single.items():
        for prompt in prompts:
            if prompt not in seen:
                seen.add(prompt)
                rows.append(
                    {"conversations": [{"from": "human", "value": prompt}], "source": f"eagle3-prompts/{category}"}
                )
    for turns in multi_turn(rng):
        key = "\n".join(value for _, value in turns)
        if key not in seen:
            seen.add(key)
            rows.append(
                {
                    "conversations": [{"from": who, "value": value} for who, value in turns],
                    "source": "eagle3-prompts/multi-turn",
                }
            )
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)


if __name__ == "__main__":
    rows = build()
    OUT.write_text(render(rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {OUT}")
