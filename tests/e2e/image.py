"""Build the e2e guest image once and cache it outside the repository.

The image is defined entirely by the files under ``guest/`` (the build script and the overlay of
configuration files it copies in). Their sha256 is the cache key, so editing any of them makes
the next run build a fresh image; unchanged recipes reuse the cached one across sessions.

The build runs in a temporary directory next to the cache entry and is renamed into place only
when it succeeded, so a crashed or interrupted build never leaves a half-made entry behind. A
file lock serialises builds between concurrent pytest processes; whoever waited on the lock
finds the finished entry and uses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RECIPE_DIR = Path(__file__).resolve().parent / "guest"
BUILD_SCRIPT = RECIPE_DIR / "build-image.sh"
DEFAULT_CACHE_ROOT = Path("/var/cache/proxgpu-testhost")

# debootstrap measured ~75-110 s; the margin covers a slow mirror without hanging CI forever.
BUILD_TIMEOUT_S = 1200.0
# Someone else's build can take as long as ours would.
LOCK_TIMEOUT_S = BUILD_TIMEOUT_S + 120.0

ARTEFACTS = (
    "base.qcow2",
    "vmlinuz",
    "initrd.img",
    "cmdline",
    "id_ed25519",
    "id_ed25519.pub",
    "ssh_host_ed25519_key.pub",
)


class ImageBuildError(RuntimeError):
    """The guest image could not be built; the message carries the build log's tail."""


@dataclass(frozen=True)
class GuestImage:
    """A finished, cached guest image directory and the paths of its artefacts."""

    directory: Path

    @property
    def base(self) -> Path:
        """Compressed qcow2 root filesystem; the backing file of every overlay."""
        return self.directory / "base.qcow2"

    @property
    def kernel(self) -> Path:
        """Kernel for the first boot of a fresh overlay."""
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        """Initramfs for the first boot of a fresh overlay."""
        return self.directory / "initrd.img"

    @property
    def cmdline(self) -> str:
        """Kernel command line for the first boot (the image's /etc/kernel/cmdline)."""
        return (self.directory / "cmdline").read_text().strip()

    @property
    def identity_file(self) -> Path:
        """Private key that root in the guest accepts."""
        return self.directory / "id_ed25519"

    @property
    def host_public_key(self) -> Path:
        """The guest's SSH host key (public half), in OpenSSH .pub format."""
        return self.directory / "ssh_host_ed25519_key.pub"


def cache_root() -> Path:
    """Where images are cached: $PROXGPU_TESTHOST_CACHE or /var/cache/proxgpu-testhost."""
    configured = os.environ.get("PROXGPU_TESTHOST_CACHE")
    return Path(configured) if configured else DEFAULT_CACHE_ROOT


def recipe_key(recipe_dir: Path = RECIPE_DIR) -> str:
    """Return the sha256 over every file that defines the image (paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in recipe_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        # Length-prefixed so that moving bytes between a name and a body changes the key.
        name = path.relative_to(recipe_dir).as_posix().encode()
        digest.update(b"%d:%s:%d:" % (len(name), name, len(data)))
        digest.update(data)
    return digest.hexdigest()


def is_complete(directory: Path) -> bool:
    """Tell whether a cache entry holds every artefact the harness needs."""
    return all((directory / name).is_file() for name in ARTEFACTS)


def ensure_image(root: Path | None = None) -> GuestImage:
    """Return the cached image for the current recipe, building it first if it is missing."""
    root = root or cache_root()
    entry = root / recipe_key()
    if is_complete(entry):
        return GuestImage(entry)
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / ".lock", LOCK_TIMEOUT_S):
        # Another process may have finished the build while we waited for the lock.
        if not is_complete(entry):
            _build_into(entry)
    return GuestImage(entry)


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; give up after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageBuildError(f"timed out waiting for the build lock {path}") from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_into(entry: Path) -> None:
    """Build the image in a temporary sibling directory and rename it to ``entry``.

    Must be called with the build lock held: it also clears leftovers of earlier builds that
    died, which only a lock holder can tell apart from a build in progress.
    """
    root = entry.parent
    for stale in root.glob(".build-*"):
        remove_tree(stale)
    if entry.exists():
        remove_tree(entry)  # an incomplete entry, e.g. someone deleted a file by hand
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        started = time.monotonic()
        _run_build_script(staging)
        (staging / "recipe.sha256").write_text(entry.name + "\n")
        staging.chmod(0o755)  # mkdtemp made it private; the private key is 0600 on its own
        staging.rename(entry)
        log.info("built guest image %s in %.0f s", entry, time.monotonic() - started)
    except BaseException:
        remove_tree(staging)
        raise


def _run_build_script(out: Path) -> None:
    """Run guest/build-image.sh into ``out``, bounded in time, keeping its log."""
    build_log = out / "build.log"
    with build_log.open("wb") as sink:
        # A new session lets us stop debootstrap and every helper it spawned as one group.
        proc = subprocess.Popen(
            ["bash", str(BUILD_SCRIPT), str(out)],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=BUILD_TIMEOUT_S)
        except BaseException:
            _kill_group(proc)
            raise
    if rc != 0:
        tail = _tail(build_log, 40)
        # The staging directory is about to be removed; keep the log where a human can find it.
        kept = out.parent / "last-failed-build.log"
        kept.write_bytes(build_log.read_bytes())
        raise ImageBuildError(f"guest image build failed (rc={rc}, full log {kept}):\n{tail}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a build's whole process group: SIGTERM first, SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int) -> str:
    """Return the last ``lines`` lines of a text file."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def remove_tree(path: Path) -> None:
    """Delete a build tree, first unmounting whatever a killed debootstrap left mounted in it.

    debootstrap mounts /proc and /sys inside the target; deleting through a live mount would
    reach into the host's own pseudo filesystems, hence the unmount and --one-file-system.
    """
    for mountpoint in sorted(_mounts_under(path), key=lambda p: len(p.parts), reverse=True):
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, from /proc/self/mountinfo."""
    prefix = path.resolve()
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and the like written as octal escapes.
        raw = line.split()[4]
        point = Path(raw.encode().decode("unicode_escape"))
        if point == prefix or prefix in point.parents:
            found.append(point)
    return found


def main() -> int:
    """``python -m tests.e2e.image``: build the image for the current recipe, or reuse the cached
    one, and say which and how long it took (``.ci/run`` builds it so while lint runs)."""
    started = time.monotonic()
    entry = cache_root() / recipe_key()
    verb = "reused" if is_complete(entry) else "built"
    image = ensure_image()
    print(f"e2e guest image {verb} in {time.monotonic() - started:.0f} s: {image.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
