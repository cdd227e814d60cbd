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

use super::num::{EvalError, Num, Ratio};

/// Deeper nesting than this is an error, not a stack overflow.
const MAX_DEPTH: usize = 64;

/// Evaluates `s` completely; trailing unparsed input is an error.
pub(crate) fn eval(s: &str) -> Result<Num, EvalError> {
    let mut p = Parser { c: s.chars().collect(), i: 0, depth: 0 };
    let v = p.expr()?;
    p.ws();
    if p.i != p.c.len() {
        return Err("unexpected trailing input");
    }
    Ok(v)
}

struct Parser {
    c: Vec<char>,
    i: usize,
    depth: usize,
}

/// Commands that can begin an operand, so that juxtaposition means product.
const PRIMARY_COMMANDS: &[&str] = &["frac", "dfrac", "tfrac", "sqrt", "pi", "infty"];

impl Parser {
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
                v = v.add(self.term()?)?;
            } else if self.eat('-') {
                v = v.sub(self.term()?)?;
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(v)
    }

    fn starts_operand(&mut self) -> bool {
        self.ws();
        match self.peek() {
            Some(c) if c.is_ascii_digit() || c == '.' || c == '(' || c == '{' => true,
            Some('\\') => self.peek_command().is_some_and(|(n, _)| PRIMARY_COMMANDS.contains(&n.as_str())),
            _ => false,
        }
    }

    fn term(&mut self) -> Result<Num, EvalError> {
        let mut v = self.unary()?;
        loop {
            self.ws();
            let is_pow = self.peek() == Some('*') && self.c.get(self.i + 1) == Some(&'*');
            if !is_pow && self.eat('*') || self.eat_command(&["cdot", "times", "ast"]) {
                v = v.mul(self.unary()?)?;
            } else if self.eat('/') || self.eat_command(&["div"]) {
                v = v.div(self.unary()?)?;
            } else if self.starts_operand() {
                v = v.mul(self.power()?)?;
            } else {
                break;
            }
        }
        Ok(v)
    }

    fn unary(&mut self) -> Result<Num, EvalError> {
        self.enter()?;
        let v = if self.eat('-') {
            self.unary()?.neg()?
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
            base.pow(e)
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
            self.exponent()?.neg()?
        } else if self.eat('+') {
            self.exponent()?
        } else {
            let atom = self.postfix()?;
            if self.eat_pow() {
                atom.pow(self.exponent()?)?
            } else {
                atom
            }
        };
        self.depth -= 1;
        Ok(e)
    }

    fn postfix(&mut self) -> Result<Num, EvalError> {
        let mut v = self.primary()?;
        while self.eat('!') {
            v = v.factorial()?;
        }
        Ok(v)
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
                        a.div(b)?
                    }
                    "sqrt" => {
                        if self.eat('[') {
                            let n = self.expr()?;
                            self.expect(']')?;
                            self.arg()?.root(n)?
                        } else {
                            self.arg()?.root(Num::int(2))?
                        }
                    }
                    "pi" => Num::Approx(std::f64::consts::PI),
                    "infty" => Num::Approx(f64::INFINITY),
                    _ => return Err("unsupported command"),
                }
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
        let v = literal_value(&int_part, &frac_part, exp10)?;
        if is_integer {
            if let Some((n, d)) = self.simple_frac() {
                // The literal is non-negative; a leading minus applies to the sum.
                let fr = Num::int(n).div(Num::int(d))?;
                return v.add(fr);
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
        eval(s).unwrap_or_else(|e| panic!("{s}: {e}")).to_f64()
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
    fn rejects_variables_functions_and_garbage() {
        for s in ["x", "2x", "\\sin(1)", "(1", "1)", "", "1+", "\\frac{1}", "e"] {
            assert!(eval(s).is_err(), "{s}");
        }
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
