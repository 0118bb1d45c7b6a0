"""What a patch must never change, recorded before any test applies one and checked after every test.

A patch touches one model instance. What another model in the same process shares must stay as it was: the
classes a model reaches (OmniVoice, the LLM's layers, the codec's; every base class in omnivoice, transformers or
torch.nn), the globals of the omnivoice and transformers modules those classes are defined in (an upstream function
a patch could swap module-wide), and torch's process-wide settings (threads, TF32, cuDNN, determinism, matmul
precision, default dtype, attention kernels).

`take(model)` records all of it as the objects themselves (compared by identity, so a rebinding to an equal copy
is seen). `changed(record)` names every attribute rebound or removed since, and every one added that is not a
submodule; `foreign(record)` names every object defined in `fastpath` that sits in an upstream namespace, whatever
the record says (a leak that happened before the record was taken is found too); `restore(record)` puts back what
changed, so that one leak fails one test, not every test after it.

torch.compile's own doing is not a leak, and is told apart by torch's records, never by a name's look: the globals
dynamo installs in the module whose function it compiles (its compile cache: `__compiled_fn_*`, `__builtins_dict___N`,
`_<id>_c0`, ...), which dynamo lists as it installs them; and its once-per-process wrappers of a shared class's
attribute, defined in torch/_dynamo/mutation_guard.py around the very value they replace. Where this torch keeps no
such list, each added or removed module global says that it could not be told apart.

conftest.py takes the record once per session, before the first test that runs with omnivoice imported, and
checks it after every test; tests_patches/test_registry.py's instance-only test compares with the same record.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import fastpath

UPSTREAM = ("omnivoice", "transformers")  # packages whose module globals are recorded
CLASS_PACKAGES = ("omnivoice", "transformers", "torch")  # packages whose classes in a model's reach are recorded
FASTPATH_DIR = str(Path(fastpath.__file__).resolve().parent)
# Caches upstream keeps on a class or module by itself, the same for every instance: not a patch's doing, and
# harmless to a second model. (name: why)
CACHES = {
    "_can_set_attn_implementation_cached_value": "transformers caches whether a class may set its attention "
                                                 "implementation",
    "___needs_generation_tag_patch": "torch._dynamo's flag that it has wrapped torch.nn.Module.__init__ and "
                                     "__setstate__ (once per process, on the first compile)",
    "___needs_mutation_patch": "torch._dynamo's flag that it has wrapped this class's __setattr__ (mutation_guard."
                               "ensure_patched, once per class)",
}
# dynamo's record of the globals torch.compile installs, {(id(scope dict), name): token}, kept to remove each when its
# compiled code is freed (torch/_dynamo/utils.py, CleanupHook.create): a name it lists is the compile cache, which the
# compiled code reads on every cache hit (deleting it makes the next hit raise NameError)
DYNAMO_RECORD = ("torch._dynamo.utils", "_cleanup_owners")
# where dynamo defines the wrappers it puts on a shared class once per process, each around the value it replaces:
# install_generation_tagging_init (torch.nn.Module.__init__, __setstate__: closures over the originals) and
# ensure_patched (a class's __setattr__: a functools.wraps wrapper)
DYNAMO_WRAPPERS = "torch._dynamo.mutation_guard"


def dynamo_globals() -> set | None:
    """{(id(namespace dict), name)} of the globals torch.compile has installed and not yet removed (DYNAMO_RECORD):
    empty where dynamo was never imported (nothing compiled); None where this torch keeps no such record."""
    if "torch._dynamo" not in sys.modules:
        return set()
    module, attr = DYNAMO_RECORD
    try:
        owners = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None
    return set(owners.copy()) if isinstance(owners, dict) else None


def dynamo_wrapper(value, wrapped) -> bool:
    """Whether `value` is one of dynamo's once-per-process wrappers (DYNAMO_WRAPPERS) of `wrapped`: its code is in
    that module's file and its __wrapped__ or one of its closure cells is `wrapped` itself."""
    module = sys.modules.get(DYNAMO_WRAPPERS)
    code = getattr(value, "__code__", None)
    if wrapped is _MISSING or module is None or not isinstance(code, types.CodeType) \
            or os.path.realpath(code.co_filename) != os.path.realpath(module.__file__):
        return False
    if getattr(value, "__wrapped__", _MISSING) is wrapped:
        return True
    for cell in getattr(value, "__closure__", None) or ():
        try:
            if cell.cell_contents is wrapped:
                return True
        except ValueError:  # an empty cell
            continue
    return False


