"""fastpath.fingerprints beyond the patches' own check: the fingerprints of every definition of a module and of a
package folder (what the version gate compares between two omnivoice versions), `record` (what
`python -m fastpath fingerprints --record` writes into fingerprints.json) and `review_installed` (the review the
suite and the gate accept the installed omnivoice's fingerprints by)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from fastpath import fingerprints
from fastpath.fingerprints import definitions, fingerprint_source, package_fingerprints

SOURCE = Path(importlib.util.find_spec("omnivoice").origin).parent / "models" / "omnivoice.py"

MODULE = '''"""A module."""
import os
LIMIT = 3


def plain(x):
    return x + 1
@decorator
@other(1)
def decorated(y):
    def inner(z):
        return z
    return inner
AFTER = 1


class Config:
    """Fields."""
    steps: int = 32

    @staticmethod
    def method():
        class Local:
            size = 2
        return Local

    class Inner:
        def deep(self):
            return os.sep
'''


def between(text: str, start: str, end: str | None) -> str:
    """The lines of `text` from the one `start` begins to the one before `end` (to the end when None)."""
    first = text.index(start)
    first = text.rindex("\n", 0, first) + 1
    last = len(text) if end is None else text.rindex("\n", 0, text.index(end)) + 1
    return text[first:last]


def test_definitions_names_every_function_nested_one_and_class_body_and_the_module():
    assert set(definitions(MODULE)) == {
        "plain", "decorated", "decorated.<locals>.inner", "Config.method", "Config.method.<locals>.Local.<body>",
        "Config.Inner.deep", "Config.Inner.<body>", "Config.<body>", "<module>"}
    assert all(len(fp) == 16 and int(fp, 16) >= 0 for fp in definitions(MODULE).values())


@pytest.mark.parametrize("name, start, end", [
    ("plain", "def plain", "@decorator"),
    ("decorated", "@decorator", "AFTER = 1"),  # from its first decorator's line, as inspect.getsource gives it
    ("decorated.<locals>.inner", "def inner", "return inner"),
    ("Config.method", "@staticmethod", "    class Inner"),
    ("Config.Inner.deep", "def deep", None),
])
def test_a_functions_fingerprint_is_that_of_its_own_lines_decorators_included(name, start, end):
    assert definitions(MODULE)[name] == fingerprint_source(between(MODULE, start, end))


def test_the_decorators_count():
    undecorated = MODULE.replace("@decorator\n@other(1)\n", "")
    assert definitions(undecorated)["decorated"] != definitions(MODULE)["decorated"]
    assert definitions(MODULE.replace("@other(1)", "@other(2)"))["decorated"] != definitions(MODULE)["decorated"]


def changed(old: str, new: str) -> list:
    """The names whose fingerprint differs between MODULE and MODULE with `old` replaced by `new`."""
    text = MODULE.replace(old, new)
    assert text != MODULE
    a, b = definitions(MODULE), definitions(text)
    assert set(a) == set(b)
    return sorted(k for k in a if a[k] != b[k])


@pytest.mark.parametrize("old, new, names", [
    ("LIMIT = 3", "LIMIT = 4", ["<module>"]),  # a constant is the module's
    ("import os", "import sys", ["<module>"]),
    ('"""A module."""', '"""Another docstring."""', []),  # a docstring is not
    ("steps: int = 32", "steps: int = 16", ["Config.<body>"]),  # a field's default is the class body's
    ('"""Fields."""', '"""Other fields."""', []),
    ("size = 2", "size = 3", ["Config.method", "Config.method.<locals>.Local.<body>"]),
    ("return x + 1", "return x + 2", ["plain"]),  # a function's change is its own, not the module's or class's
    ("return os.sep", "return os.pathsep", ["Config.Inner.deep"]),
    ("return z", "return -z", ["decorated", "decorated.<locals>.inner"]),
])
def test_each_change_is_seen_by_the_definition_that_holds_it(old, new, names):
    assert changed(old, new) == names


def test_a_module_or_class_without_a_docstring_keeps_its_first_statement():
    a = "X = 1\nclass C:\n    y = 1\n    def f(self):\n        pass\n"
    b = a.replace("X = 1", "X = 2").replace("y = 1", "y = 2")
    assert definitions(a)["<module>"] != definitions(b)["<module>"]
    assert definitions(a)["C.<body>"] != definitions(b)["C.<body>"]
    only_methods = "class C:\n    def f(self):\n        pass\n"
    assert definitions(only_methods)["C.<body>"] == definitions("class C:\n    '''doc'''\n    def g(self):\n"
                                                                "        return 1\n")["C.<body>"]


def test_package_fingerprints_keys_each_files_definitions_by_its_path_and_skips_pycache(tmp_path):
    package = tmp_path / "pkg"
    files = {"__init__.py": "def top():\n    return 1\n", "sub/mod.py": MODULE,
             "broken.py": "def broken(:\n    pass\n", "__pycache__/stale.py": "def stale():\n    pass\n",
             "sub/__pycache__/old.py": "OLD = 1\n", "notes.txt": "def not_python(): pass\n"}
    for rel, text in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    (tmp_path / "outside.py").write_text("def outside():\n    pass\n")
    with pytest.raises(SyntaxError) as syntax:
        ast.parse(files["broken.py"])
    expected = {"broken.py:<module>": f"syntax error: {syntax.value}"}
    for rel in ("__init__.py", "sub/mod.py"):
        expected.update({f"{rel}:{name}": fp for name, fp in definitions(files[rel]).items()})
    assert package_fingerprints(str(package)) == expected
    assert "sub/mod.py:Config.Inner.deep" in expected and "__init__.py:top" in expected


@pytest.fixture
def known_file(tmp_path, monkeypatch):
    """fingerprints.json replaced by a small one in tmp_path, for `record` to write."""
    path = tmp_path / "fingerprints.json"
    path.write_text(json.dumps({"_about": "kept", "functions": {"A": {"aaaa": ["0.2.0"]}}}, indent=1) + "\n")
    monkeypatch.setattr(fingerprints, "KNOWN_FILE", path)
    return path


def test_record_adds_the_version_under_each_names_fingerprint_sorted_and_once(known_file):
    data = fingerprints.record(["B", "A", "B"], {"A": "aaaa", "B": "bbbb", "C": None}, "0.1.5")
    expected = {"_about": "kept", "functions": {"A": {"aaaa": ["0.1.5", "0.2.0"]}, "B": {"bbbb": ["0.1.5"]}}}
    assert data == expected and json.loads(known_file.read_text()) == expected
    fingerprints.record(["A"], {"A": "aaaa"}, "0.1.5")  # again: no second entry
    fingerprints.record(["A"], {"A": "a2"}, "0.3.0")  # a new fingerprint of a name beside the old one
    assert json.loads(known_file.read_text())["functions"]["A"] == {"aaaa": ["0.1.5", "0.2.0"], "a2": ["0.3.0"]}


def test_record_writes_the_format_of_fingerprints_json_and_of_the_release_command(known_file):
    """The file as the repository keeps it (one-space indent, sorted keys, a final newline): a record is a diff of
    the lines it adds, and the same text as the release command's own record of a version (harness.release)."""
    from harness.release import with_fingerprints

    before = known_file.read_text()
    found = {"B": "bbbb", "A": "aaaa"}
    fingerprints.record(list(found), found, "0.1.5")
    assert known_file.read_text() == with_fingerprints(before, found, "0.1.5")
    text = Path(fingerprints.__file__).with_name("fingerprints.json").read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"


