"""One name → implementation registry behind every extension point: methods, attacks, defenses,
datasets, cut layers (HE schemes), sweep engines and SSL objectives.

A registry refuses a second entry under a taken name (a programming error: two plugins would
shadow each other silently), answers an unknown name with the one-line user error that lists what
exists, and lists its names sorted. An entry may be *lazy* — a ``"module:attribute"`` imported on
first use — so a registry can name an implementation whose module imports the registry's own
module (the Ray engine, the HE schemes) without an import cycle, and optional libraries load only
when chosen.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar

from securevfl.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named implementations of one extension point.

    Args:
        kind: what an entry is, in the user's words (``"method"``, ``"dataset"``); it names the
            registry in errors.
        unknown: the error for an unknown name, a format string with ``{kind}``, ``{name}`` and
            ``{names}`` (the sorted names, comma-separated).
    """

    def __init__(self, kind: str, unknown: str = "unknown {kind} {name!r}; available: {names}") -> None:
        self.kind = kind
        self.unknown = unknown
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._refused: dict[str, str] = {}

    def _claim(self, name: str) -> None:
        if name in self._items or name in self._lazy or name in self._refused:
            raise ValueError(f"{self.kind} {name!r} is already registered")

    def register(self, item: T) -> T:
        """Add ``item`` under its ``name`` attribute; returns it, so it works as a class decorator.

        Args:
            item: a class or entry with a ``name`` attribute.
        Returns:
            ``item`` unchanged.
        Raises:
            ValueError: the name is taken (two implementations must not shadow each other).
        """
        name = item.name  # type: ignore[attr-defined]
        self._claim(name)
        self._items[name] = item
        return item

    def register_lazy(self, name: str, target: str) -> None:
        """Add an entry imported on first :meth:`get`.

        Args:
            name: the entry's name.
            target: ``"package.module:attribute"``.
        """
        self._claim(name)
        self._lazy[name] = target

    def refuse(self, name: str, message: str) -> None:
        """Make ``get(name)`` raise ``message`` as a user error (an optional extra not installed);
        the name is not listed."""
        self._claim(name)
        self._refused[name] = message

    def names(self) -> list[str]:
        """Every usable name, sorted."""
        return sorted([*self._items, *self._lazy])

    def get(self, name: str) -> T:
        """The entry called ``name``.

        Args:
            name: as the user wrote it.
        Returns:
            The registered item (a lazy entry is imported now, once).
        Raises:
            UserError: one line naming the unknown name and listing the available ones, or saying
                what to install for a refused one.
        """
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            module, _, attr = self._lazy[name].partition(":")
            self._items[name] = getattr(importlib.import_module(module), attr)
            del self._lazy[name]
            return self._items[name]
        if name in self._refused:
            raise UserError(self._refused[name])
        raise UserError(self.unknown.format(kind=self.kind, name=name, names=", ".join(self.names())))

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) for every name, sorted; imports lazy entries."""
        return [(n, self.get(n)) for n in self.names()]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items) + len(self._lazy)

