"""Documentation of ``proxgpu.pve.gpu_facts``; the work is done by the action plugin of the same
name (``plugins/action/gpu_facts.py``) on the controller, so this file never runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: Read a Proxmox VE host's GPUs, NUMA nodes and guests as facts
version_added: "0.1.0"
author: proxgpu contributors
description:
  - Sets the fact C(proxgpu) to the host's inventory as C(proxgpu inspect --json) prints it
    (guest config secrets redacted), in one command on the host.
extends_documentation_fragment:
  - proxgpu.pve.common
  - proxgpu.pve.common.read_only
options:
  gpu_vendor:
    description:
      - Only PCI functions of these vendor IDs (four hex digits) count as GPUs, their processing
        accelerators that are not GPUs (FPGAs, Gaudi) too.
    type: list
    elements: str
  gpu_class:
    description:
      - PCI class code prefixes that count as GPUs (default C(03) and C(12), every display
        controller and the processing accelerators that are GPUs, AMD Instinct).
    type: list
    elements: str
attributes:
  facts:
    description: Sets C(ansible_facts.proxgpu).
    support: full
seealso:
  - module: proxgpu.pve.gpu_split
"""

EXAMPLES = r"""
- name: Read the GPUs
  proxgpu.pve.gpu_facts:

- name: Say which GPUs sit on which NUMA node
  ansible.builtin.debug:
    msg: "{{ ansible_facts.proxgpu.gpus | map(attribute='numa_node') | list }}"
"""

RETURN = r"""
ansible_facts:
  description: The fact C(proxgpu).
  returned: success
  type: dict
  contains:
    proxgpu:
      description:
        - The inventory as C(proxgpu inspect --json) prints it; its fields are proxgpu's stable
          contract (C(hostname), C(numa_nodes), C(gpus) with C(address), C(numa_node),
          C(iommu_group), C(driver), C(nvidia_minor)..., C(warnings), C(schema_version)).
      type: dict
      returned: success
"""
