"""Jinja2 templates for the files proxgpu writes; installed as the package proxgpu.templates."""
