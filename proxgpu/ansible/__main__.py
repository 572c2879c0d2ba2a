"""``python3 -m proxgpu.ansible``: print the directory that holds the Ansible module, for
``ANSIBLE_LIBRARY``."""

from proxgpu.ansible import LIBRARY

print(LIBRARY)
