"""Training and evaluation prompts from the Python source on this machine, split by source file.

Owns where prompts come from (the CPython standard library and site-packages, found through
`sysconfig`), how a source file becomes prompts, the seeded selection, and the held-out split.
It knows nothing of models: `encode_prompt` turns a prompt into token ids with a tokenizer.

Prompt kinds (`Prompt.kind`):

- ``code``: raw text to continue (no chat template): a function header (optionally with its
  docstring) after up to ~1500 characters of the file before it, or the head of a file;
- ``explain`` / ``bug`` / ``docstring`` / ``simplify`` / ``typehints`` / ``test`` / ``summary``:
  a chat question about one function of the file (the code in a fenced block);
- ``task``: "Write a Python function ..." from a function's name, signature and docstring, or
  from a fixed list of small tasks;
- ``general``: questions about a module of the file, or from a fixed list of general questions.

Split: a source is held out iff ``sha1(source id)`` falls under `HELDOUT_FRACTION`; the id is
the root label plus the path relative to that root (``stdlib:json/decoder.py``,
``site:numpy/linalg/linalg.py``; fixed-list questions are ``list:<sha1 of the text>``), so the
split is the same on every machine and Python version. `heldout_prompts` draws only from
held-out sources; `sample_prompts(split="train")` never does, and also skips site-packages
files whose path ends like a held-out stdlib file's (vendored copies). `frozen_heldout_prompts` reads
the evaluation set shipped with the package (``heldout_prompts.jsonl``: `make_frozen_heldout`,
written by ``python -m specdec.train prompts --frozen --write ...``), so CPU and GPU machines
evaluate on the very same prompts; `frozen_heldout_prompts(n)` takes n of them, alternating
code and chat prompts. `frozen_edit_prompts` reads the shipped repetitive set
(``edit_prompts.jsonl``, kind ``edit``): requests to repeat a given file or list with a small
change, where the answer mostly copies the prompt (the workload of prompt-lookup drafting).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import sysconfig
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "HELDOUT_FRACTION",
    "Prompt",
    "SourceFile",
    "dedup",
    "discover_sources",
    "encode_prompt",
    "frozen_heldout_prompts",
    "heldout_prompts",
    "is_heldout",
    "make_frozen_heldout",
    "normalize",
    "sample_prompts",
    "write_prompts",
    "read_prompts",
]

HELDOUT_FRACTION = 0.1  # share of source files (and fixed-list questions) kept for evaluation
FROZEN_HELDOUT = Path(__file__).with_name("heldout_prompts.jsonl")
FROZEN_EDIT = Path(__file__).with_name("edit_prompts.jsonl")
ROOTS = ("stdlib", "site")
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "test", "tests", "idle_test", "lib2to3"})
MAX_FILE_BYTES = 300_000
MAX_CONTEXT_CHARS = 1000  # code before a function header
MAX_CODE_PROMPT_CHARS = 1400  # a whole code-completion prompt
MAX_SNIPPET_CHARS = 1200  # a function quoted in a chat question
MAX_SNIPPET_LINES = 40
PROMPTS_PER_FILE = 3  # prompts drawn from each file read

DEFAULT_MIX = {"code": 0.4, "question": 0.35, "task": 0.15, "general": 0.10}
QUESTIONS = {
    "explain": "Explain what this function does:\n\n```python\n{code}\n```",
    "bug": "Find the bug in this code, if there is one, and show the fix:\n\n```python\n{code}\n```",
    "docstring": "Write a docstring for this function:\n\n```python\n{code}\n```",
    "simplify": "Rewrite this code more simply:\n\n```python\n{code}\n```",
    "typehints": "Add type hints to this function:\n\n```python\n{code}\n```",
    "test": "Write a unit test for this function:\n\n```python\n{code}\n```",
    "summary": "What does this Python code do? Answer in a few sentences.\n\n```python\n{code}\n```",
}
SMALL_TASKS = [
    "checks whether a string is a palindrome", "returns the n-th Fibonacci number", "reverses a linked list",
    "counts the words in a text file", "merges two sorted lists into one sorted list", "removes duplicates from a list while keeping the order",
    "checks whether a number is prime", "flattens a nested list", "computes the factorial of a number",
    "finds the most common element in a list", "converts a Roman numeral to an integer", "parses a CSV line into fields",
    "returns the longest common prefix of a list of strings", "implements binary search on a sorted list", "computes the greatest common divisor of two numbers",
    "transposes a matrix given as a list of lists", "groups words that are anagrams of each other", "validates an email address with a regular expression",
    "reads a JSON file and returns the value of a given key", "sorts a list of dictionaries by a key", "chunks a list into pieces of size n",
    "counts the vowels in a string", "converts a temperature from Celsius to Fahrenheit", "returns all permutations of a string",
    "computes the moving average of a list of numbers", "checks whether two strings are anagrams", "finds the second largest number in a list",
    "capitalizes the first letter of every word in a sentence", "computes the sum of the digits of an integer", "checks whether parentheses in a string are balanced",
    "implements a simple LRU cache", "returns the intersection of two lists", "converts a decimal number to binary",
    "finds all files with a given extension in a directory", "retries a function call up to three times", "measures how long a function takes to run",
    "splits a string into sentences", "computes the median of a list", "generates the first n prime numbers", "rotates a list by k positions",
]
GENERAL_QUESTIONS = [
    "What is the difference between a list and a tuple in Python?", "How do Python decorators work? Give an example.",
    "Explain the difference between `is` and `==` in Python.", "What is a generator in Python and when should I use one?",
    "How does exception handling work in Python?", "What are Python's context managers and the `with` statement for?",
    "Explain list comprehensions with an example.", "What is the Global Interpreter Lock?",
    "How do I read a file line by line in Python?", "What is the difference between `*args` and `**kwargs`?",
    "Explain what a lambda function is.", "How do I sort a dictionary by its values?",
    "What is recursion? Give a simple example.", "What is the difference between a shallow copy and a deep copy?",
    "How do virtual environments work in Python?", "Explain how inheritance works in Python classes.",
    "What does `if __name__ == '__main__':` do?", "What is type hinting in Python?",
    "How do I handle command-line arguments in a Python script?", "What is the difference between a process and a thread?",
    "Explain big-O notation in simple terms.", "What is a hash table and how does it work?",
    "How does garbage collection work in Python?", "What are f-strings in Python?",
    "What is the difference between `append` and `extend` for lists?", "How do I write a unit test in Python?",
    "What is a REST API?", "Explain the difference between a stack and a queue.",
    "What is a regular expression? Give an example in Python.", "How do I merge two dictionaries in Python?",
    "What are Python dataclasses?", "What is asynchronous programming in Python?",
    "How do I remove whitespace from a string in Python?", "What is the difference between `range` and a list?",
    "Explain what JSON is and how to use it in Python.", "What is an iterator in Python?",
    "What is the purpose of `self` in Python classes?", "How do I measure the running time of Python code?",
    "What are some good practices for writing readable Python code?", "How do I install a Python package?",
    "What is the capital of France?", "Give me three tips for staying focused while studying.",
    "Explain photosynthesis in simple terms.", "Write a short poem about the ocean.",
    "What causes the seasons on Earth?", "Summarize the benefits of regular exercise.",
    "How does a computer store numbers?", "What is machine learning?",
    "Explain how the internet works in a few sentences.", "What is the difference between weather and climate?",
]


@dataclass(frozen=True)
class Prompt:
    """One prompt. kind: see the module docstring; source: the id the split is decided on;
    text: the user message (chat) or the raw text to continue (``chat=False``); variant: 0 for
    the target's greedy answer, k > 0 for the k-th extra answer to the same text, sampled (so a
    templated family with few distinct prompts can still fill its share of the mix)."""

    kind: str
    source: str
    text: str
    chat: bool
    variant: int = 0


@dataclass(frozen=True)
class SourceFile:
    id: str  # "stdlib:json/decoder.py": root label + path relative to the root
    path: Path
    group: str  # "stdlib:json": root label + top-level package, for stratified sampling


def _hash_unit(text: str) -> float:
    """A stable number in [0, 1) from `text` (sha1, machine- and version-independent)."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16) / float(1 << 48)


