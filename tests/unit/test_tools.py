"""The tests find the tools the venv installed even when the venv is not on PATH (as on CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.tools import find_tool


def test_a_tool_installed_beside_the_interpreter_is_found_without_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    found = find_tool("ansible-playbook")
    assert found == str(Path(sys.executable).parent / "ansible-playbook")


def test_system_tools_and_sbin_are_still_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no sbin, as a non-login shell may have
    assert find_tool("sh") in {"/usr/bin/sh", "/bin/sh"}
    assert find_tool("ldconfig") in {"/usr/sbin/ldconfig", "/sbin/ldconfig"}  # libc-bin
    assert find_tool("no-such-tool-anywhere") is None
