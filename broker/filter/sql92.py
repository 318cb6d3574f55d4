"""RocketMQ's SQL92 property filter: the grammar of `filter/.../SelectorParser.jj` and the type rules
of its `ComparisonExpression`/`UnaryExpression`/`LogicExpression` (taken from ActiveMQ), so an
expression selects here exactly the messages it selects on a RocketMQ broker.

Grammar (keywords case-insensitive; identifiers `[A-Za-z_$][A-Za-z0-9_$]*`, case-sensitive)::

    selector   := or
    or         := and (OR and)*
    and        := equality (AND equality)*
    equality   := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison := unary ( ('>'|'>='|'<'|'<=') unary
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' string (',' string)* ')'
                        | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) string )*
    unary      := '+' unary | '-' unary | NOT unary | primary
    primary    := literal | identifier | '(' or ')'
    literal    := 'string' ('' escapes ') | decimal (0 | [1-9][0-9]*[lL]?) | float | TRUE | FALSE | NULL

`--` comments run to a line end, `/* */` comments anywhere. Values are Java-typed: string,
Integer (a decimal that fits 32 bits), Long, Double, Boolean, null. A property's value is always a
string (or null when absent); comparing it with a number converts it with Java's
`Integer/Long/Double.valueOf` *for the literal's type* (`a > 5` with a = "5.5" is an error, not
true). Three-valued logic as ActiveMQ's: a comparison with null is null, `AND`/`OR` absorb it
where Java's short-circuit does. Evaluation errors (a failed conversion) and a result that is
not TRUE both mean *no match* — never an exception out of `matches`.

Parse-time checks (each a `FilterError`): only numbers (or properties, or `-x`) beside
`> >= < <=`; no NULL literal beside `=`/`<>`; `TRUE = 1` refused; `BETWEEN` bounds that are both
literals must be ordered; `IN` needs a property on its left; the whole expression, and each
`AND`/`OR`/`NOT` operand, must be boolean (a bare property is cast: a string is FALSE).
Float literals outside Java's `Double.MIN_VALUE..MAX_VALUE` (so `0.0` too) are refused, as there.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.filter.errors import FilterError

__all__ = ["SqlFilter", "compile_sql92", "parse_sql92"]

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MIN_VALUE = 5e-324  # Java's Double.MIN_VALUE: the smallest positive double


class JLong(int):
    """A Java Long (an `int` beyond 32 bits, or any value converted to Long): kept apart from a
    Java Integer because a string property compared with an Integer must parse as 32-bit."""

    __slots__ = ()


class EvalError(Exception):
    """A value that Java would fail to convert or cast: the message does not match."""


# ---- Java value semantics ---------------------------------------------------------------------

def kind(v: Any) -> str:
    """Java class of a value: S(tring), Z (Boolean), I(nteger), J (Long), D(ouble)."""
    t = type(v)
    if t is str:
        return "S"
    if t is bool:
        return "Z"
    if t is JLong:
        return "J"
    if t is int:
        return "I"
    return "D"


_JAVA_INT = re.compile(r"[+-]?\d+")
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?"
    r"|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?)"
)


def java_int(s: str, lo: int = _INT_MIN, hi: int = _INT_MAX) -> int:
    """`Integer.valueOf` (or `Long.valueOf` with the long bounds): EvalError where Java throws."""
    if not _JAVA_INT.fullmatch(s):
        raise EvalError(f"not an integer: {s!r}")
    n = int(s)
    if not lo <= n <= hi:
        raise EvalError(f"out of range: {s!r}")
    return n


def java_double(s: str) -> float:
    """`Double.valueOf`: surrounding characters <= U+0020 trimmed, Java's literal forms (NaN,
    Infinity, exponents, an f/d suffix, hexadecimal with a p exponent)."""
    t = s.strip(_JAVA_TRIMMED)
    if not _JAVA_DOUBLE.fullmatch(t):
        raise EvalError(f"not a number: {s!r}")
    if t[-1] in "fFdD":
        t = t[:-1]
    if "x" in t or "X" in t:
        return float.fromhex(t)
    return float(t.replace("Infinity", "inf"))


_JAVA_TRIMMED = "".join(chr(c) for c in range(0x21))


def java_boolean(s: str) -> bool:
    """`Boolean.valueOf(String)`: true for "true" in any case, false for anything else."""
    return s.lower() == "true"


_D = struct.Struct(">d")
_Q = struct.Struct(">q")


def _double_bits(d: float) -> int:
    """`Double.doubleToLongBits`: every NaN is the canonical one."""
    return 0x7FF8000000000000 if d != d else _Q.unpack(_D.pack(d))[0]


def _compare_to(a: Any, b: Any) -> int:
    """`compareTo` of two values of the same Java class."""
    if type(a) is float:
        if a < b:
            return -1
        if a > b:
            return 1
        x, y = _double_bits(a), _double_bits(b)  # -0.0 < 0.0; NaN equal to itself, above all
        return 0 if x == y else (-1 if x < y else 1)
    if type(a) is str:  # String.compareTo: UTF-16 code units
        if a == b:
            return 0
        ua, ub = a.encode("utf-16-be"), b.encode("utf-16-be")
        return -1 if ua < ub else 1
    return -1 if a < b else (1 if a > b else 0)


def java_compare(lv: Any, rv: Any) -> int:
    """`ComparisonExpression.__compare` with string conversion on (as RocketMQ's parser sets it):
    values of different classes are converted up, or a string to the other side's class; a
    pair with no conversion compares as -1. EvalError where Java throws."""
    lc, rc = kind(lv), kind(rv)
    if lc != rc:
        if lc == "Z":
            if rc == "S":
                raise EvalError("Boolean cast to String")  # Java casts lv itself: ClassCastException
            return -1
        if lc == "I":
            if rc == "J":
                lv = JLong(lv)
            elif rc == "D":
                lv = float(lv)
            elif rc == "S":
                rv = java_int(rv)
            else:
                return -1
        elif lc == "J":
            if rc == "I":
                rv = JLong(rv)
            elif rc == "D":
                lv = float(lv)
            elif rc == "S":
                rv = JLong(java_int(rv, _LONG_MIN, _LONG_MAX))
            else:
                return -1
        elif lc == "D":
            if rc in "IJ":
                rv = float(rv)
            elif rc == "S":
                rv = java_double(rv)
            else:
                return -1
        else:  # lc == "S"
            if rc == "Z":
                lv = java_boolean(lv)
            elif rc == "I":
                lv = java_int(lv)
            elif rc == "J":
                lv = JLong(java_int(lv, _LONG_MIN, _LONG_MAX))
            else:
                lv = java_double(lv)
    return _compare_to(lv, rv)


def java_equals(lv: Any, rv: Any) -> bool:
    """`Object.equals` of two non-null values (same class and value; Double by its bits)."""
    if kind(lv) != kind(rv):
        return False
    if type(lv) is float:
        return _double_bits(lv) == _double_bits(rv)
    return lv == rv


# ---- syntax tree ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Node:
    """One expression node. `op` names the Java expression class it stands for."""

    op: str
    args: tuple[Any, ...] = ()

    @property
    def is_boolean(self) -> bool:
        """Java's `instanceof BooleanExpression`."""
        return self.op in _BOOLEAN_OPS or (self.op == "const" and (self.args[0] is None
                                                                    or type(self.args[0]) is bool))

    @property
    def is_constant(self) -> bool:
        return self.op == "const"


_BOOLEAN_OPS = frozenset({"and", "or", "not", "cast", "eq", "gt", "ge", "lt", "le", "in", "notin",
                          "contains", "notcontains", "startswith", "notstartswith", "endswith",
                          "notendswith"})

# ---- lexer ------------------------------------------------------------------------------------

_KEYWORDS = ("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
             "STARTSWITH", "ENDSWITH")
_SYMBOLS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-")
# (name, pattern) in JavaCC declaration order: of several matches the longest wins, then the first.
_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("skip", re.compile(r"[ \t\n\r\f]")),
    ("skip", re.compile(r"--[^\n\r]*(?:\r\n|\n|\r)")),
    ("skip", re.compile(r"/\*[^*]*\*(?:\*|[^*/][^*]*\*)*/")),
    *((kw, re.compile(kw, re.IGNORECASE)) for kw in _KEYWORDS),
    ("decimal", re.compile(r"0|[1-9][0-9]*[lL]?")),
    ("float", re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
                         r"|[0-9]+[eE][+-]?[0-9]+")),
    ("string", re.compile(r"'(?:''|[^'])*'")),
    ("id", re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")),
    *((sym, re.compile(re.escape(sym))) for sym in _SYMBOLS),
)


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """[(kind, image, position)] ending with ("eof", "", len)."""
    out: list[tuple[str, str, int]] = []
    pos, n = 0, len(text)
    while pos < n:
        best: tuple[str, str] | None = None
        for name, pat in _TOKENS:
            m = pat.match(text, pos)
            if m and m.end() > pos and (best is None or m.end() - pos > len(best[1])):
                best = (name, m.group())
        if best is None:
            raise FilterError(f"unexpected character {text[pos]!r} at position {pos}")
        if best[0] != "skip":
            out.append((best[0], best[1], pos))
        pos += len(best[1])
    out.append(("eof", "", n))
    return out


