"""Host access: the local machine, a directory laid out like a host, or a remote host over SSH.

:func:`connect` opens the host a command names. The kinds live in :mod:`~proxgpu.host.local` and
:mod:`~proxgpu.host.ssh`, their common base in :mod:`~proxgpu.host.base`, and
:mod:`~proxgpu.host.scripts` runs proxgpu's shell scripts (``proxgpu/scripts/*.sh``) on any of them.

>>> connect(root="/").name
'localhost'
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

from proxgpu.host.base import CommandResult, Host, command_line
from proxgpu.host.local import DirectoryHost, LocalHost

if TYPE_CHECKING:
    from proxgpu.host.ssh import SSHOptions


def connect(
    host: str | None = None, root: str | None = None, ssh_options: SSHOptions | None = None
) -> Host:
    """Open the host a command names: ``host`` over SSH, ``root`` as a directory, else this machine.

    With both, ``root`` is the prefix on the remote host (a mounted image, a test tree).

    >>> connect(root="examples/hosts/ct200").name, connect(root="//").name
    ('dir:examples/hosts/ct200', 'localhost')
    """
    if host is None:
        # Any spelling of / (//, /., a link to it) is the live host, with every live check.
        if root is None or os.path.realpath(root) == "/":
            return LocalHost()
        return DirectoryHost(root)
    # Imported on first use: paramiko takes longer to import than a local command takes to run.
    from proxgpu.host.sshclient import open_ssh  # noqa: PLC0415

    remote_root = "/" if root is None or posixpath.normpath(root).strip("/") == "" else root
    return open_ssh(host, ssh_options, root=remote_root)


__all__ = ["CommandResult", "DirectoryHost", "Host", "LocalHost", "command_line", "connect"]
