//! A tiny, bounded evaluator for the arithmetic that appears in final answers.
//!
//! It understands numbers (`12`, `-3.5`, `.5`, `1e3`), `+ - * / ^ **`,
//! `\cdot`, `\times`, `\div`, parentheses and braces, `\frac{a}{b}`,
//! `\sqrt{x}`, `\sqrt[n]{x}`, `\pi`, `\infty`, `n!`, implicit multiplication
//! (`2\pi`, `3\sqrt2`, `2(1+1)`) and mixed numbers (`2\frac{1}{2}` = 5/2).
//! Anything else (variables, functions) is an error, and the caller then
//! compares the answer as text. There is no `e` constant: a bare `e` is more
//! often a variable or part of a word than Euler's number.
//!
//! Bounded by construction: the input is capped by the caller, recursion depth
//! is capped here, and exponentiation never loops over the exponent.
//!
//! Parsing and evaluating are kept apart on purpose. A well-formed expression
//! whose value cannot be represented (`9^{9^{9^{9}}}`, `1e999999`, `171!`,
//! `1/0`) is [`EvalFailure::NoValue`], not a syntax error: it is still a
//! complete mathematical answer, so the caller must neither fall back to
//! reading some number out of it (`1e999999` is not 999999) nor call it equal
//! to anything but the identical expression.

use super::num::{EvalError, Num, Ratio};

/// Deeper nesting than this is an error, not a stack overflow.
const MAX_DEPTH: usize = 64;

/// Why a text has no numeric value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EvalFailure {
    /// Not arithmetic this evaluator reads (variables, functions, stray
    /// brackets, trailing text): the caller compares it as text.
    Syntax(EvalError),
    /// Well-formed arithmetic without a finite real value here: overflow,
    /// division by zero, a factorial of a non-integer or of more than 170.
    NoValue(EvalError),
}

/// Parses `s` completely (trailing unparsed input is a syntax error) and
/// evaluates it.
pub(crate) fn eval(s: &str) -> Result<Num, EvalFailure> {
    run(s, None).map(|(v, _)| v)
}

/// Evaluates `s` as a function of its variables, each bound by `bind` (a
/// letter such as `x`, a subscripted `a_1`, or a Greek letter's command
/// name such as `theta`), and returns the variables it met, in order of
/// first use. Only [`crate::equiv`]'s symbolic comparison binds variables:
/// plain [`eval`] still refuses them.
pub(crate) fn eval_with(s: &str, bind: &dyn Fn(&str) -> f64) -> Result<(Num, Vec<String>), EvalFailure> {
    run(s, Some(bind))
}

fn run(s: &str, bind: Option<&dyn Fn(&str) -> f64>) -> Result<(Num, Vec<String>), EvalFailure> {
    let mut p = Parser { c: s.chars().collect(), i: 0, depth: 0, no_value: None, bind, seen: Vec::new() };
    let v = p.expr().map_err(EvalFailure::Syntax)?;
    p.ws();
    if p.i != p.c.len() {
        return Err(EvalFailure::Syntax("unexpected trailing input"));
    }
    match p.no_value {
        Some(why) => Err(EvalFailure::NoValue(why)),
        None => Ok((v, p.seen)),
    }
}

/// Methods return `Err` only for syntax errors; arithmetic failures are
/// recorded in `no_value` and parsing goes on, so that the whole input is
/// still checked for being an expression.
struct Parser<'a> {
    c: Vec<char>,
    i: usize,
    depth: usize,
    /// The first arithmetic failure; later values are placeholders.
    no_value: Option<EvalError>,
    /// Values of variables, when they are allowed at all.
    bind: Option<&'a dyn Fn(&str) -> f64>,
    /// Variables met so far.
    seen: Vec<String>,
}

/// Commands that can begin an operand, so that juxtaposition means product.
const PRIMARY_COMMANDS: &[&str] = &["frac", "dfrac", "tfrac", "sqrt", "pi", "infty"];

/// Functions of one argument: `\sin x`, `\sin(2x)`, `\sin^2 x`, `\log_2 8`.
const FUNCTIONS: &[&str] = &[
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "ln", "log", "exp",
];

/// Greek letters read as variables when variables are bound (`\pi` is the
/// constant, never a variable).
const GREEK: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
];

