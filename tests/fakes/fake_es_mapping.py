"""Mapping checks of the fake Elasticsearch (``fake_elasticsearch``): why a document cannot be
indexed with a stream's mapping, as Elasticsearch answers per bulk item (400,
``document_parsing_exception``).

What is checked: every field that is not walked into is checked against
its mapped type (``check_value``: numbers, dates, IPs, booleans, constant_keyword), with
``dynamic: strict`` refusing unmapped fields and Elasticsearch's default dynamic mapping (or a
dynamic template) typing the others; objects are walked field by field, flattened fields take
anything. ``walk`` is that check, field by field; ``Checker`` gives the same answer cheaper.

``Checker`` (one per stream) memoizes per *object*: the key of an object is its keys and the
types of its values (and of its lists' items), one flat tuple built in C and hashed
shallowly (strings cache their hash, types hash by identity); its plan is what a document with
that object still has to check: the fields whose check depends on the value (a date string, a
number in a string, a constant_keyword, a field that fails) and the child objects to walk. A
child object under which nothing can fail whatever it holds (``_free``: only free types mapped
below it, no strict mapping, every string typed by a dynamic template of a free type) is not
looked at. So a decision document visits 6 of its 16 objects, and those through one dict
lookup each (~7 us per document, where the walk takes ~38).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from tests.fakes.fake_es_search import NUMERIC, Mapping_, check_value

FREE_TYPES = frozenset({"keyword", "text", "match_only_text", "wildcard", "flattened", "object"})
"""Mapped types ``check_value`` passes every value of."""

_Step = tuple[str, str, Any]
"""(key, path, what): what is a ``_NodePlans`` (walk into the object) or a ``Callable`` (a
cheap test of the value; False: check the field in full)."""
_MAX_PLANS = 10_000
"""Object shapes remembered per object path (beyond: checked field by field, not stored)."""
_MAX_SHAPES = 1_000
"""Document shapes compiled per stream (``_compile``; beyond: checked through the plans)."""
_MAX_SHAPES_PER_KEYS = 16
"""Of them, with the same top-level keys (each one is tried in turn)."""


def walk(node: Any, mapping: Mapping_, prefix: str = "") -> str | None:
    """The first problem of ``node`` with ``mapping``, field by field in document order (the
    reference the memoized ``Checker`` must agree with)."""
    if not isinstance(node, dict):
        return None
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and is_object(path, mapping):
            problem = walk(value, mapping, path + ".")
        else:
            problem = check_field(path, value, mapping)
        if problem is not None:
            return problem
    return None


class StrictRefusal(str):
    """A refusal by ``dynamic: strict``: Elasticsearch answers it as its own error type,
    ``strict_dynamic_mapping_exception`` (a ``document_parsing_exception`` in its class
    hierarchy), with the new field's name and the object it was introduced in:
    ``mapping set to strict, dynamic introduction of [hostname] within [agent] is not
    allowed`` (``[_doc]`` at the top level)."""


def is_object(path: str, mapping: Mapping_) -> bool:
    """Whether a dict at ``path`` is walked into (not flattened, not a leaf type)."""
    kind = mapping.field_type(path, None)
    if kind == "flattened":
        return False
    if kind is None and mapping.dynamic == "strict":
        return True
    return not kind or kind == "object"


def check_field(path: str, value: Any, mapping: Mapping_) -> str | None:
    """The mapping check of one field that is not walked into (Elasticsearch's per-field
    parsing: strict dynamic mapping, then the mapped type of the value or of each item)."""
    sample = None if isinstance(value, dict | list) else value
    kind = mapping.field_type(path, sample)
    if kind == "flattened":
        return None
    if kind is None and mapping.dynamic == "strict" and not isinstance(value, dict):
        parent, _, leaf = path.rpartition(".")
        return StrictRefusal(
            f"[1:1] mapping set to strict, dynamic introduction of [{leaf}] within "
            f"[{parent or '_doc'}] is not allowed"
        )
    if kind and kind != "object":
        for item in value if isinstance(value, list) else [value]:
            problem = check_value(kind, item, mapping.fields.get(path, {}))
            if problem:
                return f"failed to parse field [{path}] of type [{kind}]: {problem}"
    return None


class Checker:
    """The mapping checks of one stream, memoized per object shape (see the module)."""

    def __init__(self, mapping: Mapping_) -> None:
        self.mapping = mapping
        self.root = _NodePlans(self, "")
        self._free: dict[str, bool] = {}
        self._shapes: dict[tuple[str, ...], list[Callable[[dict[str, Any]], bool]]] = {}
        """Compiled document shapes (``_compile``) by the document's top-level keys."""
        self._learned = 0
        self._any: dict[str, bool] = {}

    def check(self, source: Any) -> str | None:
        """Why ``source`` cannot be indexed, or None (``walk``'s answer, cheaper)."""
        if type(source) is not dict:
            return None if not isinstance(source, dict) else self.root.check(source)
        shapes = self._shapes.get(tuple(source))
        if shapes is not None:
            for passes in shapes:
                if passes(source):
                    return None
        problem = self.root.check(source)
        if problem is None:
            self._learn(source)
        return problem

    def _learn(self, source: dict[str, Any]) -> None:
        """Compile the shape of a document that passed (``_compile``), kept by its keys."""
        if self._learned >= _MAX_SHAPES:
            return
        shapes = self._shapes.setdefault(tuple(source), [])
        if len(shapes) < _MAX_SHAPES_PER_KEYS:
            compiled = _compile(self, source)
            if compiled is not None:
                shapes.append(compiled)
            self._learned += 1  # (a shape without a compiled check is tried again, up to this)

    def any_value(self, path: str) -> bool:
        """Whether every value at ``path`` passes (``_any_value``), memoized."""
        found = self._any.get(path)
        if found is None:
            found = self._any[path] = _any_value(self, path)
        return found

    def free(self, path: str) -> bool:
        """Whether nothing below the object at ``path`` can fail, whatever it holds."""
        found = self._free.get(path)
        if found is None:
            found = self._free[path] = _free(self.mapping, path)
        return found


