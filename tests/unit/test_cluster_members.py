"""pmxcfs' member list (``/etc/pve/.members``) as proxgpu reads it, and the pvesh command that
writes a cluster PCI mapping once."""

from __future__ import annotations

import json

import pytest

from proxgpu.errors import SysfsError
from proxgpu.pve.api import config_digest
from proxgpu.pve.cluster import mapping_call, parse_members
from proxgpu.pve.mapping import changed_ids

# Printed the way pmxcfs' cfs_create_memberlist_msg prints it: online as 0/1, an ip only where
# pmxcfs knows one, nodes in hash-table order (not by id).
MEMBERS = """{
"nodename": "pve2",
"version": 31,
"cluster": { "name": "gpu-lab", "version": 7, "nodes": 4, "quorate": 1 },
"nodelist": {
  "pve3": { "id": 3, "online": 1, "ip": "127.0.0.13"},
  "pve1": { "id": 1, "online": 1, "ip": "127.0.0.11"},
  "pve4": { "id": 4, "online": 0},
  "pve2": { "id": 2, "online": 1, "ip": "::1"}
  }
}
"""


def test_members_are_in_node_id_order_with_offline_ones_apart() -> None:
    members = parse_members(MEMBERS, "pve2")
    assert (members.nodename, members.name, members.quorate) == ("pve2", "gpu-lab", True)
    assert [m.name for m in members.online()] == ["pve1", "pve2", "pve3"]
    assert [(m.name, m.ip) for m in members.offline()] == [("pve4", None)]
    pve2 = members.member("pve2")
    assert pve2 is not None and pve2.ip == "::1"


def test_a_cluster_without_quorum_says_so() -> None:
    document = json.loads(MEMBERS)
    document["cluster"]["quorate"] = 0
    assert not parse_members(json.dumps(document), "pve2").quorate


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"nodename": "pve1", "nodelist": {', "not pmxcfs' member list (Expecting"),
        ("[]", "not pmxcfs' member list (not a JSON object)"),
        ('{"version": 3, "nodelist": {"a": {"id": 1, "online": 1}}}', "(no 'nodename')"),
        ('{"nodename": "a", "nodelist": {"a": {"online": 1}}}', "not readable (no 'id')"),
        ('{"nodename": "a", "nodelist": {"a": {"id": "x", "online": 1}}}', "not readable"),
        ('{"nodename": "a", "nodelist": {"a": 1}}', "not readable (node 'a' is not an object)"),
        ('{"nodename": "pve1", "version": 1}', "lists no cluster: pve1 is a node on its own"),
    ],
)
def test_a_malformed_member_list_is_one_line_naming_host_and_path(text: str, why: str) -> None:
    with pytest.raises(SysfsError) as caught:
        parse_members(text, "root@pve1")
    message = str(caught.value)
    assert message.startswith("root@pve1: /etc/pve/.members: ")
    assert why in message and "\n" not in message
    assert caught.value.exit_code == 8
    # ... and says what to do, in the line and as the --json document's fix.
    fix = caught.value.fix
    assert fix and message.endswith(f"; {fix}")
    assert caught.value.document()["fix"] == fix


def test_damaged_json_is_placed_once_and_sends_the_admin_to_pmxcfs() -> None:
    # Cut short inside a string, as a file truncated by a full disk is.
    text = '{\n"nodename": "pve1",\n"nodelist": {\n  "pve1": {"id": 1, "ip": "127.0.0.1'
    with pytest.raises(SysfsError) as caught:
        parse_members(text, "pve1")
    assert caught.value.reason == (
        "not pmxcfs' member list (Unterminated string starting at line 4, column 27)"
    )
    assert caught.value.fix is not None
    assert "`pvecm status`" in caught.value.fix and "pve-cluster" in caught.value.fix
    assert "take a new `proxgpu snapshot --cluster`" in caught.value.fix


def test_an_existing_mapping_is_set_with_the_files_digest_and_every_map_line() -> None:
    before = "gpu-vfio\n\tdescription pool\n\tmap node=pve4,path=0000:31:00\n"
    after = before + "\tmap node=pve1,path=0000:81:00\n"
    argv = mapping_call("gpu-vfio", before, after)
    assert argv[:3] == ["pvesh", "set", "/cluster/mapping/pci/gpu-vfio"]
    assert argv[3:] == [
        "--description",
        "pool",
        "--map",
        "node=pve4,path=0000:31:00",
        "--map",
        "node=pve1,path=0000:81:00",
        "--digest",
        config_digest(before),
    ]


def test_a_new_mapping_is_created_beside_the_others() -> None:
    before = "other\n\tmap node=pve1,path=0000:01:00\n"
    after = before + "\ngpu-vfio\n\tmap node=pve1,path=0000:81:00\n"
    argv = mapping_call("gpu-vfio", before, after)
    assert argv == [
        "pvesh", "create", "/cluster/mapping/pci", "--id", "gpu-vfio",
        "--map", "node=pve1,path=0000:81:00",
    ]  # fmt: skip


def test_a_mapping_call_sets_creates_or_deletes_the_one_id_with_the_files_digest() -> None:
    before = "gpus\n\tdescription GPUs\n\tmap id=10de:2330,node=a,path=0000:01:00\n\nkeep\n"
    after = "gpus\n\tmap id=10de:2330,node=a,path=0000:01:00\n\tmap node=b\n\nkeep\n"
    assert changed_ids(before, after) == ["gpus"]
    call = mapping_call("gpus", before, after)
    assert call[:3] == ["pvesh", "set", "/cluster/mapping/pci/gpus"]
    assert call[3:] == [
        "--map", "id=10de:2330,node=a,path=0000:01:00", "--map", "node=b",
        "--delete", "description", "--digest", config_digest(before),
    ]  # fmt: skip
    # Rolling back a mapping proxgpu created removes it; there is no digest to give then.
    assert mapping_call("gpus", after, "keep\n") == ["pvesh", "delete", "/cluster/mapping/pci/gpus"]
    # Proxmox's rewrite of the same lines in its own order is no change.
    assert not changed_ids(after, "keep\n\ngpus\n\tmap id=10de:2330,node=a,path=0000:01:00\n"
                           "\tmap node=b\n\n")  # fmt: skip
