"""proxgpu's Ansible module, shipped in the package so that ``pip install proxgpu`` brings it.

Ansible looks for modules in the directories of ``ANSIBLE_LIBRARY`` (or ``library =`` in
``ansible.cfg``, or a ``library/`` folder beside the playbook); :data:`LIBRARY` is this one:

    ANSIBLE_LIBRARY=$(python3 -m proxgpu.ansible) ansible-playbook -i pve1, split.yml

The module runs on the Proxmox host, which needs proxgpu installed too; the controller only
reads the module file.

>>> (LIBRARY / "proxgpu_split.py").is_file()
True
"""

from __future__ import annotations

from pathlib import Path

LIBRARY = Path(__file__).resolve().parent
