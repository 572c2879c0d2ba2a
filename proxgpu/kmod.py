"""What kmod (``modprobe``, and udev loading a driver for a device) makes of a host's modprobe
configuration: which files it reads in which order, and which ``softdep`` and ``install`` line it
uses for a module.

The rules, as kmod 28 to 34 (Proxmox VE 7 to 9: Debian 11 to 13) implement them; the tests run
the real ``depmod`` and ``modprobe`` of each of those releases' kmod, 28, 30 and 34.2, over the
files proxgpu writes (``tests/local/test_kmod_binding.py``, ``tests/kmod/versions.toml``):

* Config files are ``*.conf`` files not starting with ``.`` (before kmod 33, as in kmod 28 and
  30 of Proxmox VE 7 and 8, ``*.alias`` files too: libkmod-config.c ``conf_files_filter_out``)
  in ``/etc/modprobe.d``, ``/run/modprobe.d``, ``/usr/local/lib/modprobe.d`` (kmod 29 and
  later; 28 does not read it), ``/usr/lib/modprobe.d`` (kmod 32 and later; on a merged-/usr
  host, as every Proxmox VE 8 and 9 is, it is ``/lib/modprobe.d``) and ``/lib/modprobe.d``
  (libkmod.c ``default_config_paths``); a name seen in an earlier directory hides the same name
  in a later one (libkmod-config.c ``conf_files_list``). proxgpu reads all five directories and
  both kinds of file on every release: a line an old or a new kmod skips can only make it refuse
  or warn where it need not, never miss a line kmod uses.
  The initramfs holds ``/etc`` and ``/lib``'s files only (mkinitramfs copies those two).
* depmod's ``modules.softdep`` in the kernel's module directory, which holds every module's own
  ``MODULE_SOFTDEP``, is read as one more config file named ``modules.softdep``, and all of them
  are read sorted by file name with ``strcmp`` (``kmod_config_new`` and
  ``conf_files_insert_sorted``): ``modules.softdep`` comes before ``proxgpu-vfio.conf``.
  kmod 33 and later read ``modules.weakdep`` there too: ``weakdep`` lines only, no softdep.
* For a module, only the first ``softdep`` line whose name matches it (``fnmatch``) is used, and
  likewise only the first ``install`` command (``kmod_module_get_softdeps``,
  ``kmod_module_get_install_commands``: "find only the first command").
* A line starting with ``#`` is a comment, a ``\\`` at the end of a line joins the next one, and
  module names are compared with ``-`` read as ``_`` (``underscores``).
* A softdep's modules are separated by white space only: NVIDIA's open module declares
  ``pre: ecdh_generic,ecdsa_generic``, which kmod looks up as one name, finds no module of that
  name, and goes on ("continuing anyway").

Which modules a device's modalias names (what udev's builtin kmod and ``modprobe MODALIAS`` load)
is :func:`lookup_modalias`; its rules are in that function's docstring.

>>> files = {"/lib/modules/6.8.12-4-pve/modules.softdep":
...              "softdep nvidia pre: ecdh_generic,ecdsa_generic\\n",
...          "/etc/modprobe.d/proxgpu-vfio.conf": "softdep nvidia pre: vfio-pci\\n"}
>>> config = KmodConfig.of(files, "6.8.12-4-pve")
>>> [path for path, _ in config.files]
['/lib/modules/6.8.12-4-pve/modules.softdep', '/etc/modprobe.d/proxgpu-vfio.conf']
>>> config.softdep("nvidia").where
'/lib/modules/6.8.12-4-pve/modules.softdep:1'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from proxgpu.kmodglob import alias_normalize, glob_matches, index_matches

#: kmod's config directories, in the order a name in one hides the same name in the next.
CONFIG_DIRS = (
    "/etc/modprobe.d/",
    "/run/modprobe.d/",
    "/usr/local/lib/modprobe.d/",
    "/usr/lib/modprobe.d/",
    "/lib/modprobe.d/",
)
#: The names of config files in them: kmod 33 and later read ``*.conf`` only, earlier ones
#: ``*.alias`` too (module-init-tools' old name), so both are read, as the oldest kmod does.
CONFIG_SUFFIXES = (".conf", ".alias")
#: The file depmod writes from the modules' own ``softdep`` modinfo, read as a config file.
MODULES_SOFTDEP = "modules.softdep"
#: The modules' own aliases, ``alias GLOB MODULE`` a line, as depmod writes them beside the
#: ``modules.alias.bin`` index kmod searches.
MODULES_ALIAS = "modules.alias"
#: The kernel's modinfo of its built-in modules, ``MODULE.KEY=VALUE`` strings each ending in a
#: NUL, from whose ``alias`` entries depmod makes ``modules.builtin.alias.bin``.
MODULES_BUILTIN_MODINFO = "modules.builtin.modinfo"


def module_dir(kernel: str) -> str:
    """The kernel's module directory, where depmod writes ``modules.softdep``.

    >>> module_dir("6.8.12-4-pve")
    '/lib/modules/6.8.12-4-pve/'
    """
    return f"/lib/modules/{kernel}/"


def normalize(name: str) -> str:
    """A module name as kmod compares it: ``-`` read as ``_``, except inside ``[...]``.

    >>> normalize("vfio-pci"), normalize("snd-hda-[a-z]*")
    ('vfio_pci', 'snd_hda_[a-z]*')
    """
    parts = re.split(r"(\[[^\]]*\])", name)
    return "".join(p if p.startswith("[") else p.replace("-", "_") for p in parts)


def module_of(file: str) -> str | None:
    """The module a ``.ko`` file (compressed or not) holds, as kmod names it; else ``None``.

    >>> module_of("snd-hda-intel.ko.zst"), module_of("00-proxgpu-vfio.conf")
    ('snd_hda_intel', None)
    """
    name, dot, _ = file.partition(".ko")
    return normalize(name) if dot and name else None


@dataclass(frozen=True)
class ConfigLine:
    """One command line of a config file: where it is, what it says."""

    path: str
    number: int
    text: str

    @property
    def words(self) -> list[str]:
        return self.text.split()

    @property
    def command(self) -> str:
        return self.words[0]

    @property
    def module(self) -> str:
        """The module (a pattern for ``softdep``) the line is about, as kmod compares it."""
        words = self.words
        return normalize(words[1]) if len(words) > 1 else ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"

    def matches(self, module: str) -> bool:
        return fnmatchcase(normalize(module), self.module)

    def softdeps(self) -> tuple[list[str], list[str]]:
        """A ``softdep`` line's ``pre:`` and ``post:`` modules, as kmod reads them.

        kmod takes what follows the module name and one blank; when more blanks follow, it
        reads the first word with a blank in front, so that word is never ``pre:`` or
        ``post:`` (``kmod_config_add_softdep``), and the modules up to the next keyword are lost.

        >>> ConfigLine("f", 1, "softdep nvidia pre: a b post: c").softdeps()
        (['a', 'b'], ['c'])
        >>> ConfigLine("f", 1, "softdep nvidia  pre: a post: c").softdeps()
        ([], ['c'])
        """
        match = re.match(r"\S+[ \t]+\S+[ \t]?(.*)", self.text, re.DOTALL)
        rest = match.group(1) if match else ""
        words = rest.split()
        pre: list[str] = []
        post: list[str] = []
        into: list[str] | None = None
        for n, word in enumerate(words):
            if word in ("pre:", "post:") and not (n == 0 and rest[:1].isspace()):
                into = pre if word == "pre:" else post
            elif into is not None:
                into.append(word)
        return pre, post


def _read_lines(text: str) -> list[tuple[int, str]]:
    r"""The lines of a config file as kmod reads them (``freadline_wrapped``), each with the
    number of the line it starts on: only a newline ends a line, a backslash before it joins the
    next line, and a backslash before any other character stands for that character (so two at
    the end of a line are a backslash, not a continuation).

    >>> _read_lines("a \\\\\nb\\_c \\\n d\n")
    [(1, 'a \\'), (2, 'b_c  d')]
    """
    lines: list[tuple[int, str]] = []
    current: list[str] = []
    number = start = 1
    characters = iter(text)
    for character in characters:
        if character == "\n":
            lines.append((start, "".join(current)))
            current, number = [], number + 1
            start = number
        elif character == "\\":
            escaped = next(characters, "")
            if escaped == "\n":
                number += 1
            else:
                current.append(escaped)
        else:
            current.append(character)
    if current:
        lines.append((start, "".join(current)))
    return lines


def parse_lines(path: str, text: str) -> list[ConfigLine]:
    """The command lines of one config file (see :func:`_read_lines`), comments left out.

    >>> [line.text for line in parse_lines("f", "# c\\nsoftdep a \\\\\\n  pre: b\\n\\n")]
    ['softdep a   pre: b']
    """
    return [
        ConfigLine(path, number, line.strip())
        for number, line in _read_lines(text)
        if line.split() and not line.startswith("#")
    ]


@dataclass(frozen=True)
class KmodConfig:
    """A host's modprobe configuration as kmod reads it: ``files`` in kmod's order."""

    files: tuple[tuple[str, str], ...]

    @classmethod
    def of(
        cls,
        host_files: Mapping[str, str],
        kernel: str | None,
        *,
        without: frozenset[str] = frozenset(),
    ) -> KmodConfig:
        """The config kmod reads for ``kernel`` from ``host_files`` (by path), leaving out the
        paths in ``without`` (to see what kmod would do without them)."""
        by_name: dict[str, str] = {}
        for directory in CONFIG_DIRS:
            for path in sorted(host_files):
                name = path[len(directory) :]
                if not path.startswith(directory) or "/" in name or path in without:
                    continue
                if name.endswith(CONFIG_SUFFIXES) and len(name) > 5 and not name.startswith("."):
                    by_name.setdefault(name, path)
        if kernel is not None:
            softdep = module_dir(kernel) + MODULES_SOFTDEP
            if softdep in host_files and softdep not in without:
                by_name.setdefault(MODULES_SOFTDEP, softdep)
        ordered = sorted(by_name.items(), key=lambda item: item[0].encode())
        return cls(tuple((path, host_files[path]) for _, path in ordered))

    def lines(self, command: str | None = None) -> list[ConfigLine]:
        """Every command line, in the order kmod reads them (``command`` ones only if given).

        >>> config = KmodConfig.of({"/etc/modprobe.d/b.conf": "blacklist nouveau\\n",
        ...                         "/lib/modprobe.d/a.conf": "softdep amdgpu post: x\\n"}, None)
        >>> [line.where for line in config.lines()], [l.text for l in config.lines("blacklist")]
        (['/lib/modprobe.d/a.conf:1', '/etc/modprobe.d/b.conf:1'], ['blacklist nouveau'])
        """
        return [
            line
            for path, text in self.files
            for line in parse_lines(path, text)
            if command is None or line.command == command
        ]

    def softdep(self, module: str) -> ConfigLine | None:
        """The ``softdep`` line kmod uses for ``module``: the first that matches it.

        >>> text = "softdep snd-hda-* pre: x\\nsoftdep snd_hda_intel pre: y\\n"
        >>> config = KmodConfig.of({"/etc/modprobe.d/a.conf": text}, None)
        >>> config.softdep("snd_hda_intel").text
        'softdep snd-hda-* pre: x'
        """
        return next((line for line in self.lines("softdep") if line.matches(module)), None)

    def aliases(self) -> list[tuple[ConfigLine, str, str]]:
        """The ``alias`` lines kmod keeps, in its order, each with its pattern and module as kmod
        compares them (:func:`alias_normalize`); a line missing either, or with a bracket that
        does not close, is a syntax error kmod skips.

        >>> text = "alias pci:v0000ABCDd* my-driver\\nalias pci:v[0 x\\nalias lonely\\n"
        >>> config = KmodConfig.of({"/etc/modprobe.d/a.conf": text}, None)
        >>> [(line.number, pattern, module) for line, pattern, module in config.aliases()]
        [(1, 'pci:v0000ABCDd*', 'my_driver')]
        """
        kept = []
        for line in self.lines("alias"):
            words = [alias_normalize(word) for word in line.words[1:3]]
            if len(words) == 2 and words[0] is not None and words[1] is not None:
                kept.append((line, words[0], words[1]))
        return kept

    def install(self, module: str) -> ConfigLine | None:
        """The ``install`` command kmod runs instead of loading ``module``: the first one.

        >>> config = KmodConfig.of({"/etc/modprobe.d/a.conf": "install vfio_pci /bin/t\\n"}, None)
        >>> config.install("vfio-pci").where, config.install("nvidia")
        ('/etc/modprobe.d/a.conf:1', None)
        """
        return next((line for line in self.lines("install") if line.matches(module)), None)


@dataclass(frozen=True)
class Resolved:
    """A module kmod finds for an alias: the pattern that named it, where that pattern is (a
    config file's line, or the module directory's file), and whether it is built in."""

    module: str
    alias: str
    where: str
    builtin: bool = False


def matching_aliases(
    modalias: str, aliases: Iterable[tuple[str, str]], where: str, *, builtin: bool = False
) -> list[Resolved]:
    """The modules of an index (``(alias, module)`` pairs, as ``modules.alias`` lists them, each
    alias normalized as depmod indexes it) whose alias finds ``modalias``, in their order.

    >>> aliases = [("pci:v000010DEd*sv*sd*bc03sc*i*", "nouveau"), ("pci:v00001002d*", "amdgpu")]
    >>> [r.module for r in matching_aliases("pci:v000010DEd00002BB1sv0sd0bc03sc00i00", aliases,
    ...                                      "modules.alias")]
    ['nouveau']
    """
    name = alias_normalize(modalias)
    found: list[Resolved] = []
    for alias, module in aliases:
        key = alias_normalize(alias)
        if name is not None and key is not None and index_matches(key, name):
            resolved = Resolved(normalize(module), alias, where, builtin)
            found += [resolved] if resolved.module not in {r.module for r in found} else []
    return found


def lookup_modalias(
    modalias: str,
    config: KmodConfig,
    aliases: Iterable[tuple[str, str]],
    builtin: Iterable[tuple[str, str]] = (),
) -> list[Resolved]:
    """The modules kmod returns for a device's modalias (``kmod_module_new_from_lookup``, which
    udev's builtin kmod and ``modprobe MODALIAS`` call, loading each), given the config, the
    kernel's ``modules.alias`` and its built-in modules' aliases (``modules.builtin.modinfo``'s
    ``alias=`` entries), each as ``(alias, module)``.

    kmod 28 to 34 alike normalize the name (:func:`alias_normalize`), then ask one source after
    another and stop at the first that finds any module: the config's ``alias`` lines (every
    one whose pattern matches the whole name with ``fnmatch``, in the config's order: they
    override everything else), ``modules.dep`` and ``modules.builtin`` (names without a ``:``
    only), ``modules.symbols`` (``symbol:`` names), ``install`` and ``remove`` commands (a
    module spelled exactly like the name; such a command runs instead of any module, so it is
    left out here), ``modules.alias.bin`` (:func:`index_matches`) and
    ``modules.builtin.alias.bin`` (the same search; its modules are built in). kmod reads only
    the indexes; depmod writes the text ``modules.alias`` beside its index from the same modinfo,
    and the built-in one from ``modules.builtin.modinfo``, so those are read here instead.
    (kmod 28's depmod writes the built-in index empty, which kmod 29 fixed: there kmod finds no
    built-in module by an alias, though the module, in the kernel, takes the device all the
    same.)

    >>> config = KmodConfig.of({"/etc/modprobe.d/a.conf": "alias pci:v000010DE* nvidia\\n"}, None)
    >>> name = "pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00"
    >>> own = [("pci:v000010DEd*sv*sd*bc03sc*i*", "nouveau")]
    >>> [(r.module, r.where) for r in lookup_modalias(name, config, own)]
    [('nvidia', '/etc/modprobe.d/a.conf:1')]
    >>> [r.module for r in lookup_modalias(name, KmodConfig(()), own)]
    ['nouveau']
    """
    name = alias_normalize(modalias)
    if name is None:
        return []
    found: list[Resolved] = []
    for line, pattern, module in config.aliases():
        if glob_matches(pattern, name) and module not in {r.module for r in found}:
            found.append(Resolved(module, pattern, line.where))
    return (
        found
        or matching_aliases(modalias, aliases, "modules.alias")
        or matching_aliases(modalias, builtin, "modules.builtin.modinfo", builtin=True)
    )
