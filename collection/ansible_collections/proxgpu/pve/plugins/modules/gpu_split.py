"""Documentation of ``proxgpu.pve.gpu_split``; the work is done by the action plugin of the same
name (``plugins/action/gpu_split.py``) on the controller, so this file never runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_split
short_description: Split a Proxmox VE host's GPUs between its host driver and vfio-pci
version_added: "0.1.0"
author: proxgpu contributors
description:
  - Inspects the host, plans a NUMA-aware split, renders the LXC, VM, modprobe and boot files,
    and applies them with backups, a journal and rollback on failure (see proxgpu's README).
  - proxgpu runs on the controller (C(pip install proxgpu) beside ansible-core) and reaches the
    host through the task's connection, its SSH settings, C(become) and jump hosts; the host
    needs only a POSIX shell, no Python.
  - Supports the C(ssh) and C(local) connections, which give a command its stdin.
  - The options and results are those of the C(proxgpu_split) module that proxgpu ships for
    running on the host itself.
options:
  root:
    description:
      - Directory on the host laid out like a host's absolute paths (an image, a snapshot);
        files are written there and follow-up actions are listed, not run. Default the host.
    type: str
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
    description: Only PCI functions of these vendor IDs (four hex digits) count as GPUs.
    type: list
    elements: str
attributes:
  check_mode:
    description: Plans and diffs without writing anything.
    support: full
  diff_mode:
    description: Returns every file change in before/after form.
    support: full
  action:
    description: Runs on the controller as an action plugin.
    support: full
notes:
  - Errors fail the task with proxgpu's one-line message and RV(error), the error document
    C(proxgpu --json) prints; a lost connection makes the host unreachable.
  - M(proxgpu.pve.gpu_rollback) undoes the last apply, M(proxgpu.pve.gpu_verify) fails on drift.
seealso:
  - module: proxgpu.pve.gpu_facts
  - module: proxgpu.pve.gpu_rollback
  - module: proxgpu.pve.gpu_verify
"""

EXAMPLES = r"""
- name: Review the split of every host (run the play with --check --diff)
  proxgpu.pve.gpu_split:
    lxc: 200
    vms: ["300"]
  register: split

- name: Reboot into the new binding
  ansible.builtin.reboot:
  when: split.reboot_required and not ansible_check_mode

- name: Try the split on a snapshot kept on the host
  proxgpu.pve.gpu_split:
    root: /srv/proxgpu/ct200
    lxc: 200
    vms: ["300:2"]
"""

RETURN = r"""
changed:
  description: Whether files changed (or, in check mode, would change).
  returned: success
  type: bool
diff:
  description: The file changes (secrets redacted), in diff mode.
  returned: success
  type: list
  elements: dict
plan:
  description:
    - The split as C(proxgpu plan --json) prints it for the host as this run found it (secrets
      redacted).
  returned: success
  type: dict
  contains:
    groups:
      description:
        - One per role, C(role) (C(host) or C(vfio)), C(numa_node), C(gpus), C(functions),
          C(cpus), C(driver), C(guest).
      type: list
      elements: dict
    warnings:
      description: What the planner warns about.
      type: list
      elements: str
    tensor_parallel:
      description: >-
        The NUMA-local C(CUDA_VISIBLE_DEVICES) sets for each tensor-parallel size of each host
        group, with the containers they are numbered for (C(guests)) and their GPUs (C(gpu_sets)).
      type: list
      elements: dict
    changes:
      description:
        - The file changes, C(files) (path, before, after), C(actions), C(reboot_required),
          C(changed), C(summary) and C(diff) (Ansible's before/after form).
      type: dict
    reboot_pending:
      description:
        - The functions not yet on their planned driver while every file already matches the
          plan (applied, not yet rebooted); empty while files still change.
      type: list
      elements: str
actions:
  description: Follow-up commands, run or (check mode, directory trees) listed.
  returned: success
  type: list
  elements: list
next_steps:
  description:
    - What each container given NVIDIA GPUs must hold, one sentence each, as a next step; its
      NVIDIA user-space libraries of exactly the host's nvidia module version, installed without a
      kernel module (NVML refuses a mismatch), again after every host driver upgrade.
  returned: success
  type: list
  elements: str
notes:
  description:
    - What the split does or assumes, asking nothing of you (an uneven split, an initramfs that
      was not read); what asks something is a warning.
  returned: success
  type: list
  elements: str
reboot_required:
  description:
    - Whether the host must reboot for the split to take effect, on this run or a later one
      (an earlier apply that needed a reboot which has not happened yet).
    - Always false with O(root), a directory that is not the machine that would reboot.
  returned: success
  type: bool
journal_id:
  description: The journal entry to roll back with C(proxgpu rollback --to).
  returned: when files were written
  type: str
error:
  description:
    - The error as C(proxgpu --json) prints it, so a play can tell failures apart without
      parsing the message.
  returned: failure
  type: dict
  contains:
    code:
      description: proxgpu's exit code for it (9 plan refused, 10 refused before writing...).
      type: int
    kind:
      description: The class of the error (C(PlanRefusedError), C(PreflightError)...).
      type: str
    message:
      description: The one-line message, also in C(msg).
      type: str
    host:
      description: The host it names, or null.
      type: str
    path:
      description: The file it names, or null.
      type: str
    fix:
      description: What to do about it, or null.
      type: str
"""
