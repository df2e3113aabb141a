"""The documentation against the code: docs/api.md against the OpenAPI document, and every link.

docs/api.md lists the endpoints in one table whose first column is
"`METHOD /path`", and the fields of the desired state (section "Desired
state") in tables whose first column is the field's JSON path, like
`loadbalancers[].listeners[].listener_port`. The OpenAPI document is generated
from the routes and the pydantic models, so a field or an endpoint added to
the code and not to the document (or the other way round) fails here, with
what is missing on each side.

README.md and docs/*.md may link only to files inside the repository, and
every such link must resolve.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from lbagent.api.openapi import document
from lbagent.desired.budget import MAX_SERVERS_PER_HOST, MAX_SERVERS_PER_LB
from lbagent.desired.details import MAX_DETAILS, MAX_PATH_LEN

REPO = Path(__file__).resolve().parents[3]
API_DOC = REPO / "docs" / "api.md"
LINKED_DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
FIELDS_SECTION = "Desired state"  # the level-2 heading whose field tables are compared
ENDPOINTS_HEADER = "endpoint"  # first header cell of the endpoint table
FIELDS_HEADER = "field"  # first header cell of a field table


# --- reading markdown ---------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of everything outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def _cells(row: str) -> list[str]:
    """The cells of a table row; `\\|` is a literal bar inside a cell."""
    row = row.strip()
    row = row.removeprefix("|")
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.replace("\\|", "|").strip() for cell in re.split(r"(?<!\\)\|", row)]


def _tables(text: str) -> list[tuple[str, list[str], list[tuple[int, list[str]]]]]:
    """Every table as (the level-2 section it is in, header cells, [(line number, cells)])."""
    found = []
    section = ""
    current: list[tuple[int, str]] = []

    def flush() -> None:
        if len(current) >= 2 and re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", current[1][1].strip()):
            header = _cells(current[0][1])
            found.append((section, header, [(number, _cells(line)) for number, line in current[2:]]))
        current.clear()

    for number, line in _prose_lines(text):
        if line.startswith("## "):
            flush()
            section = line[3:].strip()
        elif line.lstrip().startswith("|"):
            current.append((number, line))
        else:
            flush()
    flush()
    return found


def _code(cell: str) -> str | None:
    """The text of a cell that is one code span, else None."""
    match = re.fullmatch(r"`([^`]+)`", cell.strip())
    return match.group(1).strip() if match else None


# --- what docs/api.md says ------------------------------------------------------------


def documented_endpoints() -> list[tuple[str, str]]:
    tables = [rows for _, header, rows in _tables(API_DOC.read_text()) if header[0].lower() == ENDPOINTS_HEADER]
    assert len(tables) == 1, f"docs/api.md needs exactly one table whose first column is '{ENDPOINTS_HEADER}'"
    endpoints = []
    for number, cells in tables[0]:
        code = _code(cells[0])
        match = re.fullmatch(r"([A-Z]+) (/\S*)", code or "")
        assert match, f"docs/api.md:{number}: the endpoint cell {cells[0]!r} is not `METHOD /path`"
        endpoints.append((match.group(1), match.group(2)))
    return endpoints


def documented_fields() -> list[str]:
    fields = []
    tables = [
        rows
        for section, header, rows in _tables(API_DOC.read_text())
        if section.startswith(FIELDS_SECTION) and header[0].lower() == FIELDS_HEADER
    ]
    assert tables, f"docs/api.md has no '{FIELDS_HEADER}' table in its section '{FIELDS_SECTION}'"
    for rows in tables:
        for number, cells in rows:
            path = _code(cells[0])
            assert path, f"docs/api.md:{number}: the first cell {cells[0]!r} is not a field path in backticks"
            fields.append(path)
    return fields


# --- what the OpenAPI document says ---------------------------------------------------


def openapi_endpoints(doc: dict) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, operations in doc["paths"].items()
        for method in operations
        if method in HTTP_METHODS
    }


class _Walker:
    """Field paths of a JSON schema: objects by `.name`, arrays by `[]`, nullable objects through anyOf/oneOf."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.paths: set[str] = set()

    def _resolve(self, schema: dict, seen: tuple[str, ...]) -> tuple[dict, tuple[str, ...]]:
        while "$ref" in schema:
            ref = schema["$ref"]
            assert ref.startswith("#/"), f"only local references are supported, not {ref!r}"
            if ref in seen:  # a recursive schema: its fields are listed once
                return {}, seen
            seen = (*seen, ref)
            target = self.doc
            for part in ref[2:].split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            schema = target
        return schema, seen

    def value(self, schema: dict, path: str, seen: tuple[str, ...] = ()) -> None:
        """Whatever lies under `path` (the path itself is already listed)."""
        schema, seen = self._resolve(schema, seen)
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in schema.get(key, []):
                self.value(branch, path, seen)
        if "items" in schema:
            self.value(schema["items"], f"{path}[]", seen)
        for name, child in schema.get("properties", {}).items():
            child_path = f"{path}.{name}" if path else name
            self.paths.add(child_path)
            self.value(child, child_path, seen)


