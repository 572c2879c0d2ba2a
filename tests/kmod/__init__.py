"""The kmod releases of every Proxmox VE release, built from Debian's sources for the tests."""
