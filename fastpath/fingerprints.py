"""Source fingerprints of the upstream OmniVoice code that the patches rely on.

A fingerprint is the sha256 of a function's AST with its docstring removed, so formatting and comments do not
count but any change to what the code does does. `fingerprints.json` (beside this file) records, per upstream
name, the fingerprints seen in each omnivoice version known to work with the patches. A patch refuses to apply
when an upstream function it relies on has a fingerprint no known version had.

    python -m fastpath fingerprints            # show the installed version's fingerprints vs the known ones
    python -m fastpath fingerprints --record   # add the installed version to fingerprints.json (after review!)
    python -m fastpath fingerprints --source path/to/omnivoice/models/omnivoice.py --version 0.2.0 [--record]
                                               # the same for a source file that is not installed
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import textwrap
from importlib import metadata
from pathlib import Path

KNOWN_FILE = Path(__file__).with_name("fingerprints.json")
UPSTREAM_MODULE = "omnivoice.models.omnivoice"
ENV_ALLOW = "FASTPATH_ALLOW_UNVERIFIED_UPSTREAM"  # "1": apply whatever the upstream source (a blanket override)
# JSON {"version": V, "functions": {name: fingerprint}}: exactly these fingerprints are accepted, as "under review",
# besides the known ones. The version-bump gate runs the parity tier with the candidate's own (review_value), and
# the suite turns a user's ENV_ALLOW into the installed omnivoice's (conftest.py), so that a test which makes a
# fingerprint unknown still sees the refusal it asserts.
ENV_REVIEWED = "FASTPATH_REVIEWED_UPSTREAM"
UNDER_REVIEW = "(under review)"


class UpstreamMismatchError(RuntimeError):
    """An upstream function no longer matches what a patch was written against."""


def omnivoice_version() -> str:
    try:
        return metadata.version("omnivoice")
    except metadata.PackageNotFoundError:
        return "unknown"


def resolve(name: str):
    """'OmniVoice._generate_iterative' or '_gumbel_sample' -> the object in omnivoice.models.omnivoice."""
    import importlib

    obj = importlib.import_module(UPSTREAM_MODULE)
    for part in name.split("."):
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return obj


def fingerprint_source(source: str) -> str:
    """sha256 of the normalised AST of one function's source (docstring dropped)."""
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(canonical(tree).encode()).hexdigest()[:16]


def canonical(node) -> str:
    """The AST as text, the same on every Python that parses it the same way: node types and their fields, with
    positions left out and empty fields (None, []) omitted, since new Pythons add fields with empty defaults
    (3.12's `type_params` on every def and class changed `ast.dump` and with it every fingerprint)."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if value is None or value == []:
                continue
            fields.append(f"{name}={canonical(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(canonical(item) for item in node) + "]"
    return repr(node)


@functools.lru_cache(maxsize=None)
def fingerprint(name: str) -> str:
    """The installed source's fingerprint of `name`, computed once per process (9 ms each; every apply checks
    six or more): the installed omnivoice does not change under a running process."""
    return fingerprint_source(inspect.getsource(resolve(name)))


def definition_source(module_source: str, name: str) -> str:
    """The source of `name` ('Class.method', 'function' or 'Class') in a module's source text, without importing it.

    Decorators included and lines kept whole, as `inspect.getsource` returns them, so `fingerprint_source` of the
    result equals `fingerprint(name)` for the installed module. Raises KeyError when the module has no such name.
    """
    tree = ast.parse(module_source)
    scope, node = tree.body, None
    for part in name.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise KeyError(f"{name}: no definition of {part!r} in this source")
        scope = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "".join(module_source.splitlines(keepends=True)[first - 1 : node.end_lineno])


def definitions(module_source: str) -> dict:
    """{qualified name: fingerprint} of every function and method (nested ones too) in a module's source text,
    plus 'Class.<body>' for what a class defines besides its methods (dataclass fields and their defaults) and
    '<module>' for the module's own statements (constants)."""
    tree = ast.parse(module_source)
    lines = module_source.splitlines(keepends=True)
    out = {}

    def visit(nodes, prefix):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + node.name
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                out[name] = fingerprint_source("".join(lines[first - 1 : node.end_lineno]))
                visit(node.body, name + ".<locals>.")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
                out[prefix + node.name + ".<body>"] = _without_defs(node)  # fields, defaults, constants

    visit(tree.body, "")
    out["<module>"] = _without_defs(tree)  # module constants and imports
    return out


