"""What a patch must never change, recorded before any test applies one and checked after every test.

A patch touches one model instance. What another model in the same process shares must stay as it was: the
classes a model reaches (OmniVoice, the LLM's layers, the codec's; every base class in omnivoice, transformers or
torch.nn), the globals of the omnivoice and transformers modules those classes are defined in (an upstream function
a patch could swap module-wide) and of torch and torch.nn.functional (EXTRA_MODULES), the entries of every dict
those modules hold (transformers' attention and mask registries, ACT2FN, ROPE_INIT_FUNCTIONS, ...: `containers`),
torch's process-wide settings (threads, TF32, cuDNN, determinism, matmul precision, default dtype, attention
kernels) and the environment variables fastpath, torch and its math libraries read (ENV_PREFIXES). A model shared
between tests (a module- or session-scoped fixture) is checked the same way (`model_state`): no patch left applied,
no instance attribute rebound, no parameter or buffer replaced or written.

`take(model)` records all of it as the objects themselves (compared by identity, so a rebinding to an equal copy
is seen). `changed(record)` names every attribute rebound or removed since, and every one added that is not a
submodule; `foreign(record)` names every object defined in `fastpath` that sits in an upstream namespace, whatever
the record says (a leak that happened before the record was taken is found too); `restore(record)` puts back what
changed, so that one leak fails one test, not every test after it.

torch.compile's own doing is not a leak, and is told apart by torch's records, never by a name's look: the globals
dynamo installs in the module whose function it compiles (its compile cache: `__compiled_fn_*`, `__builtins_dict___N`,
`_<id>_c0`, ...), which dynamo lists as it installs them; and its once-per-process wrappers of a shared class's
attribute, defined in torch/_dynamo/mutation_guard.py around the very value they replace. Where this torch keeps no
such list, each added or removed module global says that it could not be told apart. A replacement of a value that
was there is never dynamo's compile cache: whatever module the new value comes from, it is reported.

fastpath's own registry entry is not a leak either: `fastpath.loop.install_padded_key_attention` adds a name of its
own to transformers' attention registry ("fastpath_padded_keys|<impl>", its padding wrapper of <impl>) and leaves it
there after revert: no model but a patched one is set to that name, and a model a module-scoped fixture keeps
patched needs it between tests. That entry alone (a new key with fastpath's prefix, holding fastpath's wrapper of
the implementation the key names) is passed and left in place; any other entry added, removed or rebound is
reported, whatever its value.

conftest.py takes the record once per session, before the first test that runs with omnivoice imported, and
checks it after every test, and again after each module's fixtures are torn down (the session's end included: a
leak in a module- or session-scoped fixture's teardown); tests_patches/test_registry.py's instance-only test
compares with the same record.
"""

from __future__ import annotations

import collections.abc
import importlib
import operator
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import fastpath

UPSTREAM = ("omnivoice", "transformers")  # packages whose module globals are recorded
# recorded beside the modules a model reaches: torch's own namespaces a test could swap a function in, and the
# modules of transformers' attention and mask registries (AttentionInterface, AttentionMaskInterface)
EXTRA_MODULES = ("torch", "torch.nn.functional", "transformers.modeling_utils", "transformers.masking_utils")
# environment variables that fastpath, torch, inductor and the math libraries read (threads, ISA, TF32, devices)
ENV_PREFIXES = ("FASTPATH_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "ATEN_", "ONEDNN_", "DNNL_", "CUDA_",
                "CUBLAS_", "CUDNN_", "NVIDIA_TF32", "TORCH", "PYTORCH_")
# a variable a library sets to its value when first imported (name: (value, who)): that value is the library's, the
# same in every process, not a test's doing; any other value is compared
ENV_IMPORT_DEFAULTS = {"KMP_INIT_AT_FORK": ("FALSE", "joblib and scikit-learn, os.environ.setdefault at import")}
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
    """The shared state at one moment: {where: {name: object}} of the namespaces and of the dicts they hold, torch's
    settings and the environment."""

    namespaces: dict = field(default_factory=dict)  # "class omnivoice...OmniVoice" / "module ..." -> {name: obj}
    objects: dict = field(default_factory=dict)  # where -> the class or module itself
    flags: dict = field(default_factory=dict)  # name -> value
    compiled: set | None = field(default_factory=set)  # dynamo_globals() then (None: this torch keeps no record)
    entries: dict = field(default_factory=dict)  # "dict module torch.X" -> {key: value}, a copy of each container
    containers: dict = field(default_factory=dict)  # the same where -> the dict itself
    environ: dict = field(default_factory=dict)  # name -> value of the variables ENV_PREFIXES names
    fastpaths: dict | None = None  # (kind, where) -> foreign's finding there while it holds what the record holds


