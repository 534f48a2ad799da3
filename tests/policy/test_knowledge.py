"""gpuguard's knowledge tables as data: the strict parser (agent/policy/knowledge.py) and the choice between the
package's copy and a bundle's (agent/policy/knowledge_files.py); the dcgm-exporter and TheRock release tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.policy.companions import exporter_table
from agent.policy.knowledge import MAX_KNOWLEDGE_BYTES, KnowledgeInvalid, parse_knowledge
from agent.policy.knowledge_files import BundleKnowledge, choose, compiled_table, parse_named, shipped_table
from agent.policy.table_unknown import therock_table

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "policies/knowledge/dcgm-exporter.toml"

GOOD = """table = "dcgm-exporter"
version = 3
dated = "2026-12-20"

[[row]]
exporter = "4.10.0"
dcgm = "4.8.0"
dcgm_series = ["4.8"]
source = "https://github.com/NVIDIA/dcgm-exporter/releases"
date = "2026-12-06"

[[row]]
exporter = "4.11.0"
dcgm = "4.9.0"
dcgm_series = ["4.9"]
source = "invented for the test"
date = "2026-12-20"
"""


def test_the_shipped_table_parses_with_a_source_and_date_on_every_row() -> None:
    """The file the package ships is well-formed: named, versioned, dated, each row with its source and date, and
    its newest row is exporter 4.10.0 with DCGM 4.8.0 from NVIDIA's releases page."""
    table = parse_knowledge(SHIPPED.read_bytes(), str(SHIPPED))
    assert (table.table, table.dated) == ("dcgm-exporter", "2026-12-06") and table.version >= 1
    assert all(row.source and row.date <= table.dated for row in table.row)
    assert (table.row[-1].exporter, table.row[-1].dcgm) == ("4.10.0", "4.8.0")
    assert table.row[-1].source.startswith("https://github.com/NVIDIA/dcgm-exporter/releases")


def test_a_good_table_compiles_to_what_the_hook_reads_back() -> None:
    """The compiled form, read back by the hook's stdlib reader, keeps every row, the date and the origin."""
    table = parse_knowledge(GOOD.encode(), "t.toml")
    back = exporter_table(table.to_compiled("bundle serial 4"))
    assert (back.version, back.dated, back.origin) == (3, "2026-12-20", "bundle serial 4")
    assert [(r.exporter, r.dcgm, r.series) for r in back.rows] == [("4.10.0", "4.8.0", ("4.8",)),
                                                                  ("4.11.0", "4.9.0", ("4.9",))]


@pytest.mark.parametrize("old, new, message", [
    ('table = "dcgm-exporter"', 'table = "fabric"', "t.toml: table: Input should be 'dcgm-exporter'"),
    ("version = 3", 'version = "3"', "t.toml: version: '3' is a string: write a whole number (no quotes)"),
    ("version = 3", "version = 0", "t.toml: version: Input should be greater than or equal to 1"),
    ('dated = "2026-12-20"', 'dated = "2026-12-32"', "t.toml: dated: '2026-12-32' is not a day as "
                                                     "YYYY-MM-DD"),
    ('dated = "2026-12-20"', "dated = 2026-12-20", "t.toml: dated: datetime.date(2026, 12, 20) is a value of "
                                                   "another type: write a string in quotes"),
    ('exporter = "4.11.0"', 'exporter = "4.11"', "t.toml: row -> 2 -> exporter: '4.11' is not a "
                                                 "MAJOR.MINOR.PATCH release"),
    ('dcgm = "4.9.0"', 'dcgm = "4.9.x"', "t.toml: row -> 2 -> dcgm: '4.9.x' is not a MAJOR.MINOR.PATCH "
                                         "release"),
    ('dcgm_series = ["4.9"]', "dcgm_series = []", "t.toml: row -> 2 -> dcgm_series: List should have at least 1 "
                                                  "item"),
    ('dcgm_series = ["4.9"]', 'dcgm_series = ["4"]', "t.toml: row -> 2 -> dcgm_series: '4' is not a "
                                                     "MAJOR.MINOR series"),
    ('source = "invented for the test"', 'source = ""', "t.toml: row -> 2 -> source: String should have at least 1 "
                                                        "character"),
    ('date = "2026-12-20"\n', 'date = "2026-12-21"\n', "t.toml: (top level): row -> 2 -> date: "
                                                       "2026-12-21 is after the table's dated 2026-12-20"),
    ('exporter = "4.11.0"', 'exporter = "4.9.0"', "t.toml: (top level): row -> 2 -> exporter: 4.9.0 is "
                                                  "not after the row before it (4.10.0)"),
    ('source = "invented for the test"', 'source = "x"\nwhere = "y"', "t.toml: row -> 2 -> where: Extra inputs are "
                                                                      "not permitted"),
])
def test_each_bad_field_is_one_line_naming_file_and_field(old: str, new: str, message: str) -> None:
    """Every wrong field is refused in one line that names the file and the field."""
    assert old in GOOD
    with pytest.raises(KnowledgeInvalid) as caught:
        parse_knowledge(GOOD.replace(old, new, 1).encode(), "t.toml")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("data, message", [
    (b"\xff\xfe", "t.toml: knowledge file is not UTF-8 (byte 0)"),
    (b"table = ", "t.toml: not valid TOML:"),
    (GOOD.replace("version = 3", "version = 3\nversion = 4").encode(), "t.toml: not valid TOML:"),  # key twice
    (b"#" * (MAX_KNOWLEDGE_BYTES + 1), f"t.toml: knowledge file is {MAX_KNOWLEDGE_BYTES + 1} bytes, more than the"),
    (b"", "t.toml: table: Field required"),
])
def test_bytes_that_are_not_a_table_are_refused_in_one_line(data: bytes, message: str) -> None:
    """Not UTF-8, not TOML, a duplicate key, too large, empty: one line naming the file."""
    with pytest.raises(KnowledgeInvalid) as caught:
        parse_knowledge(data, "t.toml")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


