"""User docs and CLI help say what is true now: no commit ids, no issue numbers, a word budget, live links.

Why: users read docs/ and ``--help`` to run DLB; which commit measured what and which issue changed what
belong in research/ and the issue notes. In-process: files are read and parsers built, nothing is run.

Rules, precisely:

- **Commit id**: a run of 7-40 lowercase hex digits standing alone (no letter, digit, ``_``, ``#``,
  ``/``, ``.`` or ``-`` glued to it on either side; ``0x`` not before it) with at least one digit and
  at least one letter a-f. So ``ab48804`` and ``5f11a9d4...`` count; ``1234567`` (a number),
  ``defaced`` (a word), ``#a1b2c3d`` (a colour), ``0xdeadbeef1`` (a literal), 64-hex sha256 digests,
  UUID fields and hex inside paths or file names (``run-ab48804.json``) do not.
- **Issue reference**: ``issue`` or ``issues`` (any case) followed by an optional ``#`` or ``-`` and a
  number: ``issue 14``, ``Issue #9``, ``issue-11``.
- **Budget**: all of docs/**/*.md and README.md together at most 25,000 words (``wc -w`` counting).
- **Links**: every relative Markdown link in those files names a file or folder that exists, and its
  ``#anchor``, if any, is a heading of that file.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORD_BUDGET = 25_000

COMMIT_ID = re.compile(r"(?<![0-9A-Za-z_#/.\-])(?<!0x)([0-9a-f]{7,40})(?![0-9A-Za-z_/\-]|\.[0-9A-Za-z])")
ISSUE_REF = re.compile(r"\bissues?\s*[#-]?\s*\d+", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")



def commit_ids(text: str) -> list[str]:
    """Tokens of ``text`` that look like git commit ids (rule in the module docstring)."""
    return [m for m in COMMIT_ID.findall(text) if re.search(r"[0-9]", m) and re.search(r"[a-f]", m)]


def issue_refs(text: str) -> list[str]:
    return ISSUE_REF.findall(text)


def user_docs(repo: Path = REPO) -> list[Path]:
    return sorted((repo / "docs").rglob("*.md")) + [repo / "README.md"]


def word_count(paths: list[Path]) -> int:
    """Words as ``wc -w`` counts them: runs of non-whitespace."""
    return sum(len(p.read_text(encoding="utf-8").split()) for p in paths)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))  # no headings in code blocks
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"(?m)^#{1,6} (.*)$", text)}


def broken_links(path: Path) -> list[str]:
    """Relative links of a Markdown file whose file does not exist, or whose anchor is no heading there."""
    bad = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # URLs, mailto:
        file_part, _, anchor = target.partition("#")
        dest = path.parent / file_part if file_part else path
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            bad.append(target)
    return bad


def help_texts(parser: argparse.ArgumentParser, prog: str = "dlb") -> Iterator[tuple[str, str]]:
    """(command, --help text) for ``parser`` and every subcommand below it."""
    yield prog, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from help_texts(sub, f"{prog} {name}")


def findings(text: str) -> list[str]:
    return [f"commit id {c}" for c in commit_ids(text)] + [f"issue reference {i!r}" for i in issue_refs(text)]


@pytest.fixture(scope="module")
def all_help() -> list[tuple[str, str]]:
    from dlb.cli import build_parser

    return list(help_texts(build_parser(None)))  # None: every command's module registers its real parser


# -- the rules on the real files -------------------------------------------------------------------


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_user_doc_names_no_commit_or_issue(path: Path) -> None:
    """A user doc names no commit id and no issue number."""
    assert findings(path.read_text(encoding="utf-8")) == []


def test_user_docs_fit_the_word_budget() -> None:
    """docs/**/*.md and README.md together stay within 25,000 words."""
    assert word_count(user_docs()) <= WORD_BUDGET


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_user_doc_links_resolve(path: Path) -> None:
    """Every relative link of a user doc names a file that exists."""
    assert broken_links(path) == []


TEST_PATH = re.compile(r"\btests/[A-Za-z0-9_/]+\.py")


def missing_test_paths(text: str, repo: Path = REPO) -> list[str]:
    """``tests/….py`` paths named in ``text`` that do not exist (a moved or split test file left behind)."""
    return sorted({m for m in TEST_PATH.findall(text) if not (repo / m).is_file()})


def test_named_test_files_exist() -> None:
    """User docs and the code's docstrings name test files by path; every such path exists."""
    texts = [p.read_text(encoding="utf-8") for p in [*user_docs(), *sorted((REPO / "dlb").rglob("*.py"))]]
    assert missing_test_paths("\n".join(texts)) == []


