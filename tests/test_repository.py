"""What a newcomer meets stays small and true: the README and docs/performance.md within their
lengths, results/ holding the current records rather than every run ever made, every results file
the docs cite present in the tree, and every link between the docs landing on a heading."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harness.results import is_scratch

REPO = Path(__file__).resolve().parents[1]
LIMITS = {"README.md": 200, "docs/performance.md": 350}  # lines
RESULTS_FILES = 83  # tracked files under results/: each experiment's current run, and what the docs cite
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readme_and_the_performance_guide_stay_within_their_lengths():
    for name, limit in LIMITS.items():
        lines = len((REPO / name).read_text().splitlines())
        assert lines <= limit, (
            f"{name} has {lines} lines, over {limit}: condense it (git history keeps the detail)"
        )


def _tracked_results() -> list[str]:
    """`git ls-files results`; in a copy without git, the files on disk outside scratch folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
        )
        return out.stdout.split()
    except (OSError, subprocess.SubprocessError):
        root = REPO / "results"
        return [
            str(p.relative_to(REPO))
            for p in root.rglob("*")
            if p.is_file() and p.name != ".gitignore" and not any(is_scratch(d) for d in p.parents)
        ]


def test_results_holds_the_current_records_not_every_run():
    files = _tracked_results()
    assert len(files) <= RESULTS_FILES, (
        f"{len(files)} tracked files under results/, over {RESULTS_FILES}: keep each experiment's current run"
        " and what the docs cite; `git rm` the rest (git history keeps it)"
    )


def _expand(path: str) -> list[str]:
    """'a-{x,y}.json' as ['a-x.json', 'a-y.json']."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [
        p
        for part in match.group(1).split(",")
        for p in _expand(path[: match.start()] + part + path[match.end() :])
    ]


CITED = re.compile(r"`(results/[^`\s]+\.(?:jsonl|json|log|txt|md))`")
SCRATCH = ("results/smoke/", "results/adhoc/")  # what the reader's own runs write; never committed


def test_every_results_file_the_readme_and_docs_cite_is_in_the_tree():
    missing = []
    for doc in DOCS:
        for cited in CITED.findall(doc.read_text()):
            for path in _expand(cited):
                if "<" in path or path.startswith(SCRATCH):
                    continue  # a pattern for the reader (results/<experiment>.jsonl), or their own run
                found = (
                    list(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
                )
                if not found:
                    missing.append(f"{doc.relative_to(REPO)}: {path}")
    assert missing == [], "cited but not in the tree (restore it, or cite what is): " + "; ".join(missing)


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file: each heading slugged, and every explicit `<a id=...>`."""
    text = doc.read_text()
    slugs = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slugs.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return slugs


LINK = re.compile(r"\]\(([^)\s]+\.md)(#[^)\s]+)?\)")


def test_every_link_between_the_docs_lands_on_a_file_and_heading():
    broken = []
    for doc in DOCS:
        for target, anchor in LINK.findall(doc.read_text()):
            if target.startswith("http"):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
            elif anchor and anchor[1:] not in _anchors(path):
                broken.append(f"{doc.relative_to(REPO)}: {target}{anchor}")
    assert broken == [], "links to a missing file or heading: " + "; ".join(broken)


HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
GENERATED_BLOCK = re.compile(r"<!-- generated: ([a-z0-9-]+) .*?<!-- end generated: \1 -->", re.S)


def commit_mentions(text: str) -> list[tuple[int, str]]:
    """(line, hash) for every commit hash a reader meets in a doc: not a results file's name (a path
    in backticks), nor after "Data:" in a generated block, which names the run a table comes from."""
    mentions = []
    for number, line in enumerate(text.splitlines(), start=1):
        if "Data: " in line and _in_block(text, number):
            line = line.split("Data: ", 1)[0]  # the run a table comes from, named where its data is
        prose = re.sub(r"`[^`]*/[^`]*`", "", line)  # a path: results/device-logs/x-20261204-9616b23.json
        mentions += [(number, found) for found in HASH.findall(prose)]
    return mentions


def _in_block(text: str, number: int) -> bool:
    start = len("\n".join(text.splitlines()[: number - 1]))
    return any(m.start() <= start <= m.end() for m in GENERATED_BLOCK.finditer(text))


def test_the_docs_name_no_commit_outside_the_data_lines_of_generated_blocks():
    """A guide says what is true now and how to reproduce it; the history stays in git. A commit may
    stand on a generated block's "Data:" line (the run the table comes from) and in a results file's
    name, nowhere else."""
    found = [f"{doc.relative_to(REPO)}:{n}: {h}" for doc in DOCS for n, h in commit_mentions(doc.read_text())]
    assert found == [], "commit hashes in the docs (say what is true now): " + "; ".join(found)


def test_no_doc_asks_for_git_history():
    """No instruction that needs the repository's history to run (a file that has left the tree)."""
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), start=1):
            assert not re.search(r"git (show|checkout|log|worktree) ", line), (
                f"{doc.relative_to(REPO)}:{number}: {line}"
            )
