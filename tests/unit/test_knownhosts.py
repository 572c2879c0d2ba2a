"""known_hosts lines read as OpenSSH reads them: patterns, negation, hashed names, markers, and a
damaged line named by file and line. Real files, keys made by ssh-keygen."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proxgpu.errors import KnownHostsDamagedError
from proxgpu.host.knownhosts import read_known_hosts


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real ed25519 public key, ``TYPE BASE64``."""
    path = tmp_path_factory.mktemp("key") / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.mark.parametrize(
    ("patterns", "name", "matches"),
    [
        ("pve1", "pve1", True),
        ("PVE1", "pve1", True),
        ("pve*", "pve12", True),
        ("pve?", "pve12", False),
        ("pve*,!pve9", "pve9", False),
        ("[127.0.0.1]:2222", "[127.0.0.1]:2222", True),
        ("[127.0.0.1]:*", "[127.0.0.1]:2222", True),
        ("127.0.0.1", "[127.0.0.1]:2222", False),
    ],
)
def test_patterns_match_as_openssh_matches_them(
    tmp_path: Path, key: str, patterns: str, name: str, matches: bool
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"{patterns} {key}\n")
    assert bool(read_known_hosts([str(known)]).matching(name)) is matches


def test_hashed_names_markers_and_file_order(tmp_path: Path, key: str) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(f"pve1 {key}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(first)], check=True, capture_output=True)
    second.write_text(f"@cert-authority *.lab {key}\n@revoked pve1 {key}\n")
    known = read_known_hosts([str(first), str(tmp_path / "missing"), str(second)])
    assert [(e.path, e.line) for e in known.matching("pve1")] == [(str(first), 1)]
    assert known.matching("pve2") == []
    assert [e.line for e in known.matching("a.lab", "@cert-authority")] == [1]
    assert known.revoked("pve1", known.matching("pve1")[0].blob) is not None
    assert known.revoked("pve2", known.matching("pve1")[0].blob) is None


@pytest.mark.parametrize(
    "damage",
    [
        "pve1 ssh-ed25519",
        "pve1 ssh-ed25519 ***",
        "pve1 ssh-rsa {blob}",
        "@trusted pve1 {kind} {blob}",
        "|1|bad|hash {kind} {blob}",
    ],
)
def test_a_damaged_line_is_named_by_file_and_line(tmp_path: Path, key: str, damage: str) -> None:
    kind, blob = key.split()
    known = tmp_path / "known_hosts"
    known.write_text(f"pve0 {key}\n\n{damage.format(kind=kind, blob=blob)}\n")
    with pytest.raises(KnownHostsDamagedError) as err:
        read_known_hosts([str(known)])
    assert str(err.value).startswith(f"{known}:3: damaged known_hosts line")
    assert err.value.exit_code == 5 and "\n" not in str(err.value)
