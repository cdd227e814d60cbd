//! Numbers that stay exact while they can.
//!
//! Integers, decimals and fractions are kept as reduced `i128` ratios so that
//! large integer answers are compared exactly: a relative tolerance of 1e-6
//! would otherwise call 123456789 and 123456790 equal. Anything irrational
//! (radicals that are not perfect powers, π) or too large for `i128` falls back
//! to `f64`, compared with the configured tolerance.

use std::fmt;

/// Largest integer exponent applied exactly; larger ones go through `powf`, so
/// the cost of `x^n` never depends on `n`.
const MAX_EXACT_EXPONENT: i128 = 512;

/// Why an arithmetic expression has no value.
pub(crate) type EvalError = &'static str;

/// A reduced fraction with a positive denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ratio {
    num: i128,
    den: i128,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Ratio {
    /// `None` on a zero denominator or when `i128::MIN` would make negation overflow.
    pub(crate) fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 || num == i128::MIN || den == i128::MIN {
            return None;
        }
        let (num, den) = if den < 0 { (-num, -den) } else { (num, den) };
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()).max(1);
        // g divides |den| <= i128::MAX, so it fits.
        let g = g as i128;
        Some(Self { num: num / g, den: den / g })
    }

    pub(crate) fn int(n: i128) -> Option<Self> {
        Self::new(n, 1)
    }

    pub(crate) fn is_integer(self) -> bool {
        self.den == 1
    }

    pub(crate) fn numer(self) -> i128 {
        self.num
    }

    pub(crate) fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    fn add(self, o: Self) -> Option<Self> {
        let n = self.num.checked_mul(o.den)?.checked_add(o.num.checked_mul(self.den)?)?;
        Self::new(n, self.den.checked_mul(o.den)?)
    }

    fn mul(self, o: Self) -> Option<Self> {
        // Cross-reduce first so products of already-reduced fractions overflow later.
        let g1 = gcd(self.num.unsigned_abs(), o.den.unsigned_abs()).max(1) as i128;
        let g2 = gcd(o.num.unsigned_abs(), self.den.unsigned_abs()).max(1) as i128;
        Self::new((self.num / g1).checked_mul(o.num / g2)?, (self.den / g2).checked_mul(o.den / g1)?)
    }

    fn recip(self) -> Option<Self> {
        Self::new(self.den, self.num)
    }

    fn neg(self) -> Option<Self> {
        Self::new(self.num.checked_neg()?, self.den)
    }

    fn pow(self, e: i128) -> Option<Self> {
        if e.abs() > MAX_EXACT_EXPONENT {
            return None;
        }
        let base = if e < 0 { self.recip()? } else { self };
        let e = u32::try_from(e.unsigned_abs()).ok()?;
        Self::new(base.num.checked_pow(e)?, base.den.checked_pow(e)?)
    }

    /// Exact `q`-th root of a non-negative integer when it is a perfect power.
    fn int_root(n: i128, q: u32) -> Option<i128> {
        // Beyond 2^100 the f64 estimate can be off by more than one.
        if !(0..(1i128 << 100)).contains(&n) || q == 0 {
            return None;
        }
        let est = (n as f64).powf(1.0 / f64::from(q)).round() as i128;
        (est.saturating_sub(1)..=est.saturating_add(1)).find(|&r| r >= 0 && r.checked_pow(q) == Some(n))
    }

    fn root(self, q: u32) -> Option<Self> {
        if self.num < 0 {
            // Odd roots of negatives are real; even ones are not representable here.
            return if q % 2 == 1 { self.neg()?.root(q)?.neg() } else { None };
        }
        Self::new(Self::int_root(self.num, q)?, Self::int_root(self.den, q)?)
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

/// A real number: exact when every step was exact, `f64` otherwise.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Num {
    /// Exactly representable rational.
    Exact(Ratio),
    /// Floating-point approximation; infinite only for an explicit `\infty`.
    Approx(f64),
}

