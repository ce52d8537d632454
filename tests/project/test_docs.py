"""README.md and docs/: links resolve, the README stays short, no page names an issue number (#22 or issue 22).

Pure file checks, no Spark and no network: they read the Markdown files only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) or [text](target "title"); not images' remote URLs (filtered below).
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
# An issue or pull request by number: "issue 12", "PR #7", and a bare "#22" (what our commit messages
# and notes say). Not "&#39;" (an HTML entity), "C#9" or a link's "#1-first-step" anchor.
ISSUE = re.compile(r"\b(?:issues?|PRs?|pull requests?) #?\d+|(?<![\w&#])#\d+(?![\w-])", re.I)


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]


def without_fences(text: str) -> str:
    """The text with fenced code blocks blanked out (a `# comment` there is no heading), lines kept."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code spans blanked out (links there are not links)."""
    return INLINE_CODE.sub("``", without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(without_fences(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The link targets of a Markdown file that point inside the repository (no scheme, no mailto)."""
    targets = LINK.findall(without_code(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t)]


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    """`file: target (why)` for every relative link whose file or #anchor does not exist."""
    broken = []
    for path in files:
        for target in relative_links(path):
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no heading with anchor #{anchor} in {dest.relative_to(root)})")
    return broken


def issue_mentions(files: list[Path], root: Path = ROOT) -> list[str]:
    """`file:line: text` for every line that names an issue number."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ISSUE.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_the_docs_folder_has_its_pages():
    assert (ROOT / "docs" / "README.md").is_file()
    assert len(doc_files()) > 2


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = broken_links(doc_files())
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_no_page_names_an_issue_number():
    found = issue_mentions(doc_files())
    assert not found, "issue numbers in the docs (say what the issue asked for instead):\n" + "\n".join(found)


def test_the_docs_index_lists_every_page():
    index = relative_links(ROOT / "docs" / "README.md")
    listed = {target.partition("#")[0] for target in index}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert not pages - listed, f"docs/README.md does not list: {sorted(pages - listed)}"


# The checks themselves: each finds what it is for, so a passing run above means something.

@pytest.mark.parametrize("heading, anchor", [
    ("Crashes, interrupts and `--resume`", "crashes-interrupts-and---resume"),
    ("The driver and Spark at a million keys", "the-driver-and-spark-at-a-million-keys"),
    ("INT8: faster when it agrees", "int8-faster-when-it-agrees"),
    ("Measuring: `make bench`", "measuring-make-bench"),
    ("snake_case and 12 MP", "snake_case-and-12-mp"),
])
def test_slug_follows_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_the_checks_report_broken_links_and_issue_numbers(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n\n[ok](docs/a.md#a-page) [gone](docs/missing.md) [bad anchor](docs/a.md#nope)\n"
        "[self](#top) [web](https://example.com/x.md) `[in code](nowhere.md)`\n"
        "As issue 12 asked.\n", encoding="utf-8")
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n```md\n[fenced](nowhere.md)\n```\nSee Issues #3.\n[up](../README.md#top)\n", encoding="utf-8")
    files = doc_files(tmp_path)
    assert broken_links(files, tmp_path) == [
        "README.md: docs/missing.md (no such file)",
        "README.md: docs/a.md#nope (no heading with anchor #nope in docs/a.md)",
    ]
    assert issue_mentions(files, tmp_path) == ["README.md:5: As issue 12 asked.", "docs/a.md:6: See Issues #3."]


@pytest.mark.parametrize("line", [
    "in the two shapes #22 names", "(#22)", "#22's targets", "as #7 asked.", "see PR #12", "pull request 4",
])
def test_the_issue_check_catches_a_bare_hash_number(line):
    assert ISSUE.search(line), line


@pytest.mark.parametrize("line", [
    "[step one](#1-first-step)", "don&#39;t", "C#9 code", "## 22 images", "`--top-k 5`", "photo-#a1",
])
def test_the_issue_check_passes_anchors_entities_and_headings(line):
    assert not ISSUE.search(line), line


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Notes\n\n## Notes\n\n```\n# not a heading\n```\n", encoding="utf-8")
    assert anchors(page) == {"notes", "notes-1"}


def test_make_help_lists_every_documented_target():
    """Every Makefile target with a ``## what it does`` comment is in ``make help``, digits in its name or not."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    documented = re.findall(r"^([A-Za-z0-9_.-]+):[^\n]*?## ", makefile, flags=re.MULTILINE)
    assert "bench-int8" in documented and "test" in documented
    listed = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    assert sorted(set(documented) - names) == []


def test_make_help_says_make_exits_2_and_where_the_jobs_code_is_for_submit_and_watch():
    """make exits 2 whenever a recipe fails: help may not promise the job's code through it."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    listed = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    lines = {line.split()[0]: line for line in listed.splitlines() if line.strip()}
    for target, direct in (("submit", "the printed == line"),
                           ("watch", ".venv/bin/python -m mxjob.reporting.watch OUTPUT")):
        line = lines[target]
        assert "exit with its code" not in line, line
        assert "make itself exits 2 on any failure" in line and "the last line" in line, line
        assert direct in line, line


def test_the_readme_says_what_make_test_takes_and_installs():
    # A new user runs make test first: its length, and that it runs apt-get as root, are no surprise.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if line.startswith("make test "))
    assert re.search(r"about \d+ minutes", line), line
    assert "installs with `apt-get` when run as root" in readme and "Maven" in readme



MAKE_SUBMIT = re.compile(r"make submit ARGS='([^']*)'")
DEMO_CONFIG = re.compile(r"--config[ =]conf/demo\.yaml\b")


def demo_output_commands(files: list[Path], root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """``(where, args)`` of each ``make submit ARGS='...'`` that writes the demo's output (``--config
    conf/demo.yaml`` without ``--output``: the file's ``output``, which ``make run-local`` has written)."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in MAKE_SUBMIT.finditer(line):
                args = match[1].split()
                if DEMO_CONFIG.search(match[1]) and not any(a.partition("=")[0] == "--output" for a in args):
                    found.append((f"{path.relative_to(root)}:{number}", args))
    return found


def test_every_make_submit_example_on_the_demo_output_replaces_or_resumes_it():
    # A reader tries these after make run-local: the job, and a dry run too, refuse an existing output
    # without --overwrite (or --resume).
    commands = demo_output_commands(doc_files())
    assert {"docs/planning.md", "docs/configuration.md", "README.md"} <= {w.partition(":")[0] for w, _ in commands}
    refused = [f"{where}: {' '.join(args)}" for where, args in commands if not {"--overwrite", "--resume"} & set(args)]
    assert not refused, "these fail after make run-local (add --overwrite):\n" + "\n".join(refused)


def test_the_demo_output_check_finds_only_commands_that_write_the_demo_output(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("make submit ARGS='--config conf/demo.yaml --top-k 2'\n"
                    "`make submit ARGS='--config=conf/demo.yaml --dry-run'` and "
                    "`make submit ARGS='--config conf/demo.yaml --output s3://b/o.jsonl'` and "
                    "`make submit ARGS='--config s3://b/job.yaml'`\n", encoding="utf-8")
    assert demo_output_commands([page], tmp_path) == [("p.md:1", ["--config", "conf/demo.yaml", "--top-k", "2"]),
                                                      ("p.md:2", ["--config=conf/demo.yaml", "--dry-run"])]


def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or higher (``#`` in fences is no heading)."""
    # By line: without_fences keeps the line count, not the offsets.
    lines, plain = text.splitlines(), without_fences(text).splitlines()
    first = next(i for i, line in enumerate(plain) if re.fullmatch(rf"#{{1,6}}[ \t]+{re.escape(heading)}[ \t]*", line))
    level = len(plain[first]) - len(plain[first].lstrip("#"))
    after = (i for i in range(first + 1, len(plain)) if re.match(rf"#{{1,{level}}}[ \t]", plain[i]))
    return "\n".join(lines[first + 1: next(after, len(lines))])


def test_section_ends_at_the_next_heading_of_its_level_not_at_a_comment_in_a_fence():
    text = "# Page\n## First\none\n```sh\n# not a heading\n```\n### Sub\ntwo\n## Second\nthree\n"
    assert section(text, "First") == "one\n```sh\n# not a heading\n```\n### Sub\ntwo"
    assert section(text, "Second") == "three"


def test_emr_before_the_first_run_names_the_iam_actions_and_the_dry_run():
    # The person creating the cluster needs these before any AWS call, and a dry run against the real S3
    # catches a wrong bucket or a missing model before a cluster bills.
    before = section((ROOT / "docs" / "emr.md").read_text(encoding="utf-8"), "Before the first run")
    for needed in ("iam:PassRole", "elasticmapreduce:RunJobFlow", "elasticmapreduce:AddJobFlowSteps",
                   "infer_main.py --config my-job.yaml --dry-run", "bootstrap-actions/1/"):
        assert needed in before, needed


def test_the_library_page_quotes_the_batch_size_bound_the_model_test_asserts():
    # docs/library.md promises "probabilities within <bound>" across batch sizes;
    # tests/unit/model/test_model.py holds it.
    bound = re.search(r"^BATCH_SIZE_PROBABILITY_BOUND = (\S+)$",
                      (ROOT / "tests" / "unit" / "model" / "test_model.py").read_text(encoding="utf-8"), re.M)[1]
    page = " ".join((ROOT / "docs" / "library.md").read_text(encoding="utf-8").split())
    assert f"probabilities within {bound} of each other" in page
