"""Run Proxmox's own config parsers (``tests/proxmox/harness/pve-check``) on files the tests write.

pve-check is this project's Perl harness: it loads qemu-server's, pve-container's and
pve-guest-common's real parsers and schemas from the pinned Proxmox sources
(``tests/proxmox/sources.toml``, found by :func:`tests.proxmox.sources.locate`) on a plain Debian
machine, standing in only for what a Proxmox node has and a test machine lacks. Without the
sources a test fails, saying how to get them; it never skips. Without Perl's modules a test
skips locally and fails under CI (``CI`` set), as :func:`tests.conftest.require_tool` does.

Many files go through one process (its module load is most of its run time): collect them with
their modes, then :func:`validate` them all.

>>> [(mode, path.name) for mode, path in files_in_tree(REPO / "examples" / "hosts" / "ct200")]
[('qemu-start', '300.conf'), ('lxc', '200.conf')]
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import pytest

from tests.proxmox.sources import SourcesUnavailableError, corpus, locate
from tests.support.tools import find_tool

REPO = Path(__file__).resolve().parents[2]
PVE_CHECK = REPO / "tests" / "proxmox" / "harness" / "pve-check"
DEPS_HINT = "install the Perl packages .ci/run lists (perl libjson-perl libpadwalker-perl ...)"

Mode = Literal["qemu", "lxc", "pci-mapping", "qemu-start"]

#: The storage.cfg of a fresh Proxmox VE install, with both root file systems' guest storages
#: (``local-lvm`` on ext4, ``local-zfs`` on ZFS): the example hosts' disks live on either, and
#: qemu-start resolves every volume through it.
STORAGE_CFG = """\
dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup

lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images

zfspool: local-zfs
\tpool rpool/data
\tsparse
\tcontent images,rootdir
"""


@dataclass(frozen=True)
class Verdict:
    """What Proxmox's code said about one file: nothing (OK) or its error messages."""

    file: Path
    mode: Mode
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@cache
def _sources() -> Path | SourcesUnavailableError:
    try:
        return locate()
    except SourcesUnavailableError as error:
        return error


def proxmox_sources() -> Path:
    """The pinned Proxmox sources; fails the test, saying how to get them, when there are none."""
    found = _sources()
    if isinstance(found, SourcesUnavailableError):
        pytest.fail(str(found), pytrace=False)
    return found


def corpus_files(kind: Literal["qemu", "lxc"]) -> list[Path]:
    """Proxmox's own test configs of ``kind`` (for parametrising: empty without the sources)."""
    found = _sources()
    return [] if isinstance(found, SourcesUnavailableError) else corpus(found, kind)


def pve_check_command() -> list[str]:
    """``perl pve-check --sources DIR``; skips (or fails under CI) without Perl."""
    sources = proxmox_sources()
    perl = find_tool("perl")
    if perl is None:
        _unavailable(f"perl not found: {DEPS_HINT}")
    assert perl is not None
    return [perl, str(PVE_CHECK), "--sources", str(sources)]


