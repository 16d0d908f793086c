"""The repository stands alone: every document it mentions is in it, every relative link in its
markdown points at a file (and heading) it holds, and nothing points outside it. And where the
prose states an identity between the methods, it states the identity's condition."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", "runs", "build", "__pycache__", "node_modules"}
# Paths of the machine this project was written on, which a clone does not have. Spelled in
# two pieces so that this file does not name them itself.
OUTSIDE = ("/work/" + "shared", "shared/" + "reference")
# A mention of a markdown file: `docs/algorithms.md`, "README.md", ... (not `<key>.md`, `*.md`).
MD_MENTION = re.compile(r"(?<![\w/.<*-])([\w./-]*[\w-]\.md)\b")
# A markdown link or an HTML image in markdown: [text](target), <img src="target">.
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img[^>]*\bsrc=\"([^\"]+)\"")


def repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore; without git, every file outside the
    virtual environments, caches and run outputs."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                              "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
        return [ROOT / n for n in names if (ROOT / n).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file()
                and not any(part in SKIP_DIRS or part.startswith(".venv") or
                            part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)]


FILES = repository_files()
TEXT = {p: p.read_text(errors="replace") for p in FILES
        if p.suffix in (".md", ".py", ".toml", ".ipynb", ".yml", ".json", ".cfg", ".txt", "")
        and p.stat().st_size < 5_000_000}
SOURCES = [p for p in TEXT if p.suffix in (".md", ".py", ".toml") or p.name == "Makefile"]
NOTEBOOK_SOURCES = [p for p in SOURCES if p.suffix == ".py" and "notebooks" in p.parts]
MARKDOWN = [p for p in SOURCES if p.suffix == ".md"]
PATHS = {p.relative_to(ROOT).as_posix() for p in FILES}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lower case, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (repeated headings get -1, -2, ...)."""
    seen, out, fenced = {}, set(), False
    for line in TEXT[path].splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def markdown_links(path: Path):
    """(line, target) of each relative link: every link of a .md file, and those in the
    comment lines (markdown cells) of a notebook's .py source."""
    text = TEXT[path]
    if path.suffix == ".py":
        text = "\n".join(line if line.lstrip().startswith("#") else ""
                         for line in text.splitlines())
    for m in LINK.finditer(text):
        target = m[1] or m[2]
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("//"):
            yield line_of(text, m.start()), target


def test_no_file_points_outside_the_repository():
    found = [f"{rel(p)}:{line_of(text, m.start())}: {m[0]}" for p, text in TEXT.items()
             for m in re.finditer("|".join(map(re.escape, OUTSIDE)), text)]
    assert not found, "these files point outside the repository:\n" + "\n".join(found)


def test_every_markdown_file_mentioned_is_in_the_repository():
    """A mention matches a file of the repository whose path ends with it (`results.md` is
    figures/results.md; `docs/algorithms.md` is that file)."""
    def exists(name: str) -> bool:
        name = name.lstrip("./")
        return any(p == name or p.endswith("/" + name) for p in PATHS)

    # the book's code and its test name the pages of the built book, not repository files
    book = [p for p in SOURCES if rel(p).startswith("book/") or p.name == "test_book.py"]
    assert book, "the book's code moved: update this test"
    missing = [f"{rel(p)}:{line_of(TEXT[p], m.start())}: {m[1]}" for p in SOURCES
               if p not in book for m in MD_MENTION.finditer(TEXT[p]) if not exists(m[1])]
    assert not missing, ("these files mention markdown files the repository does not hold:\n"
                         + "\n".join(missing))