def is_heldout(source_id: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Whether prompts from `source_id` belong to the held-out (evaluation) split."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction={fraction} is out of range; allowed: [0, 1)")
    return _hash_unit(source_id) < fraction


@functools.lru_cache(maxsize=1)
def _heldout_stdlib_paths() -> frozenset[str]:
    return frozenset(f.id.split(":", 1)[1] for f in discover_sources(("stdlib",)) if is_heldout(f.id))


def _excluded_from_training(source_id: str) -> bool:
    """Held out, or a copy of a held-out stdlib file: a site-packages file whose path ends
    like one (vendored copies such as ``setuptools/_distutils/cmd.py`` of ``distutils/cmd.py``;
    plain name clashes are excluded too, which costs nothing)."""
    if is_heldout(source_id):
        return True
    root, _, rel = source_id.partition(":")
    if root != "site":
        return False
    parts = rel.split("/")
    held = _heldout_stdlib_paths()
    return any("/".join(parts[i:]) in held for i in range(len(parts)))


def _root_dirs(roots: tuple[str, ...]) -> list[tuple[str, Path]]:
    unknown = sorted(set(roots) - set(ROOTS))
    if unknown:
        raise ValueError(f"unknown source roots {unknown}; allowed: {list(ROOTS)}")
    paths = sysconfig.get_paths()
    out, seen = [], set()
    for label, keys in (("stdlib", ("stdlib",)), ("site", ("purelib", "platlib"))):
        if label not in roots:
            continue
        for key in keys:
            p = Path(paths[key]).resolve()
            if p.is_dir() and p not in seen:
                seen.add(p)
                out.append((label, p))
    return out


