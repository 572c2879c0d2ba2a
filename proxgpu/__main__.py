"""``python -m proxgpu``."""

import sys

from proxgpu.cli import entry

sys.exit(entry())
