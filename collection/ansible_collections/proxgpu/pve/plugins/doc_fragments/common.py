"""What the documentation of the collection's modules shares (``extends_documentation_fragment:
proxgpu.pve.common``, ``proxgpu.pve.common.read_only`` for the modules that change nothing and
``proxgpu.pve.common.journal`` for those that act on a journal entry): the ``root`` option, how
proxgpu reaches the host, how a failure reads, and ``trust_unsigned``."""

from __future__ import annotations


class ModuleDocFragment:
    """The shared blocks, merged by ``ansible-doc`` and ``validate_argument_spec`` alike."""

    DOCUMENTATION = r"""
options:
  root:
    description:
      - Directory on the host laid out like a host's absolute paths (an image, a snapshot);
        default the host.
    type: str
attributes:
  action:
    description: Runs on the controller as an action plugin.
    support: full
notes:
  - proxgpu runs on the controller (C(pip install proxgpu) beside ansible-core) and reaches the
    host through the task's connection, as M(proxgpu.pve.gpu_split) does; the host needs only
    a POSIX shell, no Python.
  - Errors fail the task with proxgpu's one-line message and RV(error), the error document
    C(proxgpu --json) prints; a lost connection makes the host unreachable.
"""

    READ_ONLY = r"""
attributes:
  check_mode:
    description: Reads the same in check mode; never changes anything.
    support: full
  diff_mode:
    description: Changes nothing, so has no diff.
    support: none
"""

    JOURNAL = r"""
options:
  trust_unsigned:
    description:
      - Act on a journal entry not signed with this controller's key (C(~/.config/proxgpu/key)
        of the user running Ansible), as C(--trust-unsigned) does on the command line, for an
        apply made from another controller (a CI runner with a fresh home) whose entry you have
        checked by hand. The task then warns that it did. An entry made for another root is
        refused all the same.
    type: bool
    default: false
"""
