"""Which of QEMU's named x86 CPU models give a guest 1 GiB pages (``pdpe1gb``).

OVMF uses more than 40 physical address bits only with 1 GiB pages (:mod:`proxgpu.planning.ovmf`),
so a VM on a named model needs to know whether the model has them. The facts come from QEMU's
model table, ``builtin_x86_defs`` in target/i386/cpu.c: a model has the pages when its
``features[FEAT_8000_0001_EDX]`` includes ``CPUID_EXT2_PDPE1GB``. Checked against a copy of that
table with ClearwaterForest but before EPYC-Turin, and against the patch that adds EPYC-Turin:

* With them: the EPYC family (EPYC, EPYC-Rome, EPYC-Milan, EPYC-Genoa, EPYC-Turin), Hygon's
  Dhyana, Opteron_G4 and G5, phenom, Skylake-Server, Cascadelake-Server, Cooperlake,
  Icelake-Server, SapphireRapids, GraniteRapids, SierraForest, ClearwaterForest, the Atom server
  models Denverton and Snowridge, KnightsMill and Zhaoxin's YongFeng.
* Without them: qemu64 and kvm64 (their definitions list ``CPUID_EXT2_PDPE1GB`` as missing), the
  Intel desktop line up to Skylake-Client (Conroe, Penryn, Nehalem, Westmere, SandyBridge,
  IvyBridge, Haswell, Broadwell, Skylake-Client, core2duo), Opteron_G1 to G3, and the 32-bit
  models, which cannot run OVMF's 64-bit firmware anyway.

A versioned name (``EPYC-Rome-v2``) or a version's alias (``Skylake-Server-IBRS``, ``EPYC-IBPB``) is
its base model with the properties its version lists: no version in that copy, nor in the patches
adding EPYC-v5, EPYC-Rome-v5, EPYC-Milan-v3 and EPYC-Genoa-v2, turns ``pdpe1gb`` off, so each takes
its base model's answer (later ones, such as SapphireRapids-v4, were not read and are assumed to
follow their base model likewise). qemu-server's own x86-64-v2, -v2-AES, -v3 and -v4 are qemu64 with
flags (``$builtin_models_by_arch``), none of them ``pdpe1gb``, and it runs Icelake-Client as
Icelake-Server (``$depreacated_cpu_map``); its ``check_phys_bits_above_40_compat`` warns for qemu64
and kvm64 alone for the same reason.

A name in neither list (a model newer than this table) is unknown: :func:`has_1g_pages`
answers ``None`` rather than a guess.

>>> has_1g_pages("EPYC-Rome-v2"), has_1g_pages("kvm64"), has_1g_pages("Mystery-Lake")
(True, False, None)
"""

from __future__ import annotations

import re

#: Base models whose ``builtin_x86_defs`` entry has ``CPUID_EXT2_PDPE1GB``.
WITH_1G_PAGES = frozenset(
    {
        "EPYC",
        "EPYC-Rome",
        "EPYC-Milan",
        "EPYC-Genoa",
        "EPYC-Turin",
        "Dhyana",
        "Opteron_G4",
        "Opteron_G5",
        "phenom",
        "Skylake-Server",
        "Cascadelake-Server",
        "Cooperlake",
        "Icelake-Server",
        "SapphireRapids",
        "GraniteRapids",
        "SierraForest",
        "ClearwaterForest",
        "Denverton",
        "Snowridge",
        "KnightsMill",
        "YongFeng",
    }
)
#: Base models without it, and qemu-server's qemu64-based x86-64 micro-architecture levels.
WITHOUT_1G_PAGES = frozenset(
    {
        "qemu64",
        "kvm64",
        "x86-64-v2",
        "x86-64-v2-AES",
        "x86-64-v3",
        "x86-64-v4",
        "core2duo",
        "Conroe",
        "Penryn",
        "Nehalem",
        "Westmere",
        "SandyBridge",
        "IvyBridge",
        "Haswell",
        "Broadwell",
        "Skylake-Client",
        "Opteron_G1",
        "Opteron_G2",
        "Opteron_G3",
        "qemu32",
        "kvm32",
        "coreduo",
        "n270",
        "athlon",
        "486",
        "pentium",
        "pentium2",
        "pentium3",
    }
)
#: Version aliases in ``builtin_x86_defs`` and qemu-server's renamed Icelake-Client: base model.
ALIASES = {
    "Nehalem-IBRS": "Nehalem",
    "Westmere-IBRS": "Westmere",
    "SandyBridge-IBRS": "SandyBridge",
    "IvyBridge-IBRS": "IvyBridge",
    "Haswell-noTSX": "Haswell",
    "Haswell-IBRS": "Haswell",
    "Haswell-noTSX-IBRS": "Haswell",
    "Broadwell-noTSX": "Broadwell",
    "Broadwell-IBRS": "Broadwell",
    "Broadwell-noTSX-IBRS": "Broadwell",
    "Skylake-Client-IBRS": "Skylake-Client",
    "Skylake-Client-noTSX-IBRS": "Skylake-Client",
    "Skylake-Server-IBRS": "Skylake-Server",
    "Skylake-Server-noTSX-IBRS": "Skylake-Server",
    "Cascadelake-Server-noTSX": "Cascadelake-Server",
    "Icelake-Server-noTSX": "Icelake-Server",
    "Icelake-Client": "Icelake-Server",
    "Icelake-Client-noTSX": "Icelake-Server",
    "EPYC-IBPB": "EPYC",
}
_VERSION = re.compile(r"-v\d+$")


def base_model(model: str) -> str:
    """The ``builtin_x86_defs`` entry a model name stands for.

    >>> base_model("Cascadelake-Server-v5"), base_model("Haswell-noTSX-IBRS"), base_model("EPYC")
    ('Cascadelake-Server', 'Haswell', 'EPYC')
    """
    if model in WITH_1G_PAGES or model in WITHOUT_1G_PAGES:
        return model
    model = ALIASES.get(model, model)
    return ALIASES.get(_VERSION.sub("", model), _VERSION.sub("", model))


def has_1g_pages(model: str) -> bool | None:
    """Whether QEMU's model ``model`` has 1 GiB pages; ``None`` when the table does not know it.

    >>> has_1g_pages("Icelake-Client"), has_1g_pages("Skylake-Client-v4")
    (True, False)
    """
    base = base_model(model)
    if base in WITH_1G_PAGES:
        return True
    return False if base in WITHOUT_1G_PAGES else None
