"""What paramiko is allowed and told, as OpenSSH would be: the algorithms OpenSSH 9 offers by
default, what ssh_config says of a host, and the verdict on the host's key against known_hosts
(used by :class:`~proxgpu.host.ssh.SSHHost`).

>>> "aes256-ctr" in OPENSSH_DEFAULTS["ciphers"], "3des-cbc" in OPENSSH_DEFAULTS["ciphers"]
(True, False)
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from proxgpu.errors import UsageError
from proxgpu.host.knownhosts import GLOBAL_KNOWN_HOSTS, KnownHosts
from proxgpu.host.sshcommon import (
    SSHOptions,
    config_text,
    key_revoked,
    key_unknown,
    parse_target,
)

#: What OpenSSH 9.x offers by default (ssh_config(5): Ciphers, MACs, KexAlgorithms,
#: HostKeyAlgorithms, PubkeyAcceptedAlgorithms); paramiko may use nothing else. Its own lists
#: also hold 3des-cbc, the CBC modes, hmac-md5 and SHA-1 key exchanges, which OpenSSH dropped from
#: its defaults as weak. An allow list, so that an algorithm a newer paramiko adds stays off
#: until it is here.
OPENSSH_DEFAULTS: dict[str, frozenset[str]] = {
    "ciphers": frozenset(
        {
            "chacha20-poly1305@openssh.com",
            "aes128-ctr",
            "aes192-ctr",
            "aes256-ctr",
            "aes128-gcm@openssh.com",
            "aes256-gcm@openssh.com",
        }
    ),
    "macs": frozenset(
        {
            "umac-64-etm@openssh.com",
            "umac-128-etm@openssh.com",
            "hmac-sha2-256-etm@openssh.com",
            "hmac-sha2-512-etm@openssh.com",
            "hmac-sha1-etm@openssh.com",
            "umac-64@openssh.com",
            "umac-128@openssh.com",
            "hmac-sha2-256",
            "hmac-sha2-512",
            "hmac-sha1",
        }
    ),
    "kex": frozenset(
        {
            "mlkem768x25519-sha256",
            "sntrup761x25519-sha512",
            "sntrup761x25519-sha512@openssh.com",
            "curve25519-sha256",
            "curve25519-sha256@libssh.org",
            "ecdh-sha2-nistp256",
            "ecdh-sha2-nistp384",
            "ecdh-sha2-nistp521",
            "diffie-hellman-group-exchange-sha256",
            "diffie-hellman-group16-sha512",
            "diffie-hellman-group18-sha512",
            "diffie-hellman-group14-sha256",
        }
    ),
    "keys": frozenset(
        {
            "ssh-ed25519",
            "ecdsa-sha2-nistp256",
            "ecdsa-sha2-nistp384",
            "ecdsa-sha2-nistp521",
            "sk-ssh-ed25519@openssh.com",
            "sk-ecdsa-sha2-nistp256@openssh.com",
            "rsa-sha2-512",
            "rsa-sha2-256",
        }
    ),
}

OPENSSH_DEFAULTS["pubkeys"] = OPENSSH_DEFAULTS["keys"]

_PARAMIKO_LISTS = {
    "ciphers": "_preferred_ciphers",
    "macs": "_preferred_macs",
    "kex": "_preferred_kex",
    "keys": "_preferred_keys",
    "pubkeys": "_preferred_pubkeys",
}


def disabled_algorithms() -> dict[str, list[str]]:
    """Every algorithm paramiko offers that OpenSSH's defaults do not, by kind, as paramiko's
    ``disabled_algorithms`` takes them.

    >>> off = disabled_algorithms()
    >>> "3des-cbc" in off["ciphers"], "hmac-md5" in off["macs"], "aes128-ctr" in off["ciphers"]
    (True, True, False)
    """
    return {
        kind: [
            name
            for name in getattr(paramiko.Transport, attribute, ())
            if name not in OPENSSH_DEFAULTS[kind]
        ]
        for kind, attribute in _PARAMIKO_LISTS.items()
    }


def key_identity(key: paramiko.PKey) -> tuple[str, str]:
    """The key's type and fingerprint, as the host-key errors name a key."""
    return key.get_name(), fingerprint(key)


