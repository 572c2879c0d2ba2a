"""Which SSH transport reaches a host: paramiko (in-process) or the system's OpenSSH ``ssh``.

``--ssh-client`` (else ``$PROXGPU_SSH_CLIENT``) picks one; ``auto``, the default, takes paramiko
unless the host needs what only OpenSSH does: host certificates (a known_hosts
``@cert-authority`` line), user certificates, FIDO or PKCS#11 keys, GSSAPI, an ``IdentityAgent``
other than ``$SSH_AUTH_SOCK``, or a ``Match exec`` line. It reads ssh_config with paramiko's
parser (no ``ssh -G`` process on the way to the host); ``-v`` logs which transport it took and
why.

>>> why_openssh({"pkcs11provider": ["/usr/lib/opensc-pkcs11.so"]}, "pve1", "")
'a PKCS#11 key (PKCS11Provider)'
>>> why_openssh({"identityagent": ["none"]}, "pve1", "Host *\\n  User root\\n")
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from proxgpu.host.base import Host
from proxgpu.host.knownhosts import read_known_hosts
from proxgpu.host.openssh import OpenSSHHost
from proxgpu.host.sshcommon import (
    SSHOptions,
    client_choice,
    config_text,
    known_hosts_files,
    known_hosts_name,
)
from proxgpu.host.sshmaster import ssh_binary

log = logging.getLogger(__name__)

_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


def open_ssh(
    target: str, options: SSHOptions | None = None, root: str = "/", live: bool | None = None
) -> Host:
    """The host ``target`` over the transport ``options.client`` names (see the module docstring).

    >>> open_ssh("pve1", SSHOptions(client="openssh")).name
    'pve1'
    """
    options = options or SSHOptions()
    chosen = client_choice(options.client)
    why = "asked for"
    if chosen == "auto":
        chosen, why = _auto(target, options)
    log.info("%s: SSH through %s (%s)", target, chosen, why)
    if chosen == "openssh":
        return OpenSSHHost(target, options, root=root, live=live)
    from proxgpu.host.ssh import SSHHost  # noqa: PLC0415 - paramiko only when it is used

    return SSHHost(target, options, root=root, live=live)


def _auto(target: str, options: SSHOptions) -> tuple[str, str]:
    if ssh_binary() is None:
        return "paramiko", "no ssh client on PATH"
    text = config_text(options.ssh_config)
    # Before paramiko resolves the config: that runs the Match exec commands, and ssh would run
    # them a second time.
    if _MATCH_EXEC.search(text):
        return "openssh", "paramiko cannot use Match exec"
    from proxgpu.host.paramikoconf import resolved_options  # noqa: PLC0415 - see open_ssh

    config = resolved_options(target, options)
    hostname = (config.get("hostname") or [""])[0]
    display = known_hosts_name(hostname, int((config.get("port") or ["22"])[0]))
    reason = why_openssh(config, display, text)
    return ("openssh", f"paramiko cannot use {reason}") if reason else ("paramiko", "default")


def why_openssh(config: dict[str, list[str]], display: str, config_text: str) -> str | None:
    """What in ``config`` (``ssh -G``'s answer) only OpenSSH can use, or ``None``."""
    files = known_hosts_files(config)
    identities = [os.path.expanduser(p) for p in config.get("identityfile", [])]
    checks = [
        (
            bool(read_known_hosts(files).matching(display, "@cert-authority")),
            "host certificates (known_hosts @cert-authority)",
        ),
        (bool(config.get("certificatefile")), "a user certificate (CertificateFile)"),
        (
            any(os.path.exists(p + "-cert.pub") for p in identities),
            "a user certificate (IdentityFile's -cert.pub)",
        ),
        (any(_is_fido(p) for p in identities), "a FIDO key (sk-*)"),
        (_set(config, "pkcs11provider"), "a PKCS#11 key (PKCS11Provider)"),
        (_yes(config, "gssapiauthentication"), "GSSAPI (GSSAPIAuthentication)"),
        (_other_agent(config), "another agent (IdentityAgent)"),
        (bool(_MATCH_EXEC.search(config_text)), "Match exec"),
    ]
    return next((reason for hit, reason in checks if hit), None)


def _set(config: dict[str, list[str]], key: str) -> bool:
    return any(value.lower() != "none" for value in config.get(key, []))


def _yes(config: dict[str, list[str]], key: str) -> bool:
    return any(value.lower() in ("yes", "true") for value in config.get(key, []))


def _other_agent(config: dict[str, list[str]]) -> bool:
    agent = (config.get("identityagent") or ["SSH_AUTH_SOCK"])[0]
    own = os.environ.get("SSH_AUTH_SOCK", "")
    return agent.lower() != "none" and agent.lstrip("$") != "SSH_AUTH_SOCK" and agent != own


def _is_fido(identity: str) -> bool:
    try:
        public = Path(identity + ".pub").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return public.startswith("sk-")


__all__ = ["open_ssh", "why_openssh"]