/// Turns an `f64` result into a value, refusing NaN and overflow: an answer
/// like `10^{400}` must not compare equal to `10^{401}` just because both
/// became infinity.
fn approx(x: f64, inputs_infinite: bool) -> Result<Num, EvalError> {
    if x.is_nan() {
        Err("not a real number")
    } else if x.is_infinite() && !inputs_infinite {
        Err("overflow")
    } else {
        Ok(Num::Approx(x))
    }
}

impl Num {
    pub(crate) fn int(n: i128) -> Self {
        Ratio::int(n).map_or(Num::Approx(n as f64), Num::Exact)
    }

    pub(crate) fn to_f64(self) -> f64 {
        match self {
            Num::Exact(r) => r.to_f64(),
            Num::Approx(x) => x,
        }
    }

    fn is_infinite(self) -> bool {
        self.to_f64().is_infinite()
    }

    fn either_infinite(self, o: Self) -> bool {
        self.is_infinite() || o.is_infinite()
    }

    pub(crate) fn add(self, o: Self) -> Result<Self, EvalError> {
        if let (Num::Exact(a), Num::Exact(b)) = (self, o) {
            if let Some(r) = a.add(b) {
                return Ok(Num::Exact(r));
            }
        }
        approx(self.to_f64() + o.to_f64(), self.either_infinite(o))
    }

    pub(crate) fn neg(self) -> Result<Self, EvalError> {
        match self {
            Num::Exact(r) => Ok(r.neg().map_or(Num::Approx(-r.to_f64()), Num::Exact)),
            Num::Approx(x) => Ok(Num::Approx(-x)),
        }
    }

    pub(crate) fn sub(self, o: Self) -> Result<Self, EvalError> {
        self.add(o.neg()?)
    }

    pub(crate) fn mul(self, o: Self) -> Result<Self, EvalError> {
        if let (Num::Exact(a), Num::Exact(b)) = (self, o) {
            if let Some(r) = a.mul(b) {
                return Ok(Num::Exact(r));
            }
        }
        approx(self.to_f64() * o.to_f64(), self.either_infinite(o))
    }

    pub(crate) fn div(self, o: Self) -> Result<Self, EvalError> {
        if o.to_f64() == 0.0 {
            return Err("division by zero");
        }
        if let (Num::Exact(a), Num::Exact(b)) = (self, o) {
            if let Some(r) = b.recip().and_then(|b| a.mul(b)) {
                return Ok(Num::Exact(r));
            }
        }
        approx(self.to_f64() / o.to_f64(), self.either_infinite(o))
    }

    pub(crate) fn pow(self, e: Self) -> Result<Self, EvalError> {
        if let (Num::Exact(b), Num::Exact(ex)) = (self, e) {
            if ex.is_integer() {
                if ex.numer() < 0 && b.num == 0 {
                    return Err("division by zero");
                }
                if let Some(r) = b.pow(ex.numer()) {
                    return Ok(Num::Exact(r));
                }
            } else if let Ok(q) = u32::try_from(ex.den) {
                // Rational exponent p/q: exact when the q-th root is.
                if let Some(r) = b.root(q).and_then(|r| r.pow(ex.num)) {
                    return Ok(Num::Exact(r));
                }
                if b.num < 0 && q % 2 == 1 {
                    // (-x)^(p/q) = (-1)^p * x^(p/q) when q is odd.
                    let mag = (-b.to_f64()).powf(ex.to_f64());
                    return approx(if ex.num % 2 == 0 { mag } else { -mag }, false);
                }
            }
        }
        approx(self.to_f64().powf(e.to_f64()), self.either_infinite(e))
    }

