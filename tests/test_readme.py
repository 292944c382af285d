"""The README's environment-variable table is generated from graphjit.env.VARIABLES: keep them equal."""

from __future__ import annotations

from pathlib import Path

import graphjit.env

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_env_table_matches_env_module():
    text = README.read_text()
    start = text.index("<!-- env-table:start -->") + len("<!-- env-table:start -->")
    end = text.index("<!-- env-table:end -->")
    assert text[start:end].strip() == graphjit.env.table_markdown().strip()


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
