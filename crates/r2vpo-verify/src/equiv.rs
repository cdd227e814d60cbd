//! Structural reading of a normalised answer and the equality on it.

use std::fmt;

use super::expr::{eval, EvalFailure};
use super::normalize::{split_top_level, strip_assignment};
use super::num::{EvalError, Num};

/// Nested structure beyond this depth is compared as text.
const MAX_DEPTH: usize = 6;

/// What an answer means, as far as this verifier can tell.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// A real number (exact or approximate).
    Num(Num),
    /// Anything not understood numerically, compared as a string.
    Text(String),
    /// Well-formed arithmetic with no finite value here (`9^{9^{9^{9}}}`,
    /// `1e999999`, `171!`): a complete answer, but equal only to the
    /// identical normalised expression. Never reduced to one of its numbers.
    Unevaluated { text: String, why: EvalError },
    /// Ordered: points, tuples and intervals. The bracket characters are part
    /// of the value, so `[1,3)` differs from `[1,3]` and from `(1,3)`.
    Tuple { open: char, close: char, items: Vec<Value> },
    /// `\{…\}`: order and repetition do not matter.
    Set(Vec<Value>),
    /// A bare comma list `1, 2`: several answers (all roots of an equation…).
    List(Vec<Value>),
    /// `A \cup B`: order does not matter.
    Union(Vec<Value>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Num(_) => "number",
            Value::Text(_) => "text",
            Value::Unevaluated { .. } => "expression without a value",
            Value::Tuple { open: '(', close: ')', .. } => "tuple",
            Value::Tuple { .. } => "interval",
            Value::Set(_) => "set",
            Value::List(_) => "list",
            Value::Union(_) => "union",
        }
    }

    /// True when no part of the value fell back to text.
    pub(crate) fn is_mathematical(&self) -> bool {
        match self {
            Value::Num(_) | Value::Unevaluated { .. } => true,
            Value::Text(_) => false,
            Value::Tuple { items, .. } | Value::Set(items) | Value::List(items) | Value::Union(items) => {
                items.iter().all(Value::is_mathematical)
            }
        }
    }

    /// The number, if this is a plain number.
    pub(crate) fn as_num(&self) -> Option<Num> {
        match self {
            Value::Num(n) => Some(*n),
            _ => None,
        }
    }
}

fn join(items: &[Value], sep: &str) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(sep)
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Num(n) => write!(f, "{n}"),
            Value::Text(s) => write!(f, "text {s:?}"),
            Value::Unevaluated { text, why } => write!(f, "expression {text:?} without a value ({why})"),
            Value::Tuple { open, close, items } => write!(f, "{open}{}{close}", join(items, ", ")),
            Value::Set(items) => write!(f, "set {{{}}}", join(items, ", ")),
            Value::List(items) => write!(f, "list [{}]", join(items, ", ")),
            Value::Union(items) => write!(f, "{}", join(items, " ∪ ")),
        }
    }
}

/// Reads a normalised answer.
pub(crate) fn parse_value(s: &str) -> Value {
    parse(s, 0)
}

fn items(inner: &str, depth: usize) -> Vec<Value> {
    split_top_level(inner, ",")
        .into_iter()
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| parse(strip_assignment(e), depth + 1))
        .collect()
}

/// Index of the bracket closing the one at byte 0, counting all bracket kinds.
fn closing_index(s: &str) -> Option<usize> {
    let mut depth = 0i64;
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn parse(s: &str, depth: usize) -> Value {
    let s = s.trim();
    if depth > MAX_DEPTH {
        return Value::Text(s.to_string());
    }
    let union = split_top_level(s, "\\cup");
    if union.len() > 1 {
        return Value::Union(union.into_iter().map(|p| parse(p, depth + 1)).collect());
    }
    // `\{ … \}`: the brace after the backslash must close at the very end.
    if s.len() >= 4 && s.starts_with("\\{") && s.ends_with("\\}") && closing_index(&s[1..]) == Some(s.len() - 2) {
        return Value::Set(items(&s[2..s.len() - 2], depth));
    }
    let first = s.chars().next().unwrap_or(' ');
    let last = s.chars().last().unwrap_or(' ');
    if matches!(first, '(' | '[') && matches!(last, ')' | ']') && closing_index(s) == Some(s.len() - 1) {
        let inner = &s[1..s.len() - 1];
        if split_top_level(inner, ",").len() > 1 {
            return Value::Tuple { open: first, close: last, items: items(inner, depth) };
        }
    }
    if split_top_level(s, ",").len() > 1 {
        return Value::List(items(s, depth));
    }
    match eval(s) {
        Ok(n) => Value::Num(n),
        Err(EvalFailure::NoValue(why)) => Value::Unevaluated { text: s.to_string(), why },
        Err(EvalFailure::Syntax(_)) => Value::Text(s.to_string()),
    }
}

/// Tolerances and list semantics for [`equal`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tolerance {
    pub rel: f64,
    pub abs: f64,
    pub unordered_lists: bool,
}

