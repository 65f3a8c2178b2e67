"""The repository's text: every cited `.md` document exists, and no text speaks of how work is organised."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

CITING_SUFFIXES = (".py", ".md", ".toml", ".ipynb")
CITED_MD = re.compile(r"[\w./-]*\w\.md\b")
# Text we write: code, docs, specs, notebooks, and the run records the suite writes. Left out: the
# paper's published CSVs (their text is the paper authors') and SVGs (matplotlib's metadata).
SKIPPED = re.compile(r"^results/published/.*\.csv$|\.(svg|png|ipynb_checkpoints)$")
# Upstream bug trackers keep their own word: "fla issue #640" names a fact of that library.
DENYLIST = re.compile(
    r"\bbriefs?\b|\bissues?\b(?! #\d)|\bsessions?\b|\btickets?\b|\bthe lead\b|\blent\b|\bhelpers?\b",
    re.IGNORECASE,
)


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and name != THIS]


def text_of(name: str) -> str | None:
    data = (ROOT / name).read_bytes()
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def cited_documents(name: str, text: str) -> list[str]:
    """The `.md` paths `name` cites that exist neither from the repository root nor beside `name`."""
    here = (ROOT / name).parent
    return [
        cited
        for cited in set(CITED_MD.findall(text))
        if not ((ROOT / cited).is_file() or (here / cited).is_file())
    ]


def test_every_cited_document_is_in_the_repository():
    missing = {
        name: cited
        for name in tracked_files()
        if name.endswith(CITING_SUFFIXES) and (text := text_of(name)) is not None
        if (cited := cited_documents(name, text))
    }
    assert missing == {}


def test_a_missing_cited_document_is_found(tmp_path):
    assert cited_documents("tests/test_docs.py", "see `docs/no_such_design.md`") == ["docs/no_such_design.md"]
    assert cited_documents("docs/design.md", "[formulas](model_formulas.md)") == []
    assert cited_documents("tests/test_docs.py", "the counts (docs/model_formulas.md)") == []


def test_no_text_speaks_of_how_work_is_organised():
    hits = [
        f"{name}:{number}: {line.strip()[:120]}"
        for name in tracked_files()
        if not SKIPPED.search(name) and (text := text_of(name)) is not None
        for number, line in enumerate(text.splitlines(), 1)
        if DENYLIST.search(line)
    ]
    assert hits == []


@pytest.mark.parametrize(
    "line, found",
    [
        ("# Issue 3's GPU check", True),
        ("the brief's keys", True),
        ("measured on a lent H100", True),
        ("Helpers shared by the tests", True),
        ("wrong results, fla issue #640", False),
        ("hidden from the legend by the leading underscore", False),
    ],
)
def test_denylist(line, found):
    assert bool(DENYLIST.search(line)) is found


def test_the_quick_test_files_exist_and_the_readme_names_the_target():
    makefile = (ROOT / "Makefile").read_text()
    block = makefile.split("QUICK_TESTS := $(addprefix tests/test_,")[1].split(")")[0]
    names = block.replace("\\", " ").split()
    assert len(names) > 10
    assert [name for name in names if not (ROOT / "tests" / f"test_{name}.py").is_file()] == []
    readme = (ROOT / "README.md").read_text()
    assert "make test-quick" in readme and "about 6 minutes" in readme


def test_the_cpu_install_names_pytorchs_cpu_index_and_quiets_the_editable_banner():
    makefile = (ROOT / "Makefile").read_text()
    assert "CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu" in makefile
    assert '--index-url $(CPU_TORCH_INDEX) "$(CPU_TORCH)+cpu"' in makefile
    assert "cannot be reached: installing $(CPU_TORCH)" in makefile
    recipes = [line for line in makefile.splitlines() if line.startswith("\t")]
    editable = [line for line in recipes if "pip install" in line and " -e " in line]
    assert editable and all(line.strip().startswith("$(QUIET_BUILD)") for line in editable)
    assert "download.pytorch.org/whl/cpu" in (ROOT / "docs" / "install.md").read_text()


def test_the_readme_is_a_guide_under_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) < 250
