"""SQL92 property filters: RocketMQ's grammar and Java's type rules, and a hypothesis test against an
independent reference evaluator (a literal transcription of RocketMQ's expression classes, with
Java's string conversions written out by hand in a table, not computed by the code under test)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.filter import ExpressionType, FilterError, FilterExpression, build_filter
from broker.filter.sql92 import compile_sql92, parse_sql92, tokenize


def matches(expr: str, **props: str) -> bool:
    return compile_sql92(expr)(props)


# ---- examples from RocketMQ's docs and tests -------------------------------------------------

def test_rocketmq_documented_example():
    expr = "(TAGS is not null and TAGS in ('TagA', 'TagB')) and (a is not null and a between 0 and 3)"
    assert matches(expr, TAGS="TagA", a="0")
    assert matches(expr, TAGS="TagB", a="3")
    assert not matches(expr, TAGS="TagC", a="1")
    assert not matches(expr, TAGS="TagA", a="4")
    assert not matches(expr, TAGS="TagA")  # a is null
    assert not matches(expr, a="1")  # TAGS is null


def test_numbers_compare_numerically_with_the_literals_type():
    assert matches("a > 5", a="6") and not matches("a > 5", a="5")
    assert matches("a >= 5.0", a="5") and matches("a < 5.5", a="5.25")
    # Integer literal: the property must parse as a 32-bit Integer, else no match (an error)
    assert not matches("a > 5", a="5.5")
    assert not matches("a > 5", a="3000000000")
    assert not matches("a > 5L", a="3000000000")  # 5L fits 32 bits: still an Integer
    assert matches("a > 2147483648", a="3000000000") and matches("a > 2147483648L", a="3000000000")
    assert matches("a = -3", a="-3") and matches("a = 7", a="+7")
    assert not matches("a > 5", a="abc") and not matches("a <> 5", a="abc")


def test_two_properties_compare_as_doubles_and_strings_only_by_equality():
    assert matches("a > b", a="10", b="9.5")
    assert not matches("a > b", a="x", b="y")
    assert matches("a = b", a="x", b="x") and not matches("a = b", a="x", b="y")
    assert matches("a = b")  # both absent: null = null is TRUE in ActiveMQ's equality
    with pytest.raises(FilterError):
        parse_sql92("a > 'x'")


def test_three_valued_logic():
    assert not matches("a = 1")  # null → no match
    assert not matches("NOT (a = 1)")  # NOT null is null
    assert matches("a = 1 OR b = 'x'", b="x")  # null OR TRUE
    assert not matches("a = 1 AND b = 'x'", b="x")  # null AND TRUE = null
    assert matches("a IS NULL") and not matches("a IS NOT NULL")
    assert matches("a IS NOT NULL", a="")


def test_errors_abort_the_whole_expression_in_evaluation_order():
    # the left side raises before OR can look at the right one (Java evaluates left first)
    assert not matches("a = 5 OR b = 'x'", a="abc", b="x")
    # short circuit: the erroneous side is never evaluated
    assert matches("b = 'x' OR a = 5", a="abc", b="x")


def test_text_operators():
    assert matches("a CONTAINS 'bc'", a="abcd") and not matches("a NOT CONTAINS 'bc'", a="abcd")
    assert matches("a STARTSWITH 'ab'", a="abcd") and matches("a ENDSWITH 'cd'", a="abcd")
    assert matches("a NOT STARTSWITH 'x'", a="abcd") and matches("a NOT ENDSWITH 'x'", a="abcd")
    assert not matches("a CONTAINS ''", a="abc")  # an empty search is FALSE, as RocketMQ's
    assert not matches("a NOT CONTAINS 'x'")  # null is FALSE for these, not null


def test_booleans_and_bare_properties():
    assert matches("a = TRUE", a="true") and matches("a = TRUE", a="TRUE")
    assert matches("a = FALSE", a="yes")  # Boolean.valueOf: anything but "true" is false
    assert not matches("a", a="true")  # a bare property is cast: a string is never Boolean.TRUE
    assert matches("NOT a", a="true")
    assert matches("TRUE") and not matches("FALSE") and not matches("NULL")


def test_doubles_follow_java_compare_to():
    assert matches("a = 1.5", a="1.5f") and matches("a = 1.0", a="0x1p0")
    assert matches("a > 1.0", a="NaN")  # NaN is above everything in Double.compareTo
    assert matches("a < 1.0", a="-Infinity")
    assert matches("a < 1E-300", a="-0")  # -0.0 < 0.0 < 1e-300
    assert matches("a = 1.0", a=" 1 ")  # Double.valueOf trims


def test_in_and_not_in():
    assert matches("a IN ('x', 'y')", a="y") and not matches("a IN ('x', 'y')", a="z")
    assert matches("a NOT IN ('x')", a="z") and not matches("a NOT IN ('x')")
    assert matches("a IN ('it''s')", a="it's")


def test_precedence():
    # AND binds tighter than OR; NOT applies to the unary expression only
    assert matches("a = 1 OR a = 2 AND b = 3", a="1")
    assert not matches("(a = 1 OR a = 2) AND b = 3", a="1")
    assert matches("NOT a = 1 OR TRUE")
    assert matches("a BETWEEN 1 AND 3 AND b = 'x'", a="2", b="x")
    assert matches("a NOT BETWEEN 1 AND 3", a="4") and not matches("a NOT BETWEEN 1 AND 3", a="2")


def test_lexical_rules():
    assert [t[0] for t in tokenize("a=1 /* c */ AND b<>'x'")] == ["id", "=", "decimal", "AND", "id", "<>",
                                                                 "string", "eof"]
    assert matches("a = 1 -- trailing comment\n", a="1")
    assert matches("A = 1 and B = 2", A="1", B="2")  # keywords any case; names exactly
    assert not matches("A = 1", a="1")
    assert matches("$x_1 = 'v'", **{"$x_1": "v"})
    for bad in ("a = 1 --", "a = 0L", "a = 01", "a @ 1", "a = 'open", "a = 1 b", "", "   "):
        with pytest.raises(FilterError):
            parse_sql92(bad)


@pytest.mark.parametrize("bad", [
    "a = NULL", "NULL <> a", "TRUE = 1", "a > 'x'", "a > TRUE", "(a > 1) > 2", "a BETWEEN 3 AND 1",
    "a BETWEEN NULL AND 1", "5 IN ('x')", "5", "'x'", "a AND 5", "NOT 5", "0.0 < a", "1e400 > a",
    "a > 9223372036854775808", "a IN ()", "a IN (1)",
])
def test_refused_at_parse_time(bad):
    with pytest.raises(FilterError):
        parse_sql92(bad)


def test_build_filter_types_and_property_filter_switch():
    f = build_filter("SQL92", "a = 1", True)
    assert f.expression_type == "SQL92" and f.accepts_code(123) and f.matches({"a": "1"})
    assert build_filter("SQL", "a = 1", True).expression_type == "SQL92"  # gRPC's spelling
    with pytest.raises(FilterError, match="enablePropertyFilter"):
        build_filter(ExpressionType.SQL92, "a = 1", False)
    with pytest.raises(FilterError):
        build_filter("REGEX", "a", True)
    assert FilterExpression().build(False).match_all


# ---- the reference evaluator -----------------------------------------------------------------

class ParseRefused(Exception):
    pass


class EvalFailed(Exception):
    pass


ERR = object()
INT_MAX, LONG_MAX = 2**31 - 1, 2**63 - 1
# property value -> (Integer.valueOf, Long.valueOf, Double.valueOf, Boolean.valueOf), worked out by
# hand from the Java documentation; ERR = NumberFormatException.
JAVA = {
    "0": (0, 0, 0.0, False), "-3": (-3, -3, -3.0, False), "42": (42, 42, 42.0, False),
    "+7": (7, 7, 7.0, False), "2147483647": (INT_MAX, INT_MAX, 2147483647.0, False),
    "2147483648": (ERR, 2147483648, 2147483648.0, False),
    "-2147483648": (-(2**31), -(2**31), -2147483648.0, False),
    "9223372036854775807": (ERR, LONG_MAX, 9.223372036854776e18, False),
    "9223372036854775808": (ERR, ERR, 9.223372036854776e18, False),
    "1.5": (ERR, ERR, 1.5, False), "-0": (0, 0, -0.0, False), "-0.0": (ERR, ERR, -0.0, False),
    "NaN": (ERR, ERR, math.nan, False), "Infinity": (ERR, ERR, math.inf, False),
    "-Infinity": (ERR, ERR, -math.inf, False), "1e3": (ERR, ERR, 1000.0, False),
    "2.5f": (ERR, ERR, 2.5, False), " 3 ": (ERR, ERR, 3.0, False), "0x10": (ERR, ERR, ERR, False),
    "abc": (ERR, ERR, ERR, False), "true": (ERR, ERR, ERR, True), "TRUE": (ERR, ERR, ERR, True),
    "TagA": (ERR, ERR, ERR, False), "": (ERR, ERR, ERR, False), "x y": (ERR, ERR, ERR, False),
    "x": (ERR, ERR, ERR, False), "it's": (ERR, ERR, ERR, False),
}


@dataclass
class JVal:
    cls: str  # S Z I J D
    v: Any


def jv(value: Any) -> JVal | None:
    if value is None:
        return None
    if isinstance(value, JVal):
        return value
    return JVal("S", value)


def conv(s: str, cls: str) -> JVal:
    idx = {"I": 0, "J": 1, "D": 2, "Z": 3}[cls]
    out = JAVA[s][idx]
    if out is ERR:
        raise EvalFailed(f"{s!r} -> {cls}")
    return JVal(cls, out)


def double_cmp(a: float, b: float) -> int:
    if math.isnan(a) or math.isnan(b):
        return 0 if math.isnan(a) and math.isnan(b) else (1 if math.isnan(a) else -1)
    if a == b == 0.0:
        sa, sb = math.copysign(1, a), math.copysign(1, b)
        return 0 if sa == sb else (-1 if sa < sb else 1)
    return (a > b) - (a < b)


def same_class_cmp(a: JVal, b: JVal) -> int:
    if a.cls == "D":
        return double_cmp(a.v, b.v)
    if a.cls == "S":
        return 0 if a.v == b.v else (-1 if a.v.encode("utf-16-be") < b.v.encode("utf-16-be") else 1)
    return (a.v > b.v) - (a.v < b.v)


def ref_compare(lv: JVal, rv: JVal) -> int:
    """ComparisonExpression.__compare, branch by branch."""
    if lv.cls != rv.cls:
        table = {
            ("Z", "S"): "raise", ("I", "J"): ("L", "J"), ("I", "D"): ("L", "D"), ("I", "S"): ("R", "I"),
            ("J", "I"): ("R", "J"), ("J", "D"): ("L", "D"), ("J", "S"): ("R", "J"),
            ("D", "I"): ("R", "D"), ("D", "J"): ("R", "D"), ("D", "S"): ("R", "D"),
            ("S", "Z"): ("L", "Z"), ("S", "I"): ("L", "I"), ("S", "J"): ("L", "J"), ("S", "D"): ("L", "D"),
        }
        rule = table.get((lv.cls, rv.cls))
        if rule == "raise":
            raise EvalFailed("ClassCastException")
        if rule is None:
            return -1
        side, to = rule
        if side == "L":
            lv = conv(lv.v, to) if lv.cls == "S" else JVal(to, float(lv.v) if to == "D" else lv.v)
        else:
            rv = conv(rv.v, to) if rv.cls == "S" else JVal(to, float(rv.v) if to == "D" else rv.v)
    return same_class_cmp(lv, rv)


class E:
    boolean = False
    constant = False

    def ev(self, p: dict[str, str]) -> Any:
        raise NotImplementedError


@dataclass
class Const(E):
    val: JVal | None
    constant = True

    @property
    def boolean(self) -> bool:  # BooleanConstantExpression: TRUE, FALSE, NULL
        return self.val is None or self.val.cls == "Z"

    def ev(self, p):
        return self.val

    def text(self) -> str:
        v = self.val
        if v is None:
            return "NULL"
        if v.cls == "Z":
            return "TRUE" if v.v else "FALSE"
        if v.cls == "S":
            return "'" + v.v.replace("'", "''") + "'"
        if v.cls == "J" and v.v <= LONG_MAX:
            return f"{v.v}L" if v.v % 2 else str(v.v)
        return repr(v.v) if v.cls == "D" else str(v.v)


@dataclass
class Prop(E):
    name: str

    def ev(self, p):
        return jv(p.get(self.name))

    def text(self):
        return self.name


@dataclass
class Neg(E):
    x: E

    def ev(self, p):
        v = self.x.ev(p)
        if v is None or v.cls not in "IJD":
            return None
        return JVal(v.cls, -v.v)


@dataclass
class Cast(E):
    x: E
    boolean = True

    def ev(self, p):
        v = self.x.ev(p)
        if v is None:
            return None
        return JVal("Z", v.v) if v.cls == "Z" else JVal("Z", False)


def as_bool(e: E) -> E:
    if e.boolean:
        return e
    if isinstance(e, Prop):
        return Cast(e)
    raise ParseRefused("not boolean")


@dataclass
class Not(E):
    x: E
    boolean = True

    def __post_init__(self):
        self.x = as_bool(self.x)

    def ev(self, p):
        v = self.x.ev(p)
        return None if v is None else JVal("Z", not v.v)


@dataclass
class Logic(E):
    op: str
    left: E
    right: E
    boolean = True

    def __post_init__(self):
        self.left, self.right = as_bool(self.left), as_bool(self.right)

    def ev(self, p):
        stop = self.op == "OR"  # OR stops on TRUE, AND on FALSE
        lv = self.left.ev(p)
        if lv is not None and lv.v is stop:
            return JVal("Z", stop)
        rv = self.right.ev(p)
        if rv is not None and rv.v is stop:
            return JVal("Z", stop)
        if lv is None or rv is None:
            return None
        return JVal("Z", not stop)


@dataclass
class Cmp(E):
    op: str  # = <> > >= < <=
    left: E
    right: E
    boolean = True

    def __post_init__(self):
        if self.op in ("=", "<>"):
            for side in (self.left, self.right):
                if side.constant and side.val is None:
                    raise ParseRefused("NULL in =")
            if self.left.constant and self.right.constant and self.left.boolean and not self.right.boolean:
                raise ParseRefused("boolean = non-boolean")
        else:
            for side in (self.left, self.right):
                if side.constant and (side.val is None or side.val.cls not in "IJD"):
                    raise ParseRefused("non-number in <")
                if not side.constant and side.boolean:
                    raise ParseRefused("boolean in <")

    def ev(self, p):
        if self.op in ("=", "<>"):
            lv, rv = self.left.ev(p), self.right.ev(p)
            if (lv is None) != (rv is None):
                eq = None if lv is None else JVal("Z", False)
            elif lv is None:
                eq = JVal("Z", True)
            elif lv.cls == rv.cls and (same_class_cmp(lv, rv) == 0):
                eq = JVal("Z", True)
            else:
                eq = JVal("Z", ref_compare(lv, rv) == 0)
            if self.op == "=" or eq is None:
                return eq
            return JVal("Z", not eq.v)
        lv = self.left.ev(p)
        if lv is None:
            return None
        rv = self.right.ev(p)
        if rv is None:
            return None
        if lv.cls == rv.cls == "S":
            lv, rv = conv(lv.v, "D"), conv(rv.v, "D")
        c = ref_compare(lv, rv)
        return JVal("Z", {">": c > 0, ">=": c >= 0, "<": c < 0, "<=": c <= 0}[self.op])


def between(v: E, lo: E, hi: E, negated: bool) -> E:
    if not negated and lo.constant and hi.constant:
        if lo.val is None or hi.val is None:
            raise ParseRefused("NULL bound")
        try:
            if ref_compare(hi.val, lo.val) < 0:
                raise ParseRefused("bounds out of order")
        except EvalFailed:
            raise ParseRefused("bounds not comparable") from None
    if negated:
        return Logic("OR", Cmp("<", v, lo), Cmp(">", v, hi))
    return Logic("AND", Cmp(">=", v, lo), Cmp("<=", v, hi))


@dataclass
class Between(E):
    v: E
    lo: E
    hi: E
    negated: bool
    boolean = True

    def __post_init__(self):
        self.impl = between(self.v, self.lo, self.hi, self.negated)

    def ev(self, p):
        return self.impl.ev(p)


@dataclass
class In(E):
    x: E
    items: list[str]
    negated: bool
    boolean = True

    def __post_init__(self):
        if not isinstance(self.x, Prop):
            raise ParseRefused("IN needs a property")

    def ev(self, p):
        v = self.x.ev(p)
        if v is None or v.cls != "S":
            return None
        return JVal("Z", (v.v in self.items) != self.negated)


@dataclass
class Text(E):
    op: str
    x: E
    search: str
    negated: bool
    boolean = True

    def ev(self, p):
        if not self.search:
            return JVal("Z", False)
        v = self.x.ev(p)
        if v is None or v.cls != "S":
            return JVal("Z", False)
        hit = {"CONTAINS": self.search in v.v, "STARTSWITH": v.v.startswith(self.search),
               "ENDSWITH": v.v.endswith(self.search)}[self.op]
        return JVal("Z", hit != self.negated)


@dataclass
class IsNull(E):
    x: E
    negated: bool
    boolean = True

    def ev(self, p):
        return JVal("Z", (self.x.ev(p) is None) != self.negated)


def ref_matches(tree: E, props: dict[str, str]) -> bool:
    try:
        v = as_bool(tree).ev(props)
    except EvalFailed:
        return False
    return v is not None and v.cls == "Z" and v.v is True


# ---- generators ------------------------------------------------------------------------------

NAMES = ["a", "b", "TAGS"]
COMPARISONS = ["=", "<>", ">", ">=", "<", "<="]
WORDS = ["x", "TagA", "it's", "", "abc", "true"]
constants = st.one_of(
    st.integers(0, INT_MAX).map(lambda n: JVal("I", n)),
    st.integers(INT_MAX + 1, LONG_MAX).map(lambda n: JVal("J", n)),
    st.floats(min_value=5e-324, max_value=1e300, allow_nan=False).map(lambda d: JVal("D", d)),
    st.sampled_from([JVal("D", 1.5), JVal("I", 3), JVal("I", 42), JVal("D", 1000.0)]),
    st.booleans().map(lambda b: JVal("Z", b)),
    st.sampled_from(WORDS).map(lambda s: JVal("S", s)),
    st.none(),
)
leaves = st.one_of(constants.map(Const), st.sampled_from(NAMES).map(Prop))


def extend(children):
    return st.one_of(
        children.map(lambda x: ("NEG", x)),
        children.map(lambda x: ("NOT", x)),
        st.tuples(st.sampled_from(["AND", "OR"]), children, children).map(lambda t: ("LOGIC", *t)),
        st.tuples(st.sampled_from(COMPARISONS), children, children).map(lambda t: ("CMP", *t)),
        st.tuples(children, children, children, st.booleans()).map(lambda t: ("BETWEEN", *t)),
        st.tuples(children, st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), st.booleans())
        .map(lambda t: ("IN", *t)),
        st.tuples(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]), children,
                  st.sampled_from(["a", "Tag", "", "x"]), st.booleans()).map(lambda t: ("TEXT", *t)),
        st.tuples(children, st.booleans()).map(lambda t: ("ISNULL", *t)),
    )


specs = st.recursive(leaves, extend, max_leaves=8)  # anything: mostly refused at parse time

# Mostly well-typed trees: comparisons of values (properties, numbers, -x) joined by AND/OR/NOT.
numbers = st.one_of(constants.filter(lambda v: v is not None and v.cls in "IJD").map(Const),
                    st.sampled_from(NAMES).map(Prop))
values = st.one_of(numbers, numbers.map(lambda x: ("NEG", x)), leaves)
predicates = st.one_of(
    st.tuples(st.sampled_from(COMPARISONS), st.sampled_from(NAMES).map(Prop), values)
    .map(lambda t: ("CMP", *t)),
    st.tuples(st.sampled_from(COMPARISONS), values, st.sampled_from(NAMES).map(Prop))
    .map(lambda t: ("CMP", *t)),
    st.tuples(st.sampled_from(NAMES).map(Prop), numbers, numbers, st.booleans())
    .map(lambda t: ("BETWEEN", *t)),
    st.tuples(st.sampled_from(NAMES).map(Prop), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
              st.booleans()).map(lambda t: ("IN", *t)),
    st.tuples(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]), st.sampled_from(NAMES).map(Prop),
              st.sampled_from(["a", "Tag", "", "x"]), st.booleans()).map(lambda t: ("TEXT", *t)),
    st.tuples(values, st.booleans()).map(lambda t: ("ISNULL", *t)),
    st.sampled_from(NAMES).map(Prop),
)
typed_specs = st.recursive(predicates, lambda kids: st.one_of(
    kids.map(lambda x: ("NOT", x)),
    st.tuples(st.sampled_from(["AND", "OR"]), kids, kids).map(lambda t: ("LOGIC", *t)),
    st.tuples(st.sampled_from(["=", "<>"]), kids, kids).map(lambda t: ("CMP", *t)),
), max_leaves=6)


def realize(spec) -> tuple[E | None, str]:
    """(reference tree or None if RocketMQ's parser refuses it, SQL text)."""
    if isinstance(spec, E):
        return spec, spec.text()
    kind, *args = spec
    subs = [realize(a) if isinstance(a, E | tuple) else (a, None) for a in args]
    texts = [t for _, t in subs]
    trees = [t for t, _ in subs]
    text_of = {
        "NEG": lambda: f"-({texts[0]})",
        "NOT": lambda: f"NOT ({texts[0]})",
        "LOGIC": lambda: f"({texts[1]} {args[0]} {texts[2]})",
        "CMP": lambda: f"({texts[1]} {args[0]} {texts[2]})",
        "BETWEEN": lambda: f"({texts[0]} {'NOT ' if args[3] else ''}BETWEEN {texts[1]} AND {texts[2]})",
        "IN": lambda: f"({texts[0]} {'NOT ' if args[2] else ''}IN ("
                      + ", ".join("'" + i.replace("'", "''") + "'" for i in args[1]) + "))",
        "TEXT": lambda: f"({texts[1]} {'NOT ' if args[3] else ''}{args[0]} '{args[2]}')",
        "ISNULL": lambda: f"({texts[0]} IS {'NOT ' if args[1] else ''}NULL)",
    }
    text = text_of[kind]()
    if any(t is None and isinstance(a, E | tuple) for t, a in zip(trees, args, strict=True)):
        return None, text
    try:
        tree: E = {
            "NEG": lambda: Neg(trees[0]),
            "NOT": lambda: Not(trees[0]),
            "LOGIC": lambda: Logic(args[0], trees[1], trees[2]),
            "CMP": lambda: Cmp(args[0], trees[1], trees[2]),
            "BETWEEN": lambda: Between(trees[0], trees[1], trees[2], args[3]),
            "IN": lambda: In(trees[0], args[1], args[2]),
            "TEXT": lambda: Text(args[0], trees[1], args[2], args[3]),
            "ISNULL": lambda: IsNull(trees[0], args[1]),
        }[kind]()
    except ParseRefused:
        return None, text
    return tree, text


properties = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(sorted(JAVA)), max_size=3)


@settings(max_examples=600, deadline=None)
@given(spec=st.one_of(typed_specs, typed_specs, specs), props=st.lists(properties, min_size=1, max_size=4))
def test_agrees_with_reference_evaluator(spec, props):
    tree, text = realize(spec)
    if tree is not None:
        try:
            tree = as_bool(tree)
        except ParseRefused:
            tree = None
    if tree is None:
        with pytest.raises(FilterError):
            parse_sql92(text)
        return
    fn = compile_sql92(text)
    for p in props:
        assert fn(p) == ref_matches(tree, p), (text, p)


@given(st.text(max_size=40))
def test_arbitrary_text_never_raises_anything_but_filter_error(text):
    try:
        fn = compile_sql92(text)
    except FilterError:
        return
    assert fn({"a": "1", "TAGS": "x"}) in (True, False)