def reach(model) -> tuple:
    """(classes, modules) a model reaches: the class of it and of every submodule with their bases in
    CLASS_PACKAGES; the modules those are defined in that belong to UPSTREAM, and every loaded omnivoice module."""
    classes = {type(model)} | {type(m) for m in model.modules()}
    classes = {base for c in classes for base in c.__mro__
               if base.__module__.split(".")[0] in CLASS_PACKAGES and base is not object}
    names = {c.__module__ for c in classes} | {n for n in sys.modules if n.split(".")[0] == "omnivoice"}
    modules = {sys.modules[n] for n in names if n in sys.modules and n.split(".")[0] in UPSTREAM}
    return classes, modules | {importlib.import_module(n) for n in EXTRA_MODULES}


def containers(modules) -> dict:
    """where -> dict, for every dict a recorded module holds (read and written through dict's own methods: a subclass
    such as transformers' ACT2FN builds a new object on each lookup): its dict globals ("dict module
    transformers.modeling_utils.LOSS_MAPPING"), the dicts inside a mapping object it holds (transformers'
    GeneralInterface: "dict module transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS._local_mapping"), and the
    class-level dicts of the classes it defines (the registries themselves: "dict class
    transformers.modeling_utils.AttentionInterface._global_mapping"). One dict reached twice is named once."""
    out, seen = {}, set()

    def add(where, value):
        if isinstance(value, dict) and id(value) not in seen:
            seen.add(id(value))
            out[where] = value

    for module in sorted(modules, key=lambda m: m.__name__):
        for name, value in list(vars(module).items()):
            if name.startswith("__"):
                continue
            where = f"dict module {module.__name__}.{name}"
            add(where, value)
            if isinstance(value, collections.abc.Mapping) and not isinstance(value, dict):
                for attr, inner in list(getattr(value, "__dict__", {}).items()):
                    add(f"{where}.{attr}", inner)
            if isinstance(value, type) and value.__module__ == module.__name__:
                for attr, inner in list(vars(value).items()):
                    if not attr.startswith("__"):
                        add(f"dict {_where(value)}.{attr}", inner)
    return out


def unchanged(before: dict, after) -> bool:
    """The same keys holding the same objects, in the same order: the common case, decided at C speed. `after`: a
    dict (read through dict's own methods) or a class's mappingproxy."""
    plain = dict if isinstance(after, dict) else type(after)
    return len(before) == len(after) and all(map(operator.is_, before.values(), plain.values(after))) \
        and all(map(operator.eq, before.keys(), plain.keys(after)))


def raw(held: dict) -> dict:
    """A plain copy of a dict's own entries, never through a subclass's __getitem__ (dict(ACT2FN) builds objects)."""
    return dict(dict.items(held))


def environment() -> dict:
    """name -> value of the variables ENV_PREFIXES names, less one a library set to its import default."""
    return {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIXES)
            and value != ENV_IMPORT_DEFAULTS.get(name, (None,))[0]}


