"""The JSON shape of the record dataclasses, derived from their fields: ``to_dict`` and
``from_dict`` written once here for every record class.

A record class is a dataclass that derives from ``Shaped`` and is decorated with ``@shaped``.
Its JSON object has one key per field, in field order, plus its ``derived`` properties (computed
keys, each written right after the field it names, as they are). A field's value is written as
its annotation says:

- ``datetime`` (or ``datetime | None``): RFC 3339 UTC with microseconds and ``Z`` (``rfc3339``);
- another ``Shaped`` class (or ``... | None``): its own ``to_dict()``;
- ``list[<Shaped class>]``: their ``to_dict()`` in list order, or sorted by the attribute that
  the field's ``sorted_by`` metadata names;
- a field with ``AS_STR`` metadata: ``str(value)`` (``StrEnum`` members become plain strings);
- anything else: as it is (JSON values: str, int, float, bool, None, lists, dicts).

``to_dict`` is compiled once per class from its keys (as ``dataclasses`` writes ``__init__``):
one dict display of attribute reads and converter calls, the work a hand-written one does
(``to_dict_source`` shows it). ``from_dict`` is the inverse: derived keys are ignored, times
parsed with ``parse_rfc3339``, nested records rebuilt with their own ``from_dict``. A key
missing from the dict raises ``KeyError``, unless the class is ``@shaped(lenient=True)`` or the
field has ``ADDED`` metadata: then it takes the field's default (records written before the
field existed).

Pure: no I/O, no third-party imports.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from operator import attrgetter
from typing import Any, ClassVar, Self

#: Field metadata: the value is written as ``str(value)``.
AS_STR: Mapping[str, Any] = types.MappingProxyType({"as_str": True})
#: Field metadata: a field added to a strict class after records without it were written (the
#: journal's entries of an older version): ``from_dict`` gives it its default when the key is missing.
ADDED: Mapping[str, Any] = types.MappingProxyType({"added": True})


def sorted_by(attribute: str) -> Mapping[str, Any]:
    """Field metadata for a ``list[<Shaped class>]``: written sorted by ``attribute`` (stable)."""
    return types.MappingProxyType({"sorted_by": attribute})


def rfc3339(ts: datetime | None) -> str | None:
    """Formats an aware datetime as RFC 3339 UTC with microseconds and a ``Z`` suffix (the year
    in four digits: ``strftime("%Y")`` gives ``1`` for year 1 on Linux)."""
    if ts is None:
        return None
    u = ts.astimezone(timezone.utc)
    return f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond:06d}Z"


#: A fraction of a second finer than microseconds (it would be cut off unseen).
_FRACTION_TOO_FINE = re.compile(r"\.\d{7,}")


def parse_rfc3339(value: str) -> datetime:
    """The aware UTC datetime of an RFC 3339 / ISO 8601 time; ``ValueError`` when it has no
    offset (a time without one is ambiguous evidence), does not parse, or is out of range in UTC."""
    if not isinstance(value, str):
        raise TypeError(f"a time must be a string, not {type(value).__name__}")
    value = value.upper()  # RFC 3339 §5.6: "t" and "z" may be lower case
    if _FRACTION_TOO_FINE.search(value):
        raise ValueError(f"more than 6 digits of a second (the store keeps microseconds): {value!r}")
    when = datetime.fromisoformat(value)
    if when.tzinfo is None:
        raise ValueError(f"time without offset: {value!r}")
    try:
        return when.astimezone(timezone.utc)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00, before year 1 in UTC
        raise ValueError(f"time out of range in UTC: {value!r}") from None


class Kind(enum.Enum):
    """How a key's value is written and read."""

    VALUE = "value"  # as it is
    TIME = "time"  # datetime <-> RFC 3339 string
    RECORD = "record"  # a nested Shaped record <-> its dict
    RECORDS = "records"  # a list of Shaped records <-> a list of dicts
    DERIVED = "derived"  # a computed property: written, never read


