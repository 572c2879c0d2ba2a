"""paramiko, imported without the invoke library until an ssh_config ``Match exec`` line runs,
and without ``importlib.metadata``.

paramiko imports invoke (and with it asyncio, unittest.mock and a YAML parser) as it is imported,
only to run the commands of ``Match exec`` lines: about 45 ms of the 150 ms paramiko takes to
import, on the path of every ``--host`` command (``bench/bench_inspect.py``). While paramiko
imports, ``invoke`` is a stand-in module that imports the real one on first use; afterwards
``sys.modules`` is as it was. paramiko also asks ``importlib.metadata`` for its own version as it
is imported (its SSH banner names it): that module (email, zipfile, csv) and its search of every
installed distribution are about a third of what importing paramiko costs (callgrind: 121 M of
320 M instructions). Its stand-in reads a package's version from the ``.dist-info`` beside it,
and imports the real module for anything else, or when that is not one plain directory.

>>> import_paramiko().SSHClient.__name__
'SSHClient'
>>> from importlib import metadata
>>> _version_beside("paramiko") == metadata.version("paramiko")
True
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType


class _OnFirstUse(ModuleType):
    """A module that imports the real one of its name when an attribute is first asked of it."""

    def __getattr__(self, name: str) -> object:
        return getattr(self.real(), name)

    def real(self) -> ModuleType:
        """The real module, imported now (this stand-in leaves ``sys.modules`` first)."""
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return importlib.import_module(self.__name__)


class _Metadata(_OnFirstUse):
    """``importlib.metadata`` while paramiko imports: :func:`version` without the real module."""

    def version(self, name: str) -> str:
        """The installed version of the distribution ``name``, as ``importlib.metadata`` says."""
        found = _version_beside(name)
        if found is None:
            real: str = self.real().version(name)
            return real
        return found


def _version_beside(name: str) -> str | None:
    """The ``Version`` of the one ``NAME-*.dist-info`` beside the package ``name`` (where pip
    installs both), or ``None`` when there is not exactly one such directory to read it from
    (or ``name`` is a dotted one, which finding would import its parent)."""
    if "." in name:
        return None
    spec = importlib.util.find_spec(name)
    folders = list(spec.submodule_search_locations or []) if spec else []
    if len(folders) != 1:
        return None
    parent = os.path.dirname(folders[0])
    infos = [e for e in os.listdir(parent) if e.startswith(f"{name}-") and e.endswith(".dist-info")]
    if len(infos) != 1:
        return None
    try:
        with open(os.path.join(parent, infos[0], "METADATA"), encoding="utf-8") as headers:
            for line in headers:
                if not line.strip():
                    break  # the headers end at the first blank line
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def import_paramiko() -> ModuleType:
    """The paramiko module, imported with invoke and ``importlib.metadata`` deferred (see the
    module docstring)."""
    if "paramiko" in sys.modules:
        return sys.modules["paramiko"]
    stand_ins = {
        name: module
        for name, module in (
            ("invoke", _OnFirstUse("invoke")),
            ("importlib.metadata", _Metadata("importlib.metadata")),
        )
        if name not in sys.modules
    }
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("paramiko")
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
