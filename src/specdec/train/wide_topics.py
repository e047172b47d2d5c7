"""The wide instruction pool's extra topics and ways of asking (training only).

`mix.TOPICS` x `mix.INSTRUCT_TEMPLATES` is the base pool: the frozen per-category evaluation set
(`categories`) was drawn from its held-out part, so it stays as it is. A head trained on the base
pool's ~600 training requests learned those requests, not general chat (issue 21's e3 head:
general-chat validation flat for the last third of its run while the training estimate rose).
These lists widen what training asks about and how, for `MixConfig(instruct_pool="wide")`:
305 more topics over 26 domains and 20 more templates: 11616 distinct training requests where
the base pool has 696 (`mix.instruct_prompts("train", "wide")`).

Rules, checked by tests/train/test_train_mix.py: every topic and template here is a training one
(none is, or contains, a held-out topic of `mix.HELDOUT_TOPICS`; none repeats a base topic or
template id); topics hold no ``|`` or ``:`` (they go into `Prompt.source`); a template formats
with ``{t}`` (and ``{u}``, a second topic of the same domain). The topics were chosen as broad
general knowledge, not with the evaluation prompts in view.
"""

from __future__ import annotations

__all__ = ["MORE_TEMPLATES", "MORE_TOPICS"]

# domain -> topics; a domain of `mix.TOPICS` extends it, a new one is its own ("programming": chat about code)
MORE_TOPICS: dict[str, tuple[str, ...]] = {
    "science": ("earthquakes", "the speed of light", "DNA", "magnets", "rainbows", "the periodic table", "gravity",
                "climate change", "the human heart", "antibiotics", "plate tectonics", "the immune system", "atoms",
                "evolution", "solar eclipses"),
    "history": ("the French Revolution", "the Great Wall of China", "the Renaissance", "the invention of the telephone",
                "the Vikings", "the Cold War", "ancient Greece", "the Aztecs", "the fall of the Berlin Wall",
                "the Ottoman Empire", "the history of writing", "medieval castles", "the Gold Rush",
                "the invention of paper"),
    "cooking": ("making pasta from scratch", "grilling vegetables", "homemade pizza", "cooking rice", "making pancakes",
                "vegetarian cooking", "sourdough starters", "making jam", "curry", "cooking with cast iron",
                "chocolate", "salad dressings", "making dumplings", "roasting a chicken"),
    "health": ("posture", "vitamins", "running injuries", "hand washing", "screen time", "meditation", "healthy snacks",
               "back pain", "allergies", "sunscreen", "the flu", "strength training", "hearing protection",
               "dental care"),
    "travel": ("camping", "road trips", "backpacking in Europe", "traveling with children", "hostels",
               "airport security", "planning a budget vacation", "visiting national parks", "cruise ships",
               "travel photography", "reading a paper map", "solo travel"),
    "money": ("retirement savings", "student loans", "index funds", "paying off debt", "emergency funds", "taxes",
              "mortgages", "starting a small business", "cryptocurrency", "tipping", "insurance",
              "negotiating a salary"),
    "nature": ("whales", "wolves", "deserts", "ants", "tides", "glaciers", "owls", "sharks", "butterflies",
               "mangrove forests", "penguins", "earthworms", "the Amazon river", "tornadoes"),
    "arts": ("opera", "sculpture", "street art", "calligraphy", "the Mona Lisa", "classical music", "film making",
             "knitting", "pottery", "writing a novel", "stand-up comedy", "ballet", "oil painting", "comic books"),
    "everyday": ("doing laundry", "cleaning the kitchen", "waking up early", "decluttering", "writing a thank-you note",
                 "choosing a gift", "fixing a leaky tap", "keeping houseplants alive", "commuting by bus",
                 "organizing a birthday party", "ironing shirts", "saving energy at home"),
    "sports": ("tennis", "basketball", "marathon training", "rock climbing", "skiing", "surfing", "table tennis",
               "boxing", "the Olympic Games", "golf", "hiking", "martial arts", "soccer tactics"),
    "programming": ("linked lists", "binary search", "Python decorators", "closures", "memory management",
                    "Docker containers", "type hints", "dynamic programming", "design patterns", "code reviews",
                    "continuous integration", "graph algorithms", "JSON", "HTTP caching", "threads and locks",
                    "list comprehensions", "exceptions", "database indexes", "big O notation",
                    "functional programming", "virtual environments", "logging", "command-line tools",
                    "binary trees", "caching", "API versioning"),
    "technology": ("smartphones", "3D printing", "electric cars", "Wi-Fi", "password managers", "cloud storage",
                   "robots", "virtual reality", "GPS", "solar panels", "batteries", "search engines", "email spam",
                   "smart home devices"),
    "pets": ("adopting a cat", "training a puppy", "aquarium fish", "keeping chickens", "hamsters", "parrots",
             "walking a dog", "pet nutrition", "horses", "rabbits"),
    "language": ("learning Spanish", "English grammar", "idioms", "sign language", "the origin of words",
                 "learning vocabulary", "writing clearly", "punctuation", "public speaking", "reading faster"),
    "psychology": ("motivation", "habits", "memory", "procrastination", "dreams", "confidence", "empathy",
                   "handling criticism", "decision making", "boredom"),
    "geography": ("the Sahara desert", "mountains", "islands", "rivers", "Japan", "Iceland", "the Arctic", "time zones",
                  "capital cities", "the Mediterranean Sea", "Australia", "the Andes"),
    "work": ("job interviews", "writing a resume", "working from home", "leadership", "giving feedback",
             "running meetings", "asking for a raise", "changing careers", "freelancing", "networking events"),
    "education": ("studying for exams", "note taking", "online courses", "homeschooling", "learning math",
                  "reading to children", "university applications", "science fairs", "group projects", "libraries"),
    "environment": ("recycling", "composting", "plastic pollution", "saving water", "air quality",
                    "endangered species", "wind power", "reducing food waste", "planting trees", "ocean cleanup"),
    "philosophy": ("free will", "happiness", "ethics", "the meaning of life", "Socrates", "stoicism", "fairness",
                   "truth"),
    "space": ("Mars", "the International Space Station", "comets", "Saturn's rings", "telescopes", "the Big Bang",
              "exoplanets", "the Milky Way", "satellites"),
    "music": ("piano lessons", "writing songs", "music festivals", "drums", "hip hop", "choirs", "vinyl records",
              "music theory", "the violin", "film soundtracks"),
    "family": ("toddler tantrums", "family dinners", "bedtime routines", "teenagers and phones", "grandparents",
               "sibling rivalry", "pocket money", "moving house with kids"),
    "transport": ("learning to drive", "car maintenance", "bicycles", "public transport", "electric scooters",
                  "flying", "traffic jams"),
    "civics": ("voting", "jury duty", "copyright", "renting an apartment", "consumer rights", "contracts",
               "privacy online"),
    "games": ("board games", "video game design", "crossword puzzles", "sudoku", "card games", "Dungeons and Dragons",
              "prime numbers", "probability", "fractions", "statistics"),
}

