"""Marked YAML: every mapping and sequence remembers the file and line it came from.

The configuration's sections are checked long after the file is parsed (a schema that does not load, an
XPath that does not compile); with the place kept on each value, every such error still points at
``file:line``. The ``expect_*`` functions check one value's shape and name its place when it is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import ConfigError, clip

__all__ = [
    "NOWHERE",
    "MarkedDict",
    "MarkedList",
    "Where",
    "check_keys",
    "expect_bool",
    "expect_choice",
    "expect_int",
    "expect_list",
    "expect_mapping",
    "expect_str",
    "load_yaml",
    "parse_duration",
]


@dataclass(frozen=True, slots=True)
class Where:
    """A place in a configuration file (``line`` is 1-based)."""

    file: str | None
    line: int | None

    def error(self, detail: str) -> ConfigError:
        return ConfigError(detail, file=self.file, line=self.line)

    def __str__(self) -> str:
        if self.file is None:
            return "<config>"
        return self.file if self.line is None else f"{self.file}:{self.line}"


NOWHERE = Where(None, None)


class MarkedDict(dict):
    """A mapping that knows where it starts (``where``) and where each key is (``at(key)``)."""

    where: Where = NOWHERE
    key_where: dict[Any, Where]

    def at(self, key: Any) -> Where:
        return getattr(self, "key_where", {}).get(key, self.where)


class MarkedList(list):
    """A sequence that knows where it starts (``where``) and where each item is (``at(index)``)."""

    where: Where = NOWHERE
    item_where: list[Where]

    def at(self, index: int) -> Where:
        items = getattr(self, "item_where", [])
        return items[index] if 0 <= index < len(items) else self.where


class _MarkedLoader(yaml.SafeLoader):
    """A safe loader whose mappings and sequences remember their file and lines."""

    file_name: str | None = None

    def _where(self, node: yaml.Node) -> Where:
        return Where(self.file_name, node.start_mark.line + 1)

    def construct_marked_mapping(self, node: yaml.MappingNode) -> MarkedDict:
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(None, None, "expected a mapping", node.start_mark)
        self.flatten_mapping(node)
        result = MarkedDict()
        result.where = self._where(node)
        result.key_where = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise ConfigError(
                    "a mapping key must be a plain value", file=self.file_name, line=key_node.start_mark.line + 1
                ) from None
            if key in result:
                raise ConfigError(
                    f"duplicate key {clip(str(key), 80)!r} (first at line {result.key_where[key].line})",
                    file=self.file_name,
                    line=key_node.start_mark.line + 1,
                )
            result[key] = self.construct_object(value_node, deep=True)
            result.key_where[key] = self._where(key_node)
        return result

    def construct_marked_sequence(self, node: yaml.SequenceNode) -> MarkedList:
        result = MarkedList(self.construct_object(child, deep=True) for child in node.value)
        result.where = self._where(node)
        result.item_where = [self._where(child) for child in node.value]
        return result


_MarkedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _MarkedLoader.construct_marked_mapping)
_MarkedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _MarkedLoader.construct_marked_sequence)


def load_yaml(path: str | Path | None = None, *, text: str | None = None, name: str | None = None) -> Any:
    """Load one YAML document (from *path*, or from *text* named *name*) with marks.

    Raises :class:`ConfigError` with the file and line of a syntax error, a
    duplicate key, or an unreadable file.
    """
    shown = name if name is not None else (str(path) if path is not None else "<config>")
    if text is None:
        if path is None:
            raise ValueError("load_yaml needs a path or a text")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("no such file", file=shown) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the file: {clip(str(exc), 200)}", file=shown) from None
    loader = _MarkedLoader(text)
    loader.file_name = shown
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"YAML syntax error: {clip(problem or str(exc), 300)}", file=shown, line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML error: {clip(str(exc), 300)}", file=shown) from None
    finally:
        loader.dispose()


# --------------------------------------------------------------------------- typed values

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any, where: Where, what: str) -> float:
    """Seconds from a number (seconds) or a string like ``250ms``, ``10s``, ``5m``, ``1h``, ``7d``."""
    if isinstance(value, bool):
        raise where.error(f"{what} must be a duration such as 10s, 250ms, 5m; got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise where.error(f"{what} must not be negative; got {value!r}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise where.error(f"{what} must be a duration such as 10s, 250ms, 5m, 1h or 7d; got {clip(repr(value), 60)}")


def expect_mapping(value: Any, where: Where, what: str) -> MarkedDict:
    if value is None:
        empty = MarkedDict()
        empty.where = where
        empty.key_where = {}
        return empty
    if not isinstance(value, dict):
        raise where.error(f"{what} must be a mapping, not {_kind(value)}")
    if not isinstance(value, MarkedDict):
        marked = MarkedDict(value)
        marked.where = where
        marked.key_where = {}
        return marked
    return value


def expect_list(value: Any, where: Where, what: str) -> MarkedList:
    if value is None:
        empty = MarkedList()
        empty.where = where
        empty.item_where = []
        return empty
    if not isinstance(value, list):
        raise where.error(f"{what} must be a list, not {_kind(value)}")
    if not isinstance(value, MarkedList):
        marked = MarkedList(value)
        marked.where = where
        marked.item_where = []
        return marked
    return value


def expect_str(value: Any, where: Where, what: str, *, pattern: re.Pattern[str] | None = None, hint: str = "") -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"{what} must be a non-empty string, not {_kind(value)}")
    if pattern is not None and not pattern.match(value):
        raise where.error(f"{what} {clip(value, 80)!r} is not valid{': ' + hint if hint else ''}")
    return value


def expect_int(value: Any, where: Where, what: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"{what} must be an integer, not {_kind(value)}")
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
        raise where.error(f"{what} must be {bounds}; got {value}")
    return value


def expect_choice(value: Any, where: Where, what: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise where.error(f"{what} must be one of {', '.join(choices)}, not {clip(repr(value), 80)}")
    return value


def expect_bool(value: Any, where: Where, what: str) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"{what} must be true or false, not {_kind(value)}")
    return value


def check_keys(mapping: MarkedDict, allowed: set[str], what: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise mapping.at(key).error(
                f"unknown key {clip(str(key), 60)!r} in {what}; known keys: {', '.join(sorted(allowed))}"
            )


def _kind(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {clip(value, 40)!r}"
    return f"{type(value).__name__} {clip(repr(value), 40)}"