def torch_settings() -> dict:
    """name -> (read, write) of torch's process-wide settings a patch or a test could change."""
    import torch

    def attr(obj, name):
        return (lambda: getattr(obj, name)), (lambda value: setattr(obj, name, value))

    flags = {
        "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
        "torch.are_deterministic_algorithms_enabled()": (
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
        "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision,
                                                 torch.set_float32_matmul_precision),
        "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
        "torch.is_grad_enabled()": (torch.is_grad_enabled, torch.set_grad_enabled),
        "torch.backends.cuda.matmul.allow_tf32": attr(torch.backends.cuda.matmul, "allow_tf32"),
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": attr(
            torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": attr(
            torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
        "torch.backends.cudnn.allow_tf32": attr(torch.backends.cudnn, "allow_tf32"),
        "torch.backends.cudnn.benchmark": attr(torch.backends.cudnn, "benchmark"),
        "torch.backends.cudnn.deterministic": attr(torch.backends.cudnn, "deterministic"),
        "torch.backends.cudnn.enabled": attr(torch.backends.cudnn, "enabled"),
        "torch.backends.mkldnn.enabled": attr(torch.backends.mkldnn, "enabled"),
    }
    for kind in ("flash", "mem_efficient", "math"):
        read = getattr(torch.backends.cuda, f"{kind}_sdp_enabled")
        write = getattr(torch.backends.cuda, f"enable_{kind}_sdp")
        flags[f"torch.backends.cuda.{kind}_sdp_enabled()"] = (read, write)
    return flags


@dataclass
class Record:
    """The shared state at one moment: {where: {name: object}} of the namespaces, and torch's settings."""

    namespaces: dict = field(default_factory=dict)  # "class omnivoice...OmniVoice" / "module ..." -> {name: obj}
    objects: dict = field(default_factory=dict)  # where -> the class or module itself
    flags: dict = field(default_factory=dict)  # name -> value
    compiled: set | None = field(default_factory=set)  # dynamo_globals() then (None: this torch keeps no record)


def reach(model) -> tuple:
    """(classes, modules) a model reaches: the class of it and of every submodule with their bases in
    CLASS_PACKAGES; the modules those are defined in that belong to UPSTREAM, and every loaded omnivoice module."""
    classes = {type(model)} | {type(m) for m in model.modules()}
    classes = {base for c in classes for base in c.__mro__
               if base.__module__.split(".")[0] in CLASS_PACKAGES and base is not object}
    names = {c.__module__ for c in classes} | {n for n in sys.modules if n.split(".")[0] == "omnivoice"}
    modules = {sys.modules[n] for n in names if n in sys.modules and n.split(".")[0] in UPSTREAM}
    return classes, modules


