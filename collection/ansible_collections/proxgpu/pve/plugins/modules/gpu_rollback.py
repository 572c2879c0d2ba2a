"""Documentation of ``proxgpu.pve.gpu_rollback``; the work is done by the action plugin of the
same name (``plugins/action/gpu_rollback.py``) on the controller, so this file never runs on a
host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_rollback
short_description: Roll back the last proxgpu apply on a Proxmox VE host
version_added: "0.1.0"
author: proxgpu contributors
description:
  - Rolls back the last apply (the newest journal entry that did not fail) while it is still
    in effect, as C(proxgpu rollback) does; once it is rolled back, a second run changes
    nothing (unlike C(proxgpu rollback), which would go on to the apply before it). A failed
    apply restored everything itself and is passed over.
  - A file still as the apply left it gets its backup back byte for byte (files the apply
    created are removed); a guest config, C(pci.cfg) or kernel command line changed since keeps
    every later change and loses only the entries the apply wrote. When one of those entries
    was itself changed since, the task fails naming the file, in check mode too, unless
    O(force).
  - The follow-up actions run again (listed, not run, on a O(root) tree).
extends_documentation_fragment:
  - proxgpu.pve.common
  - proxgpu.pve.common.journal
options:
  to:
    description:
      - The journal entry to roll back (C(journal_id) of M(proxgpu.pve.gpu_split),
        C(proxgpu history)); nothing changes when it was rolled back already.
    type: str
  force:
    description: Write every backup back, even over entries changed since the apply.
    type: bool
    default: false
  live:
    description: Also return the functions the apply rebound at runtime to their drivers.
    type: bool
    default: false
  break_lock:
    description: Take over a lock another machine's apply or rollback left behind.
    type: bool
    default: false
attributes:
  check_mode:
    description: Says what would be restored (and the diff); writes nothing.
    support: full
  diff_mode:
    description: Returns every file the rollback changes in before/after form.
    support: full
seealso:
  - module: proxgpu.pve.gpu_split
  - module: proxgpu.pve.gpu_verify
"""

EXAMPLES = r"""
- name: Say what undoing the last split would restore (run with --check --diff)
  proxgpu.pve.gpu_rollback:
  register: undone

- name: Reboot into the drivers from before the split
  ansible.builtin.reboot:
  when: undone.changed and not ansible_check_mode
"""

RETURN = r"""
changed:
  description: Whether an apply was (in check mode, would be) rolled back.
  returned: always
  type: bool
journal_id:
  description: The journal entry rolled back (in check mode, that would be); null when none.
  returned: success
  type: str
restored:
  description: The files the rollback changed (in check mode, would change).
  returned: success
  type: list
  elements: str
actions:
  description: The follow-up commands run again (listed in check mode and on a O(root) tree).
  returned: success
  type: list
  elements: list
messages:
  description: What the rollback says it did (files restored, entries kept, actions listed).
  returned: success
  type: list
  elements: str
diff:
  description: The file changes (secrets redacted), in diff mode.
  returned: success
  type: list
  elements: dict
error:
  description:
    - The error as C(proxgpu --json) prints it, C(code) (proxgpu's exit code), C(kind) (the
      class, C(FileChangedError)...), C(message), C(host), C(path) and C(fix) (null where none).
  returned: failure
  type: dict
"""