class _NodePlans:
    """The plans of the objects at one path, by the object's key."""

    __slots__ = ("checker", "plans", "prefix")

    def __init__(self, checker: Checker, prefix: str) -> None:
        self.checker = checker
        self.prefix = prefix
        self.plans: dict[tuple[Any, ...], list[_Step]] = {}

    def plan_of(self, node: dict[str, Any]) -> list[_Step]:
        """The plan of an object of ``node``'s shape (made the first time it is seen)."""
        # one flat tuple: the keys (strings), then their values' types, then the item types
        # of each list value (tuples); unambiguous, as no key is a type or a tuple
        key: tuple[Any, ...] = (*node, *map(type, node.values()))
        if list in key:  # a list's check depends on its items' types too
            key += tuple(tuple(map(type, v)) for v in node.values() if type(v) is list)
        plan = self.plans.get(key)
        if plan is None:
            plan = self._plan(node)
            if len(self.plans) < _MAX_PLANS:
                self.plans[key] = plan
        return plan

    def check(self, node: dict[str, Any]) -> str | None:
        for key_, path, what in self.plan_of(node):
            value = node[key_]
            if type(what) is _NodePlans:
                problem = what.check(value)
                if problem is not None:
                    return problem
            elif not what(value):
                problem = check_field(path, value, self.checker.mapping)
                if problem is not None:
                    return problem
        return None

    def _plan(self, node: dict[str, Any]) -> list[_Step]:
        """What an object of this shape has to check beyond its keys and types."""
        checker, mapping = self.checker, self.checker.mapping
        plan: list[_Step] = []
        for key, value in node.items():
            path = f"{self.prefix}{key}"
            if isinstance(value, dict) and is_object(path, mapping):
                if not checker.free(path):
                    plan.append((key, path, _NodePlans(checker, path + ".")))
            elif check_field(path, value, mapping) is not None or not _type_decides(
                path, value, mapping
            ):
                plan.append((key, path, _fast_check(path, value, mapping)))
        return plan


