"""A Proxmox VE cluster's members, as pmxcfs lists them in ``/etc/pve/.members``.

pmxcfs writes that file itself (``cfs_create_memberlist_msg`` in pve-cluster's
``src/pmxcfs/status.c``): JSON with this node's ``nodename``, a ``version``, and on a node that
is in a cluster also ``cluster`` (``name``, ``version``, ``nodes``, ``quorate``) and
``nodelist``, each node with its ``id``, ``online`` (0 or 1) and, when pmxcfs knows it, ``ip``.
A node that is in no cluster lists neither.

>>> members = parse_members('{"nodename": "pve1", "version": 5, "cluster": {"name": "gpu", '
...     '"version": 3, "nodes": 2, "quorate": 1}, "nodelist": {"pve1": {"id": 1, "online": 1, '
...     '"ip": "127.0.0.1"}, "pve2": {"id": 2, "online": 0, "ip": "127.0.0.2"}}}', "pve1")
>>> members.name, [m.name for m in members.online()], [m.name for m in members.offline()]
('gpu', ['pve1'], ['pve2'])
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from pydantic import Field

from proxgpu.errors import MappingChangedError, PveApiError, SysfsError
from proxgpu.host.base import Host
from proxgpu.model import FrozenModel
from proxgpu.paths import MEMBERS
from proxgpu.pve.api import API_TIMEOUT, config_digest
from proxgpu.pve.mapping import mapping_lines

#: Where the cluster PCI mappings are in the Proxmox API.
MAPPING_API = "/cluster/mapping/pci"
#: What Proxmox says when the file changed since it was read (``assert_if_modified`` in
#: pve-common) or the id to create exists (pve-manager's ``create``).
_CHANGED_SINCE = ("detected modified configuration", "already defined")


class Member(FrozenModel):
    """One cluster node: its name, its corosync node id, whether it is online, its address."""

    name: str
    id: int
    online: bool
    ip: str | None = None


class ClusterMembers(FrozenModel):
    """The cluster as one node sees it: that node's name, the cluster's, and every member in
    node-id order."""

    nodename: str
    name: str | None = None
    quorate: bool = False
    members: list[Member] = Field(default_factory=list)

    def online(self) -> list[Member]:
        """The members that are online, in node-id order."""
        return [m for m in self.members if m.online]

    def offline(self) -> list[Member]:
        """The members that are not online, in node-id order."""
        return [m for m in self.members if not m.online]

    def member(self, name: str) -> Member | None:
        """The member called ``name``, if there is one.

        >>> ClusterMembers(nodename="a", members=[Member(name="a", id=1, online=True)]
        ...                ).member("a").id
        1
        """
        return next((m for m in self.members if m.name == name), None)


#: pve-common's ``pve_verify_node_name`` (``PVE/JSONSchema.pm``, format ``pve-node``).
NODE_NAME = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?")


def parse_members(text: str, host: str, path: str = MEMBERS) -> ClusterMembers:
    """Read ``/etc/pve/.members``.

    The file is host data that proxgpu connects by and puts into SSH's configuration (``%h`` in
    a ``ProxyCommand`` or ``Match exec`` line runs in a shell): every node name must be a
    Proxmox node name and every address an IP address, without an IPv6 zone (which may hold any
    character), or the whole list is refused, naming the line.

    :raises SysfsError: when it is not the JSON pmxcfs writes, or lists no cluster (a node on its
        own), naming ``host`` and ``path``.

    >>> parse_members('{"nodename": "pve1", "version": 1}', "pve1")
    Traceback (most recent call last):
    ...
    proxgpu.errors.SysfsError: pve1: /etc/pve/.members: lists no cluster: pve1 is a node on its \
