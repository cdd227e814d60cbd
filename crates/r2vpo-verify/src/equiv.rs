//! Structural reading of a normalised answer and the equality on it.

use std::fmt;

use super::expr::{eval, eval_with, EvalFailure};
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
    /// An expression in variables (`x+1`, `2\sin x\cos x`), compared by
    /// evaluation at fixed points ([`POINTS`]).
    Expr { text: String, vars: Vec<String> },
    /// An equation or inequality, a chain read left to right with `>` and
    /// `\ge` turned round (`5 \ge x` is `x \le 5`), so that `sides[k]
    /// ops[k] sides[k+1]`.
    Relation { sides: Vec<String>, ops: Vec<Rel> },
    /// `\begin{pmatrix}…\end{pmatrix}` and its kin, row by row.
    Matrix(Vec<Vec<Value>>),
    /// Named parts: `a = 2, b = 3` or `(a, b) = (2, 3)`.
    Labelled(Vec<(String, Value)>),
}

/// A relation operator after turning `>`-type relations round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rel {
    /// `=`
    Eq,
    /// `\ne`
    Ne,
    /// `<` (and `>` turned round)
    Lt,
    /// `\le` (and `\ge` turned round)
    Le,
}

impl Rel {
    fn symbol(self) -> &'static str {
        match self {
            Rel::Eq => "=",
            Rel::Ne => "≠",
            Rel::Lt => "<",
            Rel::Le => "≤",
        }
    }
}

/// Relation operators as normalised answers write them: (text, operator,
/// whether the operator points the other way).
const RELATIONS: &[(&str, Rel, bool)] = &[
    ("\\leq", Rel::Le, false),
    ("\\leqslant", Rel::Le, false),
    ("\\le", Rel::Le, false),
    ("\\geq", Rel::Le, true),
    ("\\geqslant", Rel::Le, true),
    ("\\ge", Rel::Le, true),
    ("\\neq", Rel::Ne, false),
    ("\\ne", Rel::Ne, false),
    ("\\lt", Rel::Lt, false),
    ("\\gt", Rel::Lt, true),
    ("<=", Rel::Le, false),
    (">=", Rel::Le, true),
    ("!=", Rel::Ne, false),
    ("≤", Rel::Le, false),
    ("≥", Rel::Le, true),
    ("≠", Rel::Ne, false),
    ("<", Rel::Lt, false),
    (">", Rel::Lt, true),
    ("=", Rel::Eq, false),
];

/// Where two expressions are compared: fixed, irregular values, negative
/// and positive, away from the small integers and simple fractions where
/// different expressions tend to coincide. Variable `k` of an expression
/// takes `POINTS[(p + 3k) % len]` at point `p`, so variables differ.
const POINTS: &[f64] = &[0.5381, -1.2377, 1.8913, 0.3127, 2.4461, -0.7219, 1.3373, -2.1049];

/// An expression that reads as arithmetic in single-letter (or Greek)
/// variables. A run of three or more letters is a word, not a product of
/// variables: `odd` is not `o·d·d`.
fn as_expression(s: &str) -> Option<Value> {
    let mut run = 0usize;
    let mut in_command = false;
    for c in s.chars() {
        if c == '\\' {
            in_command = true;
            run = 0;
            continue;
        }
        if c.is_ascii_alphabetic() {
            if !in_command {
                run += 1;
                if run >= 3 {
                    return None;
                }
            }
        } else {
            in_command = false;
            run = 0;
        }
    }
    let (_, vars) = eval_with(s, &|_| 0.7).ok()?;
    (!vars.is_empty()).then(|| Value::Expr { text: s.to_string(), vars })
}

/// The values of `text` at every point, with `vars` in that order (NaN where
/// the expression has no value there).
fn sample(text: &str, vars: &[String]) -> Vec<f64> {
    (0..POINTS.len())
        .map(|p| {
            let bind = |name: &str| {
                let k = vars.iter().position(|v| v == name).unwrap_or(vars.len());
                POINTS[(p + 3 * k) % POINTS.len()] + 0.01 * k as f64
            };
            match eval_with(text, &bind) {
                Ok((v, _)) => v.to_f64(),
                Err(_) => f64::NAN,
            }
        })
        .collect()
}

