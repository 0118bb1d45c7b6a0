"""Instance patching: put a value in one object's own `__dict__`, and later put back exactly what was there.

Every patch touches the model instance (or one of its submodules), never a class. `install(obj, name, value)`
shadows the class attribute, or replaces a value the instance had of its own, and remembers what was there;
`restore(obj, name)` puts that back (deleting the key where there was none). Installing a name again keeps the
first remembered value, so one restore after any number of installs returns to the state before the first.
What is remembered lives here, keyed weakly by the object, so nothing is left on the instance either.
`overridden` does both around a block, nesting correctly (instrumentation: recording, counting, slowing).
`install_wrapper` / `remove_wrapper` do it for a wrapper object kept on the model too (the GPU patches).
`copy_saved(memo)` gives the objects a `copy.deepcopy` made what their originals remember, so a deep copy of a
patched model reverts to stock as the original does (fastpath.registry installs the model's `__deepcopy__`).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from typing import Callable

WARNINGS_ATTR = "_fastpath_warnings"  # on the model: what an applied patch could not do here, and why


class _Absent:
    """The instance had no value of its own under that name; one object, also in deep copies."""

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return "<absent>"


_ABSENT = _Absent()
_saved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # obj -> {name: its own value before install}


def install(obj, name: str, value) -> None:
    """Set `obj.<name>` to `value` on the instance, remembering what the instance had (the first time)."""
    saved = _saved.setdefault(obj, {})
    saved.setdefault(name, obj.__dict__.get(name, _ABSENT))
    obj.__dict__[name] = value


def installed(obj, name: str) -> bool:
    """Whether `install` put something under `name` that `restore` has not put back yet."""
    return name in _saved.get(obj, {})


def restore(obj, name: str, only_if=_ABSENT) -> None:
    """Put back what `obj.<name>` was on the instance before the first `install`. With `only_if`, only while that
    object is still what the instance holds (someone installed over it since: theirs is left in place)."""
    saved = _saved.get(obj, {})
    if name not in saved or (only_if is not _ABSENT and obj.__dict__.get(name) is not only_if):
        return
    previous = saved.pop(name)
    if previous is _ABSENT:
        obj.__dict__.pop(name, None)
    else:
        obj.__dict__[name] = previous
    if not saved:
        _saved.pop(obj, None)


def copy_saved(memo: dict) -> None:
    """After `copy.deepcopy(x, memo)`: every object it copied that has something remembered here gets a deep copy
    of it (same memo: a remembered bound method binds to the copy), so `restore` on the copy puts back its own."""
    for obj, saved in list(_saved.items()):
        twin = memo.get(id(obj))
        if twin is not None and twin is not obj and twin not in _saved:
            _saved[twin] = copy.deepcopy(saved, memo)


def install_wrapper(model, attr: str, module, name: str, make):
    """Put `make()` in place of `module.<name>` on the instance and keep it as `model.<attr>`.
    Once installed, the installed wrapper is returned again."""
    if attr in model.__dict__:
        return model.__dict__[attr]
    wrapper = make()
    install(module, name, wrapper)
    install(model, attr, wrapper)
    return wrapper


def remove_wrapper(model, attr: str, name: str, module_of):
    """Undo `install_wrapper`: forget `model.<attr>` and put back what `<module_of(wrapper)>.<name>` was, if the
    wrapper is still in place. Returns the removed wrapper, or None when none was installed."""
    wrapper = model.__dict__.get(attr)
    if wrapper is not None:
        restore(model, attr)
        restore(module_of(wrapper), name, only_if=wrapper)
    return wrapper


@contextlib.contextmanager
def overridden(obj, name: str, wrap: Callable):
    """Within the block `obj.<name>` is `wrap(current)`, current being what the instance sees now (stock or
    patched); afterwards the instance dict is exactly as before, also when blocks nest."""
    own = obj.__dict__.get(name, _ABSENT)
    obj.__dict__[name] = wrap(getattr(obj, name))
    try:
        yield
    finally:
        if own is _ABSENT:
            obj.__dict__.pop(name, None)
        else:
            obj.__dict__[name] = own
