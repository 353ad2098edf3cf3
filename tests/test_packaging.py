"""README's two commands and CI stay true to each other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_readme_starts_with_two_commands() -> None:
    cmds = _readme_commands()
    assert len(cmds) >= 2
    head = (ROOT / "README.md").read_text().split("## ")[0]
    assert head.count("```bash") == 2, "README must start with exactly two commands"
    assert cmds[0].endswith("python -m refcore demo")
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci.splitlines()


def test_torch_is_pinned_everywhere() -> None:
    for path in [ROOT / "pyproject.toml", *ROOT.glob("providers/*/pyproject.toml")]:
        # "torch" and its specifiers, not other packages named torch... (torchao)
        for line in re.findall(r'"torch(?:[<>=!~;\[ ][^"]*)?"', path.read_text()):
            assert line == '"torch==2.13.0"', (
                f"{path}: {line} (an unpinned torch pulls a CUDA build)"
            )
