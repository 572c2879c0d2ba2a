"""Documentation of ``proxgpu.pve.gpu_verify``; the work is done by the action plugin of the
same name (``plugins/action/gpu_verify.py``) on the controller, so this file never runs on a
host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_verify
short_description: Check that a Proxmox VE host is still as proxgpu's last apply left it
version_added: "0.1.0"
author: proxgpu contributors
description:
  - Compares the host with the last apply (or O(to)) as C(proxgpu verify) does, and fails on
    drift; the result holds the report either way.
  - Each function's driver, the files proxgpu owns byte for byte, and in guest configs,
    C(pci.cfg) and the kernel command line only the entries the apply changed (a VM snapshot
    or a new tag is not drift). Drivers not yet as planned before the reboot that completes
    the apply are RV(verify.pending_reboot), not drift.
  - The guests the apply gives GPUs are looked at too, unless O(guests=false)
    (RV(verify.guests)) - a container holding another NVIDIA user space than the host's nvidia
    module is drift; inside each running container, C(nvidia-smi) must list exactly its GPUs
    (by UUID), and each running VM's QEMU must hold every function the apply gives it. A guest
    that could not be looked at (stopped, locked, without C(nvidia-smi)) is a warning saying
    what to do, never part of a pass.
  - A host without an applied journal entry fails the task (C(UsageError)).
extends_documentation_fragment:
  - proxgpu.pve.common
  - proxgpu.pve.common.journal
  - proxgpu.pve.common.read_only
options:
  to:
    description: The journal entry to compare with (default the last applied one).
    type: str
  guests:
    description:
      - Look at the guests the apply gives GPUs (C(proxgpu verify) without C(--no-guests)).
    type: bool
    default: true
seealso:
  - module: proxgpu.pve.gpu_split
  - module: proxgpu.pve.gpu_rollback
"""

EXAMPLES = r"""
- name: Fail any host that drifted from its split
  proxgpu.pve.gpu_verify:
  register: checked

- name: Show which functions the split moved, and where they are now
  ansible.builtin.debug:
    var: checked.verify.moved
"""

RETURN = r"""
changed:
  description: Always false.
  returned: always
  type: bool
verify:
  description: The report, as C(proxgpu verify --json) prints it.
  returned: when the journal was read
  type: dict
  contains:
    drifted:
      description: Whether the host differs from the apply.
      type: bool
    drift:
      description: One line per difference.
      type: list
      elements: str
    pending_reboot:
      description: Functions not yet on their planned driver because the host has not rebooted.
      type: list
      elements: str
    moved:
      description: The driver each function the apply moved to vfio-pci is bound to now.
      type: dict
    guests:
      description:
        - What was found at each guest the apply gives GPUs - C(guest) (C(CT 200), C(VM 300)),
          C(verdict) (C(ok), C(drift), or C(unchecked) with why and what to do) and C(line).
      type: list
      elements: dict
error:
  description:
    - The error as C(proxgpu --json) prints it (C(DriftError), code 17, on drift), C(code),
      C(kind), C(message), C(host), C(path) and C(fix).
  returned: failure
  type: dict
"""
