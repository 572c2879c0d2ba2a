#!/usr/bin/python
"""Ansible module: split a Proxmox VE host's GPUs along NUMA lines with proxgpu.

It runs on the managed host (proxgpu must be installed in the Python that Ansible uses there) and
wraps :func:`proxgpu.pipeline.split_host`: check mode plans and diffs without writing, diff mode
returns every file change, and a real run applies the change set as one transaction.

Ansible finds it in the directory ``python3 -m proxgpu.ansible`` prints (``ANSIBLE_LIBRARY``), or
through ``examples/ansible/library``, a link to this file.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxgpu_split
short_description: Split a Proxmox VE host's GPUs between its host driver and vfio-pci
description:
  - Inspects the host, plans a NUMA-aware split, renders the LXC, VM, modprobe and boot files,
    and applies them with backups, a journal and rollback on failure (see proxgpu's README).
options:
  root:
    description: Directory laid out like the host (an offline image); default the host itself.
    type: path
  lxc:
    description: >-
      Containers that get the GPUs kept on the host driver, as VMID (they share them),
      VMID:N (N GPUs of their own on one NUMA node), either one with @NODE to take them from
      that NUMA node, pinned to it (VMID@NODE: every GPU the node keeps), or
      VMID:mig=GPU/GI[/CI] (one MIG instance of GPU, a CUDA index or PCI address).
    type: list
    elements: raw
  vms:
    description: >-
      VMs that get vfio GPUs, as VMID or VMID:N, or a vGPU of an mdev type, as
      VMID:vgpu=TYPE.
    type: list
    elements: str
    default: []
  host_nodes:
    description: NUMA nodes whose GPUs stay on the host driver.
    type: list
    elements: int
    default: []
  vfio_nodes:
    description: NUMA nodes whose GPUs go to vfio-pci.
    type: list
    elements: int
    default: []
  host_gpus:
    description: GPUs (PCI addresses) that stay on the host driver.
    type: list
    elements: str
    default: []
  vfio_gpus:
    description: GPUs (PCI addresses) that go to vfio-pci.
    type: list
    elements: str
    default: []
  enable_iommu:
    description: Turn the IOMMU on in the kernel command line if it is off.
    type: bool
    default: false
  bind_method:
    description: Boot-time binding by modprobe.d hook or driverctl overrides.
    type: str
    choices: [modprobe, driverctl]
    default: modprobe
  mapping:
    description: Give VMs their GPUs through this cluster PCI mapping.
    type: str
  live:
    description: Also rebind the vfio group now, without a reboot.
    type: bool
    default: false
  gpu_vendor:
    description: Only PCI functions of these vendor IDs count as GPUs.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Node 0 GPUs stay on nvidia for CT 200, node 1 GPUs go to VM 300
  proxgpu_split:
    lxc: 200
    vms: ["300"]
"""

RETURN = r"""
changed:
  description: Whether files changed (or, in check mode, would change).
  type: bool
diff:
  description: The file changes (secrets redacted), in diff mode.
  type: list
plan:
  description:
    - The split as proxgpu plan --json prints it for the host as this run found it, with
      changes (files with before/after, actions, reboot_required, changed, summary, diff) and
      reboot_pending (functions not yet on their planned driver while the files already
      match the plan).
  type: dict
actions:
  description: Follow-up commands, run or (check mode, directory trees) listed.
  type: list
next_steps:
  description:
    - What each container given NVIDIA GPUs must hold, one sentence each, as a next step; its
      NVIDIA user-space libraries of exactly the host's nvidia module version, installed without a
      kernel module (NVML refuses a mismatch), again after every host driver upgrade.
  type: list
notes:
  description:
    - What the split does or assumes, asking nothing of you (an uneven split, an initramfs that
      was not read); what asks something is a warning.
  type: list
reboot_required:
  description:
    - Whether the host must reboot for the split to take effect, on this run or a later one
      (an earlier apply that needed a reboot which has not happened yet).
    - Always false with O(root), a directory that is not the machine the module runs on.
  type: bool
journal_id:
  description: The journal entry to roll back with proxgpu rollback --to.
  type: str
error:
  description:
    - On failure, the error as proxgpu --json prints it, code (proxgpu's exit code), kind
      (the class, PlanRefusedError...), message, host, path and fix (null where none).
  type: dict
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule

ARGUMENTS: dict[str, Any] = {
    "root": {"type": "path"},
    "lxc": {"type": "list", "elements": "raw"},
    "vms": {"type": "list", "elements": "str", "default": []},
    "host_nodes": {"type": "list", "elements": "int", "default": []},
    "vfio_nodes": {"type": "list", "elements": "int", "default": []},
    "host_gpus": {"type": "list", "elements": "str", "default": []},
    "vfio_gpus": {"type": "list", "elements": "str", "default": []},
    "enable_iommu": {"type": "bool", "default": False},
    "bind_method": {"type": "str", "choices": ["modprobe", "driverctl"], "default": "modprobe"},
    "mapping": {"type": "str"},
    "live": {"type": "bool", "default": False},
    "gpu_vendor": {"type": "list", "elements": "str"},
}


def main() -> None:
    """Run the module: plan (check mode) or apply the split, and say whether to reboot."""
    module = AnsibleModule(argument_spec=ARGUMENTS, supports_check_mode=True)
    try:
        import proxgpu
        from proxgpu.ansible.request import change_options, split_request
        from proxgpu.ansible.results import failure, split_result
        from proxgpu.pipeline import reboot_awaited, split_host
    except ImportError as exc:
        module.fail_json(msg=f"proxgpu is not installed for the Python running this module: {exc}")
    p = module.params
    try:
        request = split_request(p)
        with proxgpu.connect(root=p["root"]) as host:
            result = split_host(
                host,
                request.policy,
                request.options,
                gpu_filter=request.gpu_filter,
                how=change_options(p, check=module.check_mode),
            )
            # A directory tree is not the machine this module runs on: its boot is not ours to
            # ask for. On the host itself, a change that needs a reboot asks for one, and so does
            # every later run until the host has rebooted after the last apply.
            reboot = host.is_live and reboot_awaited(host, result)
    except proxgpu.ProxgpuError as exc:
        module.fail_json(**failure(exc))
    # module.warn, not exit_json(warnings=...), which ansible-core 2.19 deprecates.
    for warning in [*result.plan.warnings, *result.changes.warnings]:
        module.warn(warning)
    module.exit_json(**split_result(result, diff=module._diff, reboot=reboot))


if __name__ == "__main__":
    main()