own; plan it without --cluster
    """
    try:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise TypeError("not a JSON object")
        nodename = str(document["nodename"])
        nodelist = document.get("nodelist")
    except (ValueError, KeyError, TypeError) as exc:
        raise SysfsError(host, path, f"not pmxcfs' member list ({_why(exc)})") from None
    if not nodelist:
        raise SysfsError(
            host,
            path,
            f"lists no cluster: {nodename} is a node on its own",
            "plan it without --cluster",
        )
    found = document.get("cluster")
    cluster: dict[str, Any] = found if isinstance(found, dict) else {}
    try:
        members = [_member(name, fields) for name, fields in dict(nodelist).items()]
    except (ValueError, KeyError, TypeError) as exc:
        raise SysfsError(host, path, f"a node in nodelist is not readable ({_why(exc)})") from None
    for value, what in [(nodename, "node name"), *_names_and_addresses(members)]:
        if not _valid(value, what):
            raise SysfsError(
                host,
                f"{path}:{_line_of(text, value)}",
                f"{value!r} is not a valid {what}: refused, and nothing it names is reached",
            )
    return ClusterMembers(
        nodename=nodename,
        name=str(cluster["name"]) if "name" in cluster else None,
        quorate=bool(cluster.get("quorate")),
        members=sorted(members, key=lambda m: (m.id, m.name)),
    )


def _member(name: str, fields: Any) -> Member:
    if not isinstance(fields, dict) or not name:
        raise TypeError(f"node {name!r} is not an object")
    ip = fields.get("ip")
    if ip is not None and not isinstance(ip, str):
        raise TypeError(f"node {name!r} has an ip that is no string")
    return Member(name=name, id=int(fields["id"]), online=bool(fields["online"]), ip=ip or None)


def _names_and_addresses(members: list[Member]) -> list[tuple[str, str]]:
    pairs = [(m.name, "node name") for m in members]
    return pairs + [(m.ip, "IP address") for m in members if m.ip is not None]


def _valid(value: str, what: str) -> bool:
    if what == "node name":
        return NODE_NAME.fullmatch(value) is not None
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return "%" not in value


def _line_of(text: str, value: str) -> int:
    """The line of ``text`` where ``value`` first appears as a JSON string (1 when it does not
    appear as written: JSON escapes)."""
    at = text.find(json.dumps(value))
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r}"
    if isinstance(exc, json.JSONDecodeError):
        # json's own words end in " at" where they point at a place ("Unterminated string
        # starting at"): the place is said once.
        return f"{exc.msg.removesuffix(' at')} at line {exc.lineno}, column {exc.colno}"
    return str(exc)


def mapping_call(name: str, before: str | None, after: str) -> list[str]:
    """The ``pvesh`` command that turns mapping ``name`` in ``pci.cfg`` text ``before`` into what
    ``after`` says of it (Proxmox's ``/cluster/mapping/pci`` API, pve-manager's
    ``PVE/API2/Cluster/Mapping/PCI.pm``): ``set`` with the file's ``digest`` (Proxmox refuses it
    if the file changed since, and takes pmxcfs' lock on the file for the write), ``delete`` for
    keys that go; ``create`` for a new id (refused if it exists by then); ``delete`` of the id
    when ``after`` has none. ``map`` is a list: pvesh takes it as one ``--map`` per line.

    >>> mapping_call("gpus", None, "gpus\\n\\tmap node=a,path=0000:01:00\\n")
    ['pvesh', 'create', '/cluster/mapping/pci', '--id', 'gpus', '--map', 'node=a,path=0000:01:00']
    >>> before = "gpus\\n\\tdescription x\\n\\tmap node=a\\n"
    >>> mapping_call("gpus", before, "gpus\\n\\tmap node=b\\n")[1:7]
    ['set', '/cluster/mapping/pci/gpus', '--map', 'node=b', '--delete', 'description']
    """
    old, new = mapping_lines(before or ""), mapping_lines(after)
    path = f"{MAPPING_API}/{name}"
    if name not in new:
        return ["pvesh", "delete", path]
    options = [arg for key, value in new[name] for arg in (f"--{key}", value)]
    if before is None or name not in old:
        return ["pvesh", "create", MAPPING_API, "--id", name, *options]
    gone = sorted({key for key, _ in old[name]} - {key for key, _ in new[name]})
    delete = ["--delete", ",".join(gone)] if gone else []
    return ["pvesh", "set", path, *options, *delete, "--digest", config_digest(before)]


def write_mapping(host: Host, name: str, before: str | None, after: str) -> None:
    """Write cluster mapping ``name`` through the Proxmox API of ``host`` (one pvesh run over
    its connection, as :mod:`proxgpu.pve.api` does), once for the whole cluster.

    proxmoxer's command backend passes each parameter once, which cannot carry ``map``'s list,
    so the pvesh command is made here.

    :raises MappingChangedError: when Proxmox refused it because the file changed since
        ``before`` was read (the digest), or the id it creates exists by now.
    :raises PveApiError: when Proxmox refuses it otherwise (a line it cannot read).
    """
    argv = mapping_call(name, before, after)
    method = {"create": "POST", "set": "PUT", "delete": "DELETE"}[argv[1]]
    result = host.run(argv, timeout=API_TIMEOUT)
    if result.ok:
        return
    lines = [line.strip() for line in result.stderr_text.splitlines() if line.strip()]
    detail = "; ".join(lines) or f"pvesh exited with {result.returncode}"
    status = int(lines[0][:3]) if lines and lines[0][:3].isdigit() else 500
    changed = any(why in detail for why in _CHANGED_SINCE)
    raise (MappingChangedError if changed else PveApiError)(
        host.name, method, argv[2], status, detail
    )
