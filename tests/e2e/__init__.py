"""End-to-end tests against a QEMU-emulated dual-NUMA "GPU server" (see ``conftest.py``)."""