fn union_vars(a: &[String], b: &[String]) -> Vec<String> {
    let mut v = a.to_vec();
    for x in b {
        if !v.contains(x) {
            v.push(x.clone());
        }
    }
    v.sort();
    v
}

/// `f(point)` equal to `c · g(point)` at every point where both have a
/// value, with at least three such points; `c` is returned. Where only one
/// has a value, they differ (`\sqrt{x^2}` is not `x`: at negative points).
fn proportional(f: &[f64], g: &[f64], tol: Tolerance) -> Option<f64> {
    let mut c = None;
    let mut valid = 0;
    for (&x, &y) in f.iter().zip(g) {
        match (x.is_finite(), y.is_finite()) {
            (false, false) => continue,
            (true, true) => {}
            _ => return None,
        }
        valid += 1;
        if y.abs() <= tol.abs {
            if x.abs() > tol.abs {
                return None;
            }
            continue;
        }
        let r = x / y;
        match c {
            None => c = Some(r),
            Some(c0) if (r - c0).abs() <= tol.rel.max(1e-9) * 10.0 * c0.abs().max(1.0) => {}
            Some(_) => return None,
        }
    }
    if valid >= 3 {
        Some(c.unwrap_or(1.0))
    } else {
        None
    }
}

fn expr_equal(a: &str, av: &[String], b: &str, bv: &[String], tol: Tolerance) -> bool {
    let vars = union_vars(av, bv);
    let (f, g) = (sample(a, &vars), sample(b, &vars));
    proportional(&f, &g, tol).is_some_and(|c| (c - 1.0).abs() <= tol.rel.max(1e-9) * 10.0)
}

/// A relation's sides and its operators, each with whether it points the
/// other way (`>`, `\ge`).
type SplitRelation = (Vec<String>, Vec<(Rel, bool)>);

/// Splits at depth-0 relation operators: sides and operators, or `None`.
fn split_relation(s: &str) -> Option<SplitRelation> {
    let mut sides = Vec::new();
    let mut ops = Vec::new();
    let mut depth = 0i64;
    let mut start = 0;
    let mut i = 0;
    let b = s.as_bytes();
    while i < b.len() {
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && s.is_char_boundary(i) {
            let hit = RELATIONS.iter().find(|(t, _, _)| {
                s[i..].starts_with(t)
                    && !(t.starts_with('\\') && s[i + t.len()..].starts_with(|c: char| c.is_ascii_alphabetic()))
            });
            if let Some(&(t, rel, flip)) = hit {
                sides.push(s[start..i].trim().to_string());
                ops.push((rel, flip));
                i += t.len();
                start = i;
                continue;
            }
        }
        i += 1;
    }
    if ops.is_empty() {
        return None;
    }
    sides.push(s[start..].trim().to_string());
    if sides.iter().any(String::is_empty) {
        return None;
    }
    Some((sides, ops))
}

/// A relation with `>`-type operators turned round; a chain must point one
/// way (`1 < x > 0` is no relation).
fn relation(s: &str) -> Option<Value> {
    let (mut sides, raw) = split_relation(s)?;
    let flips: Vec<bool> = raw.iter().filter(|(r, _)| matches!(r, Rel::Lt | Rel::Le)).map(|(_, f)| *f).collect();
    if flips.iter().any(|&f| f != flips[0]) {
        return None;
    }
    let mut ops: Vec<Rel> = raw.iter().map(|(r, _)| *r).collect();
    if flips.first() == Some(&true) {
        sides.reverse();
        ops.reverse();
    }
    Some(Value::Relation { sides, ops })
}

/// A side of a relation at every point.
fn side_samples(side: &str, vars: &[String]) -> Vec<f64> {
    match eval(side) {
        Ok(n) => vec![n.to_f64(); POINTS.len()],
        Err(_) => sample(side, vars),
    }
}

fn side_vars(side: &str) -> Vec<String> {
    eval_with(side, &|_| 0.7).map(|(_, v)| v).unwrap_or_default()
}

