//! Bit-for-bit reproduction of verl's `math_dapo` comparison, for parity runs.
//!
//! verl's `normalize_final_answer` (Minerva, Lewkowycz et al. 2022) rewrites
//! both strings with a fixed list of substitutions and then compares them
//! exactly, so `0.5` and `\frac{1}{2}` differ there. This module reimplements
//! those rules in order (from reading `verl/utils/reward_score/math_dapo.py`);
//! [`super::Equivalence::Math`] is the more forgiving default.

/// Applied in order, like verl's `SUBSTITUTIONS`.
const SUBSTITUTIONS: &[(&str, &str)] = &[
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
];

/// Deleted in order, like verl's `REMOVED_EXPRESSIONS`.
const REMOVED: &[&str] = &[
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    "\"",
    "\\dots",
];

/// `\cmd{X}` → `X` for every occurrence, with X ending at the first `}` (the
/// regex is non-greedy).
fn unwrap_nongreedy(s: &str, cmd: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(cmd) {
        let after = &rest[i + cmd.len()..];
        // `.` in Python regex does not match newlines.
        match after.find(['}', '\n']) {
            Some(j) if after.as_bytes()[j] == b'}' => {
                out.push_str(&rest[..i]);
                out.push_str(&after[..j]);
                rest = &after[j + 1..];
            }
            _ => {
                out.push_str(&rest[..i + cmd.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `(frac)([^{])(.)` → `frac{\2}{\3}` and `(sqrt)([^{])` → `sqrt{\2}`.
fn shorthand(s: &str, word: &str, nargs: usize) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut rest = s;
    while let Some(i) = rest.find(word) {
        let after = &rest[i + word.len()..];
        let mut chars = after.chars();
        let a = chars.next().filter(|&c| c != '{' && c != '\n');
        let b = if nargs == 2 { chars.next().filter(|&c| c != '\n') } else { Some(' ') };
        match (a, b) {
            (Some(a), Some(b)) => {
                out.push_str(&rest[..i]);
                out.push_str(word);
                if nargs == 2 {
                    out.push_str(&format!("{{{a}}}{{{b}}}"));
                    rest = &after[a.len_utf8() + b.len_utf8()..];
                } else {
                    out.push_str(&format!("{{{a}}}"));
                    rest = &after[a.len_utf8()..];
                }
            }
            _ => {
                out.push_str(&rest[..i + word.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// verl's `normalize_final_answer`.
pub(crate) fn normalize_final_answer(s: &str) -> String {
    let mut t = s.rsplit('=').next().unwrap_or("").to_string();
    for (from, to) in SUBSTITUTIONS {
        t = t.replace(from, to);
    }
    for r in REMOVED {
        t = t.replace(r, "");
    }
    // `(.*?)(\$)(.*?)(\$)(.*)` → `$\3$` on a single line: keep the first math span.
    let first_line_end = t.find('\n').unwrap_or(t.len());
    let line = &t[..first_line_end];
    if let Some(a) = line.find('$') {
        if let Some(b) = line[a + 1..].find('$') {
            let inner = line[a + 1..a + 1 + b].to_string();
            t = format!("${inner}${}", &t[first_line_end..]);
        }
    }
    for cmd in ["\\text{", "\\textbf{", "\\overline{"] {
        t = unwrap_nongreedy(&t, cmd);
    }
    // `(\\boxed\{)(.*)(\})` is greedy: up to the last `}` on the line.
    if let Some(i) = t.find("\\boxed{") {
        let line_end = t[i..].find('\n').map_or(t.len(), |j| i + j);
        if let Some(j) = t[i..line_end].rfind('}') {
            let j = i + j;
            if j >= i + 7 {
                t = format!("{}{}{}", &t[..i], &t[i + 7..j], &t[j + 1..]);
            }
        }
    }
    t = shorthand(&t, "frac", 2);
    t = shorthand(&t, "sqrt", 1);
    t = t.replace('$', "");
    let no_commas = t.replace(',', "");
    if !no_commas.is_empty() && no_commas.chars().all(|c| c.is_ascii_digit()) {
        t = no_commas;
    }
    t.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::normalize_final_answer as n;

    #[test]
    fn matches_verl_examples() {
        assert_eq!(n("1,000"), "1000");
        assert_eq!(n("$\\frac12$"), "\\frac{1}{2}");
        assert_eq!(n("x = 5"), "5");
        assert_eq!(n("\\boxed{42}"), "42");
        assert_eq!(n("10^\\circ"), "10");
        assert_eq!(n("\\text{5 cm}"), "5");
        assert_eq!(n("\\sqrt2"), "\\sqrt{2}");
        assert_eq!(n("12 ways"), "12");
    }

    #[test]
    fn is_exact_string_equality_after_rewriting() {
        assert_ne!(n("0.5"), n("\\frac{1}{2}"));
        assert_ne!(n("1,2"), n("2,1"));
    }
}