/// Text equal up to braces and spaces: `x^{2}` and `x^2` are the same answer.
fn squash(s: &str) -> String {
    s.chars().filter(|c| !matches!(c, '{' | '}' | ' ')).collect()
}

/// `^{400}` → `^400` where the evaluator reads both alike: the braces hold
/// only digits and no digit or point follows them (`9^{9}9` is 9⁹·9, not
/// 9^99, so it is left alone). Lets `10^{400}` match `10^400` unevaluated.
fn unbrace_digit_exponents(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < c.len() {
        if c[i] == '^' && c.get(i + 1) == Some(&'{') {
            let mut j = i + 2;
            while c.get(j).is_some_and(char::is_ascii_digit) {
                j += 1;
            }
            let next_ok = !c.get(j + 1).is_some_and(|&n| n.is_ascii_digit() || n == '.');
            if j > i + 2 && c.get(j) == Some(&'}') && next_ok {
                out.push('^');
                out.extend(&c[i + 2..j]);
                i = j + 1;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

fn all_in(a: &[Value], b: &[Value], tol: Tolerance) -> bool {
    a.iter().all(|x| b.iter().any(|y| equal(x, y, tol)))
}

/// Multiset equality: each element of `a` pairs with a distinct one in `b`.
fn multiset_eq(a: &[Value], b: &[Value], tol: Tolerance) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    a.iter().all(|x| {
        let hit = (0..b.len()).find(|&j| !used[j] && equal(x, &b[j], tol));
        if let Some(j) = hit {
            used[j] = true;
        }
        hit.is_some()
    })
}

/// Equality of two answers. Sets and unions use set semantics (`{1,1,2}` =
/// `{1,2}`); bare lists are multisets when `unordered_lists` is on; a bare
/// list also equals a set with the same elements, since "the solutions are
/// 1, 2" and `\{1, 2\}` state the same thing.
pub(crate) fn equal(a: &Value, b: &Value, tol: Tolerance) -> bool {
    match (a, b) {
        (Value::Num(x), Value::Num(y)) => x.close_to(*y, tol.rel, tol.abs),
        (Value::Text(x), Value::Text(y)) => x == y || squash(x) == squash(y),
        // Same expression only. Not `squash`: dropping braces changes
        // arithmetic (`9^{9^{9}}9` and `9^{9^{99}}` squash alike).
        (Value::Unevaluated { text: x, .. }, Value::Unevaluated { text: y, .. }) => {
            x == y || unbrace_digit_exponents(x) == unbrace_digit_exponents(y)
        }
        (Value::Tuple { open: o1, close: c1, items: i1 }, Value::Tuple { open: o2, close: c2, items: i2 }) => {
            o1 == o2 && c1 == c2 && i1.len() == i2.len() && i1.iter().zip(i2).all(|(x, y)| equal(x, y, tol))
        }
        (Value::Set(x), Value::Set(y))
        | (Value::Union(x), Value::Union(y))
        | (Value::Set(x), Value::List(y))
        | (Value::List(x), Value::Set(y)) => all_in(x, y, tol) && all_in(y, x, tol),
        (Value::List(x), Value::List(y)) => {
            if tol.unordered_lists {
                multiset_eq(x, y, tol)
            } else {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q, tol))
            }
        }
        _ => false,
    }
}

/// A one-line reason why `a` (answer) and `b` (gold) differ, for users
/// debugging rewards.
pub(crate) fn explain_mismatch(a: &Value, b: &Value) -> String {
    match (a, b) {
        (Value::Num(x), Value::Num(y)) => format!("numbers differ: {x} vs {y}"),
        (Value::Text(x), Value::Text(y)) => format!("texts differ: {x:?} vs {y:?}"),
        (Value::Tuple { open: o1, close: c1, items: i1 }, Value::Tuple { open: o2, close: c2, items: i2 }) => {
            if (o1, c1) != (o2, c2) {
                format!("brackets differ: {o1}…{c1} vs {o2}…{c2}")
            } else if i1.len() != i2.len() {
                format!("lengths differ: {} vs {}", i1.len(), i2.len())
            } else {
                "elements differ (order matters)".to_string()
            }
        }
        (Value::List(x), Value::List(y)) if x.len() != y.len() => {
            format!("lengths differ: {} vs {}", x.len(), y.len())
        }
        (Value::Unevaluated { why, .. }, _) | (_, Value::Unevaluated { why, .. }) => {
            format!("an expression without a value ({why}) matches only the identical expression")
        }
        _ if a.kind() != b.kind() => format!("answer is a {} but gold is a {}", a.kind(), b.kind()),
        _ => "elements differ".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance { rel: 1e-6, abs: 1e-9, unordered_lists: true };

    fn eq(a: &str, b: &str) -> bool {
        equal(&parse_value(a), &parse_value(b), TOL)
    }

    #[test]
    fn structure_is_recognised() {
        assert_eq!(parse_value("(1,2)").kind(), "tuple");
        assert_eq!(parse_value("[1,3)").kind(), "interval");
        assert_eq!(parse_value("\\{1,2\\}").kind(), "set");
        assert_eq!(parse_value("1,2").kind(), "list");
        assert_eq!(parse_value("(-\\infty,1)\\cup(2,\\infty)").kind(), "union");
        assert_eq!(parse_value("(5)").kind(), "number");
        assert_eq!(parse_value("2x").kind(), "text");
    }

    #[test]
    fn tuples_are_ordered_and_brackets_matter() {
        assert!(eq("(1,2)", "(1,2)"));
        assert!(!eq("(1,2)", "(2,1)"));
        assert!(!eq("[1,3)", "[1,3]"));
        assert!(!eq("(1,3)", "[1,3]"));
        assert!(eq("[\\frac{1}{2},3)", "[0.5,3)"));
        assert!(!eq("(1,2,3)", "(1,2)"));
    }

    #[test]
    fn sets_unions_and_lists_are_unordered() {
        assert!(eq("\\{1,2\\}", "\\{2,1\\}"));
        assert!(eq("\\{1,1,2\\}", "\\{2,1\\}"));
        assert!(!eq("\\{1,2\\}", "\\{1,3\\}"));
        assert!(eq("2,1", "1,2"));
        assert!(!eq("1,1,2", "1,2"));
        assert!(eq("\\{1,2\\}", "2,1"));
        assert!(eq("(2,\\infty)\\cup(-\\infty,1)", "(-\\infty,1)\\cup(2,\\infty)"));
    }

    #[test]
    fn list_elements_may_be_assignments() {
        assert!(eq("x=1,y=2", "1,2"));
    }

    #[test]
    fn ordered_lists_when_configured() {
        let tol = Tolerance { unordered_lists: false, ..TOL };
        assert!(!equal(&parse_value("2,1"), &parse_value("1,2"), tol));
        assert!(equal(&parse_value("1,2"), &parse_value("1,2"), tol));
    }

    #[test]
    fn text_compares_modulo_braces() {
        assert!(eq("x^{2}", "x^2"));
        assert!(!eq("x^2", "y^2"));
        assert!(!eq("5", "five"));
    }

    #[test]
    fn unevaluable_expressions_are_values_equal_only_to_themselves() {
        let v = parse_value("9^{9^{9^{9}}}");
        assert!(matches!(v, Value::Unevaluated { .. }) && v.is_mathematical(), "{v}");
        assert!(eq("9^{9^{9^{9}}}", "9^{9^{9^{9}}}"));
        assert!(!eq("9^{9^{9}}9", "9^{9^{99}}"));
        assert!(!eq("10^{40}0", "10^{400}"));
        assert!(eq("10^{400}", "10^400"));
        assert!(eq("9^{9^{9^{9}}}", "9^{9^{9^9}}"));
        assert!(!eq("9^{9}9^{999}", "9^99^{999}"));
        assert!(!eq("1e999999", "999999"));
        assert!(!eq("1e999999", "1e999998"));
        assert!(eq("(1e999999,2)", "(1e999999,2)"));
        assert!(!eq("171!", "171"));
        assert!(explain_mismatch(&parse_value("1e999999"), &parse_value("999999")).contains("without a value"));
        assert_eq!(parse_value("x!").kind(), "text");
    }

    #[test]
    fn mismatch_explanations_name_the_difference() {
        assert!(explain_mismatch(&parse_value("[1,3)"), &parse_value("[1,3]")).contains("brackets"));
        assert!(explain_mismatch(&parse_value("1"), &parse_value("x")).contains("number"));
    }
}
