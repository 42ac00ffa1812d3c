"""Fields of a record read from a file have the types its dataclass declares.

Files prism reads come from other machines, other versions and editors: a JSON ``"rank": "3"``
would construct a dataclass all the same and fail far away, in arithmetic. ``check_fields``
walks a dataclass instance and raises TypeError naming the first field whose value is not of its
declared type (scalars, ``X | None``, tuples and dicts of them, nested dataclasses); readers turn
that into their one-line error.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def check_fields(record: object, where: str = "") -> None:
    """Raise TypeError unless every field of dataclass ``record`` matches its annotation."""
    for field in dataclasses.fields(record):
        _check(getattr(record, field.name), _hints(type(record))[field.name], f"{where}{field.name}")


def _check(value: object, hint: object, where: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or hint is object:
        return
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return _check(value, option, where)
            except TypeError as e:
                errors.append(e)
        raise errors[0]
    if hint is type(None):
        if value is not None:
            raise TypeError(f"{where}: {value!r} where nothing belongs")
        return
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            raise TypeError(f"{where}: {type(value).__name__} where a {hint.__name__} belongs")
        check_fields(value, f"{where}.")
        return
    if origin in (tuple, list):
        if not isinstance(value, origin):
            raise TypeError(f"{where}: {value!r} where a {origin.__name__} belongs")
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):  # any length, one item type
            for k, item in enumerate(value):
                _check(item, args[0], f"{where}[{k}]")
        elif len(args) != len(value):
            raise TypeError(f"{where}: {len(value)} items where {len(args)} belong")
        else:
            for k, (item, arg) in enumerate(zip(value, args, strict=True)):
                _check(item, arg, f"{where}[{k}]")
        return
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: {value!r} where a mapping belongs")
        if args:
            for key, item in value.items():
                _check(key, args[0], f"{where} key")
                _check(item, args[1], f"{where}[{key!r}]")
        return
    if origin is not None:  # another generic (Mapping, Sequence, ...): its container type only
        if not isinstance(value, origin):
            raise TypeError(f"{where}: {value!r} where a {origin.__name__} belongs")
        return
    if isinstance(hint, type):
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return  # JSON writes 2.0 as 2
        if isinstance(value, bool) and hint is not bool:
            raise TypeError(f"{where}: {value!r} where a {hint.__name__} belongs")
        if not isinstance(value, hint):
            raise TypeError(f"{where}: {value!r} where a {hint.__name__} belongs")