fn apply(name: &str, x: f64) -> f64 {
    match name {
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tan" => x.tan(),
        "sec" => 1.0 / x.cos(),
        "csc" => 1.0 / x.sin(),
        "cot" => 1.0 / x.tan(),
        "arcsin" => x.asin(),
        "arccos" => x.acos(),
        "arctan" => x.atan(),
        "sinh" => x.sinh(),
        "cosh" => x.cosh(),
        "tanh" => x.tanh(),
        "ln" | "log" => x.ln(),
        "exp" => x.exp(),
        _ => f64::NAN,
    }
}

impl Parser<'_> {
    /// The value of an arithmetic step, or a NaN placeholder after recording
    /// why it has none (NaN keeps failing, so it never becomes a value).
    fn value(&mut self, r: Result<Num, EvalError>) -> Num {
        r.unwrap_or_else(|why| {
            self.no_value.get_or_insert(why);
            Num::Approx(f64::NAN)
        })
    }

    fn peek(&self) -> Option<char> {
        self.c.get(self.i).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, ch: char) -> bool {
        self.ws();
        if self.peek() == Some(ch) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, ch: char) -> Result<(), EvalError> {
        if self.eat(ch) {
            Ok(())
        } else {
            Err("unbalanced brackets")
        }
    }

    /// The control word at the cursor (after whitespace), without consuming it.
    fn peek_command(&mut self) -> Option<(String, usize)> {
        self.ws();
        if self.peek() != Some('\\') {
            return None;
        }
        let mut j = self.i + 1;
        while j < self.c.len() && self.c[j].is_ascii_alphabetic() {
            j += 1;
        }
        if j == self.i + 1 {
            // A control symbol such as `\{` or `\,`.
            j = (self.i + 2).min(self.c.len());
        }
        Some((self.c[self.i + 1..j].iter().collect(), j))
    }

    fn eat_command(&mut self, names: &[&str]) -> bool {
        match self.peek_command() {
            Some((name, end)) if names.contains(&name.as_str()) => {
                self.i = end;
                true
            }
            _ => false,
        }
    }

    fn enter(&mut self) -> Result<(), EvalError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err("nesting too deep")
        } else {
            Ok(())
        }
    }

    fn expr(&mut self) -> Result<Num, EvalError> {
        self.enter()?;
        let mut v = self.term()?;
        loop {
            if self.eat('+') {
                let t = self.term()?;
                v = self.value(v.add(t));
            } else if self.eat('-') {
                let t = self.term()?;
                v = self.value(v.sub(t));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(v)
    }

    fn starts_operand(&mut self) -> bool {
        self.ws();
        let vars = self.bind.is_some();
        match self.peek() {
            Some(c) if c.is_ascii_digit() || c == '.' || c == '(' || c == '{' => true,
            Some(c) if vars && c.is_ascii_alphabetic() => true,
            Some('\\') => self.peek_command().is_some_and(|(n, _)| {
                PRIMARY_COMMANDS.contains(&n.as_str())
                    || FUNCTIONS.contains(&n.as_str())
                    || vars && GREEK.contains(&n.as_str())
            }),
            _ => false,
        }
    }

    /// A variable's value, recording the variable; `x_1`/`x_{12}` subscripts
    /// are part of the name.
    fn variable(&mut self, mut name: String) -> Result<Num, EvalError> {
        let bind = self.bind.ok_or("variables are not numbers")?;
        if self.peek() == Some('_') {
            let save = self.i;
            self.i += 1;
            match self.peek() {
                Some('{') => {
                    let start = self.i;
                    while self.peek().is_some_and(|c| c != '}') {
                        self.i += 1;
                    }
                    if self.peek() != Some('}') {
                        self.i = save;
                        return Err("unbalanced brackets");
                    }
                    self.i += 1;
                    name.push('_');
                    name.extend(&self.c[start + 1..self.i - 1]);
                }
                Some(c) if c.is_ascii_alphanumeric() => {
                    self.i += 1;
                    name.push('_');
                    name.push(c);
                }
                _ => self.i = save,
            }
        }
        let x = bind(&name);
        if !self.seen.contains(&name) {
            self.seen.push(name);
        }
        Ok(Num::Approx(x))
    }

    /// `\sin x`: the argument without brackets is one factor with the
    /// letters glued to it (`\sin 2x` is sin(2x)); `\sin x \cos x` is a
    /// product of two functions.
    fn function(&mut self, name: &str) -> Result<Num, EvalError> {
        let power = if self.eat_pow() { Some(self.exponent()?) } else { None };
        let base = if name == "log" && self.eat('_') { Some(self.arg()?) } else { None };
        self.ws();
        let mut x = match self.peek() {
            Some('(' | '{') => self.primary()?,
            _ => {
                let mut v = self.power()?;
                while self.bind.is_some() && self.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
                    let f = self.power()?;
                    v = self.value(v.mul(f));
                }
                v
            }
        };
        let mut y = apply(name, x.to_f64());
        if let Some(b) = base {
            y /= b.to_f64().ln();
        }
        x = self.value(if y.is_finite() { Ok(Num::Approx(y)) } else { Err("outside the function's domain") });
        Ok(match power {
            Some(e) => self.value(x.pow(e)),
            None => x,
        })
    }

    fn term(&mut self) -> Result<Num, EvalError> {
        let mut v = self.unary()?;
        loop {
            self.ws();
            let is_pow = self.peek() == Some('*') && self.c.get(self.i + 1) == Some(&'*');
            if !is_pow && self.eat('*') || self.eat_command(&["cdot", "times", "ast"]) {
                let u = self.unary()?;
                v = self.value(v.mul(u));
            } else if self.eat('/') || self.eat_command(&["div"]) {
                let u = self.unary()?;
                v = self.value(v.div(u));
            } else if self.starts_operand() {
                let p = self.power()?;
                v = self.value(v.mul(p));
            } else {
                break;
            }
        }
        Ok(v)
    }

    fn unary(&mut self) -> Result<Num, EvalError> {
        self.enter()?;
        let v = if self.eat('-') {
            let u = self.unary()?;
            self.value(u.neg())
        } else if self.eat('+') {
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Ok(v)
    }

    fn eat_pow(&mut self) -> bool {
        self.ws();
        if self.peek() == Some('^') {
            self.i += 1;
            true
        } else if self.peek() == Some('*') && self.c.get(self.i + 1) == Some(&'*') {
            self.i += 2;
            true
        } else {
            false
        }
    }

    fn power(&mut self) -> Result<Num, EvalError> {
        let base = self.postfix()?;
        if self.eat_pow() {
            let e = self.exponent()?;
            Ok(self.value(base.pow(e)))
        } else {
            Ok(base)
        }
    }

    /// `x^{...}`, `x^-2`, `x^10` (all digits: plain-text answers mean 10, not
    /// LaTeX's one-token `1` followed by `0`), `x^\pi`; right-associative.
    fn exponent(&mut self) -> Result<Num, EvalError> {
        self.enter()?;
        self.ws();
        let e = if self.eat('-') {
            let x = self.exponent()?;
            self.value(x.neg())
        } else if self.eat('+') {
            self.exponent()?
        } else {
            let atom = self.postfix()?;
            if self.eat_pow() {
                let x = self.exponent()?;
                self.value(atom.pow(x))
            } else {
                atom
            }
        };
        self.depth -= 1;
        Ok(e)
    }

    /// `n!` is the factorial, evaluated exactly while it fits `i128` and up
    /// to `170!` in `f64`; it is never dropped as punctuation, since `5!` is
    /// 120, not 5. `n!!` is the double factorial in most texts and `(n!)!` in
    /// some, so it gets no value and only matches the identical expression.
    fn postfix(&mut self) -> Result<Num, EvalError> {
        let v = self.primary()?;
        let mut bangs = 0usize;
        while self.eat('!') {
            bangs += 1;
        }
        Ok(match bangs {
            0 => v,
            1 => self.value(v.factorial()),
            _ => self.value(Err("multiple factorial marks are ambiguous")),
        })
    }

    /// A single-token or braced macro argument: `\frac12`, `\sqrt{2}`, `\sqrt\pi`.
    fn arg(&mut self) -> Result<Num, EvalError> {
        self.ws();
        match self.peek() {
            Some('{') => self.primary(),
            Some(c) if c.is_ascii_digit() => {
                self.i += 1;
                Ok(Num::int(i128::from(c as u8 - b'0')))
            }
            Some('\\') => self.primary(),
            _ => Err("missing macro argument"),
        }
    }

    fn primary(&mut self) -> Result<Num, EvalError> {
        self.enter()?;
        self.ws();
        let v = match self.peek() {
            Some(c) if c.is_ascii_digit() || c == '.' => self.number_or_mixed()?,
            Some('(') => {
                self.i += 1;
                let v = self.expr()?;
                self.expect(')')?;
                v
            }
            // `|x - 1|`: an absolute value. Not an implicit factor
            // (`starts_operand`), so a closing bar is never read as the
            // opening of another.
            Some('|') => {
                self.i += 1;
                let v = self.expr()?;
                self.expect('|')?;
                if v.to_f64() < 0.0 {
                    self.value(v.neg())
                } else {
                    v
                }
            }
            Some('{') => {
                self.i += 1;
                let v = self.expr()?;
                self.expect('}')?;
                v
            }
            Some('\\') => {
                let (name, end) = self.peek_command().ok_or("bad command")?;
                self.i = end;
                match name.as_str() {
                    "frac" | "dfrac" | "tfrac" => {
                        let a = self.arg()?;
                        let b = self.arg()?;
                        self.value(a.div(b))
                    }
                    "sqrt" => {
                        let n = if self.eat('[') {
                            let n = self.expr()?;
                            self.expect(']')?;
                            n
                        } else {
                            Num::int(2)
                        };
                        let x = self.arg()?;
                        self.value(x.root(n))
                    }
                    "pi" => Num::Approx(std::f64::consts::PI),
                    "infty" => Num::Approx(f64::INFINITY),
                    f if FUNCTIONS.contains(&f) => self.function(f)?,
                    g if self.bind.is_some() && GREEK.contains(&g) => self.variable(g.to_string())?,
                    _ => return Err("unsupported command"),
                }
            }
            Some(c) if self.bind.is_some() && c.is_ascii_alphabetic() => {
                self.i += 1;
                self.variable(c.to_string())?
            }
            _ => return Err("expected a number"),
        };
        self.depth -= 1;
        Ok(v)
    }

    fn digits(&mut self) -> String {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.c[start..self.i].iter().collect()
    }

    /// A numeric literal, then `2\frac{1}{2}` read as a mixed number.
    fn number_or_mixed(&mut self) -> Result<Num, EvalError> {
        let int_part = self.digits();
        let mut frac_part = String::new();
        let mut is_integer = true;
        if self.peek() == Some('.') && self.c.get(self.i + 1).is_some_and(char::is_ascii_digit) {
            self.i += 1;
            frac_part = self.digits();
            is_integer = false;
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err("expected a number");
        }
        let mut exp10: i128 = 0;
        if matches!(self.peek(), Some('e' | 'E')) {
            let save = self.i;
            self.i += 1;
            let neg = self.peek() == Some('-');
            if matches!(self.peek(), Some('-' | '+')) {
                self.i += 1;
            }
            let ds = self.digits();
            if ds.is_empty() {
                self.i = save;
            } else {
                is_integer = false;
                // Saturate: exponents beyond i64 are overflow either way.
                let mag = if ds.len() > 18 { i128::from(i64::MAX) } else { ds.parse::<i128>().unwrap_or(0) };
                exp10 = if neg { -mag } else { mag };
            }
        }
        // Scientific notation is read whole: `1e999999` overflows and has no
        // value; it is never its mantissa or its exponent alone.
        let v = self.value(literal_value(&int_part, &frac_part, exp10));
        if is_integer {
            if let Some((n, d)) = self.simple_frac() {
                // The literal is non-negative; a leading minus applies to the sum.
                let fr = Num::int(n).div(Num::int(d));
                let fr = self.value(fr);
                return Ok(self.value(v.add(fr)));
            }
        }
        Ok(v)
    }

    /// `\frac{<digits>}{<digits>}` right at the cursor (consumed only on success).
    fn simple_frac(&mut self) -> Option<(i128, i128)> {
        let save = self.i;
        let out = (|| {
            if !self.eat_command(&["frac", "dfrac", "tfrac"]) {
                return None;
            }
            let mut parts = [0i128; 2];
            for part in &mut parts {
                self.ws();
                if self.peek() != Some('{') {
                    return None;
                }
                self.i += 1;
                self.ws();
                let ds = self.digits();
                self.ws();
                if ds.is_empty() || ds.len() > 30 || self.peek() != Some('}') {
                    return None;
                }
                self.i += 1;
                *part = ds.parse().ok()?;
            }
            (parts[1] != 0).then_some((parts[0], parts[1]))
        })();
        if out.is_none() {
            self.i = save;
        }
        out
    }
}

/// Exact when the digits fit `i128` and the decimal exponent is modest.
fn literal_value(int_part: &str, frac_part: &str, exp10: i128) -> Result<Num, EvalError> {
    let digits = format!("{int_part}{frac_part}");
    if digits.len() <= 36 && exp10.abs() <= 36 {
        let exact = (|| {
            let n: i128 = digits.parse().ok()?;
            let r = Ratio::new(n, 10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?)?;
            let scale = Ratio::int(10i128.checked_pow(u32::try_from(exp10.unsigned_abs()).ok()?)?)?;
            let v = Num::Exact(r);
            let s = Num::Exact(scale);
            if exp10 >= 0 {
                v.mul(s).ok()
            } else {
                v.div(s).ok()
            }
        })();
        if let Some(v) = exact {
            return Ok(v);
        }
    }
    let int_part = if int_part.is_empty() { "0" } else { int_part };
    let text =
        if frac_part.is_empty() { format!("{int_part}e{exp10}") } else { format!("{int_part}.{frac_part}e{exp10}") };
    let x: f64 = text.parse().map_err(|_| "bad number")?;
    if x.is_infinite() {
        Err("overflow")
    } else {
        Ok(Num::Approx(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> f64 {
        eval(s).unwrap_or_else(|e| panic!("{s}: {e:?}")).to_f64()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn integers_decimals_and_signs() {
        assert_eq!(val("42"), 42.0);
        assert_eq!(val("-3.25"), -3.25);
        assert_eq!(val(".5"), 0.5);
        assert_eq!(val("--2"), 2.0);
    }

    #[test]
    fn operators_and_precedence() {
        assert_eq!(val("1+2*3"), 7.0);
        assert_eq!(val("(1+2)*3"), 9.0);
        assert_eq!(val("2^3^2"), 512.0);
        assert_eq!(val("-2^2"), -4.0);
        assert_eq!(val("2**10"), 1024.0);
        assert_eq!(val("2^10"), 1024.0);
        assert_eq!(val("6\\div3"), 2.0);
        assert_eq!(val("3\\cdot4"), 12.0);
        assert_eq!(val("3\\times4"), 12.0);
        assert_eq!(val("7/2"), 3.5);
        assert_eq!(val("5!"), 120.0);
    }

    #[test]
    fn fractions_full_and_shorthand() {
        assert_eq!(val("\\frac{1}{2}"), 0.5);
        assert_eq!(val("\\frac12"), 0.5);
        assert_eq!(val("\\dfrac{3}{4}"), 0.75);
        assert_eq!(val("-\\frac{1}{4}"), -0.25);
    }

    #[test]
    fn mixed_numbers() {
        assert_eq!(val("2\\frac{1}{2}"), 2.5);
        assert_eq!(val("-2\\frac{1}{2}"), -2.5);
        // Not a mixed number: the fraction is not of plain integers.
        assert!(close(val("2\\frac{\\pi}{2}"), std::f64::consts::PI));
    }

    #[test]
    fn radicals_pi_and_implicit_products() {
        assert!(close(val("\\sqrt{2}"), 2f64.sqrt()));
        assert!(close(val("3\\sqrt{2}"), 3.0 * 2f64.sqrt()));
        assert!(close(val("3\\sqrt2"), 3.0 * 2f64.sqrt()));
        assert!(close(val("\\sqrt[3]{27}"), 3.0));
        assert!(close(val("\\sqrt[3]{-8}"), -2.0));
        assert!(close(val("2\\pi"), 2.0 * std::f64::consts::PI));
        assert!(close(val("\\frac{\\pi}{3}"), std::f64::consts::PI / 3.0));
        assert!(close(val("2(3+1)"), 8.0));
    }

    #[test]
    fn scientific_notation() {
        assert_eq!(val("1.5\\times10^{3}"), 1500.0);
        assert_eq!(val("1e3"), 1000.0);
        assert_eq!(val("2.5E-2"), 0.025);
        assert!(matches!(eval("1.5\\times10^{3}").unwrap(), Num::Exact(_)));
    }

    #[test]
    fn rejects_variables_and_garbage() {
        for s in ["x", "2x", "\\sin(x)", "(1", "1)", "", "1+", "\\frac{1}", "e", "5!x", "10^{400}x", "\\foo(1)"] {
            assert!(matches!(eval(s), Err(EvalFailure::Syntax(_))), "{s}: {:?}", eval(s));
        }
    }

    #[test]
    fn functions_of_numbers_have_values() {
        assert!(close(val("\\sin(\\pi/6)"), 0.5));
        assert!(close(val("2\\cos\\frac{\\pi}{3}"), 1.0));
        assert!(close(val("\\log_2 8"), 3.0));
        assert!(close(val("\\sin^2(1)+\\cos^2(1)"), 1.0));
        assert!(matches!(eval("\\ln(-1)"), Err(EvalFailure::NoValue(_))));
    }

    #[test]
    fn variables_are_bound_and_reported() {
        let bind = |v: &str| match v {
            "x" => 2.0,
            "y" => 3.0,
            "theta" => 0.5,
            "a_1" => 10.0,
            _ => 1.0,
        };
        let at = |s: &str| eval_with(s, &bind).unwrap();
        assert_eq!(at("2x+y").0.to_f64(), 7.0);
        assert_eq!(at("2x+y").1, ["x", "y"]);
        assert_eq!(at("xy^2").0.to_f64(), 18.0);
        assert_eq!(at("a_1 x").0.to_f64(), 20.0);
        assert!(close(at("2\\sin x\\cos x").0.to_f64(), (4.0f64).sin()));
        assert!(close(at("\\sin 2x").0.to_f64(), (4.0f64).sin()));
        assert!(close(at("\\cos\\theta").0.to_f64(), (0.5f64).cos()));
        assert!(close(at("\\frac{x^2-1}{x-1}").0.to_f64(), 3.0));
    }

    fn no_value(s: &str) -> bool {
        matches!(eval(s), Err(EvalFailure::NoValue(_)))
    }

    #[test]
    fn factorials_are_evaluated_or_have_no_value_never_dropped() {
        assert!(matches!(eval("5!").unwrap(), Num::Exact(r) if r == Ratio::int(120).unwrap()));
        assert_eq!(val("0!"), 1.0);
        assert_eq!(val("3!+1"), 7.0);
        assert_eq!(val("2\\cdot3!"), 12.0);
        assert_eq!(val("(2+1)!"), 6.0);
        assert!(close(val("170!"), 7.257415615307994e306));
        for s in ["171!", "2.5!", "(-1)!", "5!!", "10^{400}!"] {
            assert!(no_value(s), "{s}: {:?}", eval(s));
        }
    }

    #[test]
    fn unrepresentable_expressions_have_no_value_but_still_parse() {
        for s in
            ["9^{9^{9^{9}}}", "9^{9^{9^{9}}}+1", "10^{400}", "1e999999", "-1e999999", "2.5e400", "1/0", "\\frac{1}{0}"]
        {
            assert!(no_value(s), "{s}: {:?}", eval(s));
        }
        // Syntax errors win over arithmetic ones: this is not an expression.
        assert!(matches!(eval("1e999999 apples"), Err(EvalFailure::Syntax(_))));
        // Scientific notation is read whole, never as its exponent alone.
        assert_eq!(val("1e6"), 1_000_000.0);
        assert!(matches!(eval("1e3").unwrap(), Num::Exact(r) if r == Ratio::int(1000).unwrap()));
    }

    #[test]
    fn bounded_on_pathological_input() {
        let deep = format!("{}1{}", "(".repeat(500), ")".repeat(500));
        assert!(eval(&deep).is_err());
        assert!(eval("10^{100000}").is_err());
        assert!(eval("10^{10^{10^{10}}}").is_err());
        assert!(eval("1e999999999999999999999").is_err());
        assert!(eval(&"9".repeat(1000)).is_err());
        assert!(eval(&"-".repeat(1000)).is_err());
    }
}