def test_every_relative_link_points_at_a_file_and_heading_of_the_repository():
    broken = []
    for p in MARKDOWN + NOTEBOOK_SOURCES:
        for line, target in markdown_links(p):
            where, _, anchor = target.partition("#")
            dest = (p.parent / where).resolve() if where else p
            if not dest.exists():
                broken.append(f"{rel(p)}:{line}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and dest in TEXT and anchor not in anchors(dest):
                broken.append(f"{rel(p)}:{line}: {target} (no such heading)")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_the_checks_see_the_documents():
    """The scan reads the README, the docs and the code (a scan of nothing passes vacuously)."""
    assert {"README.md", "docs/algorithms.md", "diloco_lite/config.py", "Makefile",
            "pyproject.toml"} <= {rel(p) for p in SOURCES}
    assert "symbols" in anchors(ROOT / "docs" / "algorithms.md")
    assert slug("1. Data-parallel training (DDP)") == "1-data-parallel-training-ddp"
    assert slug("`make reproduce`, in detail") == "make-reproduce-in-detail"


# A sentence about DiLoCo at H = 1 with an outer SGD at lr 1 next to DDP: the identity's setting.
H1 = re.compile(r"\bH\s*=\s*1\b")
OUTER_SGD1 = re.compile(r"outer SGD|SGD\s*\(\s*(?:lr\s*=?\s*)?1(?:\.0)?\b")
SAYS_IDENTITY = re.compile(r"≡\s*DDP|\bis\W{0,3}DDP\b|\bis\?")  # "≡ DDP", "is DDP", "*is* DDP"
SGD_INNER = re.compile(r"\bSGD inner\b|\binner optimizer,? SGD\b|\bSGD as (?:the|its) inner\b")
ADAMW = re.compile(r"\bAdamW\b")


def sentences(text: str) -> list[str]:
    """A document's prose as sentences: a notebook source's comment marks dropped, lines joined,
    cut at . ? ! ; (or one closing its bold) followed by a space, at blank lines and at table
    cells."""
    out = []
    for block in re.split(r"\n\s*#?\s*\n|\|", text):
        lines = [re.sub(r"^\s*#\s?", "", line) for line in block.splitlines()]
        cuts = re.split(r"(?<=[.?!;])\s+|(?<=[.?!;]\*\*)\s+", " ".join(lines))
        out += [s.strip() for s in cuts if s.strip()]
    return out


def identity_slips(text: str) -> list[str]:
    """Sentences that set DiLoCo at H = 1 with outer SGD(lr 1) against DDP but do not name the
    inner optimizer, or that say it *is* DDP without naming the SGD inner optimizer (with AdamW
    inside, the mean of the workers' AdamW updates is not one AdamW update: it is not DDP)."""
    slips = []
    for s in sentences(text):
        if not (H1.search(s) and OUTER_SGD1.search(s) and "DDP" in s):
            continue
        if not (SGD_INNER.search(s) or ADAMW.search(s)):
            slips.append(f"names no inner optimizer: {s}")
        elif SAYS_IDENTITY.search(s) and not SGD_INNER.search(s):
            slips.append(f"says it is DDP without the SGD inner optimizer: {s}")
    return slips


IDENTITY_DOCUMENTS = ("README.md", "docs/algorithms.md", "notebooks/02_diloco.py")


def test_the_h1_identity_is_stated_with_its_condition():
    """DiLoCo with H = 1 and outer SGD(lr 1) ≡ DDP holds with an SGD inner optimizer only
    (`tests/test_identities.py` holds both sides): each document that states it says so."""
    found = [f"{name}: {slip}" for name in IDENTITY_DOCUMENTS
             for slip in identity_slips(TEXT[ROOT / name])]
    assert not found, "the H = 1 identity without its condition:\n" + "\n".join(found)
    # the check sees the sentences it is about, and the slip this test was written for
    assert any(H1.search(s) and OUTER_SGD1.search(s) and SGD_INNER.search(s)
               for name in IDENTITY_DOCUMENTS for s in sentences(TEXT[ROOT / name]))
    assert identity_slips("the identities (DiLoCo with H = 1 and outer SGD(1) ≡ DDP, and more)")
    assert identity_slips("With AdamW inside, DiLoCo with H = 1 and outer SGD(lr 1) is DDP.")
    assert not identity_slips("With AdamW inside, DiLoCo with H = 1 and outer SGD(1) is not DDP.")


# One name per quantity (docs/algorithms.md §4, rule 3): the reply's trip is t_reply, t_quorum is
# an instant (the wait to the quorum is t_quorum − t_ask), and a token weight is tokens × tokens
# per step, which says nothing about how good a step was.
MISNAMED = {r"\bt_sync\b": "the reply's trip is t_reply",
            r"\bt_quorum\s*\+\s*t_(?:sync|reply)\b":
                "t_quorum is an instant: the wait is t_quorum − t_ask",
            r"quantity\s*[×x*]\s*quality": "a token weight is tokens × tokens per step"}


def test_one_name_per_quantity():
    """The docs, the notebooks (the exercises too) and the library's code."""
    scanned = MARKDOWN + NOTEBOOK_SOURCES + [p for p in SOURCES
                                             if rel(p).startswith("diloco_lite/")]
    found = [f"{rel(p)}:{line_of(TEXT[p], m.start())}: {m[0]!r}: {why}" for p in scanned
             for pattern, why in MISNAMED.items() for m in re.finditer(pattern, TEXT[p])]
    assert not found, "a quantity under another name:\n" + "\n".join(found)
    assert ROOT / "docs" / "algorithms.md" in scanned