def request_fields(doc: dict) -> set[str]:
    body = doc["paths"]["/v1/refresh"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    walker = _Walker(doc)
    walker.value(body, "")
    return walker.paths


def _difference(what: str, in_code: set, in_docs: set, show) -> str:
    lines = []
    if in_code - in_docs:
        lines.append(f"  in the OpenAPI document, missing from docs/api.md ({len(in_code - in_docs)}):")
        lines += [f"    {show(item)}" for item in sorted(in_code - in_docs)]
    if in_docs - in_code:
        lines.append(f"  in docs/api.md, not in the OpenAPI document ({len(in_docs - in_code)}):")
        lines += [f"    {show(item)}" for item in sorted(in_docs - in_code)]
    if not lines:
        return ""
    return f"docs/api.md and the OpenAPI document disagree about {what}:\n" + "\n".join(lines)


def _doubled(items: list) -> list:
    return sorted({item for item in items if items.count(item) > 1})


# --- the tests ----------------------------------------------------------------------------


def test_the_walker_reads_paths_like_the_documents_tables():
    fields = request_fields(document())
    # an array of objects, a nullable object, an array of scalars, a map, a number-or-name
    for path in (
        "loadbalancers",
        "loadbalancers[].listeners[].listener_port",
        "loadbalancers[].listeners[].health_check.rise",
        "subnets[].routes[].nexthop",
        "loadbalancers[].listeners[].acl.cidrs",
        "pods[].labels",
        "loadbalancers[].backend_groups[].pod_selector.port",
    ):
        assert path in fields
    assert not any(path.endswith("[]") for path in fields)
    assert not any(path.startswith("pods[].labels.") for path in fields)


def test_api_md_lists_every_endpoint_and_no_other():
    documented = documented_endpoints()
    assert not _doubled(documented), f"docs/api.md lists these endpoints twice: {_doubled(documented)}"
    problem = _difference(
        "the endpoints", openapi_endpoints(document()), set(documented), lambda endpoint: f"{endpoint[0]} {endpoint[1]}"
    )
    assert not problem, problem


def test_api_md_lists_every_desired_state_field_and_no_other():
    documented = documented_fields()
    assert not _doubled(documented), f"docs/api.md lists these fields twice: {_doubled(documented)}"
    problem = _difference(
        "the fields of the desired state (POST /v1/refresh)", request_fields(document()), set(documented), str
    )
    assert not problem, problem


def test_api_md_states_the_server_budget_and_the_cap_on_details_the_code_applies():
    text = API_DOC.read_text()
    rules = text[text.index("### Rules across objects") :]
    assert f"more than {MAX_SERVERS_PER_LB} for one load" in rules
    assert f"more than {MAX_SERVERS_PER_HOST} for" in rules
    errors = text[text.index("## Errors") : text.index("## Desired state")]
    assert f"at most {MAX_DETAILS} details" in errors
    assert f"longer than {MAX_PATH_LEN} characters" in errors


# --- links ----------------------------------------------------------------------------------

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]*:[^\s>]+)>")
BARE_URL = re.compile(r"(?<![\w(<])((?:https?|ftp)://[^\s)>\]]+|www\.[^\s)>\]]+)")
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _without_code_spans(line: str) -> str:
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", line)


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose_lines(path.read_text()):
        prose = _without_code_spans(line)
        for pattern in (INLINE_LINK, REFERENCE_DEFINITION, AUTOLINK, HTML_LINK, BARE_URL):
            found += [(number, match.group(1)) for match in pattern.finditer(prose)]
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in _prose_lines(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            anchor = github_anchor(match.group(1))
            seen = counts.get(anchor, 0)
            counts[anchor] = seen + 1
            found.add(anchor if seen == 0 else f"{anchor}-{seen}")
    return found


def link_problem(source: Path, target: str) -> str | None:
    if not target:
        return "an empty link"
    if SCHEME.match(target) or target.startswith(("//", "www.")):
        return "links outside the repository"
    if target.startswith("/"):
        return "an absolute path; link relative to this file"
    file_part, _, fragment = target.partition("#")
    resolved = (source.parent / unquote(file_part)).resolve() if file_part else source
    try:
        resolved.relative_to(REPO)
    except ValueError:
        return "points outside the repository"
    if not resolved.exists():
        return f"{resolved.relative_to(REPO)} does not exist"
    if fragment and resolved.suffix == ".md" and unquote(fragment) not in anchors(resolved):
        return f"{resolved.relative_to(REPO)} has no heading with the anchor #{fragment}"
    return None


@pytest.mark.parametrize("path", LINKED_DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_link_resolves_inside_the_repository(path):
    problems = [
        f"  {path.relative_to(REPO)}:{number}: ({target}) {problem}"
        for number, target in links(path)
        if (problem := link_problem(path, target)) is not None
    ]
    assert not problems, "links that do not resolve to a file of the repository:\n" + "\n".join(problems)


def test_the_link_check_sees_what_it_must(tmp_path):
    sample = tmp_path / "sample.md"
    sample.write_text(
        "# Title\n[ok](#title) [gone](missing.md) [web](https://example.org/x) <https://example.org>\n"
        "`[in code](nowhere.md)` see www.example.org\n```\n[fenced](nowhere.md)\n```\n[ref]: ../up.md\n"
    )
    targets = [target for _, target in links(sample)]
    assert targets == [
        "#title",
        "missing.md",
        "https://example.org/x",
        "https://example.org",
        "www.example.org",
        "../up.md",
    ]
    assert link_problem(REPO / "README.md", "docs/api.md") is None
    assert link_problem(REPO / "README.md", "docs/nothing-here.md") is not None
    assert link_problem(REPO / "README.md", "https://example.org") == "links outside the repository"
    assert link_problem(REPO / "README.md", "../outside.md") == "points outside the repository"
