"""Go's ``json.Indent`` (``encoding/json/indent.go`` ``appendIndent``) over JSON bytes.

``json.MarshalIndent`` is ``Marshal`` then this, so the pretty form of a document kproxy already
holds as Go's compact bytes is made from those bytes, strings copied as they are. That matters
where a round trip through Python objects would lose what the bytes say: ``\\ufffd`` escapes Go
wrote for bytes that were not UTF-8 (a real U+FFFD is written raw), and map keys Go printed twice.
"""

from __future__ import annotations

import re

# A string (copied as is), one punctuation byte, a run of number/literal bytes, or white space.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\],:]|[^{}\[\],:"\s]+|\s+', re.DOTALL)


def indent(src: bytes, prefix: bytes = b"", indent: bytes = b"  ") -> bytes:
    """``src`` (valid JSON) indented as Go's json.Indent does: empty objects and arrays stay
    ``{}`` and ``[]``, ``": "`` after keys, white space outside strings dropped."""
    out: list[bytes] = []
    depth = 0
    need_indent = False
    for m in _TOKEN.finditer(src):
        t = m.group()
        c = t[0]
        if c in b" \t\r\n":
            continue
        if need_indent and c != 0x7D and c != 0x5D:  # } ]
            need_indent = False
            depth += 1
            out.append(b"\n" + prefix + indent * depth)
        if c == 0x7B or c == 0x5B:  # { [: the indent waits, so that empty ones stay {} and []
            need_indent = True
            out.append(t)
        elif c == 0x2C:  # ,
            out.append(b",\n" + prefix + indent * depth)
        elif c == 0x3A:  # :
            out.append(b": ")
        elif c == 0x7D or c == 0x5D:
            if need_indent:
                need_indent = False
            else:
                depth -= 1
                out.append(b"\n" + prefix + indent * depth)
            out.append(t)
        else:
            out.append(t)
    return b"".join(out)


__all__ = ["indent"]
