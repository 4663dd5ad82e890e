"""The names runstream had before it was `runstream`: `engine` and `projections`.

`from engine import Client` (and `--app` modules written that way) keeps working in this
release, with one DeprecationWarning per process. The old top-level name becomes an alias
of the new module: `engine` is `runstream` (the names users import), `engine.<x>` is
`runstream.engine.<x>` and `projections.<x>` is `runstream.projections.<x>`, the very same
module objects, so a class imported under either name is one class. Nothing inside
runstream imports the old names; a user's own `engine` or `projections` package, found
first on sys.path, is never touched (the alias applies only while the old name is ours).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

OLD_TOP = {"engine": "runstream", "projections": "runstream.projections"}
"""The module an old top-level name now stands for."""
OLD_PACKAGE = {"engine": "runstream.engine", "projections": "runstream.projections"}
"""Where an old name's submodules now live."""

_adopted: dict[str, ModuleType] = {}  # at most len(OLD_TOP) entries


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `engine.<x>` and `projections.<x>` as the new module, while the old name is ours."""

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        head, dot, _ = fullname.partition(".")
        if not dot or head not in _adopted or sys.modules.get(head) is not _adopted[head]:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        head, _, rest = spec.name.partition(".")
        return importlib.import_module(f"{OLD_PACKAGE[head]}.{rest}")

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module ran when create_module imported it."""


_FINDER = _OldNames()


def adopt(old_name: str) -> None:
    """Make the old top-level `old_name`, being imported now, an alias of its new module."""
    if not _adopted:
        warnings.warn(
            f"importing runstream as {old_name!r} is deprecated: write `from runstream import "
            "...` (or runstream.engine.<x>, runstream.projections.<x>); the old names go in "
            "the next release", DeprecationWarning, stacklevel=4)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    module = importlib.import_module(OLD_TOP[old_name])
    _adopted[old_name] = module
    sys.modules[old_name] = module