@functools.lru_cache(maxsize=8)
def discover_sources(roots: tuple[str, ...] = ROOTS) -> tuple[SourceFile, ...]:
    """Every readable ``*.py`` file under the roots (tests and caches skipped), sorted by id."""
    files = {}
    for label, root in _root_dirs(tuple(roots)):
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if set(rel.parts[:-1]) & SKIP_DIRS or any(p.endswith((".dist-info", ".egg-info")) for p in rel.parts):
                continue
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if not 200 <= size <= MAX_FILE_BYTES:
                continue
            sid = f"{label}:{rel.as_posix()}"
            top = rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else "_top"
            files.setdefault(sid, SourceFile(sid, path, f"{label}:{top}"))
    return tuple(files[k] for k in sorted(files))


@dataclass(frozen=True)
class _Function:
    name: str
    start: int  # first line (decorators included), 0-based
    header_end: int  # last line of the signature, 0-based
    doc_end: int  # last line of the docstring (== header_end without one), 0-based
    end: int  # last line, 0-based
    args: str
    doc: str | None


_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(")
_DOC = re.compile(r"^[ \t]*[rRuUbB]{0,2}(\"\"\"|\'\'\')")
_STRINGS = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'""")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _functions(lines: list[str]) -> tuple[_Function, ...]:
    """Functions found line by line (much faster than `ast` on big trees; approximate is fine here)."""
    funcs = []
    n = len(lines)
    for i, line in enumerate(lines):
        m = _DEF.match(line)
        if not m:
            continue
        indent = _indent(line)
        start = i
        while start > 0 and lines[start - 1].lstrip().startswith("@") and _indent(lines[start - 1]) == indent:
            start -= 1
        depth, header_end, sig = 0, None, []
        for j in range(i, min(i + 30, n)):
            code = _STRINGS.sub('""', lines[j]).split("#", 1)[0].rstrip()
            sig.append(code.strip())
            depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
            if depth <= 0 and code.endswith(":"):
                header_end = j
                break
        if header_end is None:
            continue
        end = header_end
        for k in range(header_end + 1, n):
            stripped = lines[k].strip()
            if not stripped:
                continue
            if _indent(lines[k]) <= indent and not stripped.startswith("#"):
                break
            end = k
        if end == header_end:
            continue  # a one-line def
        doc, doc_end = None, header_end
        k = header_end + 1
        while k <= end and not lines[k].strip():
            k += 1
        dm = _DOC.match(lines[k]) if k <= end else None
        if dm:
            quote = dm.group(1)
            rest = lines[k][dm.end() :]
            if quote in rest:
                doc, doc_end = rest[: rest.index(quote)], k
            else:
                body = [rest]
                for q in range(k + 1, min(end + 1, k + 200)):
                    if quote in lines[q]:
                        body.append(lines[q][: lines[q].index(quote)])
                        doc, doc_end = textwrap.dedent("\n".join(body)).strip(), q
                        break
                    body.append(lines[q])
        header = " ".join(sig)
        args = header[header.find("(") + 1 : header.rfind(")")] if ")" in header else ""
        funcs.append(_Function(m.group(2), start, header_end, doc_end, end, " ".join(args.split()), doc))
    return tuple(funcs)


@functools.lru_cache(maxsize=512)
def _read(path: Path) -> tuple[str, tuple[_Function, ...]] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text:
        return None
    return text, _functions(text.split("\n"))


def _snippet(lines: list[str], f: _Function, *, drop_doc: bool = False) -> str | None:
    body = lines[f.start : f.end + 1]
    if drop_doc and f.doc is not None:
        body = lines[f.start : f.header_end + 1] + lines[f.doc_end + 1 : f.end + 1]
    code = textwrap.dedent("\n".join(body)).strip("\n")
    if len(code) > MAX_SNIPPET_CHARS or code.count("\n") + 1 > MAX_SNIPPET_LINES or code.count("\n") < 2:
        return None
    return code


def _code_prompt(rng: random.Random, src: SourceFile, text: str, funcs) -> Prompt | None:
    lines = text.split("\n")
    if not funcs or rng.random() < 0.2:  # the head of the file
        n = rng.randint(8, 40)
        head = "\n".join(lines[:n])[:MAX_CONTEXT_CHARS]
        head = head[: head.rfind("\n") + 1] if "\n" in head else head
        return Prompt("code", src.id, head, False) if len(head.strip()) >= 40 else None
    f = rng.choice(funcs)
    if f.end - f.doc_end < 2:
        return None
    stop = f.doc_end if (f.doc is not None and rng.random() < 0.5) else f.header_end
    before = "\n".join(lines[max(0, f.start - 60) : f.start])
    before = before[-MAX_CONTEXT_CHARS:]
    if "\n" in before and len(before) == MAX_CONTEXT_CHARS:
        before = before[before.find("\n") + 1 :]
    head = "\n".join(lines[f.start : stop + 1])
    if len(head) > MAX_CONTEXT_CHARS:
        return None
    prompt = (before + "\n" if before else "") + head + "\n"
    if len(prompt) > MAX_CODE_PROMPT_CHARS:
        prompt = prompt[-MAX_CODE_PROMPT_CHARS:]
        prompt = prompt[prompt.find("\n") + 1 :]
    return Prompt("code", src.id, prompt, False) if prompt.strip() else None


def _question_prompt(rng: random.Random, src: SourceFile, text: str, funcs) -> Prompt | None:
    if not funcs:
        return None
    kind = rng.choice(sorted(QUESTIONS))
    f = rng.choice(funcs)
    code = _snippet(text.split("\n"), f, drop_doc=kind == "docstring")
    return Prompt(kind, src.id, QUESTIONS[kind].format(code=code), True) if code else None


def _task_prompt(rng: random.Random, src: SourceFile, text: str, funcs) -> Prompt | None:
    documented = [f for f in funcs if f.doc and not f.name.startswith("_") and 10 <= len(f.doc.split("\n")[0]) <= 160]
    if not documented:
        return None
    f = rng.choice(documented)
    first = f.doc.strip().split("\n")[0].strip()
    args = f.args.replace("self, ", "").replace("self", "")
    return Prompt("task", src.id, f"Write a Python function `{f.name}({args})`. Its job: {first}", True)


def _general_prompt(rng: random.Random, src: SourceFile, text: str, funcs) -> Prompt | None:
    module = src.id.split(":", 1)[1].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    where = "in the Python standard library" if src.id.startswith("stdlib:") else "(a Python package)"
    templates = (
        "What is the module `{m}` {w} used for? Give a short example.",
        "Explain what the Python module `{m}` {w} provides.",
        "When would I use `{m}` {w}? Show a small example.",
    )
    return Prompt("general", src.id, rng.choice(templates).format(m=module, w=where), True)


_FROM_FILE = {"code": _code_prompt, "question": _question_prompt, "task": _task_prompt, "general": _general_prompt}


def _list_prompts(kind: str, heldout: bool) -> list[Prompt]:
    if kind == "task":
        texts = [f"Write a Python function that {t}." for t in SMALL_TASKS]
    else:
        texts = list(GENERAL_QUESTIONS)
    out = []
    for t in texts:
        sid = "list:" + hashlib.sha1(t.encode()).hexdigest()[:16]
        if is_heldout(sid) == heldout:
            out.append(Prompt(kind, sid, t, True))
    return out


def sample_prompts(
    n: int,
    seed: int = 0,
    *,
    split: str = "train",
    roots: tuple[str, ...] = ROOTS,
    mix: dict[str, float] | None = None,
) -> list[Prompt]:
    """`n` distinct prompts of one split, chosen by a seeded RNG (same machine + seed = same list).

    Files are drawn stratified: first a group (root + top-level package) uniformly, then a file
    of it, so a few huge packages do not drown the rest. Fixed-list tasks and questions make up
    a third of the ``task`` and ``general`` draws.

    Args:
        n: prompts wanted (fewer come back only if the sources run dry).
        split: "train" (never a held-out source) or "heldout" (only held-out sources).
        roots: source roots, a subset of ("stdlib", "site").
        mix: weights of "code", "question", "task", "general" (default `DEFAULT_MIX`).
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split={split!r} is unknown; allowed: ['train', 'heldout']")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r} must be an int >= 0")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    if set(mix) - set(_FROM_FILE) or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix={mix} must give non-negative weights to a subset of {sorted(_FROM_FILE)}")
    heldout = split == "heldout"
    groups: dict[str, list[SourceFile]] = {}
    for f in discover_sources(tuple(roots)):
        if heldout and is_heldout(f.id) or not heldout and not _excluded_from_training(f.id):
            groups.setdefault(f.group, []).append(f)
    names = sorted(groups)
    lists = {k: _list_prompts(k, heldout) for k in ("task", "general")}
    kinds = sorted(mix)
    weights = [mix[k] for k in kinds]
    rng = random.Random(f"specdec-prompts:{seed}:{split}")
    out: list[Prompt] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n and attempts < 50 * n + 100:
        attempts += 1
        kind = rng.choices(kinds, weights)[0]
        if kind in lists and lists[kind] and (not names or rng.random() < 1 / 3):
            drawn = [rng.choice(lists[kind])]
        elif names:
            src = rng.choice(groups[rng.choice(names)])
            read = _read(src.path)
            if read is None:
                continue
            drawn = [_FROM_FILE[kind](rng, src, *read)]
            for _ in range(PROMPTS_PER_FILE - 1):  # reading a file costs more than using it
                drawn.append(_FROM_FILE[rng.choices(kinds, weights)[0]](rng, src, *read))
        else:
            continue
        for prompt in drawn:
            if prompt is not None and prompt.text not in seen and len(out) < n:
                seen.add(prompt.text)
                out.append(prompt)
    return out


def normalize(text: str) -> str:
    """The text duplicates are judged on: lower case, punctuation dropped, whitespace collapsed."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def dedup(prompts: list[Prompt]) -> list[Prompt]:
    """`prompts` without the later ones whose `normalize`d text and variant were already seen
    (order kept): a sampled variant of a prompt is not a duplicate of its greedy original."""
    seen, out = set(), []
    for p in prompts:
        key = (normalize(p.text), p.variant)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def heldout_prompts(n: int, seed: int = 0, *, roots: tuple[str, ...] = ROOTS) -> list[Prompt]:
    """`n` prompts from held-out sources only (never used for training); see `sample_prompts`."""
    return sample_prompts(n, seed, split="heldout", roots=roots)


def write_prompts(prompts: list[Prompt], path) -> Path:
    """Write prompts as JSON lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")
    return path


def read_prompts(path) -> list[Prompt]:
    """Read prompts written by `write_prompts`."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Prompt(**json.loads(line)) for line in lines if line.strip()]


def make_frozen_heldout(n_code: int = 32, n_chat: int = 32, seed: int = 0) -> list[Prompt]:
    """The recipe of the shipped evaluation set: held-out stdlib files only, code prompts then
    chat prompts (questions 60%, tasks 20%, general 20%)."""
    code = sample_prompts(n_code, seed, split="heldout", roots=("stdlib",), mix={"code": 1.0})
    chat = sample_prompts(n_chat, seed, split="heldout", roots=("stdlib",), mix={"question": 0.6, "task": 0.2, "general": 0.2})
    return code + chat


def _frozen(path: Path, what: str, n: int | None) -> list[Prompt]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} ({what}) is missing from the specdec package")
    prompts = read_prompts(path)
    if n is not None and not 1 <= n <= len(prompts):
        raise ValueError(f"n={n} {what} asked for; allowed: [1, {len(prompts)}]")
    return prompts


