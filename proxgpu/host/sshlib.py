"""paramiko, imported without the invoke library until an ssh_config ``Match exec`` line runs.

paramiko imports invoke (and with it asyncio, unittest.mock and a YAML parser) as it is imported,
only to run the commands of ``Match exec`` lines: about 45 ms of the 150 ms paramiko takes to
import, on the path of every ``--host`` command (``bench/bench_inspect.py``). While paramiko
imports, ``invoke`` is a stand-in module that imports the real one on first use; afterwards
``sys.modules`` is as it was.

>>> import_paramiko().SSHClient.__name__
'SSHClient'
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


class _OnFirstUse(ModuleType):
    """A module that imports the real one of its name when an attribute is first asked of it."""

    def __getattr__(self, name: str) -> object:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


def import_paramiko() -> ModuleType:
    """The paramiko module, imported with invoke deferred (see the module docstring)."""
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return importlib.import_module("paramiko")
    stand_in = sys.modules["invoke"] = _OnFirstUse("invoke")
    try:
        return importlib.import_module("paramiko")
    finally:
        if sys.modules.get("invoke") is stand_in:
            del sys.modules["invoke"]
