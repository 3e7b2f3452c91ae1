"""kproxy.codegen: every generated module is named, shows its lines in tracebacks, and can be dumped.

The engines that generate code (the codec's tojson and wirejson functions, the watch cache's
field-selector accessors, the validation filter's clean check) all run it through
``kproxy.codegen.generate``. A traceback from inside generated code must name the module and print
the generated line, and ``python -m kproxy.codegen --dump DIR`` must write files that are valid
Python whose line N is the traceback's line N.
"""

from __future__ import annotations

import importlib.util
import linecache
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from kproxy import codegen
from kproxy.cacher.fields import builtin_fields
from kproxy.codec import ProtobufCodec
from kproxy.filters.validation.fastcheck import compile_clean
from kproxy.filters.validation.schemanodes import GroupVersionSchemas

REPO = Path(__file__).resolve().parents[2]


def last_frame(exc: BaseException) -> traceback.FrameSummary:
    return traceback.extract_tb(exc.__traceback__)[-1]


def test_a_traceback_prints_the_generated_line() -> None:
    ns = codegen.generate("tests.codegen:divide", ["def divide(x):", "    y = 1", "    return y // x"], {})
    with pytest.raises(ZeroDivisionError) as info:
        ns["divide"](0)
    frame = last_frame(info.value)
    assert (frame.filename, frame.lineno, frame.name) == ("<generated tests.codegen:divide>", 3, "divide")
    assert frame.line == "return y // x"
    text = "".join(traceback.format_exception(info.value))
    assert 'File "<generated tests.codegen:divide>", line 3, in divide\n    return y // x\n' in text
    # linecache.checkcache() (run by traceback printing in some tools) keeps the entry.
    linecache.checkcache()
    assert linecache.getline("<generated tests.codegen:divide>", 3) == "    return y // x\n"


def test_one_name_with_other_source_keeps_both_readable() -> None:
    first = codegen.generate("tests.codegen:twice", "def f():\n    return 1 // 0\n", {})
    second = codegen.generate("tests.codegen:twice", "def f():\n    x = 0\n    return 2 // x\n", {})
    again = codegen.generate("tests.codegen:twice", "def f():\n    return 1 // 0\n", {})
    frames = []
    for ns in (first, second, again):
        with pytest.raises(ZeroDivisionError) as info:
            ns["f"]()
        frames.append(last_frame(info.value))
    assert frames[0].filename == frames[2].filename == "<generated tests.codegen:twice>"
    assert frames[1].filename.startswith("<generated tests.codegen:twice@")
    assert [f.line for f in frames] == ["return 1 // 0", "return 2 // x", "return 1 // 0"]
    names = [m.name for m in codegen.generated()]
    assert "tests.codegen:twice" in names and frames[1].filename[len("<generated ") : -1] in names


def test_codec_functions_are_named_and_show_their_lines() -> None:
    codec = ProtobufCodec()
    pod = codec.from_json({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    codec.to_json(pod)
    codec.to_obj(pod)
    modules = {m.name: m for m in codegen.generated()}
    for flavour in ("kproxy.codec.wirejson", "kproxy.codec.tojson.fragments", "kproxy.codec.tojson.obj"):
        assert f"{flavour}:k8s.io.api.core.v1.Pod" in modules
    # A upb function handed what is not a message: the frame is the generated one, its line printed.
    encoder = codec._obj.encoder("k8s.io.api.core.v1.Pod")
    with pytest.raises(AttributeError) as info:
        encoder(object())
    frame = last_frame(info.value)
    assert frame.filename.startswith("<generated kproxy.codec.tojson.obj:")
    module = modules[frame.filename[len("<generated ") : -1]]
    assert frame.lineno is not None and frame.line
    assert frame.line == module.source.splitlines()[frame.lineno - 1].strip()
    assert frame.name.startswith("enc_")


def test_field_accessors_are_named_and_show_their_lines() -> None:
    with pytest.raises(AttributeError) as info:
        builtin_fields("", "pods").from_dict(None)  # type: ignore[arg-type]
    frame = last_frame(info.value)
    assert (frame.filename, frame.name) == ("<generated kproxy.cacher.fields:pods>", "from_dict")
    assert frame.line == "s0 = o.get('metadata') or _E"


def test_the_clean_check_is_named() -> None:
    schemas: dict[str, Any] = {"t.T": {"type": "object", "properties": {"spec": {"type": "object"}}}}
    check = compile_clean(GroupVersionSchemas(False, {}, schemas).node("t.T"), "things.test.v1")
    assert check({"spec": {}}) and not check({"spec": {}, "other": 1})
    assert check.__code__.co_filename.startswith("<generated kproxy.filters.validation.fastcheck:things.test.v1")


def test_dump_writes_every_site_as_valid_python(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kproxy.codegen", "--dump", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    files = {p.name: p for p in tmp_path.iterdir()}
    assert f"{len(files)} generated modules written" in out.stdout
    for name in (
        "kproxy.codec.wirejson.k8s.io.api.core.v1.Pod.py",
        "kproxy.codec.tojson.fragments.k8s.io.api.core.v1.Pod.py",
        "kproxy.codec.tojson.obj.k8s.io.api.apps.v1.Deployment.py",
        "kproxy.cacher.fields.pods.py",
        "kproxy.cacher.fields.events.events.k8s.io.py",
        "kproxy.cacher.fields.default.py",
        "kproxy.filters.validation.fastcheck.widgets.example.com.v1.py",
    ):
        assert name in files, sorted(files)[:20]
    # Every built-in kind's codec is there (one module per kind and flavour, at least the kinds').
    assert sum(n.startswith("kproxy.codec.wirejson.") for n in files) > 300
    for path in files.values():
        compile(path.read_text(), str(path), "exec")
    # The files import as modules (a coverage tool or a reader's editor loads them so).
    for name in ("kproxy.cacher.fields.pods.py", "kproxy.codec.wirejson.k8s.io.api.core.v1.Pod.py"):
        spec = importlib.util.spec_from_file_location(name[:-3].replace(".", "_"), files[name])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    pods = files["kproxy.cacher.fields.pods.py"].read_text().splitlines()
    assert pods[0] == "def from_dict(o):"
    assert pods[-1] == "# Generated by kproxy.codegen; tracebacks name it <generated kproxy.cacher.fields:pods>"


def test_with_a_directory_the_modules_are_real_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # KPROXY_GENERATED_DIR: what coverage tools and debuggers need, the code compiled from a file.
    monkeypatch.setenv(codegen.DIRECTORY_ENV, str(tmp_path))
    ns = codegen.generate("tests.codegen:on-disk", ["def f(x):", "    return 1 // x"], {})
    with pytest.raises(ZeroDivisionError) as info:
        ns["f"](0)
    frame = last_frame(info.value)
    path = Path(frame.filename)
    assert path.parent == tmp_path.resolve() and path.name.startswith("tests.codegen.on-disk@")
    assert path.read_text() == "def f(x):\n    return 1 // x\n"
    assert (frame.lineno, frame.line) == (2, "return 1 // x")