def frozen_edit_prompts(n: int | None = None) -> list[Prompt]:
    """The shipped repetitive prompts (repeat a given file with a rename, copy a list), first n."""
    return _frozen(FROZEN_EDIT, "frozen edit prompts", n)[:n]


def frozen_heldout_prompts(n: int | None = None) -> list[Prompt]:
    """The evaluation prompts shipped with specdec (held-out stdlib files and list questions)."""
    prompts = _frozen(FROZEN_HELDOUT, "frozen held-out prompts", n)
    if n is None:
        return prompts
    code = [p for p in prompts if not p.chat]
    chat = [p for p in prompts if p.chat]
    mixed = [p for pair in zip(code, chat) for p in pair] + code[len(chat) :] + chat[len(code) :]
    return mixed[:n]


def encode_prompt(prompt: Prompt, tokenizer, vocab_size: int | None = None) -> list[int]:
    """Token ids of `prompt`: chat prompts through the tokenizer's chat template (with the
    generation prompt), code prompts as raw text.

    Without a tokenizer (tiny test targets) the UTF-8 bytes modulo `vocab_size` are the ids.
    """
    if tokenizer is None:
        if vocab_size is None:
            raise ValueError("encode_prompt without a tokenizer needs vocab_size")
        return [b % vocab_size for b in prompt.text.encode("utf-8")]
    text = prompt.text
    if prompt.chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"prompt kind {prompt.kind!r} is a chat prompt but the tokenizer has no chat template")
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