/// Two relations state the same thing: the same operators, and each
/// `right − left` a positive multiple of the other's (any non-zero multiple
/// for `=` and `≠`, whose sides may be swapped), so `x^2 + y^2 = 25` is
/// `y^2 + x^2 = 25` and `x \le 5` is `5 \ge x`. Sides that are not
/// arithmetic compare as text.
fn relation_equal(s1: &[String], o1: &[Rel], s2: &[String], o2: &[Rel], tol: Tolerance) -> bool {
    if o1 != o2 || s1.len() != s2.len() {
        return false;
    }
    if s1.iter().zip(s2).all(|(a, b)| squash(a) == squash(b)) {
        return true;
    }
    if s1.len() != 2 {
        // Chains: side by side.
        return s1.iter().zip(s2).all(|(a, b)| equal(&parse(a, 1), &parse(b, 1), tol));
    }
    let vars = s1.iter().chain(s2).fold(Vec::new(), |acc, s| union_vars(&acc, &side_vars(s)));
    let diff = |s: &[String]| -> Vec<f64> {
        let (l, r) = (side_samples(&s[0], &vars), side_samples(&s[1], &vars));
        l.iter().zip(&r).map(|(l, r)| r - l).collect()
    };
    let (f, g) = (diff(s1), diff(s2));
    if f.iter().chain(&g).all(|x| !x.is_finite()) {
        return false;
    }
    match proportional(&f, &g, tol) {
        Some(c) if matches!(o1[0], Rel::Eq | Rel::Ne) => c.abs() > 1e-12,
        Some(c) => c > 1e-12,
        None => false,
    }
}

/// An inequality in one variable as the interval it describes:
/// `1 \le x < 3` is `[1, 3)`, `x > 2` is `(2, \infty)`.
fn relation_interval(sides: &[String], ops: &[Rel]) -> Option<(char, Num, Num, char)> {
    if ops.iter().any(|r| !matches!(r, Rel::Lt | Rel::Le)) {
        return None;
    }
    let var = |s: &str| !side_vars(s).is_empty() && eval(s).is_err() && s.len() <= 8;
    let bracket = |r: Rel, open: bool| match (r, open) {
        (Rel::Le, true) => '[',
        (Rel::Le, false) => ']',
        (_, true) => '(',
        (_, false) => ')',
    };
    let num = |s: &str| eval(s).ok();
    match (sides.len(), ops) {
        (2, [r]) if var(&sides[0]) => Some(('(', Num::Approx(f64::NEG_INFINITY), num(&sides[1])?, bracket(*r, false))),
        (2, [r]) if var(&sides[1]) => Some((bracket(*r, true), num(&sides[0])?, Num::Approx(f64::INFINITY), ')')),
        (3, [r1, r2]) if var(&sides[1]) => {
            Some((bracket(*r1, true), num(&sides[0])?, num(&sides[2])?, bracket(*r2, false)))
        }
        _ => None,
    }
}

/// `\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}` (also `bmatrix`,
/// `matrix`, `smallmatrix`, `array` with its column spec), possibly inside
/// `(…)` as `\left(\begin{array}…\right)` leaves it: the rows' cells.
fn matrix_rows(s: &str) -> Option<Vec<Vec<String>>> {
    let mut t = s.trim();
    if t.starts_with('(') && t.ends_with(')') || t.starts_with('[') && t.ends_with(']') {
        let inner = t[1..t.len() - 1].trim();
        if inner.starts_with("\\begin{") {
            t = inner;
        }
    }
    let rest = t.strip_prefix("\\begin{")?;
    let close = rest.find('}')?;
    let env = &rest[..close];
    if !["pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix", "array"].contains(&env) {
        return None;
    }
    let mut body = rest[close + 1..].strip_suffix(&format!("\\end{{{env}}}"))?.trim();
    if env == "array" {
        let spec_end = body.strip_prefix('{').and_then(|b| b.find('}'))?;
        body = &body[spec_end + 2..];
    }
    let rows: Vec<Vec<String>> = split_top_level(body, "\\\\")
        .into_iter()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| split_top_level(r, "&").into_iter().map(|c| c.trim().to_string()).collect())
        .collect();
    let width = rows.first()?.len();
    (rows.iter().all(|r| r.len() == width && r.iter().all(|c| !c.is_empty()))).then_some(rows)
}