# ---- parser (recursive descent over the grammar above, with its parse-time checks) -----------

class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.i = 0

    def peek(self, ahead: int = 0) -> str:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)][0]

    def take(self, kind_: str) -> str:
        k, image, pos = self.toks[self.i]
        if k != kind_:
            shown = repr(image) if image else "the end"
            raise FilterError(f"expected {kind_} at position {pos}, found {shown}")
        self.i += 1
        return image

    def parse(self) -> Node:
        node = self.or_expr()
        if self.peek() != "eof":
            _, image, pos = self.toks[self.i]
            raise FilterError(f"unexpected {image!r} at position {pos}")
        return as_boolean(node)

    def or_expr(self) -> Node:
        left = self.and_expr()
        while self.peek() == "OR":
            self.i += 1
            left = Node("or", (as_boolean(left), as_boolean(self.and_expr())))
        return left

    def and_expr(self) -> Node:
        left = self.equality()
        while self.peek() == "AND":
            self.i += 1
            left = Node("and", (as_boolean(left), as_boolean(self.equality())))
        return left

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            k = self.peek()
            if k == "=":
                self.i += 1
                left = create_equal(left, self.comparison())
            elif k == "<>":
                self.i += 1
                left = Node("not", (create_equal(left, self.comparison()),))
            elif k == "IS" and self.peek(1) == "NULL":
                self.i += 2
                left = Node("eq", (left, NULL))
            elif k == "IS":
                self.i += 1
                self.take("NOT")
                self.take("NULL")
                left = Node("not", (Node("eq", (left, NULL)),))
            else:
                return left

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            k = self.peek()
            negated = k == "NOT" and self.peek(1) in ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH")
            if negated:
                self.i += 1
                k = self.peek()
            if k in (">", ">=", "<", "<=") and not negated:
                self.i += 1
                left = create_less_than_family(_SYMBOL_OP[k], left, self.unary())
            elif k == "BETWEEN":
                self.i += 1
                low = self.unary()
                self.take("AND")
                high = self.unary()
                left = create_not_between(left, low, high) if negated else create_between(left, low, high)
            elif k == "IN":
                self.i += 1
                self.take("(")
                items = [self.string()]
                while self.peek() == ",":
                    self.i += 1
                    items.append(self.string())
                self.take(")")
                if left.op != "prop":
                    raise FilterError(f"IN needs a property on its left, got {render(left)}")
                left = Node("notin" if negated else "in", (left, frozenset(items)))
            elif k in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.i += 1
                left = Node(("not" if negated else "") + k.lower(), (left, self.string()))
            else:
                return left

    def unary(self) -> Node:
        k = self.peek()
        if k == "+":
            self.i += 1
            return self.unary()
        if k == "-":
            self.i += 1
            return Node("neg", (self.unary(),))
        if k == "NOT":
            self.i += 1
            return Node("not", (as_boolean(self.unary()),))
        return self.primary()

    def primary(self) -> Node:
        k, image, pos = self.toks[self.i]
        if k == "(":
            self.i += 1
            node = self.or_expr()
            self.take(")")
            return node
        if k == "id":
            self.i += 1
            return Node("prop", (image,))
        if k == "string":
            return Node("const", (self.string(),))
        self.i += 1
        if k == "decimal":
            return Node("const", (decimal_value(image),))
        if k == "float":
            return Node("const", (float_value(image),))
        if k in ("TRUE", "FALSE"):
            return Node("const", (k == "TRUE",))
        if k == "NULL":
            return NULL
        shown = repr(image) if image else "the end"
        raise FilterError(f"expected a value at position {pos}, found {shown}")

    def string(self) -> str:
        return self.take("string")[1:-1].replace("''", "'")


