"""Write ``cluster-3/``, an example Proxmox VE cluster snapshot (run from anywhere; rewrites it).

It is laid out as ``proxgpu snapshot --cluster -o DIR`` writes one: a tree per node under
``DIR/NODE/``, each with the cluster's shared ``/etc/pve`` (every node's guest configs under
``etc/pve/nodes/NODE/``, ``.members``, ``mapping/pci.cfg``), and ``etc/pve/lxc`` and
``etc/pve/qemu-server`` links to the node's own folder, as on a real node. Three GPU nodes of
different shapes, built from the synthetic hosts of ``generate.py``, and a fourth member,
``pve4``, that is offline (no tree: a snapshot cannot reach it):

- ``pve1``: ct200's shape (2 sockets, 8 GPUs), CT 200 and VM 300;
- ``pve2``: shared-iommu-group's shape (4 GPUs, two behind a switch in one IOMMU group), VM 310;
- ``pve3``: uneven-5-3's shape with the IOMMU on (5 + 3 L40S), CT 150 and VM 320.

``mapping/pci.cfg`` already holds ``gpu-vfio`` with a line for ``pve4``'s GPU: a cluster plan
keeps the offline node's lines.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from generate import ct200, shared_group, uneven
from sysfs_tree import HERE, HostSpec, write_host

CLUSTER = "cluster-3"

VM_310 = """\
#Rendering VM on pve2
bios: ovmf
cores: 16
cpu: host
efidisk0: local-lvm:vm-310-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M
machine: q35
memory: 65536
name: render
net0: virtio=BC:24:11:51:0A:31,bridge=vmbr0
ostype: l26
scsi0: local-lvm:vm-310-disk-0,size=200G
scsihw: virtio-scsi-single
sockets: 1
"""

VM_320 = """\
#Inference VM on pve3
bios: ovmf
cores: 24
cpu: host
efidisk0: local-lvm:vm-320-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M
machine: q35
memory: 131072
name: infer
net0: virtio=BC:24:11:51:0A:32,bridge=vmbr0
ostype: l26
scsi0: local-lvm:vm-320-disk-0,size=200G
scsihw: virtio-scsi-single
sockets: 1
"""

PCI_CFG = """\
gpu-vfio
\tdescription GPUs for passthrough, on every node
\tmap id=10de:26b9,iommugroup=31,node=pve4,path=0000:31:00,subsystem-id=10de:1851
"""


def members() -> str:
    """``/etc/pve/.members`` as pmxcfs prints it (pve-cluster's src/pmxcfs/status.c)."""
    nodes = {
        "pve1": {"id": 1, "online": 1, "ip": "127.0.0.1"},
        "pve2": {"id": 2, "online": 1, "ip": "127.0.0.2"},
        "pve3": {"id": 3, "online": 1, "ip": "127.0.0.3"},
        "pve4": {"id": 4, "online": 0, "ip": "127.0.0.4"},
    }
    lines = ",\n".join(f'  "{name}": {json.dumps(fields)}' for name, fields in nodes.items())
    return (
        '{\n"nodename": "NODE",\n"version": 12,\n'
        '"cluster": { "name": "gpu-lab", "version": 4, "nodes": 4, "quorate": 1 },\n'
        f'"nodelist": {{\n{lines}\n  }}\n}}\n'
    )


def pve3() -> HostSpec:
    """uneven-5-3 with the IOMMU on: a group for every function, as the kernel makes them."""
    spec = uneven()
    for group, dev in enumerate(spec.devices, start=20):
        dev.group = group
    grub = spec.files["/etc/default/grub"].replace('"quiet"', '"quiet intel_iommu=on iommu=pt"')
    files = {**spec.files, "/etc/default/grub": grub, "/etc/pve/qemu-server/320.conf": VM_320}
    return replace(spec, cmdline=spec.cmdline + " intel_iommu=on iommu=pt", files=files)


def nodes() -> dict[str, HostSpec]:
    """Each GPU node's host, by node name."""
    pve2 = shared_group()
    pve2 = replace(pve2, files={**pve2.files, "/etc/pve/qemu-server/310.conf": VM_310})
    return {"pve1": ct200(), "pve2": pve2, "pve3": pve3()}


def guest_files(spec: HostSpec) -> dict[str, str]:
    """The guest configs of a node, by their path under ``/etc/pve/``."""
    return {p: t for p, t in spec.files.items() if p.startswith(("/etc/pve/lxc/", "/etc/pve/q"))}


def main() -> None:
    top = HERE / CLUSTER
    if top.exists():
        shutil.rmtree(top)
    specs = nodes()
    for name, spec in specs.items():
        others = {p: t for p, t in spec.files.items() if p not in guest_files(spec)}
        write_host(replace(spec, name=f"{CLUSTER}/{name}", files=others))
        root = top / name
        (root / "proc/sys/kernel/hostname").write_text(f"{name}\n")
        pve = root / "etc/pve"
        for node, node_spec in specs.items():
            for kind in ("lxc", "qemu-server"):
                (pve / "nodes" / node / kind).mkdir(parents=True, exist_ok=True)
            for path, text in guest_files(node_spec).items():
                kind, file = path.removeprefix("/etc/pve/").split("/")
                Path(pve / "nodes" / node / kind / file).write_text(text)
        for kind in ("lxc", "qemu-server"):
            (pve / kind).symlink_to(f"nodes/{name}/{kind}")
            for node in specs:
                keep = pve / "nodes" / node / kind / ".proxgpu-keep"
                if not any((pve / "nodes" / node / kind).iterdir()):
                    keep.touch()  # git keeps no empty directory
        (pve / ".members").write_text(members().replace("NODE", name))
        (pve / "mapping").mkdir()
        (pve / "mapping/pci.cfg").write_text(PCI_CFG)
        print(f"wrote {root}")


if __name__ == "__main__":
    main()