/// `a=2,b=3` (every element a name and a value) or `(a,b)=(2,3)`.
fn labelled(s: &str, depth: usize) -> Option<Value> {
    let name = |n: &str| {
        let n = n.trim();
        !n.is_empty()
            && n.len() <= 6
            && n.starts_with(|c: char| c.is_ascii_alphabetic() || c == '\\')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || "_\\{}'".contains(c))
    };
    let sides = split_top_level(s, "=");
    if sides.len() == 2 {
        let (l, r) = (sides[0].trim(), sides[1].trim());
        if l.starts_with('(') && l.ends_with(')') && r.starts_with('(') && r.ends_with(')') {
            let names = split_top_level(&l[1..l.len() - 1], ",");
            let values = split_top_level(&r[1..r.len() - 1], ",");
            if names.len() > 1 && names.len() == values.len() && names.iter().all(|n| name(n)) {
                return Some(Value::Labelled(
                    names.iter().zip(values).map(|(n, v)| (n.trim().to_string(), parse(v, depth + 1))).collect(),
                ));
            }
        }
    }
    let elems = split_top_level(s, ",");
    if elems.len() < 2 {
        return None;
    }
    let mut parts = Vec::new();
    for e in elems {
        let kv = split_top_level(e, "=");
        if kv.len() != 2 || !name(kv[0]) {
            return None;
        }
        parts.push((kv[0].trim().to_string(), parse(kv[1], depth + 1)));
    }
    Some(Value::Labelled(parts))
}

/// `a \pm b` as the list `a + b, a - b` (`\pm 3` is `3, -3`); at most one
/// `\pm` per element.
fn plus_minus(s: &str) -> Option<(String, String)> {
    let parts = split_top_level(s, "\\pm");
    if parts.len() != 2 {
        return None;
    }
    let (a, b) = (parts[0].trim(), parts[1].trim());
    if b.is_empty() {
        return None;
    }
    let b_needs_parens =
        split_top_level(b, "+").len() > 1 || split_top_level(b, "-").iter().skip(1).any(|p| !p.is_empty());
    let neg = if b_needs_parens { format!("-({b})") } else { format!("-{b}") };
    Some(if a.is_empty() { (b.to_string(), neg) } else { (format!("{a}+{b}"), format!("{a}{neg}")) })
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
            Value::Expr { .. } => "expression",
            Value::Relation { .. } => "relation",
            Value::Matrix(_) => "matrix",
            Value::Labelled(_) => "labelled answer",
        }
    }

    /// True when no part of the value fell back to text and none is in
    /// variables: what extraction may take as a whole answer from prose
    /// (`$x$` in "with $x$ apples" is not one).
    pub(crate) fn is_mathematical(&self) -> bool {
        match self {
            Value::Num(_) | Value::Unevaluated { .. } => true,
            Value::Text(_) | Value::Expr { .. } | Value::Relation { .. } => false,
            Value::Tuple { items, .. } | Value::Set(items) | Value::List(items) | Value::Union(items) => {
                items.iter().all(Value::is_mathematical)
            }
            Value::Matrix(rows) => rows.iter().flatten().all(Value::is_mathematical),
            Value::Labelled(parts) => parts.iter().all(|(_, v)| v.is_mathematical()),
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
            Value::Expr { text, vars } => write!(f, "expression {text:?} in {}", vars.join(", ")),
            Value::Relation { sides, ops } => {
                write!(f, "relation {}", sides[0])?;
                for (op, side) in ops.iter().zip(&sides[1..]) {
                    write!(f, " {} {side}", op.symbol())?;
                }
                Ok(())
            }
            Value::Matrix(rows) => {
                let rows: Vec<String> = rows.iter().map(|r| join(r, ", ")).collect();
                write!(f, "matrix [{}]", rows.join("; "))
            }
            Value::Labelled(parts) => {
                let parts: Vec<String> = parts.iter().map(|(n, v)| format!("{n} = {v}")).collect();
                write!(f, "labelled ({})", parts.join(", "))
            }
        }
    }
}