    /// Principal `q`-th root; odd roots of negative numbers are real.
    pub(crate) fn root(self, q: Self) -> Result<Self, EvalError> {
        let q = match q {
            Num::Exact(r) if r.is_integer() && (1..=1_000).contains(&r.numer()) => r.numer() as u32,
            _ => return Err("root index must be a small positive integer"),
        };
        if let Num::Exact(r) = self {
            if let Some(v) = r.root(q) {
                return Ok(Num::Exact(v));
            }
        }
        let x = self.to_f64();
        let v = if x < 0.0 && q % 2 == 1 { -(-x).powf(1.0 / f64::from(q)) } else { x.powf(1.0 / f64::from(q)) };
        approx(v, self.is_infinite())
    }

    pub(crate) fn factorial(self) -> Result<Self, EvalError> {
        match self {
            Num::Exact(r) if r.is_integer() && (0..=170).contains(&r.numer()) => {
                let n = r.numer();
                let mut acc = Num::int(1);
                for k in 2..=n {
                    acc = acc.mul(Num::int(k))?;
                }
                Ok(acc)
            }
            _ => Err("factorial needs a small non-negative integer"),
        }
    }

    /// Equality: exact when both sides are exact, else within tolerance.
    pub(crate) fn close_to(self, o: Self, rel_tol: f64, abs_tol: f64) -> bool {
        match (self, o) {
            (Num::Exact(a), Num::Exact(b)) => a == b,
            _ => {
                let (a, b) = (self.to_f64(), o.to_f64());
                if a == b {
                    return true; // equal infinities
                }
                if !a.is_finite() || !b.is_finite() {
                    return false;
                }
                (a - b).abs() <= (rel_tol * a.abs().max(b.abs())).max(abs_tol)
            }
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Exact(r) => write!(f, "{r}"),
            Num::Approx(x) => write!(f, "≈{x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(n: i128, d: i128) -> Num {
        Num::Exact(Ratio::new(n, d).unwrap())
    }

    #[test]
    fn ratios_reduce_and_keep_sign_on_numerator() {
        assert_eq!(Ratio::new(2, -4).unwrap(), Ratio::new(-1, 2).unwrap());
        assert!(Ratio::new(1, 0).is_none());
    }

    #[test]
    fn large_integers_compare_exactly_not_by_tolerance() {
        assert!(!ex(123_456_789, 1).close_to(ex(123_456_790, 1), 1e-6, 1e-9));
        assert!(ex(1, 2).close_to(ex(2, 4), 1e-6, 1e-9));
    }

    #[test]
    fn tolerance_is_relative_with_absolute_floor() {
        assert!(Num::Approx(1000.0).close_to(Num::Approx(1000.0005), 1e-6, 1e-9));
        assert!(!Num::Approx(1000.0).close_to(Num::Approx(1000.01), 1e-6, 1e-9));
        assert!(Num::Approx(0.0).close_to(Num::Approx(1e-12), 1e-6, 1e-9));
        assert!(!Num::Approx(0.0).close_to(Num::Approx(1e-3), 1e-6, 1e-9));
    }

    #[test]
    fn huge_exponents_are_constant_time_and_refuse_overflow() {
        assert!(ex(10, 1).pow(ex(100_000, 1)).is_err());
        assert!(ex(10, 1).pow(ex(-100_000, 1)).is_ok());
        assert!(matches!(ex(2, 1).pow(ex(100, 1)).unwrap(), Num::Exact(_)));
    }

    #[test]
    fn roots_are_exact_for_perfect_powers() {
        assert!(matches!(ex(9, 4).root(ex(2, 1)).unwrap(), Num::Exact(r) if r == Ratio::new(3, 2).unwrap()));
        assert!(matches!(ex(-27, 1).root(ex(3, 1)).unwrap(), Num::Exact(r) if r == Ratio::int(-3).unwrap()));
        assert!(matches!(ex(2, 1).root(ex(2, 1)).unwrap(), Num::Approx(_)));
        assert!(ex(-4, 1).root(ex(2, 1)).is_err());
    }

    #[test]
    fn division_by_zero_is_an_error() {
        assert!(ex(1, 1).div(ex(0, 1)).is_err());
        assert!(ex(0, 1).pow(ex(-1, 1)).is_err());
    }
}
