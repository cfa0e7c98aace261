"""Every Python block of README.md and docs/*.md runs as written (each in a fresh namespace, in
its file's order); a block that imports a framework not installed here skips, saying which. The
README's bash block is what .ci/run runs."""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/testing.md", "docs/implementers.md"]
#: optional frameworks a block may need: the block skips where one is missing
OPTIONAL = ("equinox", "flax", "keras", "mlx", "jax")


def blocks():
    for name in DOCUMENTS:
        text = (ROOT / name).read_text()
        for k, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            yield pytest.param(code, id=f"{name}#{k}")


def test_every_document_has_python_blocks():
    assert all("```python" in (ROOT / name).read_text() for name in DOCUMENTS)


@pytest.mark.parametrize("code", list(blocks()))
def test_the_block_runs_as_written(code, capsys):
    imported = set(re.findall(r"^\s*(?:import|from)\s+([\w]+)", code, re.M))
    imported |= {m.split(".")[-1] for m in re.findall(r"adapters\.(\w+)", code)}
    missing = [m for m in OPTIONAL if m in imported and importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed here)")
    exec(compile(code, "<block>", "exec"), {"__name__": "__doc_block__"})