def validate(
    checks: Sequence[tuple[Mode, Path]],
    *,
    parser_only: bool = False,
    pci_mapping: Path | None = None,
    node: str | None = None,
    storage_cfg: Path | None = None,
    pci_root: Path | None = None,
) -> dict[Path, Verdict]:
    """Every file's verdict, from one pve-check process; each file checked in its mode.

    Files must be absolute paths (a relative one could read as a mode word). ``storage_cfg`` and
    ``node`` matter to qemu-start only; ``pci_mapping`` to qemu-start's ``mapping=`` lookups;
    ``pci_root`` (a host tree) to which functions qemu-start's lspci says offer vGPU types.
    """
    if not checks:
        return {}
    options = ["--parser-only"] if parser_only else []
    for flag, value in (("--pci-mapping", pci_mapping), ("--node", node), ("--pci-root", pci_root)):
        if value is not None:
            options += [flag, str(value)]
    if storage_cfg is not None and any(mode == "qemu-start" for mode, _ in checks):
        options += ["--storage-cfg", str(storage_cfg)]
    result = subprocess.run(
        [*pve_check_command(), *options, *_mode_arguments(checks)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if "Can't locate " in result.stderr:
        _unavailable(f"pve-check lacks a Perl module ({DEPS_HINT}): {result.stderr[:300]}")
    if result.returncode not in (0, 1):
        pytest.fail(f"pve-check exited {result.returncode}: {result.stderr}")
    return _verdicts(checks, result.stdout)


def _mode_arguments(checks: Sequence[tuple[Mode, Path]]) -> list[str]:
    arguments: list[str] = []
    current: Mode | None = None
    for mode, file in checks:
        if not file.is_absolute():
            raise ValueError(f"{file}: pass absolute paths to pve-check")
        if mode != current:
            arguments.append(mode)
            current = mode
        arguments.append(str(file))
    return arguments


def _verdicts(checks: Sequence[tuple[Mode, Path]], stdout: str) -> dict[Path, Verdict]:
    """Parse ``OK FILE`` / ``FAIL FILE: message`` lines; every file must have one or the other."""
    modes = {str(file): (file, mode) for mode, file in checks}
    failures: dict[str, list[str]] = {name: [] for name in modes}
    passed: set[str] = set()
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "OK" and rest in modes:
            passed.add(rest)
        elif word == "FAIL":
            name = next((n for n in modes if rest.startswith(f"{n}: ")), None)
            assert name is not None, f"pve-check reported an unknown file: {line}"
            failures[name].append(rest[len(name) + 2 :])
    silent = [name for name in modes if name not in passed and not failures[name]]
    assert not silent, f"pve-check said nothing about {silent}:\n{stdout}"
    return {
        file: Verdict(file=file, mode=mode, failures=tuple(failures[name]))
        for name, (file, mode) in modes.items()
    }


def failures_of(verdicts: Iterable[Verdict]) -> list[str]:
    """One ``FILE: message`` line per problem Proxmox found."""
    return [f"{v.file}: {message}" for v in verdicts for message in v.failures]


def assert_all_ok(verdicts: dict[Path, Verdict]) -> None:
    assert verdicts, "nothing was validated"
    problems = failures_of(verdicts.values())
    assert not problems, "Proxmox's parsers reject:\n" + "\n".join(problems)


def files_in_tree(root: Path, *, start: bool = True) -> list[tuple[Mode, Path]]:
    """Every guest config and the PCI mapping under ``root``/etc/pve, each with its mode.

    VM configs are checked with ``qemu-start`` (``start=True``): Proxmox's config-to-command
    generation, which is where NUMA, hotplug and mapping mistakes show.
    """
    pve = root.resolve() / "etc" / "pve"
    vm_mode: Mode = "qemu-start" if start else "qemu"
    checks: list[tuple[Mode, Path]] = [(vm_mode, p) for p in sorted(pve.glob("qemu-server/*.conf"))]
    checks += [("lxc", p) for p in sorted(pve.glob("lxc/*.conf"))]
    mapping = pve / "mapping" / "pci.cfg"
    if mapping.is_file():
        checks.append(("pci-mapping", mapping))
    return checks


def validate_tree(
    root: Path, node: str, *, start: bool = True, pci_root: Path | None = None
) -> dict[Path, Verdict]:
    """Validate ``root``'s guest configs and PCI mapping as a Proxmox node named ``node`` would
    (whose PCI functions offer vGPU types as the host tree ``pci_root`` says)."""
    storage = root.resolve().parent / f"{root.name}-storage.cfg"
    storage.write_text(STORAGE_CFG)
    mapping = root.resolve() / "etc" / "pve" / "mapping" / "pci.cfg"
    return validate(
        files_in_tree(root, start=start),
        pci_mapping=mapping if mapping.is_file() else None,
        node=node,
        storage_cfg=storage,
        pci_root=pci_root,
    )


def write_tree(root: Path, files: dict[str, str | None]) -> Path:
    """Write host paths (``/etc/pve/lxc/200.conf``...) with their texts under ``root``."""
    for path, text in files.items():
        if text is not None:
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return root