def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as OpenSSH prints it (``SHA256:...``)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class ResolvedHost:
    hostname: str
    port: int
    user: str
    identity_files: list[str]
    known_hosts: str
    proxy_jump: str | None
    proxy_command: str | None
    accept_new: bool = False
    #: Every file checked, in OpenSSH's order: each UserKnownHostsFile, then the global ones.
    known_hosts_files: tuple[str, ...] = ()
    timeout: float = 10.0
    attempts: int = 1
    keepalive: int = 0
    identities_only: bool = False
    agent: bool = True


class Config(paramiko.SSHConfig):
    """paramiko's ssh_config with OpenSSH's ``%p``: the port actually used. paramiko expands
    ``%p`` (in ProxyCommand, Match exec) from the config's Port, even when ``--port`` or
    ``HOST:PORT`` names another; a port given is seeded before the config's is read."""

    _port: int | None = None

    def __init__(self) -> None:
        super().__init__()
        # One parsed config serves every host of a fleet (see read_config), each from its own
        # thread: the port seeded for one lookup must not be another's.
        self._lock = threading.Lock()

    def lookup_at(self, alias: str, port: int | None) -> paramiko.SSHConfigDict:
        """The options for ``alias``, with ``port`` (when given) as the port ``%p`` expands to."""
        with self._lock:
            self._port = port
            try:
                return self.lookup(alias)
            finally:
                self._port = None

    def _does_match(self, match_list, *args):  # type: ignore[no-untyped-def]
        # paramiko asks for the local user name at every Host block it passes, Match or not:
        # without $USER (cron, systemd, a container) that is a passwd lookup per block, per
        # lookup, per host. A block without Match criteria matches nothing here anyway.
        if not match_list:
            return []
        return super()._does_match(match_list, *args)  # type: ignore[misc]

    def _lookup(  # type: ignore[no-untyped-def]
        self, hostname, options=None, canonical=False, final=False
    ):
        if options is None and self._port is not None:
            options = paramiko.SSHConfigDict({"port": str(self._port)})
        return super()._lookup(hostname, options, canonical, final)  # type: ignore[misc]


def read_config(path: str | None) -> Config:
    """The SSH config ``path`` (else ``~/.ssh/config``), parsed once for every host of a fleet.

    :raises UsageError: as :func:`~proxgpu.host.sshcommon.config_text` does.
    """
    return _parsed(config_text(path))


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> Config:
    # Keyed on the text itself, includes and all: a fleet parses its ssh_config once, and an
    # edited file is parsed again.
    config = Config()
    config.parse(io.StringIO(text))
    return config