NULL = Node("const", (None,))
_SYMBOL_OP = {">": "gt", ">=": "ge", "<": "lt", "<=": "le"}


def decimal_value(image: str) -> int:
    """`ConstantExpression.createFromDecimal`: Integer if it fits 32 bits, else Long (64 bits max)."""
    n = int(image.rstrip("lL"))
    if n > _LONG_MAX:
        raise FilterError(f"{image} is out of the Long range")
    return n if n <= _INT_MAX else JLong(n)


def float_value(image: str) -> float:
    """`ConstantExpression.createFloat`: Java refuses values above Double.MAX_VALUE and below
    Double.MIN_VALUE (the smallest positive double, so 0.0 too)."""
    d = float(image)
    if math.isinf(d):
        raise FilterError(f"{image} is greater than Double.MAX_VALUE")
    if d < _DOUBLE_MIN_VALUE:
        raise FilterError(f"{image} is less than Double.MIN_VALUE")
    return d


def as_boolean(node: Node) -> Node:
    """`asBooleanExpression`: boolean nodes pass, a property is cast, anything else is refused."""
    if node.is_boolean:
        return node
    if node.op == "prop":
        return Node("cast", (node,))
    raise FilterError(f"expression will not result in a boolean value: {render(node)}")


def create_equal(left: Node, right: Node) -> Node:
    for side in (left, right):
        if side.is_constant and side.args[0] is None:
            raise FilterError("NULL cannot be compared with = or <>; use IS NULL")
    if left.is_constant and right.is_constant and left.is_boolean and not right.is_boolean:
        raise FilterError(f"{render(left)} cannot be compared with {render(right)}")
    return Node("eq", (left, right))