def _compile(checker: Checker, source: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A function that is True for a document of ``source``'s shape whose value-dependent
    fields pass their cheap test, in straight-line code (None: a shape whose plans have a
    field without a cheap test, left to the plans). Per object the plans walk into: its set of
    keys (one comparison; the top-level keys are the lookup's key already), the type of each
    value whose type can matter (not of a field that takes every value, ``any_value``), the
    item types of such a list, then the plan's tests (a date string's ISO parse, cached; a
    constant_keyword's value). Order does not matter: whether the walk finds a problem does
    not depend on the order of the fields, only which one it names first, and a document that
    has one is always checked by the plans. So True only where ``Checker.root.check`` (and
    ``walk``) finds nothing; anything else is False and goes through the plans. The source
    text holds names only: keys, types and values are constants of its namespace (a key is
    data, never code)."""
    mapping = checker.mapping
    namespace: dict[str, Any] = {"iso": _iso_date, "dates": _ISO_DATES}
    body: list[str] = []

    def const(value: Any) -> str:
        name = f"c{len(namespace)}"
        namespace[name] = value
        return name

    def visit(var: str, plans: _NodePlans, node: dict[str, Any], top: bool) -> bool:
        if not top:  # the top-level keys are the key the function is found by
            body.append(f"if {var}.keys() != {const(frozenset(node))}: return False")
        planned = {key: (path, what) for key, path, what in plans.plan_of(node)}
        for key, value in node.items():
            got = f"{var}[{const(key)}]"
            path, what = planned.get(key, (plans.prefix + key, None))
            if type(what) is _NodePlans:
                child = f"o{len(namespace)}"
                body.append(f"{child} = {got}")
                body.append(f"if type({child}) is not dict: return False")
                if not visit(child, what, value, False):
                    return False
                continue
            if what is not None:
                test, expected = _fast_test(path, value, mapping)
                if test == "none":
                    return False
                if test == "date":
                    body.append(f"v = {got}")
                    known = "(dates.get(v) or iso(v))"  # a hit without a call
                    body.append(f"if type(v) is not str or not {known}: return False")
                    continue
                if test == "equals":
                    body.append(f"if {got} != {const(expected)}: return False")
                    continue
                # "any": every value of this type passes, as for the fields not planned
            if checker.any_value(path):
                continue
            body.append(f"v = {got}")
            body.append(f"if type(v) is not {const(type(value))}: return False")
            if type(value) is list:
                items = const(tuple(map(type, value)))
                body.append(f"if tuple(map(type, v)) != {items}: return False")
        return True

    if not visit("d", checker.root, source, True):
        return None
    code = "def passes(d):\n" + "".join(f"    {line}\n" for line in [*body, "return True"])
    exec(compile(code, "<fake_es_mapping shape>", "exec"), namespace)  # noqa: S102
    passes: Callable[[dict[str, Any]], bool] = namespace["passes"]
    return passes


def _any_value(checker: Checker, path: str) -> bool:
    """Whether the field at ``path`` passes its check whatever its value (of any type, a list
    or an object too), so that a shape need not even fix its type: its mapped type, for a
    value of every JSON type, is one ``check_value`` takes every value of (not guessed from
    the value: ``by_value``), or it is an object under which nothing can fail (``free``; a
    value that is no object is not checked under an object mapping)."""
    mapping = checker.mapping
    if any(mapping.by_value(path, kind) for kind in (bool, int, float, str)):
        return False
    kinds = {mapping.field_type(path, sample) for sample in (None, False, 0, 0.5, "x")}
    if kinds <= FREE_TYPES - {"object"}:
        return True
    return kinds == {"object"} and checker.free(path)


def _free(mapping: Mapping_, path: str) -> bool:
    """Whether no field below the object at ``path`` can fail its check (conservative: False
    when in doubt). Nothing is strict; every field mapped below it, and its multi-fields, has a
    free type; every dynamic template maps to a free type, and one types every string below
    it (else a date-like string would be a ``date`` by Elasticsearch's date detection)."""
    if mapping.dynamic == "strict":
        return False
    below = path + "."
    for name, spec in mapping.fields.items():
        if name == path or name.startswith(below):  # ``name.sub`` of a multi-field is typed
            subfields = spec.get("fields", {}).values()
            if any(f.get("type", "keyword") not in FREE_TYPES for f in subfields):
                return False
        if name.startswith(below) and spec.get("type", "object") not in FREE_TYPES:
            return False
    strings_typed = False
    for pattern, by_path, json_kind, spec in mapping.dynamic_templates:
        if "type" not in spec:
            continue
        if spec["type"] not in FREE_TYPES:
            return False
        if json_kind in ("string", "*") and pattern.endswith("*"):
            stem = pattern[:-1]  # a literal prefix matches every path below it
            literal = not any(c in stem for c in "*?[")
            covers = below.startswith(stem) if by_path else stem == ""
            strings_typed = strings_typed or (literal and covers)
    return strings_typed


_ISO_DATES: dict[str, bool] = {}
"""``_iso_date``'s answers (a plain dict: a hit is one ``get``, cheaper than ``lru_cache``)."""
_MAX_ISO_DATES = 8192


def _iso_date(value: str) -> bool:
    """Whether ``value`` is an ISO 8601 date ``check_value`` takes (the common case, cached:
    the documents of one cycle share their timestamps; forgotten all at once when full)."""
    found = _ISO_DATES.get(value)
    if found is not None:
        return found
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        found = False
    else:
        found = True
    if len(_ISO_DATES) >= _MAX_ISO_DATES:
        _ISO_DATES.clear()
    _ISO_DATES[value] = found
    return found


def _fast_test(path: str, value: Any, mapping: Mapping_) -> tuple[str, Any]:
    """The cheap test of a field whose check depends on its value (``_fast_check``): "date"
    (an ISO 8601 string, ``_iso_date``), "any" (every value of its type passes), "equals"
    (a constant_keyword's value) or "none" (always checked in full)."""
    sample = None if isinstance(value, dict | list) else value
    kind = mapping.field_type(path, sample)
    by_value = sample is not None and mapping.by_value(path, type(sample))
    if kind == "date" and isinstance(sample, str) and not by_value:
        return "date", None
    spec = mapping.fields.get(path, {})
    if kind == "constant_keyword" and "value" not in spec:
        return "any", None  # its first value would set it: any value passes
    expected = spec.get("value")
    if kind == "constant_keyword" and isinstance(expected, str):
        return "equals", expected
    return "none", None


def _fast_check(path: str, value: Any, mapping: Mapping_) -> Callable[[Any], bool]:
    """A cheap test that a value of this field certainly passes (when it says no, the field is
    checked in full by ``check_field``, which finds the problem and its message)."""
    test, expected = _fast_test(path, value, mapping)
    if test == "date":
        return lambda v: type(v) is str and _iso_date(v)
    if test == "any":
        return lambda v: True
    if test == "equals":
        return lambda v: v == expected
    return lambda v: False


def _type_decides(path: str, value: Any, mapping: Mapping_) -> bool:
    """Whether a field that passed its check passes for every value of the same type (so an
    object of the same shape need not check it again)."""
    sample = None if isinstance(value, dict | list) else value
    if sample is not None and mapping.by_value(path, type(sample)):
        return isinstance(sample, bool | int | float)  # strings: "date" or "text" by value
    kind = mapping.field_type(path, sample)
    if kind is None or kind in FREE_TYPES:
        return kind is not None or mapping.dynamic != "strict" or isinstance(value, dict)
    items = value if isinstance(value, list) else [value]
    return all(_value_free(kind, item) for item in items)


def _value_free(kind: str, item: Any) -> bool:
    """Whether ``check_value(kind, item)`` depends only on the type of ``item``."""
    if item is None or isinstance(item, dict):
        return True
    if kind in ("long", "integer", "short", "byte"):
        return isinstance(item, int) and not isinstance(item, bool)
    if kind in NUMERIC:
        return isinstance(item, int | float)
    if kind == "date":
        return isinstance(item, int | float) and not isinstance(item, bool)
    if kind == "boolean":
        return isinstance(item, bool)
    return kind not in ("ip", "constant_keyword") and kind in FREE_TYPES