def test_a_file_must_hold_the_table_its_name_says() -> None:
    """A dcgm-exporter table in a file of another name is refused (a bundle cannot swap tables by name)."""
    with pytest.raises(KnowledgeInvalid, match="is not the table a file named fabric.toml holds"):
        parse_named("fabric.toml", GOOD.encode(), "knowledge -> fabric.toml")


def test_the_later_dated_copy_is_used_a_tie_going_to_the_bundle() -> None:
    """A bundle's table dated later than the package's is used; dated earlier, the package's stays (no rollback of
    knowledge); dated the same day, the bundle's."""
    shipped = parse_knowledge(SHIPPED.read_bytes(), "shipped")
    newer = parse_knowledge(GOOD.encode(), "newer")
    older = parse_knowledge(GOOD.replace('dated = "2026-12-20"', 'dated = "2026-12-01"').replace(
        'date = "2026-12-20"', 'date = "2026-12-01"').replace('date = "2026-12-06"', 'date = "2026-12-01"').encode(),
        "older")
    same = parse_knowledge(GOOD.replace("2026-12-20", shipped.dated).encode(), "same")
    assert choose(shipped, newer, 7) == (newer, "bundle serial 7")
    assert choose(shipped, older, 7) == (shipped, "package")
    assert choose(shipped, same, 7) == (same, "bundle serial 7")
    assert choose(shipped, None, None) == (shipped, "package")


def test_a_missing_shipped_table_and_a_damaged_bundle_copy_are_one_line_errors(tmp_path: Path) -> None:
    """No package copy anywhere, or a damaged installed bundle copy: KnowledgeInvalid naming the file."""
    with pytest.raises(KnowledgeInvalid, match="dcgm-exporter.toml: gpuguard's dcgm-exporter table is not found in"):
        shipped_table("dcgm-exporter", (str(tmp_path / "none"),))
    (tmp_path / "dcgm-exporter.toml").write_text("table = 1\n")
    with pytest.raises(KnowledgeInvalid, match=f"{tmp_path}/dcgm-exporter.toml: table: "):
        compiled_table("dcgm-exporter", BundleKnowledge(str(tmp_path), 3))


THEROCK_SHIPPED = REPO / "policies/knowledge/therock-releases.toml"
THEROCK_GOOD = """table = "therock-releases"
version = 2
dated = "2026-12-20"

[[row]]
release = "10.1"
released = "2026-10-05"
source = "https://rocm.docs.amd.com/en/latest/about/release-notes.html"
date = "2026-12-06"

[[row]]
release = "10.2"
released = "2026-12"
source = "https://github.com/ROCm/TheRock (invented for the test)"
date = "2026-12-20"
"""


def test_the_shipped_therock_table_parses_with_a_source_url_and_date_on_every_row() -> None:
    """The TheRock release table the package ships: named, versioned, dated, each row with its URL and date, from
    7.13 to 10.1 in release order; read back it names its newest row and origin."""
    table = parse_knowledge(THEROCK_SHIPPED.read_bytes(), str(THEROCK_SHIPPED))
    assert (table.table, table.dated) == ("therock-releases", "2026-12-06") and table.version >= 1
    assert all(row.source.startswith("https://") and row.date <= table.dated for row in table.row)
    assert [row.model_dump()["release"] for row in table.row] == ["7.13", "7.14", "10.0", "10.1"]
    back = therock_table(table.to_compiled("package"))
    assert back.named() == "TheRock release table version 1 dated 2026-12-06 (from package; newest row: 10.1)"