/// The last side of an equation chain (`m+n=47` → `47`), when the text is
/// one: only `=` at depth 0, no other relation.
pub(crate) fn equation_result(s: &str) -> Option<String> {
    if split_top_level(s, ",").len() > 1 {
        return None; // `x=-1,x=4` is a list of values
    }
    let (sides, ops) = split_relation(s)?;
    ops.iter().all(|(r, _)| *r == Rel::Eq).then(|| sides.last().cloned()).flatten()
}

/// Reads a normalised answer.
pub(crate) fn parse_value(s: &str) -> Value {
    parse(s, 0)
}

/// The separator of a bracket's or a list's items: `,`, or `;` where no
/// comma separates them (`(1;0;2)`, `-3;-2;5`: the semicolon lists of
/// locales whose decimal mark is a comma).
fn separator(inner: &str) -> &'static str {
    if split_top_level(inner, ",").len() == 1 && split_top_level(inner, ";").len() > 1 {
        ";"
    } else {
        ","
    }
}

fn items(inner: &str, depth: usize) -> Vec<Value> {
    let mut out = Vec::new();
    for e in split_top_level(inner, separator(inner)).into_iter().map(str::trim).filter(|e| !e.is_empty()) {
        let e = strip_assignment(e);
        // `\pm 1, \pm i`: each element's two values join the list.
        match plus_minus(e) {
            Some((p, m)) => {
                out.push(parse(&p, depth + 1));
                out.push(parse(&m, depth + 1));
            }
            None => out.push(parse(e, depth + 1)),
        }
    }
    out
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
    if let Some(rows) = matrix_rows(s) {
        return Value::Matrix(rows.iter().map(|r| r.iter().map(|c| parse(c, depth + 1)).collect()).collect());
    }
    if let Some(v) = labelled(s, depth) {
        return v;
    }
    let first = s.chars().next().unwrap_or(' ');
    let last = s.chars().last().unwrap_or(' ');
    if matches!(first, '(' | '[') && matches!(last, ')' | ']') && closing_index(s) == Some(s.len() - 1) {
        let inner = &s[1..s.len() - 1];
        if split_top_level(inner, separator(inner)).len() > 1 {
            return Value::Tuple { open: first, close: last, items: items(inner, depth) };
        }
    }
    // `x=2,y=1;x=4,y=3`: semicolons part the answers, commas each one's
    // parts (each part read whole: a labelled solution, a tuple).
    let parts = split_top_level(s, ";");
    if parts.len() > 1 && split_top_level(s, ",").len() > 1 {
        return Value::List(parts.into_iter().map(|p| parse(p, depth + 1)).collect());
    }
    if split_top_level(s, separator(s)).len() > 1 {
        return Value::List(items(s, depth));
    }
    if let Some(r) = relation(s) {
        return r;
    }
    if plus_minus(s).is_some() {
        return Value::List(items(s, depth));
    }
    match eval(s) {
        Ok(n) => Value::Num(n),
        Err(EvalFailure::NoValue(why)) => Value::Unevaluated { text: s.to_string(), why },
        Err(EvalFailure::Syntax(_)) => as_expression(s).unwrap_or_else(|| Value::Text(s.to_string())),
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
        // Words (`Yes`, `\text{odd}`) ignore case; single letters do not,
        // since `A` and `a` may be different unknowns.
        (Value::Text(x), Value::Text(y)) => {
            x == y
                || squash(x) == squash(y)
                || x.len() > 1 && x.chars().all(|c| c.is_ascii_alphabetic()) && x.eq_ignore_ascii_case(y)
        }
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
        (Value::Expr { text: x, vars: xv }, Value::Expr { text: y, vars: yv }) => expr_equal(x, xv, y, yv, tol),
        (Value::Relation { sides: s1, ops: o1 }, Value::Relation { sides: s2, ops: o2 }) => {
            relation_equal(s1, o1, s2, o2, tol)
        }
        (Value::Relation { sides, ops }, Value::Tuple { open, close, items })
        | (Value::Tuple { open, close, items }, Value::Relation { sides, ops }) => {
            relation_interval(sides, ops).is_some_and(|(o, lo, hi, c)| {
                items.len() == 2
                    && (o, c) == (*open, *close)
                    && equal(&Value::Num(lo), &items[0], tol)
                    && equal(&Value::Num(hi), &items[1], tol)
            }) || same_region(sides, ops, std::slice::from_ref(b_or(a, b)))
        }
        (Value::Relation { sides, ops }, Value::Union(parts))
        | (Value::Union(parts), Value::Relation { sides, ops }) => same_region(sides, ops, parts),
        (Value::Matrix(x), Value::Matrix(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(r, q)| r.len() == q.len() && r.iter().zip(q).all(|(p, q)| equal(p, q, tol)))
        }
        // A vector written as a tuple: `(1, 2, 3)` and a 3 × 1 matrix.
        (Value::Matrix(m), Value::Tuple { open: '(', close: ')', items })
        | (Value::Tuple { open: '(', close: ')', items }, Value::Matrix(m)) => {
            let flat: Vec<&Value> = m.iter().flatten().collect();
            (m.len() == 1 || m.iter().all(|r| r.len() == 1))
                && flat.len() == items.len()
                && flat.iter().zip(items).all(|(p, q)| equal(p, q, tol))
        }
        (Value::Labelled(x), Value::Labelled(y)) => labelled_equal(x, y, tol),
        // Named parts against plain ones: in the order the names were given.
        (Value::Labelled(x), Value::Tuple { open: '(', close: ')', items: y })
        | (Value::Tuple { open: '(', close: ')', items: y }, Value::Labelled(x))
        | (Value::Labelled(x), Value::List(y))
        | (Value::List(y), Value::Labelled(x)) => {
            if repeated_names(x) {
                // `x = -1, x = 4`: several values of one unknown, a list.
                equal(&values(x), &Value::List(y.clone()), tol)
            } else {
                x.len() == y.len() && x.iter().zip(y).all(|((_, p), q)| equal(p, q, tol))
            }
        }
        (Value::Labelled(x), other) | (other, Value::Labelled(x)) if repeated_names(x) => equal(&values(x), other, tol),
        _ => false,
    }
}

