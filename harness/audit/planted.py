"""Planted verdict flips (fixtures/mutants/planted.json), all run in one pytest session.

A plant replaces one line of a deciding function. Here it is made in the running process: the planted file is
compiled, and the function's code object is swapped on the live function object, so every caller (a module that
did `from ... import f`, a table of functions) runs the planted line; the code is put back after the plant's tests.
One session pays torch's and omnivoice's import once, where a child pytest per plant paid it 38 times.

Used as a pytest plugin: `pytest -p harness.audit.planted TESTS` with FASTPATH_PLANTS_OUT naming a JSON file. The
session runs every collected test once without a plant (the control), then each plant's named tests with it, then
every test again without a plant (a test that fails when run a second time would look like a kill), and writes
what failed in each. A test that starts a child process runs the unplanted files there: such a plant would
survive, and its control fails, naming it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANTED = ROOT / "fixtures" / "mutants" / "planted.json"
OUT_ENV = "FASTPATH_PLANTS_OUT"


def rows() -> list:
    return json.loads(PLANTED.read_text())["planted"]


def row_id(row: dict) -> str:
    return f"{row['path'].split('/')[-1][:-3]}.{row['function']}:{row['flips'].replace(' ', '-')}"


def planted_text(text: str, row: dict) -> str:
    """The file with the row's line of its function replaced (its indentation and trailing comment kept); an error
    naming the row where the function or the line is not there once."""
    tree = ast.parse(text)
    cls, _, name = row["function"].rpartition(".")
    body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None) if cls else tree.body
    node = next((n for n in body or () if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise LookupError(f"{row['path']}: no function {row['function']}; update {PLANTED.name}")
    lines = text.splitlines(keepends=True)
    at = [i for i in range(node.lineno - 1, node.end_lineno) if lines[i].split("  #")[0].strip() == row["before"]]
    if len(at) != 1:
        raise LookupError(f"{row['path']} {row['function']}: {row['before']!r} found {len(at)} times; "
                          f"update {PLANTED.name}")
    line = lines[at[0]]
    indent, rest = line[: len(line) - len(line.lstrip())], line.strip()
    lines[at[0]] = indent + row["after"] + rest[len(row["before"]):] + "\n"
    return "".join(lines)


def _code_named(code, qualname: str):
    for const in code.co_consts:
        if inspect.iscode(const):
            if const.co_qualname == qualname:
                return const
            found = _code_named(const, qualname)
            if found is not None:
                return found
    return None


def planted_code(row: dict, root: Path = ROOT):
    """(the live function, its planted code object). The module is the one this process imports, and it must be the
    file under `root`: a plant in a file the tests do not run would survive for the wrong reason."""
    path = root / row["path"]
    module = importlib.import_module(row["path"][:-3].replace("/", "."))
    if Path(module.__file__).resolve() != path.resolve():
        raise LookupError(f"{row_id(row)}: this process imports {module.__file__}, not {path}")
    cls, _, name = row["function"].rpartition(".")
    func = inspect.getattr_static(getattr(module, cls) if cls else module, name)
    func = getattr(func, "__func__", func)
    code = _code_named(compile(planted_text(path.read_text(), row), str(path), "exec"), row["function"])
    if code is None or func.__code__.co_qualname != code.co_qualname or func.__code__.co_freevars != code.co_freevars:
        raise LookupError(f"{row_id(row)}: the planted code does not fit the live function {func!r}")
    if code.co_code == func.__code__.co_code and code.co_consts == func.__code__.co_consts:
        raise LookupError(f"{row_id(row)}: the plant compiles to the same code as the original")
    return func, code


@contextmanager
def planted(row: dict):
    func, code = planted_code(row)
    original = func.__code__
    func.__code__ = code
    try:
        yield
    finally:
        func.__code__ = original


def chosen_ids(ids: list, tests: list) -> list:
    """The node ids a row names: a node id, a parametrized case of one, or every test of a file."""
    return [i for i in ids if any(i == t or i.startswith((t + "::", t + "[")) for t in tests)]


def _crash(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message.splitlines()[0][:300] if crash and crash.message else str(report.longrepr)[-300:]


def _run(items: list) -> dict:
    from _pytest.runner import runtestprotocol

    failed = []
    for i, item in enumerate(items):
        reports = runtestprotocol(item, log=False, nextitem=items[i + 1] if i + 1 < len(items) else None)
        failed += [f"{item.nodeid} ({r.when}): {_crash(r)}" for r in reports if r.failed]
    return {"ran": [item.nodeid for item in items], "failed": failed}


def _put_back(session) -> list:
    """What the tests left changed, named and put back by this checkout's shared-state guard (conftest.py)."""
    for plugin in session.config.pluginmanager.get_plugins():
        check, record = (getattr(plugin, n, None) for n in ("shared_state_problems", "shared_state_record"))
        if check and record:
            return check(session.config, record(session.config))
    raise LookupError("no shared-state guard among the plugins: run from this checkout, whose conftest.py has it")


def pytest_runtestloop(session):
    out = os.environ.get(OUT_ENV)
    if not out or session.testsfailed or session.config.option.collectonly:
        return None  # not asked to plant, or collection failed: pytest's own loop reports it
    started, plants = time.monotonic(), rows()
    found = {"control": _run(session.items)}
    for n, row in enumerate(plants, 1):
        named = chosen_ids([item.nodeid for item in session.items], row["killed_by"])
        items = [item for item in session.items if item.nodeid in named]
        try:
            with planted(row):
                found[row_id(row)] = _run(items)
        except LookupError as error:
            found[row_id(row)] = {"ran": [], "failed": [], "error": str(error)}
        # a plant in the shared-state guard's own code lets a test's leak through; put it back with the code
        # restored, so that the next plant's test is not blamed for it (that would be a kill it did not make)
        found[row_id(row)]["left"] = _put_back(session)
        left = (time.monotonic() - started) / n * (len(plants) - n)
        print(f"[planted] {n}/{len(plants)} {row_id(row)}: {len(found[row_id(row)]['failed'])} failed, "
              f"about {left:.0f} s left", file=sys.stderr, flush=True)
    found["control after"] = _run(session.items)  # a test that fails when run again would pass for a kill
    Path(out).write_text(json.dumps(found, indent=1))
    return True
