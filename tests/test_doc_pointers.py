"""Pointers from the code and docs to a section of a document name a section that document has.

Before: ``autoplan explain`` said "see Error bands in the README" (the section is in
docs/published.md) and docs/launch.md cited README "Checkpoint interval and goodput" (in
docs/cost-model.md). Two spellings are checked, as the project writes them: ``see SECTION in FILE``
(FILE: ``the README`` or ``docs/NAME.md``) and ``FILE "SECTION"`` / ``FILE, "SECTION"``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILE = r"(?P<file>the README|README|docs/[\w-]+\.md)"
POINTERS = (re.compile(rf"see (?P<section>[A-Z][\w ,-]+?) in {FILE}"),
            re.compile(rf"{FILE},? \"(?P<section>[A-Z][^\"]+)\""))
SCANNED = ("*.py", "*.md", "scripts/*")


def _pointers() -> list[tuple[str, str, str]]:
    """(where, document, section) of every pointer in the tracked code and docs."""
    listed = subprocess.run(["git", "ls-files", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
    found = []
    for name in listed.stdout.split():
        if name.startswith("tests/") or name == "CHANGELOG.md":
            continue
        for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), start=1):
            for pattern in POINTERS:
                for match in pattern.finditer(line):
                    document = "README.md" if "README" in match["file"] else match["file"]
                    found.append((f"{name}:{number}", document, match["section"].strip()))
    return found


def _headings(document: str) -> list[str]:
    text = (ROOT / document).read_text(encoding="utf-8")
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


def test_pointers_are_found():
    documents = {(document, section) for _, document, section in _pointers()}
    assert ("docs/published.md", "Error bands") in documents
    assert ("docs/cost-model.md", "Checkpoint interval and goodput") in documents


@pytest.mark.parametrize(("where", "document", "section"), _pointers())
def test_each_pointer_names_a_section_of_its_document(where, document, section):
    assert (ROOT / document).is_file(), f"{where}: {document} does not exist"
    headings = _headings(document)
    assert any(h.startswith(section) for h in headings), f"{where}: {document} has no section {section!r}"
