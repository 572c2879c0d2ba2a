"""Proxmox VE's side: its config formats (:mod:`~proxgpu.pve.config`), which guest holds which
device (:mod:`~proxgpu.pve.claims`), and its API reached over proxgpu's own connection
(:mod:`~proxgpu.pve.api`)."""