def _check_less_than_operand(node: Node) -> None:
    if node.is_constant:
        v = node.args[0]
        if v is not None and type(v) is not bool and type(v) is not str:
            return
        raise FilterError(f"value {render(node)} cannot be compared with > >= < <=")
    if node.is_boolean:
        raise FilterError(f"value {render(node)} cannot be compared with > >= < <=")


def create_less_than_family(op: str, left: Node, right: Node) -> Node:
    _check_less_than_operand(left)
    _check_less_than_operand(right)
    return Node(op, (left, right))


def create_between(value: Node, low: Node, high: Node) -> Node:
    if low.is_constant and high.is_constant:
        lv, hv = low.args[0], high.args[0]
        if lv is None or hv is None:
            raise FilterError("BETWEEN bounds cannot be NULL")
        try:
            order = java_compare(hv, lv)
        except EvalError as exc:
            raise FilterError(f"BETWEEN bounds cannot be compared: {exc}") from None
        if order < 0:
            raise FilterError(f"BETWEEN bounds out of order: {render(low)} must not exceed {render(high)}")
    return Node("and", (create_less_than_family("ge", value, low),
                        create_less_than_family("le", value, high)))


def create_not_between(value: Node, low: Node, high: Node) -> Node:
    return Node("or", (create_less_than_family("lt", value, low), create_less_than_family("gt", value, high)))