def test_record_defaults_to_the_installed_version_and_source(known_file):
    name = "OmniVoice.forward"
    data = fingerprints.record([name])
    installed = fingerprints.fingerprints_in(SOURCE.read_text(encoding="utf-8"), [name])[name]
    assert data["functions"][name] == {installed: [fingerprints.omnivoice_version()]}


def test_record_refuses_a_name_the_version_does_not_define_and_writes_nothing(known_file):
    before = known_file.read_text()
    with pytest.raises(fingerprints.UpstreamMismatchError) as refused:
        fingerprints.record(["A", "Gone"], {"A": "a2", "Gone": None}, "9.9.9")
    assert str(refused.value) == "Gone is not defined in omnivoice 9.9.9; nothing to record"
    assert known_file.read_text() == before


def test_review_installed_accepts_the_installed_fingerprints_and_leaves_out_what_it_does_not_define():
    """A name the installed module lacks (AttributeError) or whose object has no source of its own (a set:
    TypeError) is left out of the review, so a patch relying on it is still refused."""
    names = ["OmniVoice.forward", "NoSuchFunction", "LANG_IDS", "_gumbel_sample"]
    review = json.loads(fingerprints.review_installed(names))
    from_source = fingerprints.fingerprints_in(SOURCE.read_text(encoding="utf-8"), names)
    assert review == {"version": fingerprints.omnivoice_version(),
                      "functions": {n: from_source[n] for n in ("OmniVoice.forward", "_gumbel_sample")}}


def test_review_installed_leaves_out_a_source_it_cannot_read(monkeypatch):
    errors = {"no-source": OSError("could not get source code"), "builtin": TypeError("built-in"),
              "absent": AttributeError("absent")}

    def fake(name):
        if name in errors:
            raise errors[name]
        return f"fp-{name}"

    monkeypatch.setattr(fingerprints, "fingerprint", fake)
    value = fingerprints.review_installed(["kept", *errors])
    assert json.loads(value)["functions"] == {"kept": "fp-kept"}
    monkeypatch.setenv(fingerprints.ENV_REVIEWED, value)
    assert fingerprints.reviewed() == (fingerprints.omnivoice_version(), {"kept": "fp-kept"})
    errors["kept"] = ValueError("a bug, not a missing name")
    with pytest.raises(ValueError, match="a bug"):
        fingerprints.review_installed(["kept"])