def _where(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    return f"class {obj.__module__}.{obj.__qualname__}"


def namespaces(classes, modules) -> tuple:
    objects = {_where(o): o for o in (*classes, *modules)}
    return {where: dict(vars(o)) for where, o in objects.items()}, objects


def take(model) -> Record:
    """The record: what `model`'s reach and torch's settings are now."""
    spaces, objects = namespaces(*reach(model))
    return Record(namespaces=spaces, objects=objects, flags=read_settings(), compiled=dynamo_globals())


def now(record: Record) -> Record:
    """The same namespaces and settings as `record`, read again."""
    return Record(namespaces={w: dict(vars(o)) for w, o in record.objects.items()}, objects=record.objects,
                  flags=read_settings(), compiled=dynamo_globals())


def read_settings() -> dict:
    return {name: read() for name, (read, _) in torch_settings().items()}


def settings_changed(before: dict, after: dict) -> list:
    return [f"{name}: {value!r} -> {after.get(name)!r}" for name, value in before.items() if after.get(name) != value]


def restore_settings(before: dict, after: dict) -> None:
    for name, (_, write) in torch_settings().items():
        if name in before and after.get(name) != before[name]:
            write(before[name])


def changed(record: Record, current: Record | None = None) -> list:
    """Each attribute rebound (by identity), removed, or added (but a submodule, which an import adds) since
    `record`, as "class omnivoice.models.omnivoice.OmniVoice._generate_iterative"; each torch setting changed,
    as "torch.backends.cuda.matmul.allow_tf32: False -> True". torch.compile's cache and wrappers are left out
    (`differences`)."""
    current = current or now(record)
    out = [f"{where}.{name}{note}" for where, name, note in differences(record, current)]
    return out + settings_changed(record.flags, current.flags)


def differences(record: Record, current: Record) -> list:
    """(where, name, note) of every namespace entry changed since `record` that is not upstream's or torch's own
    doing: not a CACHES entry, not an added submodule, not a module global dynamo's record lists (then or now: the
    compile cache), not a dynamo wrapper of the value it replaces (DYNAMO_WRAPPERS). `note` is "" or, for a
    module global added or removed where this torch keeps no record of its compile globals, why it could not be
    told from the compile cache."""
    import torch

    compiled = (record.compiled or set()) | (current.compiled or set())
    unknown = record.compiled is None or current.compiled is None
    out = []
    for where, before in record.namespaces.items():
        obj, after = record.objects[where], current.namespaces.get(where, {})
        module = isinstance(obj, types.ModuleType)
        for name in sorted(set(before) | set(after)):
            old, new = before.get(name, _MISSING), after.get(name, _MISSING)
            if name in CACHES or old is new:
                continue
            if old is _MISSING and isinstance(new, types.ModuleType):
                continue  # a submodule, which an import adds
            if module and (id(vars(obj)), name) in compiled:
                continue
            wrapped = old if old is not _MISSING else inherited(record, obj, name)
            if new is not _MISSING and dynamo_wrapper(new, wrapped):
                continue
            note = ""
            if module and unknown and (old is _MISSING or new is _MISSING):
                note = (f" ({'added' if old is _MISSING else 'removed'}; torch {torch.__version__} has no "
                        f"{'.'.join(DYNAMO_RECORD)}, dynamo's record of the globals torch.compile installs: its "
                        f"compile cache and a leak cannot be told apart)")
            out.append((where, name, note))
    return out


def inherited(record: Record, cls, name: str):
    """What `name` resolved to on class `cls` through its bases at the record (what a wrapper added to `cls`
    wraps), or _MISSING."""
    if not isinstance(cls, type):
        return _MISSING
    for base in cls.__mro__[1:]:
        space = record.namespaces.get(_where(base), vars(base))
        if name in space:
            return space[name]
    return _MISSING


_MISSING = object()


def defined_in_fastpath(obj) -> bool:
    """Whether `obj` is fastpath's: a function, method, class, partial or wrapper whose code lives in fastpath/,
    or an instance of a class that does."""
    import functools

    seen = 0
    while seen < 8:  # unwrap bound methods, partials, wrappers
        seen += 1
        if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, functools.partial):
            obj = obj.func
        elif getattr(obj, "__wrapped__", None) is not None and not isinstance(obj, type):
            obj = obj.__wrapped__
        else:
            break
    if isinstance(obj, types.FunctionType):
        return obj.__code__.co_filename.startswith(FASTPATH_DIR)
    cls = obj if isinstance(obj, type) else type(obj)
    return cls.__module__.split(".")[0] == "fastpath"


def foreign(record: Record) -> list:
    """Every object of fastpath's in a recorded upstream namespace, and in every class any loaded omnivoice module
    defines: "class ...OmniVoice._generate_iterative is fastpath.loop.enable.<locals>.loop"."""
    objects = dict(record.objects)
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "omnivoice" and module is not None:
            objects.setdefault(_where(module), module)
            for value in list(vars(module).values()):
                if isinstance(value, type) and value.__module__ == name:
                    objects.setdefault(_where(value), value)
    out = []
    for where, obj in objects.items():
        for name, value in list(vars(obj).items()):
            if defined_in_fastpath(value):
                what = getattr(value, "__qualname__", type(value).__qualname__)
                out.append(f"{where}.{name} is fastpath's {what}")
    return sorted(out)


def restore(record: Record, current: Record | None = None) -> None:
    """Put back every namespace entry that `changed` names (added entries removed) and every torch setting that
    differs from `record`; torch.compile's cache and wrappers stay."""
    current = current or now(record)
    for where, name, _ in differences(record, current):
        obj, before = record.objects[where], record.namespaces[where]
        if name in before:
            setattr(obj, name, before[name])
        else:
            delattr(obj, name)
    restore_settings(record.flags, current.flags)