def render(node: Node) -> str:
    """Readable text of a node (error messages)."""
    op, a = node.op, node.args
    if op == "const":
        v = a[0]
        if v is None:
            return "NULL"
        if type(v) is bool:
            return "TRUE" if v else "FALSE"
        if type(v) is str:
            return "'" + v.replace("'", "''") + "'"
        return repr(v) if type(v) is float else str(int(v))
    if op == "prop":
        return a[0]
    if op in ("neg", "not", "cast"):
        return {"neg": "-", "not": "NOT ", "cast": ""}[op] + render(a[0])
    if op in ("in", "notin"):
        items = ", ".join(render(Node("const", (s,))) for s in sorted(a[1]))
        return f"{render(a[0])} {'NOT ' if op == 'notin' else ''}IN ({items})"
    symbol = {"and": "AND", "or": "OR", "eq": "=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}.get(op)
    if symbol is None:  # contains family: the search is a plain string
        return f"{render(a[0])} {op.upper().replace('NOT', 'NOT ')} {render(Node('const', (a[1],)))}"
    return f"({render(a[0])} {symbol} {render(a[1])})"


@functools.lru_cache(maxsize=256)
def parse_sql92(text: str) -> Node:
    """Parse a selector; FilterError (with the position) when RocketMQ's parser would refuse it."""
    if not isinstance(text, str) or not text.strip():
        raise FilterError("SQL92 expression is empty")
    return _Parser(text).parse()


# ---- compiler: a tree of closures, one call per node ----------------------------------------

Props = Mapping[str, str]
Fn = Callable[[Props], Any]


def _compile(node: Node) -> Fn:
    op, a = node.op, node.args
    if op == "const":
        value = a[0]
        return lambda _p: value
    if op == "prop":
        name = a[0]
        return lambda p: p.get(name)
    if op == "neg":
        inner = _compile(a[0])

        def neg(p: Props) -> Any:
            v = inner(p)
            if v is None or type(v) is str or type(v) is bool:
                return None
            return -v if type(v) is not JLong else JLong(-v)
        return neg
    if op == "not":
        inner = _compile(a[0])

        def not_(p: Props) -> Any:
            v = inner(p)
            return None if v is None else not v
        return not_
    if op == "cast":
        inner = _compile(a[0])

        def cast(p: Props) -> Any:
            v = inner(p)
            return None if v is None else (v if type(v) is bool else False)
        return cast
    if op == "and":
        left, right = _compile(a[0]), _compile(a[1])

        def and_(p: Props) -> Any:
            lv = left(p)
            if lv is False:
                return False
            rv = right(p)
            if rv is False:
                return False
            return None if lv is None or rv is None else True
        return and_
    if op == "or":
        left, right = _compile(a[0]), _compile(a[1])

        def or_(p: Props) -> Any:
            lv = left(p)
            if lv is True:
                return True
            rv = right(p)
            if rv is True:
                return True
            return None if lv is None or rv is None else False
        return or_
    if op == "eq":
        left, right = _compile(a[0]), _compile(a[1])

        def eq(p: Props) -> Any:
            lv, rv = left(p), right(p)
            if lv is None or rv is None:
                return True if lv is None and rv is None else (None if lv is None else False)
            return java_equals(lv, rv) or java_compare(lv, rv) == 0
        return eq
    if op in ("gt", "ge", "lt", "le"):
        left, right = _compile(a[0]), _compile(a[1])
        test = _ORDER_TESTS[op]

        def order(p: Props) -> Any:
            lv = left(p)
            if lv is None:
                return None
            rv = right(p)
            if rv is None:
                return None
            if type(lv) is str and type(rv) is str:  # two strings are compared as Doubles
                lv, rv = java_double(lv), java_double(rv)
            return test(java_compare(lv, rv))
        return order
    if op in ("in", "notin"):
        inner, items, negate = _compile(a[0]), a[1], op == "notin"

        def in_(p: Props) -> Any:
            v = inner(p)
            if v is None or type(v) is not str:
                return None
            return (v in items) is not negate
        return in_
    # contains / startswith / endswith and their NOT forms: null or non-string is FALSE
    inner, search = _compile(a[0]), a[1]
    negate = op.startswith("not")
    base = op[3:] if negate else op
    if not search:
        return lambda _p: False
    method = {"contains": str.__contains__, "startswith": str.startswith, "endswith": str.endswith}[base]

    def text_test(p: Props) -> Any:
        v = inner(p)
        if type(v) is not str:
            return False
        return method(v, search) is not negate
    return text_test


_ORDER_TESTS: dict[str, Callable[[int], bool]] = {
    "gt": lambda c: c > 0, "ge": lambda c: c >= 0, "lt": lambda c: c < 0, "le": lambda c: c <= 0,
}


def compile_sql92(text: str) -> Callable[[Props], bool]:
    """`text` → matches(properties): True only when the selector evaluates to TRUE; an
    evaluation error or a null/FALSE result is False. FilterError if it does not parse."""
    fn = _compile(parse_sql92(text))

    def matches(props: Props) -> bool:
        try:
            return fn(props) is True
        except (EvalError, ValueError, OverflowError):
            return False
    return matches


class SqlFilter:
    """A SQL92 property filter (RocketMQ `ExpressionType.SQL92`). Every property, TAGS and KEYS
    included, is a name the selector can use. No tags-code pre-filter: every unit is a candidate."""

    __slots__ = ("_matches", "expression")

    match_all = False

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self._matches = compile_sql92(expression)

    @property
    def expression_type(self) -> str:
        return "SQL92"

    def accepts_code(self, tags_code: int) -> bool:
        return True

    def matches(self, properties: Props) -> bool:
        return self._matches(properties)