def _without_defs(node) -> str:
    """Fingerprint of a class or module without its functions and classes: what else it defines."""
    import copy

    node = copy.deepcopy(node)
    node.body = [n for n in node.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    if node.body and isinstance(node.body[0], ast.Expr) and isinstance(getattr(node.body[0], "value", None),
                                                                       ast.Constant):
        node.body = node.body[1:]  # the docstring
    return hashlib.sha256(canonical(node).encode()).hexdigest()[:16]


def package_fingerprints(folder) -> dict:
    """{'path/in/package.py:qualified.name': fingerprint} of every function of a package folder's .py files."""
    folder = Path(folder)
    out = {}
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(folder).as_posix()
        try:
            found = definitions(path.read_text(encoding="utf-8"))
        except SyntaxError as err:
            out[f"{rel}:<module>"] = f"syntax error: {err}"
            continue
        out.update({f"{rel}:{name}": fp for name, fp in found.items()})
    return out


def fingerprints_in(module_source: str, names) -> dict:
    """{name: fingerprint, or None where the source does not define it} for a module's source text."""
    out = {}
    for name in names:
        try:
            out[name] = fingerprint_source(definition_source(module_source, name))
        except KeyError:
            out[name] = None
    return out


def load_known() -> dict:
    """{upstream name: {fingerprint: [omnivoice versions]}}: fingerprints.json, plus the fingerprints under review
    in this process (ENV_REVIEWED) as ["<version> (under review)"] where fingerprints.json does not know them."""
    known = json.loads(KNOWN_FILE.read_text())["functions"]
    version, functions = reviewed()
    for name, fp in functions.items():
        if fp is not None and fp not in known.get(name, {}):
            known.setdefault(name, {})[fp] = [f"{version} {UNDER_REVIEW}"]
    return known


def review_value(found: dict, version: str) -> str:
    """The ENV_REVIEWED value that accepts `found` ({name: fingerprint or None}) of omnivoice `version`."""
    return json.dumps({"version": version, "functions": {n: fp for n, fp in sorted(found.items()) if fp}})


def review_installed(names) -> str:
    """The ENV_REVIEWED value that accepts the installed omnivoice's own fingerprints of `names` (a name it does
    not define is left out, so it is still refused)."""
    found = {}
    for name in names:
        try:
            found[name] = fingerprint(name)
        except (AttributeError, TypeError, OSError):
            found[name] = None
    return review_value(found, omnivoice_version())


def reviewed() -> tuple:
    """(version, {name: fingerprint}) under review in this process (ENV_REVIEWED); (None, {}) when unset."""
    text = os.environ.get(ENV_REVIEWED, "").strip()
    if not text:
        return None, {}
    try:
        data = json.loads(text)
        version, functions = str(data["version"]), dict(data["functions"])
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in functions.items()):
            raise TypeError("names and fingerprints must be strings")
    except (ValueError, KeyError, TypeError) as err:
        raise UpstreamMismatchError(
            f"{ENV_REVIEWED} is not a review of upstream fingerprints ({err}): expected JSON "
            f'{{"version": "X.Y.Z", "functions": {{"Name": "fingerprint"}}}} as fastpath.fingerprints.review_value '
            f"writes it; unset it to use fingerprints.json alone") from None
    return version, functions


def check(names, patch: str, allow: bool = False) -> list[str]:
    """Raise UpstreamMismatchError unless every name has a known fingerprint (or one under review); return
    warnings: the unknown ones when allowed, and those under review."""
    known = load_known()
    installed = omnivoice_version()
    problems, notes = [], []
    for name in names:
        try:
            fp = fingerprint(name)
        except (AttributeError, TypeError, OSError) as err:
            problems.append(f"{name}: not found in the installed omnivoice {installed} ({err})")
            continue
        versions_by_fp = known.get(name)
        if versions_by_fp is None:
            problems.append(f"{name}: no fingerprint recorded; run `python -m fastpath fingerprints --record`")
        elif fp in versions_by_fp and all(v.endswith(UNDER_REVIEW) for v in versions_by_fp[fp]):
            notes.append(f"{name}: fingerprint {fp} of omnivoice {installed} is under review ({ENV_REVIEWED}), "
                         f"not recorded as known to work")
        elif fp not in versions_by_fp:
            known_versions = sorted({v for vs in versions_by_fp.values() for v in vs})
            problems.append(
                f"{name}: source fingerprint {fp} in the installed omnivoice {installed} matches none of the "
                f"versions this patch was written against ({', '.join(known_versions)})"
            )
    if problems and not allow:
        raise UpstreamMismatchError(
            f"patch {patch!r} refuses to apply:\n  " + "\n  ".join(problems) + "\n"
            f"Fix: install a known omnivoice version, or review the upstream change and record it with "
            f"`python -m fastpath fingerprints --record`; to apply anyway (unverified), pass "
            f"allow_unverified=True or set {ENV_ALLOW}=1."
        )
    return problems + notes


def record(names, found: dict | None = None, version: str | None = None) -> dict:
    """Add `version` (default: the installed one) under each name's fingerprint (default: the installed source's)."""
    data = json.loads(KNOWN_FILE.read_text())
    version = version or omnivoice_version()
    for name in sorted(set(names)):
        fp = found[name] if found is not None else fingerprint(name)
        if fp is None:
            raise UpstreamMismatchError(f"{name} is not defined in omnivoice {version}; nothing to record")
        versions = data["functions"].setdefault(name, {}).setdefault(fp, [])
        if version not in versions:
            versions.append(version)
            versions.sort()
    KNOWN_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data
