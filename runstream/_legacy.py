"""The names runstream had before it was `runstream`: `engine` and `projections`.

`from engine import Client` (and `--app` modules written that way) keeps working in this
release, with one DeprecationWarning per process. Each old name stands for a new module:

- `engine` answers the names users import from `runstream` (`engine.Client is
  runstream.Client`), and `engine.<x>` is `runstream.engine.<x>`;
- `projections` is `runstream.projections`, and `projections.<x>` is
  `runstream.projections.<x>`.

A submodule imported by its old name is the very same module object as under its new name
(its `__name__` and `__spec__` stay the new ones, so resources, `reload` and pickling see the
real module): a class imported under either name is one class. `engine` itself stays its own
small module rather than becoming `runstream`, so `import engine.worker` binds `worker` on the
alias and never adds `worker` or `testing` to the `runstream` namespace.

Nothing inside runstream imports the old names. A user's own `engine` or `projections`,
found first on sys.path, is never touched: runstream's alias applies only while the module
under the old name in sys.modules is the one this module adopted.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

OLD_PACKAGE = {"engine": "runstream.engine", "projections": "runstream.projections"}
"""Where an old name's submodules now live."""
FACADE = "runstream"
"""The module whose public names `engine.<Name>` answers."""

WARNING = ("importing runstream as {old!r} is deprecated: write `from runstream import ...` "
           "(or runstream.engine.<x>, runstream.projections.<x>); the old names go in the "
           "next release")

_adopted: dict[str, ModuleType] = {}  # old name -> its alias module, at most len(OLD_PACKAGE)


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `engine.<x>` and `projections.<x>` as the new module, while the old name is ours."""

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        head, dot, _ = fullname.partition(".")
        if not dot or head not in _adopted or sys.modules.get(head) is not _adopted[head]:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(new_name(spec.name))
        spec.loader_state = module.__spec__  # the import system is about to overwrite it
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the new module ran when create_module imported it); only give
        it back its own `__spec__`, which the import system set to the alias's."""
        alias_spec = module.__spec__
        if alias_spec is not None and alias_spec.loader is self:
            module.__spec__ = alias_spec.loader_state


_FINDER = _OldNames()


def new_name(old: str) -> str:
    """`engine.worker` -> `runstream.engine.worker`, `projections.state` ->
    `runstream.projections.state` (an old top-level name itself is not renamed here)."""
    head, _, rest = old.partition(".")
    return f"{OLD_PACKAGE[head]}.{rest}"


def adopt(old_name: str) -> None:
    """Make the module now being imported as `old_name` (`engine` or `projections`) the
    deprecated alias of its new module. Called from that name's `__init__`."""
    if not _adopted:
        # stacklevel 3: adopt, the old package's __init__, then the importing line (the
        # warnings module skips the import system's own frames).
        warnings.warn(WARNING.format(old=old_name), DeprecationWarning, stacklevel=3)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if old_name == "engine":
        alias = sys.modules[old_name]  # the shim being imported: it forwards to the facade
        facade = importlib.import_module(FACADE)
        alias.__dict__["__getattr__"] = _forward_to(facade)
        alias.__dict__["__dir__"] = lambda: sorted({*vars(alias), *facade.__all__})
    else:
        alias = importlib.import_module(OLD_PACKAGE[old_name])
        sys.modules[old_name] = alias  # the import returns what sys.modules holds
    _adopted[old_name] = alias


def _forward_to(facade: ModuleType) -> Callable[[str], Any]:
    def forward(name: str) -> Any:
        try:
            return getattr(facade, name)
        except AttributeError:
            raise AttributeError(f"module 'engine' has no attribute {name!r}") from None
    return forward
