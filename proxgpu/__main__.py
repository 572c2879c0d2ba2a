"""``python -m proxgpu``."""

import sys

from proxgpu.cli import main

sys.exit(main())