def _where(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    return f"class {obj.__module__}.{obj.__qualname__}"


def namespaces(classes, modules) -> tuple:
    objects = {_where(o): o for o in (*classes, *modules)}
    return {where: dict(vars(o)) for where, o in objects.items()}, objects


def take(model) -> Record:
    """The record: what `model`'s reach, the dicts its modules hold, torch's settings and the environment are now."""
    classes, modules = reach(model)
    spaces, objects = namespaces(classes, modules)
    held = containers(modules)
    return Record(namespaces=spaces, objects=objects, flags=read_settings(), compiled=dynamo_globals(),
                  entries={w: raw(d) for w, d in held.items()}, containers=held, environ=environment())


def now(record: Record) -> Record:
    """The same namespaces, dicts, settings and environment as `record`, read again."""
    return Record(namespaces={w: dict(vars(o)) for w, o in record.objects.items()}, objects=record.objects,
                  flags=read_settings(), compiled=dynamo_globals(),
                  entries={w: raw(d) for w, d in record.containers.items()}, containers=record.containers,
                  environ=environment())


def read_settings() -> dict:
    return {name: read() for name, (read, _) in torch_settings().items()}


def settings_changed(before: dict, after: dict) -> list:
    return [f"{name}: {value!r} -> {after.get(name)!r}" for name, value in before.items() if after.get(name) != value]


def environ_changed(before: dict, after: dict) -> list:
    """Each variable set, unset or changed: "os.environ['OMP_NUM_THREADS']: unset -> '1'"."""
    def shown(value):
        return "unset" if value is None else repr(value)

    return [f"os.environ[{name!r}]: {shown(before.get(name))} -> {shown(after.get(name))}"
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def restore_environ(before: dict, after: dict) -> None:
    for name in set(before) | set(after):
        if name not in before:
            os.environ.pop(name, None)
        elif after.get(name) != before[name]:
            os.environ[name] = before[name]


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
    out += [f"{where}[{key!r}]" for where, key in entry_differences(record, current)]
    return out + settings_changed(record.flags, current.flags) + environ_changed(record.environ, current.environ)


def entry_differences(record: Record, current: Record) -> list:
    """(where, key) of every entry added, removed or rebound (by identity) in a recorded dict since `record`, but
    fastpath's own attention name (`fastpaths_own_entry`)."""
    out = []
    for where, before in record.entries.items():
        after = current.entries.get(where, {})
        if unchanged(before, after):
            continue
        for key in list(before) + [k for k in after if k not in before]:
            old, new = before.get(key, _MISSING), after.get(key, _MISSING)
            if old is new or (old is _MISSING and (fastpaths_own_entry(key, new)
                                                   or upstreams_record(record.containers.get(where), key))):
                continue
            out.append((where, key))
    return out


# dicts upstream fills by itself as a class is first used, one entry per class, the same for every instance of it:
# an entry added there is upstream's record, not a test's doing (the dict's type name: why)
UPSTREAM_RECORDS = {
    "_CanRecordRegistry": "transformers.utils.output_capturing records each model class's _can_record_outputs, "
                          "keyed by str(the class), when a model of that class is constructed",
}


def upstreams_record(container, key) -> bool:
    """Whether an entry added under `key` to `container` is upstream's own per-class record (UPSTREAM_RECORDS)."""
    return type(container).__name__ in UPSTREAM_RECORDS and type(container).__module__.split(".")[0] in UPSTREAM \
        and isinstance(key, str) and key.startswith("<class '")


def fastpaths_own_entry(key, value) -> bool:
    """Whether (key, value) is the attention name fastpath.loop.install_padded_key_attention registers: a key with
    fastpath's prefix holding fastpath's padding wrapper of the implementation the key names (its `inner`)."""
    from fastpath import loop

    if not isinstance(key, str) or not key.startswith(loop.PADDED_ATTENTION):
        return False
    code, wrapper = getattr(value, "__code__", None), loop.padded_key_attention("")
    if code is not wrapper.__code__ or "inner" not in code.co_freevars:
        return False
    return value.__closure__[code.co_freevars.index("inner")].cell_contents == key[len(loop.PADDED_ATTENTION):]


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
        if unchanged(before, after):
            continue
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
        elif not isinstance(obj, type) and _attribute(obj, "__wrapped__") is not None:
            obj = obj.__wrapped__
        else:
            break
    if isinstance(obj, types.FunctionType):
        return obj.__code__.co_filename.startswith(FASTPATH_DIR)
    cls = obj if isinstance(obj, type) else type(obj)
    return cls.__module__.split(".")[0] == "fastpath"


def _attribute(obj, name: str):
    """getattr that a namespace object answering every name cannot break (torch.classes raises RuntimeError)."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001
        return None


def foreign(record: Record) -> list:
    """Every object of fastpath's in a recorded upstream namespace, and in every class any loaded omnivoice module
    defines: "class ...OmniVoice._generate_iterative is fastpath.loop.enable.<locals>.loop"."""
    objects = dict(record.objects)
    for name, module in list(sys.modules.items()):
        if name.startswith("omnivoice") and name.split(".")[0] == "omnivoice" and module is not None:
            objects.setdefault(_where(module), module)
            for value in list(vars(module).values()):
                if isinstance(value, type) and value.__module__ == name:
                    objects.setdefault(_where(value), value)
    if record.fastpaths is None:  # where -> what of it is fastpath's at the record, found once
        record.fastpaths = {}
    out = []
    for kind, spaces, recorded in (("namespace", {w: vars(o) for w, o in objects.items()}, record.namespaces),
                                   ("entries", record.containers, record.entries)):
        for where, space in spaces.items():
            before = recorded.get(where)
            if before is not None and unchanged(before, space) and (kind, where) in record.fastpaths:
                out += record.fastpaths[kind, where]  # nothing rebound since it was judged
                continue
            found = []
            for name, value in list((dict if isinstance(space, dict) else type(space)).items(space)):
                if defined_in_fastpath(value) and not (kind == "entries" and fastpaths_own_entry(name, value)):
                    what = getattr(value, "__qualname__", type(value).__qualname__)
                    found.append(f"{where}.{name} is fastpath's {what}" if kind == "namespace" else
                                 f"{where}[{name!r}] is fastpath's {what}")
            if before is not None and unchanged(before, space):
                record.fastpaths[kind, where] = found
            out += found
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
    for where, key in entry_differences(record, current):
        held, before = record.containers[where], record.entries[where]
        if key in before:
            dict.__setitem__(held, key, before[key])
        else:
            dict.pop(held, key, None)
    restore_settings(record.flags, current.flags)
    restore_environ(record.environ, current.environ)


# --- a model shared between tests: a module- or session-scoped fixture's ----------------------------------------
# A shared model of at most this many parameter and buffer elements is kept as a copy when first seen (the tiny
# test model: 2.3 M, 9 MB): a tensor written in place is then compared with it and put back. A larger one is
# reported by its version counters alone and left as it is.
COPY_LIMIT = 50_000_000
# the dicts of a submodule compared entry by entry (what a forward reads); its other hook dicts are not
MODULE_DICTS = ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks")
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")
# what upstream adds to an instance by itself on first use, the same whichever test uses it first (name: why); and a
# hook added whose function is upstream's own (transformers' output-capturing hooks, installed with that flag)
MODEL_CACHES = {
    "_output_capturing_hooks_installed": "transformers installs its output-capturing hooks on a model the first time "
                                         "it is asked for hidden states (utils/output_capturing.py), then sets this",
}


def upstreams_own(where: str, name, value) -> bool:
    """Whether an entry added to a shared model is upstream's lazy doing (MODEL_CACHES, or a hook whose function is
    defined in omnivoice, transformers or torch), not a test's."""
    if name in MODEL_CACHES:
        return True
    if not where.endswith(HOOK_DICTS):
        return False
    function = getattr(value, "__func__", value)
    return str(getattr(function, "__module__", "")).split(".")[0] in CLASS_PACKAGES


@dataclass
class ModelState:
    """One shared model at one moment. Read per test at the cost of walking its submodules' dicts (about 1 ms for
    the tiny model): tensors by data pointer and version counter (`t._version`, which every in-place write through
    the tensor bumps), never by value; the copy is compared only where a counter moved."""

    applied: list  # fastpath.applied(model)
    spaces: list  # (path, object, {name: value}) of every submodule's and config's __dict__ and the dicts in it
    tensors: list  # (path, tensor, data_ptr, _version, its storage then) of every parameter and buffer
    copy: list | None  # a clone of each tensor (same order), or None above COPY_LIMIT


def shared_models(value) -> list:
    """The torch modules a fixture's value holds: itself, or the items of a tuple, list or dict it is."""
    import torch

    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else [value]
    return [v for v in items if isinstance(v, torch.nn.Module)]


def model_state(model, keep_copy: bool = False, previous: ModelState | None = None) -> ModelState:
    """The state of `model` now; with `keep_copy`, a copy of its tensors (`previous`'s, where no tensor was
    replaced or written since it was taken)."""
    spaces, tensors, seen = [], [], set()
    for path, module in model.named_modules(remove_duplicate=True):
        path = path or "<model>"
        held = [(path, module)]
        config = vars(module).get("config")
        if config is not None and hasattr(config, "__dict__") and id(config) not in seen:
            seen.add(id(config))
            held.append((f"{path}.config", config))
        for where, obj in held:
            space = vars(obj)
            spaces.append((where, obj, dict(space)))
            spaces += [(f"{where}.{name}", inner, raw(inner)) for name, inner in space.items()
                       if isinstance(inner, dict) and (obj is not module or name in MODULE_DICTS)]
        prefix = "" if module is model else f"{path}."  # named as model.named_parameters() names them
        for kind in ("_parameters", "_buffers"):
            tensors += [(f"{prefix}{name}", t, t.data_ptr(), t._version, t.detach())  # the storage, kept to put back
                        for name, t in vars(module)[kind].items() if t is not None]
    import fastpath

    small = sum(t.numel() for _, t, _, _, _ in tensors) <= COPY_LIMIT
    same_tensors = previous is not None and previous.copy is not None and len(previous.tensors) == len(tensors) \
        and all(a[1] is b[1] and a[2:4] == b[2:4] for a, b in zip(previous.tensors, tensors))
    copy = (previous.copy if same_tensors else [t.detach().clone() for _, t, _, _, _ in tensors]) \
        if keep_copy and small else None
    return ModelState(applied=fastpath.applied(model), spaces=spaces, tensors=tensors, copy=copy)


def model_changed(before: ModelState, model) -> list:
    """What a test left changed on a shared model: a patch applied ("patched: fastpath.applied(model) is [...]"), an
    instance value fastpath installed and never put back, an attribute of a submodule or its config (an entry of the
    dicts in it: its parameters, buffers, submodules, hooks) added, removed or rebound, a tensor written in place
    (its version counter moved and its values differ from the copy) or given new storage."""
    import fastpath

    from fastpath import instance

    out = []
    if fastpath.applied(model) != before.applied:
        out.append(f"patched: fastpath.applied(model) is {fastpath.applied(model)} (was {before.applied})")
    remembered = len(instance._saved) > 0  # noqa: SLF001  (fastpath's record of what it installed, on any object)
    for where, obj, space in before.spaces:
        if remembered and installed(obj):
            out.append(f"{where}: fastpath installed {installed(obj)} and never put them back")
        now_ = obj if isinstance(obj, dict) else vars(obj)
        if unchanged(space, now_):
            continue
        for name in list(space) + [n for n in now_ if n not in space]:
            if name not in space and upstreams_own(where, name, dict.get(now_, name)):
                continue
            old, new = space.get(name, _MISSING), dict.get(now_, name, _MISSING)
            if not same(old, new) and not same_tensor(old, new):
                out.append(f"{where}.{name} {'added' if name not in space else 'rebound or removed'}")
    for k, (where, t, ptr, version, held) in enumerate(before.tensors):
        if t.data_ptr() != ptr and not torch_equal(t, held):  # `held` keeps the storage it had: compared by value
            out.append(f"{where} given new storage")
        elif t._version != version and (before.copy is None or not torch_equal(t, before.copy[k])):
            out.append(f"{where} written in place (version {version} -> {t._version})")
    return out


def same(a, b) -> bool:
    """The same object, or an equal plain value (a config's "sdpa" set again after a patch is another str object)."""
    return a is b or (type(a) is type(b) and isinstance(a, (str, bytes, int, float, type(None))) and a == b)


def installed(obj) -> list:
    """The names fastpath.instance installed on `obj` and has not put back (its own record, keyed weakly)."""
    from fastpath import instance

    try:
        return sorted(instance._saved.get(obj, {}))  # noqa: SLF001
    except TypeError:  # not hashable or not weakly referable: nothing of fastpath's is kept for it
        return []


def same_tensor(a, b) -> bool:
    """Two tensors of one kind, dtype, shape and bits (a buffer that `model.to(float64)` then `.to(float32)` gave
    new storage holding the same values): the model computes as it did."""
    import torch

    return isinstance(a, torch.Tensor) and type(a) is type(b) and a.requires_grad == b.requires_grad \
        and torch_equal(b, a)


def tensors_moved(before: ModelState, model) -> bool:
    """Whether any parameter or buffer of `model` is now another tensor or has other storage than `before` read
    (compared equal by value, or model_changed would have named it): the state to compare with is then read again."""
    now_ = [(id(t), t.data_ptr()) for module in model.modules() for kind in ("_parameters", "_buffers")
            for t in vars(module)[kind].values() if t is not None]
    return now_ != [(id(t), ptr) for _, t, ptr, _, _ in before.tensors]


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.detach(), b))


def model_restore(before: ModelState, model) -> ModelState:
    """Put back what `model_changed` names: every patch reverted, every attribute and dict entry as it was, every
    tensor's storage, and its values where a copy was kept. Returns the state to compare with from now on."""
    import torch

    import fastpath
    from fastpath import instance

    fastpath.revert(model)
    for where, obj, space in before.spaces:
        for name in installed(obj):
            instance.restore(obj, name)
        now_ = obj if isinstance(obj, dict) else vars(obj)
        for name in [n for n in now_ if n not in space and not upstreams_own(where, n, dict.get(now_, n))]:
            dict.pop(now_, name)
        for name, value in space.items():
            if not same(dict.get(now_, name, _MISSING), value):
                dict.__setitem__(now_, name, value)
    with torch.no_grad():
        for k, (where, t, ptr, version, storage) in enumerate(before.tensors):
            if t.data_ptr() != ptr:
                t.data = storage
            if before.copy is not None and not torch_equal(t, before.copy[k]):
                t.copy_(before.copy[k])
    return ModelState(applied=before.applied, spaces=before.spaces, copy=before.copy,
                      tensors=[(w, t, t.data_ptr(), t._version, t.detach()) for w, t, _, _, _ in before.tensors])
