"""The one place kproxy turns generated Python source into functions.

Four engines generate code at run time, because a function with the schema baked in is several
times faster than a generic walk over it: the protobuf -> JSON functions of ``kproxy.codec.tojson``
(read through upb) and ``kproxy.codec.wirejson`` (read from the wire bytes), the field-selector
accessors of ``kproxy.cacher.fields`` and the validation filter's clean check
(``kproxy.filters.validation.fastcheck``). They all go through :func:`generate`, which:

* compiles the source under a filename naming what it is (``<generated kproxy.codec.wirejson:
  k8s.io.api.core.v1.Pod>``), so a traceback says which generated module a frame is in;
* registers the source with :mod:`linecache`, so that traceback (and pdb) prints the generated
  line itself, not only its number;
* keeps a registry of everything generated in the process, which :func:`dump` writes out as
  ``.py`` files (``python -m kproxy.codegen --dump DIR`` does it for a typical configuration),
  to read, grep, and import for coverage.

The generated functions are the same code objects as a bare ``exec`` would make: nothing here
runs on their hot path. A module is named by the generator (stable across processes for the same
configuration); when one name comes with different source (another schema, another memo size),
the second gets the digest of its source appended (``name@1a2b3c4d``) so both stay readable.

With ``KPROXY_GENERATED_DIR`` set in the environment, each module is also written to that
directory as it is generated (``NAME@<digest>.py``) and compiled under that file's path, so that a
coverage tool or a debugger running kproxy (or its tests) sees real files.

This module imports nothing else of kproxy (every engine may use it); ``__main__`` is the dump
command, which imports the engines to drive them.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

__all__ = ["Generated", "dump", "generate", "generated"]

# Bounds: a long-running process whose custom resources' schemas change keeps generating checks.
_MAX_MODULES = 4096
_MAX_CODE = 64
DIRECTORY_ENV = "KPROXY_GENERATED_DIR"


@dataclass(frozen=True, slots=True)
class Generated:
    """One generated module: its name, the filename tracebacks show, and its lines (the list
    linecache holds too: the source is kept once)."""

    name: str
    filename: str
    digest: bytes
    lines: list[str]

    @property
    def source(self) -> str:
        return "".join(self.lines)


_registry: dict[str, Generated] = {}
_lock = threading.Lock()  # generation may happen in the threads that body work is offloaded to
# compile() remembered by (filename, source digest): every codec instance (one per process, one per
# test in the unit tests) generates the same source for the same first use, and compiling the
# functions of a kind and everything it refers to takes a large part of a second.
_code: dict[tuple[str, bytes], CodeType] = {}


def _filename(name: str, digest: bytes, text: str) -> str:
    directory = os.environ.get(DIRECTORY_ENV)
    if not directory:
        return f"<generated {name}>"
    # The digest in the file's name: processes sharing the directory (test workers) may give one
    # name different source, and a file is never rewritten with other content.
    path = Path(directory).resolve() / file_name(name if "@" in name else f"{name}@{digest[:4].hex()}")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(path)
    return str(path)


def _register(name: str, text: str) -> Generated:
    digest = hashlib.blake2b(text.encode(), digest_size=20).digest()
    found = _registry.get(name)
    if found is not None and found.digest != digest:
        name = f"{name}@{digest[:4].hex()}"
        found = _registry.get(name)
    if found is None:
        if len(_registry) >= _MAX_MODULES:
            oldest = next(iter(_registry.values()))
            del _registry[oldest.name]
            linecache.cache.pop(oldest.filename, None)
        lines = text.splitlines(keepends=True)
        found = _registry[name] = Generated(name, _filename(name, digest, text), digest, lines)
    # Registered again at each use (something may have called linecache.clearcache()); a None
    # mtime makes linecache.checkcache() keep the entry (there is no file to compare it with).
    linecache.cache[found.filename] = (len(text), None, found.lines, found.filename)
    return found


def generate(name: str, source: str | Iterable[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Run generated ``source`` (a string, or its lines) in ``namespace`` and return the namespace.

    ``name`` says what the module is, dotted, starting with the generating module's name
    (``kproxy.codec.tojson.fragments:k8s.io.api.core.v1.Pod``): tracebacks show it in the frame's
    filename, and :func:`dump` names the file after it.
    """
    text = source if isinstance(source, str) else "\n".join(source)
    if not text.endswith("\n"):
        text += "\n"
    with _lock:
        module = _register(name, text)
    key = (module.filename, module.digest)
    code = _code.get(key)
    if code is None:
        if len(_code) >= _MAX_CODE:
            _code.clear()
        code = _code[key] = compile(text, module.filename, "exec")
    exec(code, namespace)
    return namespace


def generated() -> list[Generated]:
    """Every module generated in this process so far (oldest first)."""
    with _lock:
        return list(_registry.values())


_UNSAFE = re.compile(r"[^A-Za-z0-9_.@+-]+")


def file_name(name: str) -> str:
    """The file :func:`dump` writes a module to: its name (``:``, ``/``... as ``.``) and ``.py``."""
    return _UNSAFE.sub(".", name) + ".py"


def dump(directory: Path) -> list[Path]:
    """Write every module generated so far to ``directory``, one ``.py`` file each.

    Line N of a file is line N of the traceback's ``<generated ...>`` frame (the note naming it is
    the file's last line). The files import as modules (the names they use are bound where the
    engine runs them, so calling a function from an imported file fails; defining it does not).
    """
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for module in generated():
        path = directory / file_name(module.name)
        path.write_text(f"{module.source}# Generated by kproxy.codegen; tracebacks name it {module.filename}\n")
        written.append(path)
    return written