# template id -> (family, text): other ways of asking; none of `mix.HELDOUT_TEMPLATES`' ids
MORE_TEMPLATES: dict[str, tuple[str, str]] = {
    "history-of": ("facts", "What is the history of {t}?"),
    "misconceptions": ("facts", "What are the most common misconceptions about {t}?"),
    "explain-analogy": ("explain", "Explain {t} using an everyday analogy."),
    "explain-detail": ("explain", "Give a detailed explanation of {t}."),
    "pros-cons": ("compare", "What are the pros and cons of {t}?"),
    "compare-table": ("compare", "Make a small table comparing {t} and {u}."),
    "write-haiku": ("write", "Write a haiku about {t}."),
    "write-dialogue": ("write", "Write a short dialogue between two friends talking about {t}."),
    "write-speech": ("write", "Write the opening of a short speech about {t}."),
    "write-ad": ("write", "Write a short, upbeat advertisement for a beginners' class on {t}."),
    "write-posts": ("write", "Write three short social media posts about {t}."),
    "quiz": ("plan", "Create a three-question multiple-choice quiz about {t}, with the answers."),
    "questions-expert": ("plan", "What five questions should I ask an expert on {t}?"),
    "story-day": ("story", "Describe a day in the life of someone whose work is about {t}."),
    "story-mystery": ("story", "Write the first paragraph of a mystery story involving {t}."),
    "everyday-cheap": ("everyday", "How can I get into {t} without spending much money?"),
    "everyday-opinion": ("everyday", "Is {t} overrated? Give me a balanced opinion."),
    "outline": ("summarize", "Write an outline for a blog post about {t}."),
    "glossary": ("summarize", "List and define five key terms related to {t}."),
    "summarize-paragraph": ("summarize", "Summarize what a beginner should know about {t} in one paragraph."),
}