def test_a_good_therock_table_compiles_to_what_explain_reads_back() -> None:
    """The compiled form keeps the date, version and origin, and the newest row by number (10.2 after 10.1)."""
    table = parse_knowledge(THEROCK_GOOD.encode(), "t.toml")
    compiled = table.to_compiled("bundle serial 4")
    assert compiled["rows"][1] == {"release": "10.2", "released": "2026-12", "date": "2026-12-20",
                                   "source": "https://github.com/ROCm/TheRock (invented for the test)"}
    back = therock_table(compiled)
    assert (back.version, back.dated, back.origin, back.newest) == (2, "2026-12-20", "bundle serial 4", "10.2")


@pytest.mark.parametrize("old, new, message", [
    ('table = "therock-releases"', 'table = "therock"', "t.toml: table: Input should be 'dcgm-exporter' or "
                                                         "'therock-releases'"),
    ("version = 2", "version = 2.0", "t.toml: version: "),
    ('dated = "2026-12-20"', 'dated = "2026-12"', "t.toml: dated: '2026-12' is not a day as YYYY-MM-DD"),
    ('release = "10.2"', 'release = "10.2.0"', "t.toml: row -> 2 -> release: '10.2.0' is not a MAJOR.MINOR series"),
    ('release = "10.2"', "release = 10.2", "t.toml: row -> 2 -> release: 10.2 is a number: write a string in quotes"),
    ('released = "2026-12"', 'released = "December 2026"', "t.toml: row -> 2 -> released: 'December 2026' is not "
                                                            "a day as YYYY-MM-DD or a month as YYYY-MM"),
    ('released = "2026-12"\n', "", "t.toml: row -> 2 -> released: Field required"),
    ('source = "https://github.com/ROCm/TheRock (invented for the test)"', 'source = "ROCm 10.2 notes"',
     "t.toml: row -> 2 -> source: 'ROCm 10.2 notes' does not start with the URL of its source (https://...)"),
    ('source = "https://github.com/ROCm/TheRock (invented for the test)"', 'source = ""',
     "t.toml: row -> 2 -> source: String should have at least 1 character"),
    ('date = "2026-12-20"\n', 'date = "2026-12-21"\n', "t.toml: (top level): row -> 2 -> date: 2026-12-21 is after "
                                                       "the table's dated 2026-12-20"),
    ('date = "2026-12-20"\n', 'date = "20 Dec"\n', "t.toml: row -> 2 -> date: '20 Dec' is not a day as "
                                                   "YYYY-MM-DD"),
    ('release = "10.2"', 'release = "10.1"', "t.toml: (top level): row -> 2 -> release: 10.1 is not after the row "
                                             "before it (10.1)"),
    ('release = "10.2"', 'release = "10.2"\ndcgm = "4.8.0"', "t.toml: row -> 2 -> dcgm: Extra inputs are not "
                                                             "permitted"),
])
def test_each_bad_therock_field_is_one_line_naming_file_and_field(old: str, new: str, message: str) -> None:
    """Every wrong field of a TheRock release table is refused in one line that names the file and the field."""
    assert old in THEROCK_GOOD
    with pytest.raises(KnowledgeInvalid) as caught:
        parse_knowledge(THEROCK_GOOD.replace(old, new, 1).encode(), "t.toml")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


def test_a_therock_table_in_the_exporter_tables_file_is_refused() -> None:
    """A bundle cannot pass the TheRock table off as the dcgm-exporter table by its file name."""
    with pytest.raises(KnowledgeInvalid, match="'therock-releases' is not the table a file named dcgm-exporter.toml"):
        parse_named("dcgm-exporter.toml", THEROCK_GOOD.encode(), "knowledge -> dcgm-exporter.toml")


def test_each_table_is_chosen_on_its_own_the_later_dated_copy_winning(tmp_path: Path) -> None:
    """A bundle directory with only a newer TheRock table: that table from the bundle, the dcgm-exporter table
    from the package."""
    (tmp_path / "therock-releases.toml").write_text(THEROCK_GOOD)
    bundle = BundleKnowledge(str(tmp_path), 5)
    assert compiled_table("therock-releases", bundle)["origin"] == "bundle serial 5"
    assert compiled_table("dcgm-exporter", bundle)["origin"] == "package"
