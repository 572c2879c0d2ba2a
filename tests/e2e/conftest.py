"""Fixtures that boot the QEMU "GPU server" for end-to-end tests.

``testhost`` (session scope) yields a running :class:`~tests.e2e.testhost.QemuTestHost`:

* ``port``, ``user``, ``identity_file``, ``known_hosts``: what an SSH client (the tool under
  test) needs to log in as root on 127.0.0.1, verifying the pinned host key;
* ``console_log``: the guest's serial console, every boot appended in order;
* ``ssh(argv, timeout)`` -> ``(rc, stdout, stderr)``, ``fetch(remote, local)``;
* ``reboot()``: cold reboot into whatever kernel/initramfs the guest now has on /boot;
* ``stop()``.

``testhost_without_iommu`` (module scope) is a second such host, booted with the IOMMU off.

The guest image is built on first use and cached (see ``image.py``); ``pytest -m "not e2e"``
never reaches these fixtures, so it builds and boots nothing. Missing host tools skip the
tests, except under CI (``$CI`` set), where a skipped e2e test would hide a broken setup, so
they fail instead.

Each test's costly steps are timed as phases (``phases.py``): the run's summary lists them per
test, and the tier fails once it has spent its budget of wall seconds (``$PROXGPU_E2E_BUDGET_S``).

Environment: ``$PROXGPU_TESTHOST_CACHE`` (image cache, default /var/cache/proxgpu-testhost),
``$PROXGPU_TESTHOST_RUNDIR`` (keep overlays and console logs there instead of pytest's tmp),
``$PROXGPU_TESTHOST_MIRROR`` (Debian mirror for the build), ``$PROXGPU_TESTHOST_ACCEL=kvm`` (only
where KVM can run a stock kernel; the default TCG is what the timeouts are sized for).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support.tools import find_tool

from .image import GuestImage, cache_root, ensure_image, is_complete, recipe_key
from .phases import LEDGER, PHASES_KEY, phase
from .testhost import QemuTestHost, stop_all

HERE = Path(__file__).resolve().parent
# Debian packages providing the tools: qemu-system-x86, qemu-utils, debootstrap, e2fsprogs,
# openssh-client.
REQUIRED_TOOLS = ("qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4", "ssh-keygen", "ssh")
INSTALL_HINT = "apt-get install -y qemu-system-x86 qemu-utils debootstrap e2fsprogs openssh-client"
CONSOLE_TAIL_LINES = 60


def _missing_prerequisites() -> list[str]:
    """Everything that stops this machine from building and booting the test host."""
    problems = [f"{tool} not found" for tool in REQUIRED_TOOLS if find_tool(tool) is None]
    image_cached = is_complete(cache_root() / recipe_key())
    if not image_cached and os.geteuid() != 0:
        problems.append("building the guest image needs root (debootstrap, chroot)")
    return problems


def _require_prerequisites() -> None:
    """Skip the e2e tests if the host lacks tools; fail instead when running under CI."""
    problems = _missing_prerequisites()
    if not problems:
        return
    message = f"e2e test host unavailable: {'; '.join(problems)} (hint: {INSTALL_HINT})"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse e2e-directory tests without the e2e marker, so "not e2e" can never boot a VM.
    The examples in the tier's helpers' docstrings run with the tier: they are marked here."""
    for item in items:
        if HERE not in item.path.parents or item.get_closest_marker("e2e") is not None:
            continue
        if not isinstance(item, pytest.DoctestItem):
            raise pytest.UsageError(f"{item.nodeid} is under tests/e2e but not marked e2e")
        item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start charging phases to an e2e test; fail it at once if the tier spent its budget."""
    if item.get_closest_marker("e2e") is None:
        return
    item.stash[_STARTED] = time.monotonic()
    LEDGER.begin(item.nodeid)
    over = LEDGER.over_budget()
    if over:
        spent = "\n".join(test.line() for test in LEDGER.tests)
        pytest.fail(f"{over}; where its time went:\n{spent}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of the guest's console to the report of a failed e2e test, and the
    test's phases to the report of its teardown."""
    report = yield
    hosts = [h for h in getattr(item, "funcargs", {}).values() if isinstance(h, QemuTestHost)]
    for host in hosts if report.failed else []:
        report.sections.append(
            (f"test host console ({host.console_log})", host.console_tail(CONSOLE_TAIL_LINES))
        )
    if call.when == "teardown" and _STARTED in item.stash:
        record = LEDGER.end(item.nodeid, time.monotonic() - item.stash[_STARTED])
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        report.user_properties.append((PHASES_KEY, (worker, record.seconds, record.line())))
    return report


_STARTED = pytest.StashKey[float]()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Last line of defence: no QEMU outlives the test session, however it ended."""
    stop_all()


def _run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where a host keeps its overlay and logs.

    pytest rotates its own temporary directories away after a few sessions, so CI can set
    $PROXGPU_TESTHOST_RUNDIR to keep console logs as artefacts.
    """
    keep_in = os.environ.get("PROXGPU_TESTHOST_RUNDIR")
    if not keep_in:
        return tmp_path_factory.mktemp("testhost")
    Path(keep_in).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="testhost-", dir=keep_in))


@pytest.fixture(scope="session")
def testhost_image() -> GuestImage:
    """The cached guest image for the current recipe, built first if missing."""
    _require_prerequisites()
    with phase("image"):
        return ensure_image()


@pytest.fixture(scope="session")
def testhost(
    testhost_image: GuestImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QemuTestHost]:
    """A booted test host on a fresh overlay, shared by the whole session."""
    yield from _booted(QemuTestHost(testhost_image, _run_directory(tmp_path_factory), _accel()))


@pytest.fixture(scope="module")
def testhost_without_iommu(
    testhost_image: GuestImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QemuTestHost]:
    """A second test host without the vIOMMU (see QemuTestHost's ``iommu``), on an overlay of
    its own, for one module: it runs beside ``testhost`` and stops when the module is done."""
    rundir = _run_directory(tmp_path_factory)
    yield from _booted(QemuTestHost(testhost_image, rundir, _accel(), iommu=False))


@pytest.fixture(autouse=True)
def _testhost_running(request: pytest.FixtureRequest) -> None:
    """Hand each test that uses the session's test host a running one: a test that failed
    with the host down (a boot that never came up) leaves the next test a fresh boot of the
    image, not a dead host, so that one failure is reported once."""
    if "testhost" in request.fixturenames:
        host = request.getfixturevalue("testhost")
        assert isinstance(host, QemuTestHost)
        host.revive()


def _accel() -> str:
    return os.environ.get("PROXGPU_TESTHOST_ACCEL", "tcg")


def _booted(host: QemuTestHost) -> Iterator[QemuTestHost]:
    """Start ``host``, hand it out, and stop it however the tests ended."""
    try:
        host.start()
        yield host
    finally:
        host.stop()