def resolve(target: str, options: SSHOptions, config: Config) -> ResolvedHost:
    user, alias, port = parse_target(target)
    entry = config.lookup_at(alias, port or options.port)
    identity = [options.identity_file] if options.identity_file else entry.get("identityfile", [])
    if options.identity_file and not os.path.isfile(os.path.expanduser(options.identity_file)):
        raise UsageError(f"{options.identity_file}: no such key file (-i/--identity)")
    users = [options.known_hosts] if options.known_hosts else _words(entry, "userknownhostsfile")
    users = users or ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]
    default_global = [GLOBAL_KNOWN_HOSTS, GLOBAL_KNOWN_HOSTS + "2"]
    globals_ = [options.global_known_hosts] if options.global_known_hosts else []
    globals_ = globals_ or _words(entry, "globalknownhostsfile") or default_global
    # StrictHostKeyChecking accept-new (or no) trusts a key seen for the first time, like
    # --accept-new-host-key; a changed key is refused whatever it says.
    strict = entry.get("stricthostkeychecking", "yes").lower()
    return ResolvedHost(
        hostname=entry.get("hostname", alias),
        port=port or options.port or int(entry.get("port", 22)),
        user=user or options.user or entry.get("user") or _local_user(),
        # ssh skips an IdentityFile that does not exist (paramiko would fail on it).
        identity_files=[p for p in map(os.path.expanduser, identity) if os.path.isfile(p)],
        known_hosts=os.path.expanduser(users[0]),
        proxy_jump=entry.get("proxyjump"),
        proxy_command=entry.get("proxycommand"),
        accept_new=options.accept_new_host_key or strict in ("accept-new", "no", "off"),
        known_hosts_files=tuple(os.path.expanduser(p) for p in [*users, *globals_]),
        timeout=options.connect_timeout or float(entry.get("connecttimeout", 10)),
        attempts=max(int(entry.get("connectionattempts", 1)), 1),
        keepalive=int(entry.get("serveraliveinterval", 0)),
        identities_only=entry.get("identitiesonly", "no").lower() == "yes",
        agent=entry.get("identityagent", "").lower() != "none",
    )


def resolved_options(target: str, options: SSHOptions) -> dict[str, list[str]]:
    """What ssh_config says for ``target``, as ``ssh -G`` lists it (each option's values), with
    the known_hosts files, key files, host name and port the connection would use.

    Read with paramiko's parser: unlike ``ssh -G`` it costs no process on the way to the host.
    """
    config = read_config(options.ssh_config)
    entry = config.lookup_at(parse_target(target)[1], options.port)
    dest = resolve(target, options, config)
    values = {k: v if isinstance(v, list) else [str(v)] for k, v in entry.items()}
    values["identityfile"] = dest.identity_files
    values["userknownhostsfile"] = list(dest.known_hosts_files)
    values["globalknownhostsfile"] = []
    values["hostname"], values["port"] = [dest.hostname], [str(dest.port)]
    return values


def _words(entry: paramiko.SSHConfigDict, key: str) -> list[str]:
    # paramiko keeps a list-valued option as one string; OpenSSH splits it on blanks.
    return str(entry.get(key) or "").split()


def refuse_revoked(display: str, known: KnownHosts, key: paramiko.PKey) -> None:
    entry = known.revoked(display, key.asbytes())
    if entry is not None:
        where = f"({entry.path} line {entry.line})"
        raise key_revoked(display, key_identity(key), entry.path, where)


def _ca_hint(display: str, known: KnownHosts) -> str:
    # paramiko cannot check host certificates: say which transport can.
    if known.matching(display, "@cert-authority"):
        return "; known_hosts trusts a certificate authority for it: use --ssh-client openssh"
    return ""


def host_keys(display: str, known: KnownHosts) -> paramiko.HostKeys:
    """The plain keys known for ``display`` that paramiko can compare (revoked ones left out)."""
    keys = paramiko.HostKeys()
    for entry in known.matching(display):
        if entry.keytype in OPENSSH_DEFAULTS["keys"] or entry.keytype == "ssh-rsa":
            with contextlib.suppress(paramiko.SSHException, ValueError, TypeError):
                key = paramiko.PKey.from_type_string(entry.keytype, entry.blob)
                if known.revoked(display, entry.blob) is None:
                    keys.add(display, entry.keytype, key)
    return keys


def _local_user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "root"


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or append them when the caller accepted new keys explicitly."""

    def __init__(self, display: str, dest: ResolvedHost, known: KnownHosts) -> None:
        self.display = display
        self.known_hosts = dest.known_hosts
        self.accept_new = dest.accept_new
        self.known = known

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        refuse_revoked(self.display, self.known, key)
        if not self.accept_new:
            hint = _ca_hint(self.display, self.known)
            raise key_unknown(self.display, key_identity(key), self.known_hosts, hint)
        Path(self.known_hosts).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.known_hosts, "a", encoding="ascii") as handle:
            handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
