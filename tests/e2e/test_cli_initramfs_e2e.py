"""The reboot walks of ``test_cli_e2e.py`` with nvidia loading from the initramfs (early KMS),
for each binding: a file of their own, so that the suite's second worker, with a test host of
its own, walks them while the first walks udev's (``--dist loadfile``: each file one worker's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_cli_e2e import BIND_METHODS, walk_the_split
from .testhost import QemuTestHost

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("method", BIND_METHODS)
def test_the_split_survives_cold_reboots_with_nvidia_in_the_initramfs(
    testhost: QemuTestHost, tmp_path: Path, method: str
) -> None:
    """nvidia in initramfs-tools' modules list, loaded before the root file system."""
    walk_the_split(testhost, tmp_path, "initramfs", method)
