"""The README's examples as written: its test examples run (the `runstream_env` fixture from
the plugin), and every import in a Python example of README.md or docs/*.md works and names
`runstream`, never the deprecated top-level `engine` or `projections`."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runstream.testing import TestEnvironment

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PARSE = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT  # examples await at top level


def _python_blocks(page: Path) -> Iterator[str]:
    yield from re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def _readme_tests() -> dict[str, Callable[..., Any]]:
    """The README's `async def test_*` examples, compiled from the README's own text."""
    found: dict[str, Any] = {}
    for block in _python_blocks(ROOT / "README.md"):
        if re.search(r"^async def test_", block, re.M):
            exec(compile(block, "README.md", "exec"), found)
    return {name: value for name, value in found.items() if name.startswith("test_")}


README_TESTS = _readme_tests()


def test_the_readme_has_its_test_examples() -> None:
    assert sorted(README_TESTS) == ["test_checkout", "test_checkout_without_the_fixture",
                                    "test_order_waits_for_approval"]


async def test_checkout(runstream_env: Callable[..., TestEnvironment]) -> None:
    await README_TESTS["test_checkout"](runstream_env)


async def test_order_waits_for_approval(runstream_env: Callable[..., TestEnvironment]) -> None:
    await README_TESTS["test_order_waits_for_approval"](runstream_env)


async def test_checkout_without_the_fixture() -> None:
    await README_TESTS["test_checkout_without_the_fixture"]()


def _imports(page: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    for block in _python_blocks(page):
        tree = compile(block, str(page), "exec", flags=PARSE)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_example_imports_runstream_by_its_name(page: Path) -> None:
    for node in _imports(page):
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [alias.name for alias in node.names]
        for module in modules:
            assert module.split(".")[0] not in ("engine", "projections"), \
                f"{page.name}: {ast.unparse(node)} (write `from runstream import ...`)"
        exec(compile(ast.Module([node], type_ignores=[]), str(page), "exec"), {})