/// Whichever of two values is not the relation (for [`same_region`]).
fn b_or<'v>(a: &'v Value, b: &'v Value) -> &'v Value {
    if matches!(a, Value::Relation { .. }) {
        b
    } else {
        a
    }
}

/// A condition in one variable and a union of intervals describe the same
/// set: `|x - 1| > 2` and `(-\infty, -1) \cup (3, \infty)`. Checked where
/// the answer can change, exactly: at every endpoint (open or closed must
/// agree), just inside and outside each, between them and beyond the
/// outermost; every piece must be an interval with numeric ends.
fn same_region(sides: &[String], ops: &[Rel], pieces: &[Value]) -> bool {
    let vars = sides.iter().fold(Vec::new(), |acc, s| union_vars(&acc, &side_vars(s)));
    if vars.len() != 1 || sides.len() < 2 {
        return false;
    }
    let mut intervals = Vec::new();
    for p in pieces {
        let Value::Tuple { open, close, items } = p else { return false };
        let (Some(lo), Some(hi)) = (items.first().and_then(Value::as_num), items.get(1).and_then(Value::as_num)) else {
            return false;
        };
        if items.len() != 2 || !matches!(open, '(' | '[') || !matches!(close, ')' | ']') {
            return false;
        }
        intervals.push((lo.to_f64(), hi.to_f64(), *open == '[', *close == ']'));
    }
    let inside =
        |x: f64| intervals.iter().any(|&(lo, hi, lc, hc)| (x > lo || lc && x == lo) && (x < hi || hc && x == hi));
    let holds = |x: f64| -> Option<bool> {
        let v: Vec<f64> =
            sides.iter().map(|s| eval_with(s, &|_| x).ok().map(|(n, _)| n.to_f64())).collect::<Option<_>>()?;
        let eps = 1e-12 * v.iter().fold(1.0f64, |m, y| m.max(y.abs()));
        Some(ops.iter().zip(v.windows(2)).all(|(op, w)| match op {
            Rel::Eq => (w[0] - w[1]).abs() <= eps,
            Rel::Ne => (w[0] - w[1]).abs() > eps,
            Rel::Lt => w[0] < w[1] - eps,
            Rel::Le => w[0] <= w[1] + eps,
        }))
    };
    let mut ends: Vec<f64> = intervals.iter().flat_map(|&(lo, hi, _, _)| [lo, hi]).filter(|e| e.is_finite()).collect();
    ends.sort_by(f64::total_cmp);
    ends.dedup();
    let mut points: Vec<f64> = Vec::new();
    for &e in &ends {
        let d = 1e-6 * e.abs().max(1.0);
        points.extend([e - d, e, e + d]);
    }
    points.extend(ends.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    match (ends.first(), ends.last()) {
        (Some(&lo), Some(&hi)) => points.extend([lo - 10.0 * (1.0 + lo.abs()), hi + 10.0 * (1.0 + hi.abs())]),
        _ => points.extend([-10.0, 0.0, 10.0]),
    }
    points.iter().all(|&x| holds(x) == Some(inside(x)))
}

/// Named parts without their names, as a list of values.
fn values(parts: &[(String, Value)]) -> Value {
    Value::List(parts.iter().map(|(_, v)| v.clone()).collect())
}

fn repeated_names(parts: &[(String, Value)]) -> bool {
    parts.iter().enumerate().any(|(i, (n, _))| parts[..i].iter().any(|(m, _)| m == n))
}

/// The same names with equal values, in any order; answers that repeat a
/// name are lists of that unknown's values.
fn labelled_equal(x: &[(String, Value)], y: &[(String, Value)], tol: Tolerance) -> bool {
    if repeated_names(x) || repeated_names(y) {
        return equal(&values(x), &values(y), tol);
    }
    x.len() == y.len() && x.iter().all(|(n, v)| y.iter().any(|(m, w)| squash(n) == squash(m) && equal(v, w, tol)))
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
        assert_eq!(parse_value("2x").kind(), "expression");
        assert_eq!(parse_value("odd").kind(), "text");
        assert_eq!(parse_value("x\\leq5").kind(), "relation");
        assert_eq!(parse_value("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}").kind(), "matrix");
        assert_eq!(parse_value("a=2,b=3").kind(), "labelled answer");
        assert_eq!(parse_value("\\pm3").kind(), "list");
    }

    #[test]
    fn expressions_compare_by_value_at_fixed_points() {
        assert!(eq("x+1", "1+x"));
        assert!(eq("(x+1)^2", "x^2+2x+1"));
        assert!(eq("\\frac{x^2-1}{x-1}", "x+1"));
        assert!(eq("2\\sin x\\cos x", "\\sin2x"));
        assert!(eq("a^2-b^2", "(a-b)(a+b)"));
        assert!(!eq("x+1", "x+2"));
        assert!(!eq("x+1", "y+1"));
        assert!(!eq("\\sqrt{x^2}", "x"), "they differ at negative x");
        assert!(!eq("2x", "2"));
    }

    #[test]
    fn relations_compare_as_statements() {
        assert!(eq("x\\leq5", "5\\geq x"));
        assert!(eq("x>-3", "-3<x"));
        assert!(eq("x^2+y^2=25", "y^2+x^2=25"));
        assert!(eq("2x-y+1=0", "y-2x-1=0"));
        assert!(!eq("x<5", "x\\leq5"));
        assert!(!eq("x\\leq5", "x\\geq5"));
        assert!(eq("1\\le x<3", "[1,3)"));
        assert!(eq("x>2", "(2,\\infty)"));
        assert!(!eq("x\\ge2", "(2,\\infty)"));
    }

    #[test]
    fn matrices_labels_and_plus_minus() {
        assert!(eq("\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"));
        assert!(eq("\\begin{pmatrix}1/2\\\\3\\end{pmatrix}", "(\\frac{1}{2},3)"));
        assert!(!eq("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1&3\\\\2&4\\end{pmatrix}"));
        assert!(eq("a=2,b=3", "(a,b)=(2,3)"));
        assert!(eq("b=3,a=2", "a=2,b=3"));
        assert!(!eq("a=3,b=2", "a=2,b=3"));
        assert!(eq("x=6,y=-4", "(6,-4)"));
        assert!(!eq("(3,2)", "a=2,b=3"));
        assert!(eq("\\pm3", "-3,3"));
        assert!(eq("1\\pm\\sqrt{2}", "1+\\sqrt{2},1-\\sqrt{2}"));
        assert!(!eq("\\pm3", "3"));
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