def test_a_planted_missing_test_path_is_found() -> None:
    assert missing_test_paths("see tests/unit/test_layout.py and tests/test_gone.py") == ["tests/test_gone.py"]


def test_cli_help_names_no_commit_or_issue(all_help: list[tuple[str, str]]) -> None:
    """No ``dlb ... --help`` text names a commit id or an issue number."""
    commands = {cmd for cmd, _ in all_help}
    assert {"dlb serve leaf", "dlb sim report", "dlb config validate", "dlb bfio study"} <= commands
    assert "--output" in dict(all_help)["dlb sim report"]  # real parsers, not the lazy placeholders
    bad = {cmd: findings(text) for cmd, text in all_help if findings(text)}
    assert bad == {}



def test_the_getting_started_commands_say_each_default() -> None:
    """``dlb up``, ``dlb demo`` and ``dlb load``: every option with a value by default says it in its help
    (was missing on nine, e.g. ``dlb up --control-planes``: 2 replicas start, the help gave no number)."""
    from dlb.cli import build_parser

    sub = next(a for a in build_parser(None)._actions if isinstance(a, argparse._SubParsersAction))
    silent = [(cmd, a.option_strings[0]) for cmd in ("up", "demo", "load") for a in sub.choices[cmd]._actions
              if a.option_strings and a.default not in (None, False, argparse.SUPPRESS) and "default" not in (a.help or "")]
    assert silent == []

# -- the rules can fail: planted violations ---------------------------------------------------------


def test_planted_commit_ids_are_found_and_lookalikes_are_not() -> None:
    planted = ("Measured at ab48804 on the box; code 5f11a9d4363cb12beb955f6787827170e48b8fb8 (commit `d6cb3be`). "
               "Fixed in 0a61bcf.")
    assert commit_ids(planted) == ["ab48804", "5f11a9d4363cb12beb955f6787827170e48b8fb8", "d6cb3be", "0a61bcf"]
    lookalikes = ("1234567 requests; the word defaced; colour #a1b2c3d; literal 0xdeadbeef1; "
                  "sha256 " + "ab12" * 16 + "; uuid 123e4567-e89b-12d3-a456-426614174000; "
                  "file run-ab48804.json and path sim/ab48804/x")
    assert commit_ids(lookalikes) == []


def test_planted_issue_references_are_found() -> None:
    assert issue_refs("as issue 14 showed; Issue #9; see issue-11; Issues 9 and 16") == \
        ["issue 14", "Issue #9", "issue-11", "Issues 9"]
    assert issue_refs("no issue here; reissue the token; issues remain") == []


def test_planted_doc_over_budget_and_broken_link_fail(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("see [running](docs/running.md#run-it) and [gone](docs/gone.md#x)\n")
    (tmp_path / "docs" / "running.md").write_text("## Run it\n" + "word " * (WORD_BUDGET + 1 - 4 - 3))
    docs = user_docs(tmp_path)
    assert word_count(docs) == WORD_BUDGET + 1 > WORD_BUDGET
    assert broken_links(tmp_path / "README.md") == ["docs/gone.md#x"]
    (tmp_path / "README.md").write_text("[moved](docs/running.md#walk-it) [self](#nowhere)\n")
    assert broken_links(tmp_path / "README.md") == ["docs/running.md#walk-it", "#nowhere"]


def test_planted_help_text_is_found() -> None:
    parser = argparse.ArgumentParser(prog="dlb")
    sub = parser.add_subparsers().add_parser("hostile", help="attacks")
    sub.add_argument("--scale", help="issue 14's attacks, measured at ab48804")
    flagged = {cmd: findings(text) for cmd, text in help_texts(parser) if findings(text)}
    assert flagged == {"dlb hostile": ["commit id ab48804", "issue reference 'issue 14'"]}
