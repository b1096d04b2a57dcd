"""Input limits: what a small hostile or careless input may cost before it is refused.

Every YAML text the library reads (``--config``, sweep files, ``KEY=VALUE`` flag values) goes through
:func:`load_yaml`, which refuses, as a :class:`~securevfl.errors.UserError`:

- a file larger than ``SECUREVFL_MAX_CONFIG_BYTES`` (default 1 MiB; only that many bytes are ever
  read, so ``securevfl sweep /dev/zero`` ends at once);
- nesting deeper than ``SECUREVFL_MAX_YAML_DEPTH`` (default 64) — PyYAML's composer recurses per
  level, so 5 000 levels would end in a ``RecursionError``;
- recursive aliases (``columns: &c [*c]``), which build a cyclic object no consumer can walk;
- more than ``SECUREVFL_MAX_YAML_NODES`` (default 100 000) nodes once aliases are expanded: a 1 KB
  "billion laughs" file is a tiny graph but an exponential object once serialised or copied;
- duplicate mapping keys (YAML says they are an error; PyYAML keeps the last silently).

Error messages quote values through :func:`brief`, and the CLI caps every ``error:`` line at
:data:`MAX_ERROR_CHARS`, so a huge value is never echoed. The limits are environment variables
because they guard the reading of the configuration itself. See docs/limits.md.
"""

from __future__ import annotations

import os
import reprlib
from pathlib import Path

import yaml

from securevfl.errors import UserError

MAX_ERROR_CHARS = 400
"""An ``error:`` line is cut to this many characters (the rest is counted, not printed)."""


def env_limit(name: str, default: int) -> int:
    """A positive integer limit from the environment variable ``name`` (``default`` when unset)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UserError(f"{name}={brief(raw)}: expected a positive integer") from None
    if value < 1:
        raise UserError(f"{name}={value}: expected a positive integer")
    return value


def max_config_bytes() -> int:
    return env_limit("SECUREVFL_MAX_CONFIG_BYTES", 1 << 20)


def max_yaml_depth() -> int:
    return env_limit("SECUREVFL_MAX_YAML_DEPTH", 64)


def max_yaml_nodes() -> int:
    return env_limit("SECUREVFL_MAX_YAML_NODES", 100_000)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def brief(value: object) -> str:
    """``repr(value)`` cut to about 100 characters: safe to put into an error message whatever its size
    (reprlib never builds the whole repr of a long string, a huge list or a cyclic structure)."""
    return _REPR.repr(value)


def cap_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters, the cut counted."""
    if len(text) > 4 * limit:  # never split a huge message completely
        text = text[: 4 * limit]
    one = " ".join(text.split())
    return one if len(one) <= limit else f"{one[:limit]}… (cut)"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with bounded depth, no recursive aliases, a bounded expanded size and no
    duplicate keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._max_depth = max_yaml_depth()

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):  # an alias adds no nesting of its own
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                mark = self.peek_event().start_mark
                raise UserError(f"line {mark.line + 1}: nesting deeper than {self._max_depth} levels "
                                "(SECUREVFL_MAX_YAML_DEPTH)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):  # type: ignore[no-untyped-def]
        node = super().compose_document()
        _check_graph(node, max_yaml_nodes())
        return node

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise UserError(f"line {key_node.start_mark.line + 1}: duplicate key "
                                        f"{brief(key_node.value)}")
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root: yaml.Node | None, max_nodes: int) -> None:
    """Refuse a cycle (a recursive alias) or more than ``max_nodes`` nodes once aliases are expanded.
    Iterative, with the expanded size of each shared node computed once (the graph itself is at most
    as large as the file)."""
    if root is None:
        return
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > max_nodes:
                raise UserError(f"more than {max_nodes} values once aliases are expanded "
                                "(SECUREVFL_MAX_YAML_NODES): an alias bomb?")
            continue
        if key in size:
            continue
        if key in on_path:
            raise UserError(f"line {node.start_mark.line + 1}: recursive alias (a value that contains itself)")
        on_path.add(key)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in on_path:
                raise UserError(f"line {c.start_mark.line + 1}: recursive alias (a value that contains itself)")
            if id(c) not in size:
                stack.append((c, False))


def load_yaml(text: str) -> object:
    """Parse one YAML document under the limits above (errors as UserError without a source name;
    callers prefix it)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506  (_Loader is a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise UserError(f"{where}not valid YAML ({cap_line(str(getattr(e, 'problem', '') or 'syntax'), 80)})") \
            from None
    except RecursionError:  # a structure the limits above did not catch: still one line, not a traceback
        raise UserError("nested too deeply") from None


def read_text_limited(path: Path, what: str) -> str:
    """A config or sweep file's text, reading at most the configured size (so a device or a pipe that
    never ends is refused, not slurped)."""
    limit = max_config_bytes()
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise UserError(f"{what} {path}: cannot read ({e.strerror or e})") from None
    if len(raw) > limit:
        raise UserError(f"{what} {path}: larger than {limit} bytes (SECUREVFL_MAX_CONFIG_BYTES)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path}: not UTF-8 text (byte {e.start})") from None
