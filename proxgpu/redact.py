"""The secrets guest configs hold, and the one function that hides them from anything shown.

A Proxmox guest config can carry two kinds of secret: ``cipassword`` (cloud-init's password
hash) and, inside a VM's raw QEMU ``args:``, option values such as ``-object secret,data=...``,
``-spice password=...`` or ``-fw_cfg name=...,string=...``. :func:`redact_secrets` replaces
those values wherever they appear: in a config's text, in a diff, in a journal entry, a log
line or an error message. Every document and message proxgpu shows goes through it; what it
writes to a host never does.

>>> redact_secrets("memory: 512\\ncipassword: $5$abc\\n")
'memory: 512\\ncipassword: <redacted by proxgpu>\\n'
>>> redact_secrets("args: -object secret,id=s0,data=hunter2 -vnc :1,password=on")
'args: -object secret,id=s0,data=<redacted by proxgpu> -vnc :1,password=<redacted by proxgpu>'
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted by proxgpu>"

# A key and its separator, then the value up to the end of the line (a config line, or the one
# line of a message): cloud-init's password, wherever it is written.
_CIPASSWORD = re.compile(r"(\bcipassword\s*[:=]\s*)[^\n]*")
# A raw QEMU ``args:`` value, in which option values that name a secret are hidden.
_ARGS = re.compile(r"(\bargs\s*[:=]\s*)([^\n]*)")
# QEMU option properties that carry secrets or point at them: a secret object's data, any
# password, key or token, and fw_cfg's inline string (how a cloud-init token reaches a guest).
_SECRET_PROPERTY = re.compile(
    r"((?:^|[\s,])(?:data|string|[\w.-]*(?:password|passwd|secret|token|key)[\w.-]*)=)"
    rf"(?!{re.escape(REDACTED)})([^\s,]*)",
    re.IGNORECASE,
)


def redact_secrets(text: str) -> str:
    """``text`` with every secret value a guest config can hold replaced (see the module).

    >>> redact_secrets("vm 300: line 4: cipassword: x is not valid")
    'vm 300: line 4: cipassword: <redacted by proxgpu>'
    >>> redact_secrets("args: -cpu host,kvm=off")
    'args: -cpu host,kvm=off'
    >>> once = redact_secrets("args: -spice password=x")
    >>> redact_secrets(once) == once
    True
    """
    # Neither pattern matches without its key word, which most strings (paths, IDs, a whole
    # document's worth of them) lack: looking for the word first is much cheaper than a match.
    if "cipassword" in text:
        text = _CIPASSWORD.sub(lambda m: m.group(1) + REDACTED, text)
    if "args" in text:
        text = _ARGS.sub(lambda m: m.group(1) + _redact_args(m.group(2)), text)
    return text


def redact_document(document: Any) -> Any:
    """``document`` (JSON data: dicts, lists, strings) with :func:`redact_secrets` applied to
    every string in it, keys and values alike: for JSON a command prints, never for writing.

    >>> redact_document({"files": [{"before": "cipassword: x\\n"}], "n": 1})
    {'files': [{'before': 'cipassword: <redacted by proxgpu>\\n'}], 'n': 1}
    """
    if isinstance(document, str):
        return redact_secrets(document)
    if isinstance(document, dict):
        return {redact_document(k): redact_document(v) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [redact_document(v) for v in document]
    return document


def _redact_args(value: str) -> str:
    return _SECRET_PROPERTY.sub(lambda m: m.group(1) + REDACTED, value)