@dataclasses.dataclass(frozen=True, slots=True)
class Key:
    """One key of a shaped class's JSON object: its ``name`` (the field's or the property's),
    ``kind``, whether it may be ``None`` (``optional``), the nested class of a ``RECORD`` /
    ``RECORDS`` key (``record``), the attribute a ``RECORDS`` list is sorted by (``sort_key``),
    whether it is written as ``str(value)`` (``as_str``), and what ``from_dict`` gives it when
    the key is missing (``missing``: a callable making the value; ``None``: ``KeyError``)."""

    name: str
    kind: Kind
    optional: bool = False
    record: type[Shaped] | None = None
    sort_key: str | None = None
    as_str: bool = False
    missing: Callable[[], Any] | None = None


class Derived(property):
    """A computed key: a read-only property that ``to_dict`` writes right after field ``after``."""

    after: str


def derived(after: str) -> Callable[[Callable[[Any], Any]], Derived]:
    """Decorates a method as a ``Derived`` property written after field ``after``."""

    def make(fget: Callable[[Any], Any]) -> Derived:
        prop = Derived(fget)
        prop.after = after
        return prop

    return make


class Shaped:
    """Base of the record dataclasses: ``to_dict``/``from_dict`` derived from the fields by
    ``@shaped`` (module docstring)."""

    __slots__ = ()
    __shape__: ClassVar[tuple[Key, ...]] = ()
    to_dict_source: ClassVar[str] = ""
    _readers: ClassVar[tuple[tuple[str, Callable[[], Any] | None, Callable[[Any], Any] | None], ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict of this record, keys in declaration order (replaced by the
        compiled one of ``@shaped``; raises ``TypeError`` on a class that is not shaped)."""
        raise TypeError(f"{type(self).__name__} is not @shaped")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """The inverse of ``to_dict`` (derived keys ignored). Raises ``KeyError`` on a missing
        key (a ``lenient`` class takes the default), ``ValueError``/``TypeError`` on a bad value."""
        kwargs: dict[str, Any] = {}
        for name, missing, convert in cls._readers:
            if name in d:
                value = d[name]
            elif missing is not None:
                value = missing()
            else:
                raise KeyError(name)
            kwargs[name] = value if convert is None else convert(value)
        return cls(**kwargs)


def shaped(cls: type | None = None, *, lenient: bool = False) -> Any:
    """Class decorator (above ``@dataclass``): derives the class's ``Key``s from its fields and
    ``Derived`` properties and prepares ``to_dict``/``from_dict``. ``lenient``: ``from_dict``
    gives a missing key the field's default. Raises ``TypeError`` on a class that is not a
    ``Shaped`` dataclass or a ``Derived`` placed after no field."""

    def wrap(cls: type) -> type:
        if not (dataclasses.is_dataclass(cls) and issubclass(cls, Shaped)):
            raise TypeError(f"{cls.__name__}: @shaped needs a dataclass deriving from Shaped")
        keys = _keys_of(cls, lenient)
        cls.__shape__ = keys
        cls.to_dict_source, cls.to_dict = _compile_to_dict(cls, keys)  # type: ignore[method-assign]
        cls._readers = tuple((k.name, k.missing, _reader(k)) for k in keys if k.kind is not Kind.DERIVED)
        return cls

    return wrap if cls is None else wrap(cls)


def keys(cls: type[Shaped]) -> tuple[Key, ...]:
    """The ``Key``s of a shaped class, in JSON order."""
    return cls.__shape__


def _keys_of(cls: type, lenient: bool) -> tuple[Key, ...]:
    hints = typing.get_type_hints(cls)
    props = {name: p for name, p in vars(cls).items() if isinstance(p, Derived)}
    names = {f.name for f in dataclasses.fields(cls)}
    for name, prop in props.items():
        if prop.after not in names:
            raise TypeError(f"{cls.__name__}.{name}: derived after {prop.after!r}, which is not a field")
    out: list[Key] = []
    for f in dataclasses.fields(cls):
        kind, record, optional = _kind(hints[f.name])
        out.append(
            Key(
                f.name,
                kind,
                optional=optional,
                record=record,
                sort_key=f.metadata.get("sorted_by"),
                as_str=bool(f.metadata.get("as_str")),
                missing=_default(f) if lenient or f.metadata.get("added") else None,
            )
        )
        for name, prop in props.items():
            if prop.after == f.name:
                _, _, optional = _kind(typing.get_type_hints(prop.fget).get("return", Any))
                out.append(Key(name, Kind.DERIVED, optional=optional))
    return tuple(out)


def _default(f: dataclasses.Field[Any]) -> Callable[[], Any] | None:
    """A callable making the field's default (a fresh one for a ``default_factory``), or ``None``."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    if f.default is not dataclasses.MISSING:
        value = f.default
        return lambda: value
    return None


def _kind(hint: Any) -> tuple[Kind, type[Shaped] | None, bool]:
    """(kind, nested record class, optional) of a field annotation."""
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
    if hint is datetime:
        return Kind.TIME, None, optional
    if isinstance(hint, type) and issubclass(hint, Shaped):
        return Kind.RECORD, hint, optional
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (Any,)
        if isinstance(item, type) and issubclass(item, Shaped):
            return Kind.RECORDS, item, optional
    return Kind.VALUE, None, optional


def compile_function(name: str, params: str, result: str, env: dict[str, Any]) -> tuple[str, Callable[..., Any]]:
    """(source, function) of ``def name(params): return result``, compiled with the globals
    ``env``. For mappings derived from field declarations: ``result`` is built from field and
    column names (identifiers) and ``repr`` of keys; values are never pasted into it."""
    source = f"def {name}({params}):\n    return {result}\n"
    namespace = dict(env)
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - see the docstring
    return source, namespace[name]


def dict_display(entries: list[tuple[str, str]]) -> str:
    """A dict display of ``(key, expression)`` pairs, one per line."""
    return "{\n" + "".join(f"        {key!r}: {expression},\n" for key, expression in entries) + "    }"


def _compile_to_dict(cls: type, keys: tuple[Key, ...]) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    """(source, function) of ``cls.to_dict``: a dict display with one entry per key."""
    env: dict[str, Any] = {"_rfc3339": rfc3339, "_sorted": sorted, "_str": str}
    entries = [(k.name, _expression(k, f"self.{k.name}", env)) for k in keys]
    source, fn = compile_function("to_dict", "self", dict_display(entries), env)
    fn.__qualname__ = f"{cls.__qualname__}.to_dict"
    fn.__doc__ = "The JSON-ready dict of this record, keys in declaration order."
    return source, fn


def _expression(key: Key, value: str, env: dict[str, Any]) -> str:
    """The expression ``to_dict`` writes for ``key``, whose value is the expression ``value``."""
    if key.kind is Kind.TIME:
        return f"_rfc3339({value})"
    if key.kind is Kind.RECORD:
        return f"None if {value} is None else {value}.to_dict()" if key.optional else f"{value}.to_dict()"
    if key.kind is Kind.RECORDS:
        if key.sort_key is None:
            return f"[x.to_dict() for x in {value}]"
        env[f"_by_{key.name}"] = attrgetter(key.sort_key)
        return f"[x.to_dict() for x in _sorted({value}, key=_by_{key.name})]"
    if key.as_str:
        return f"None if {value} is None else _str({value})" if key.optional else f"_str({value})"
    return value


def _reader(key: Key) -> Callable[[Any], Any] | None:
    """The converter ``from_dict`` applies to the key's value (``None`` passes through an
    optional key's), or ``None`` (taken as it is)."""
    record = key.record
    convert: Callable[[Any], Any]
    if key.kind is Kind.TIME:
        convert = parse_rfc3339
    elif key.kind is Kind.RECORD and record is not None:
        convert = record.from_dict
    elif key.kind is Kind.RECORDS and record is not None:
        one = record.from_dict

        def convert(v: Any) -> Any:
            return [one(x) for x in v]

    else:
        return None
    return (lambda v: None if v is None else convert(v)) if key.optional else convert
