"""The quick starts in the READMEs run: every ```python block of ``README.md`` and
``packages/*/README.md`` is executed, so a README that drifts from the API fails here.

Blocks of one file run in order in one namespace (a later block uses an earlier one's
names), in a fresh temporary working directory (snippets may write ``runs/``). A block whose
preceding line is ``<!-- not-tested: reason -->`` is skipped (GPU / vLLM snippets). Tracebacks
point at the README itself: each block is compiled with the README's path and line numbers.
The snippets carry their own asserts (shapes, finite losses, search results), so a broken API
or a changed behaviour fails the test, not only an exception.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]
# the package READMEs that must hold at least one tested quick start
QUICK_STARTS = [ROOT / "packages" / pkg / "README.md" for pkg in ("kernels", "core", "marl", "llm")]

_FENCE_OPEN = re.compile(r"^(\s*)```\s*python\s*$")
_FENCE_CLOSE = re.compile(r"^\s*```\s*$")
_SKIP = re.compile(r"^\s*<!--\s*not-tested:(.*?)-->\s*$")


@dataclass
class Block:
    """One ```python block: its code, the README line of its first code line, and the
    reason it is not run (``None``: it is run)."""

    code: str
    line: int
    skip: str | None = None


def python_blocks(text: str, name: str = "<readme>") -> list[Block]:
    """The ```python blocks of a Markdown text, in order.

    Args:
        text: the Markdown source.
        name: the file name, for error messages.

    Returns:
        One :class:`Block` per fenced ```python block (other languages are ignored); a
        block is marked skipped when the last non-blank line before its fence is
        ``<!-- not-tested: reason -->``.

    Raises:
        ValueError: an unclosed fence, or a not-tested marker without a reason.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and not _FENCE_CLOSE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{name}:{i + 1}: ```python block is never closed")
        prev = i - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        skip = None
        marker = _SKIP.match(lines[prev]) if prev >= 0 else None
        if marker:
            skip = marker.group(1).strip()
            if not skip:
                raise ValueError(f"{name}:{prev + 1}: '<!-- not-tested: ... -->' needs a reason")
        code = textwrap.dedent("\n".join(lines[start:end]))
        blocks.append(Block(code, start + 1, skip))
        i = end + 1
    return blocks


def run_blocks(blocks: list[Block], filename: str) -> dict:
    """Execute the blocks that are not skipped, in order, in one fresh namespace.

    Each block is compiled with ``filename`` and padded so that a traceback names the
    README line. Returns the namespace.
    """
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        if block.skip is not None:
            continue
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the point of the test
    return namespace


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("readme", READMES, ids=_rel)
def test_readme_python_blocks_run(readme: Path, tmp_path, monkeypatch):
    if not readme.exists():
        pytest.skip(f"{_rel(readme)} does not exist")
    blocks = python_blocks(readme.read_text(encoding="utf-8"), _rel(readme))
    if not any(b.skip is None for b in blocks):
        pytest.skip(f"{_rel(readme)} has no tested ```python block")
    monkeypatch.chdir(tmp_path)
    run_blocks(blocks, str(readme))


@pytest.mark.parametrize("readme", QUICK_STARTS, ids=_rel)
def test_package_readme_has_a_tested_quick_start(readme: Path):
    assert readme.exists(), f"{_rel(readme)} is missing"
    text = readme.read_text(encoding="utf-8")
    assert "quick start" in text.lower(), f"{_rel(readme)} has no 'Quick start' section"
    tested = [b for b in python_blocks(text, _rel(readme)) if b.skip is None]
    assert tested, f"{_rel(readme)} has no tested ```python block"


# ------------------------------------------------------------------ the harness itself
_SAMPLE = """\
# title

```bash
echo not python
```

Text.

```python
x = 1
```

<!-- not-tested: needs a GPU -->

```python
raise RuntimeError("skipped, never run")
```

- a list item with an indented block:

  ```python
  y = x + 1
  ```
"""


def test_python_blocks_parses_fences_markers_and_lines():
    blocks = python_blocks(_SAMPLE)
    assert [b.code for b in blocks] == [
        "x = 1",
        'raise RuntimeError("skipped, never run")',
        "y = x + 1",
    ]
    assert [b.line for b in blocks] == [10, 16, 22]  # 1-based lines of the first code line
    assert [b.skip for b in blocks] == [None, "needs a GPU", None]


def test_run_blocks_shares_one_namespace_and_skips_marked_blocks():
    ns = run_blocks(python_blocks(_SAMPLE), "sample.md")
    assert ns["x"] == 1 and ns["y"] == 2


def test_a_failing_block_fails_and_names_the_readme_line():
    text = "```python\nok = 1\n```\n\n```python\n\nassert ok == 2, 'wrong'\n```\n"
    with pytest.raises(AssertionError, match="wrong") as info:
        run_blocks(python_blocks(text), "broken.md")
    frame = info.traceback[-1]
    assert frame.path == Path("broken.md") or str(frame.path) == "broken.md"
    assert frame.lineno + 1 == 7  # pytest's lineno is 0-based; the assert is on line 7


def test_marker_errors_are_reported():
    with pytest.raises(ValueError, match="needs a reason"):
        python_blocks("<!-- not-tested: -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        python_blocks("```python\nx = 1\n")


# ------------------------------------------------------------------ links
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


LINKED = [ROOT / "README.md", *QUICK_STARTS, ROOT / "docs" / "ARCHITECTURE.md", ROOT / "CONTRIBUTING.md"]


@pytest.mark.parametrize("readme", LINKED, ids=_rel)
def test_package_readme_links_resolve(readme: Path):
    """Every relative link points at a file of the repository, and every ``#anchor`` into a
    Markdown file at one of its headings (so a renamed RESULTS.md section is caught)."""
    text = readme.read_text(encoding="utf-8")
    links = [m.group(1) for m in _LINK.finditer(text) if "://" not in m.group(1)]
    assert links, f"{_rel(readme)} links to nothing (apps, benchmarks/RESULTS.md)"
    for link in links:
        target, _, anchor = link.partition("#")
        path = (readme.parent / target).resolve() if target else readme
        assert path.exists(), f"{_rel(readme)}: link {link!r} -> {path} does not exist"
        if anchor and path.suffix == ".md":
            headings = re.findall(r"^#+\s+(.*)$", path.read_text(encoding="utf-8"), flags=re.M)
            slugs = {_slug(h) for h in headings}
            assert anchor in slugs, f"{_rel(readme)}: no heading '#{anchor}' in {_rel(path)}"


def test_slug_matches_github_anchors():
    assert _slug("LLM (GRPO)") == "llm-grpo"
    assert _slug("Learning (library)") == "learning-library"
    assert _slug("Coming from BenchMARL / TorchRL") == "coming-from-benchmarl--torchrl"
