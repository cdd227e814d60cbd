//! Text and LaTeX normalisation of a final answer into a canonical string.
//!
//! The rules follow the Hendrycks MATH `strip_string` and Minerva
//! `normalize_final_answer` families (as used by verl and lm-eval), made
//! explicit and ordered so that each is testable. The output is what users see
//! in a [`super::Verdict`], and the input to the structural comparison.

use super::extract::last_boxed;

/// A normalised answer, plus the marks that normalisation removed but the
/// comparison still needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Normalized {
    /// Canonical text: no `$`, no spaces (except after a control word), no units.
    pub text: String,
    /// The answer carried `%`, `\%` or "percent".
    pub percent: bool,
}

/// Unit and counting words dropped as whole words ("5 cm", "12 ways").
/// Single letters are dropped only as the whole content of `\text{}`
/// (see [`TEXT_ONLY_UNITS`]), since a bare `m` may be a variable.
const UNIT_WORDS: &[&str] = &[
    "cm",
    "centimeter",
    "centimeters",
    "centimetre",
    "centimetres",
    "mm",
    "millimeter",
    "millimeters",
    "km",
    "kilometer",
    "kilometers",
    "meter",
    "meters",
    "metre",
    "metres",
    "inch",
    "inches",
    "ft",
    "foot",
    "feet",
    "yard",
    "yards",
    "mile",
    "miles",
    "mph",
    "kmh",
    "kg",
    "gram",
    "grams",
    "gm",
    "pound",
    "pounds",
    "lb",
    "lbs",
    "ounce",
    "ounces",
    "oz",
    "sec",
    "second",
    "seconds",
    "minute",
    "minutes",
    "hour",
    "hours",
    "hr",
    "hrs",
    "day",
    "days",
    "week",
    "weeks",
    "month",
    "months",
    "year",
    "years",
    "dollar",
    "dollars",
    "cent",
    "cents",
    "euro",
    "euros",
    "unit",
    "units",
    "square",
    "sq",
    "cubic",
    "degree",
    "degrees",
    "radian",
    "radians",
    "liter",
    "liters",
    "litre",
    "litres",
    "ml",
    "gallon",
    "gallons",
    "point",
    "points",
    "way",
    "ways",
    "student",
    "students",
    "people",
    "person",
    "persons",
    "integers",
    "digits",
    "edges",
    "meals",
    "multiples",
    "times",
];

/// Units recognised only when they are the whole `\text{…}` content.
const TEXT_ONLY_UNITS: &[&str] = &[
    "m", "s", "g", "h", "l", "mi", "min", "th", "st", "nd", "rd", "m/s", "km/h", "m/s^2", "m^2", "cm^2", "m^3", "cm^3",
];

/// Commands whose braced argument is plain text to keep.
const TEXT_COMMANDS: &[&str] =
    &["text", "textbf", "textit", "textrm", "textnormal", "mathrm", "mathbf", "mathit", "mbox", "hbox", "operatorname"];

/// Spacing and style commands with no mathematical content.
const SPACING_COMMANDS: &[&str] = &["\\displaystyle", "\\qquad", "\\quad", "\\!", "\\,", "\\;", "\\:", "\\ "];

/// Normalises `s`; the caller bounds its length.
pub(crate) fn normalize(s: &str) -> Normalized {
    normalize_with(s, true)
}

/// [`normalize`], keeping a top-level `name = value` whole when
/// `strip_assignments` is false: `y = 2x+1` is then the equation of a line,
/// which an answer written as `2x - y + 1 = 0` can be compared with.
pub(crate) fn normalize_with(s: &str, strip_assignments: bool) -> Normalized {
    let mut t = map_unicode(s.trim());
    t = strip_math_wrappers(&t);
    if let Some(inner) = last_boxed(&t) {
        t = inner.to_string();
    }
    t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac");
    t = remove_delimiter_sizing(&t);
    t = join_digit_groups(&t);
    for (from, to) in [("\\varnothing", "\\emptyset"), ("\\{\\}", "\\emptyset"), ("\\mathbb{R}", "(-\\infty,\\infty)")]
    {
        t = t.replace(from, to);
    }
    // A matrix's row break `\\\\` must survive the spacing commands (its
    // second backslash and a space read as `\ `).
    t = t.replace("\\\\", "\u{2}");
    for cmd in SPACING_COMMANDS {
        t = t.replace(cmd, " ");
    }
    t = t.replace('\u{2}', "\\\\");
    t = decimal_comma(&t);
    t = t.replace('~', " ").replace("{,}", "");
    t = repeating_decimals(&t);
    t = unwrap_text_commands(&t);
    t = remove_degrees(&t);
    let (t2, percent) = remove_percent(&t);
    t = remove_unit_words(&t2);
    for dots in ["\\ldots", "\\dots", "\\cdots"] {
        t = t.replace(dots, "");
    }
    t = trim_trailing_punctuation(&t);
    t = remove_thousands_separators(&t);
    t = collapse_whitespace(&t);
    if strip_assignments {
        t = strip_assignment_top(&t);
    }
    t = expand_shorthand(&t);
    t = strip_outer_braces(&t);
    if let Some(letter) = choice_letter(&t) {
        t = letter;
    }
    Normalized { text: t, percent }
}

/// Thousands groups that LaTeX spells out: `32,\!349`, `32,\! 349`,
/// `14{,}916`, `1\,000`, `1\!000`. Unlike a bare comma these marks are
/// never list separators, so they go wherever a digit precedes them and
/// exactly three digits follow.
fn join_digit_groups(s: &str) -> String {
    const MARKS: &[&str] = &[",\\!", ",\\,", ",\\ ", "{,}", "\\,", "\\!", "\\ "];
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let prev_digit = out.chars().last().is_some_and(|c| c.is_ascii_digit());
        if prev_digit {
            if let Some(m) = MARKS.iter().find(|m| rest.starts_with(**m)) {
                let after = rest[m.len()..].trim_start_matches(' ');
                let digits = after.chars().take_while(char::is_ascii_digit).count();
                if digits == 3 {
                    rest = after;
                    continue;
                }
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `3{,}5`: LaTeX's braced comma between digits, when it is not a
/// thousands group ([`join_digit_groups`] took those), is a decimal comma.
fn decimal_comma(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("{,}") {
        let before_digit = rest[..i].ends_with(|c: char| c.is_ascii_digit());
        let after_digit = rest[i + 3..].starts_with(|c: char| c.is_ascii_digit());
        out.push_str(&rest[..i]);
        out.push_str(if before_digit && after_digit { "." } else { "{,}" });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    out
}

/// `0.\overline{3}` → `\frac{1}{3}`, `0.1\overline{6}` → `\frac{15}{90}`:
/// a repeating decimal is the exact rational it denotes (so
/// `0.\overline{9}` is 1).
fn repeating_decimals(s: &str) -> String {
    let Some(at) = s.find("\\overline{") else { return s.to_string() };
    let head = &s[..at];
    let tail = &s[at + "\\overline{".len()..];
    let Some(close) = tail.find('}') else { return s.to_string() };
    let rep = tail[..close].trim();
    let int_start = head.rfind(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(0, |i| i + 1);
    let number = &head[int_start..];
    let Some((int_part, fixed)) = number.split_once('.') else { return s.to_string() };
    if rep.is_empty() || !rep.chars().all(|c| c.is_ascii_digit()) || rep.len() + fixed.len() > 18 {
        return s.to_string();
    }
    let int_part = if int_part.is_empty() { "0" } else { int_part };
    let (Ok(whole), Ok(with_rep), Ok(without)) = (
        int_part.parse::<u128>(),
        format!("{fixed}{rep}").parse::<u128>(),
        if fixed.is_empty() { Ok(0) } else { fixed.parse::<u128>() },
    ) else {
        return s.to_string();
    };
    let den = 10u128.pow(fixed.len() as u32) * (10u128.pow(rep.len() as u32) - 1);
    let num = whole * den + with_rep - without;
    let (mut a, mut b) = (num, den);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let (num, den) = (num / a, den / a);
    let value = if den == 1 { num.to_string() } else { format!("\\frac{{{num}}}{{{den}}}") };
    format!("{}{value}{}", &head[..int_start], &tail[close + 1..])
}

fn map_unicode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\u{2212}' | '\u{2013}' | '\u{2014}' => out.push('-'),
            '×' => out.push_str("\\times "),
            '÷' => out.push_str("\\div "),
            '·' | '⋅' => out.push_str("\\cdot "),
            'π' => out.push_str("\\pi "),
            '√' => out.push_str("\\sqrt "),
            '∞' => out.push_str("\\infty "),
            '°' => out.push_str("^\\circ "),
            '∪' => out.push_str("\\cup "),
            '∅' => out.push_str("\\emptyset "),
            '½' => out.push_str("\\frac{1}{2}"),
            '⅓' => out.push_str("\\frac{1}{3}"),
            '⅔' => out.push_str("\\frac{2}{3}"),
            '¼' => out.push_str("\\frac{1}{4}"),
            '¾' => out.push_str("\\frac{3}{4}"),
            '⅕' => out.push_str("\\frac{1}{5}"),
            '⅛' => out.push_str("\\frac{1}{8}"),
            '≤' => out.push_str("\\le "),
            '≥' => out.push_str("\\ge "),
            '≠' => out.push_str("\\ne "),
            '，' => out.push(','),
            c if c.is_whitespace() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `$…$`, `$$…$$`, `\(…\)`, `\[…\]` and stray `$` (including currency `\$`).
fn strip_math_wrappers(s: &str) -> String {
    let mut t = s.trim();
    for (open, close) in [("\\(", "\\)"), ("\\[", "\\]")] {
        if let Some(inner) = t.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
            t = inner.trim();
        }
    }
    t.replace("\\$", "").replace('$', "")
}

/// Removes `\left`, `\right` and the `\big…` family; `\left.` / `\right.` are
/// invisible delimiters, so their dot goes too.
fn remove_delimiter_sizing(s: &str) -> String {
    const SIZERS: &[&str] = &[
        "left", "right", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr", "Biggl", "Biggr", "big", "Big", "bigg",
        "Bigg",
    ];
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < c.len() {
        if c[i] == '\\' {
            let mut j = i + 1;
            while j < c.len() && c[j].is_ascii_alphabetic() {
                j += 1;
            }
            let word: String = c[i + 1..j].iter().collect();
            if SIZERS.contains(&word.as_str()) {
                i = j;
                while i < c.len() && c[i] == ' ' {
                    i += 1;
                }
                if i < c.len() && c[i] == '.' {
                    i += 1;
                }
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

/// Finds the braced group starting at `open` (which must be `{`); returns the
/// index just past its closing brace. Escaped braces do not nest.
fn group_end(c: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < c.len() {
        match c[i] {
            '\\' => i += 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// `\text{5 cm}` → ` 5 cm `; `\text{cm}`-style bare units vanish. Nested text
/// commands are unwrapped by re-scanning, a bounded number of times.
fn unwrap_text_commands(s: &str) -> String {
    let mut cur = s.to_string();
    for _ in 0..8 {
        let c: Vec<char> = cur.chars().collect();
        let mut out = String::with_capacity(cur.len());
        let mut changed = false;
        let mut i = 0;
        while i < c.len() {
            if c[i] == '\\' {
                let mut j = i + 1;
                while j < c.len() && c[j].is_ascii_alphabetic() {
                    j += 1;
                }
                let word: String = c[i + 1..j].iter().collect();
                let mut k = j;
                while k < c.len() && c[k] == ' ' {
                    k += 1;
                }
                if TEXT_COMMANDS.contains(&word.as_str()) && k < c.len() && c[k] == '{' {
                    if let Some(end) = group_end(&c, k) {
                        let inner: String = c[k + 1..end - 1].iter().collect();
                        let trimmed = inner.trim();
                        if !TEXT_ONLY_UNITS.contains(&trimmed) {
                            out.push(' ');
                            out.push_str(trimmed);
                            out.push(' ');
                        }
                        i = end;
                        changed = true;
                        continue;
                    }
                }
            }
            out.push(c[i]);
            i += 1;
        }
        cur = out;
        if !changed {
            break;
        }
    }
    cur
}

fn remove_degrees(s: &str) -> String {
    let mut t = s.to_string();
    for pat in ["^{\\circ}", "^\\circ", "\\circ", "\\degree", "^{o}"] {
        t = t.replace(pat, "");
    }
    t
}

/// Strips `\%`, `%` and the word "percent", reporting whether any was present.
fn remove_percent(s: &str) -> (String, bool) {
    let mut t = s.replace("\\%", "%");
    let mut found = t.contains('%');
    t = t.replace('%', "");
    let words = replace_words(&t, |w| {
        if w.eq_ignore_ascii_case("percent") || w.eq_ignore_ascii_case("percentage") {
            Some(String::new())
        } else {
            None
        }
    });
    found |= words != t;
    (words, found)
}

/// Applies `f` to every maximal ASCII word that is not a control word;
/// `Some(r)` replaces the word (and a directly following `^2`/`^{3}`-style
/// power when `r` is empty, so "cm^2" goes entirely).
fn replace_words(s: &str, f: impl Fn(&str) -> Option<String>) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < c.len() {
        if c[i].is_ascii_alphabetic() && (i == 0 || (c[i - 1] != '\\' && !c[i - 1].is_ascii_alphabetic())) {
            let mut j = i;
            while j < c.len() && c[j].is_ascii_alphabetic() {
                j += 1;
            }
            // Part of a control word like `\sqrt`? Then `i - 1` would be a letter
            // or backslash, excluded above; so this is a plain word.
            let word: String = c[i..j].iter().collect();
            if let Some(rep) = f(&word) {
                if rep.is_empty() {
                    // `\text{cm}^2` arrives here as "cm ^2".
                    let mut k = j;
                    while k < c.len() && c[k] == ' ' {
                        k += 1;
                    }
                    for pow in [&['^', '2'][..], &['^', '3'], &['^', '{', '2', '}'], &['^', '{', '3', '}']] {
                        if c[k..].starts_with(pow) {
                            j = k + pow.len();
                            break;
                        }
                    }
                }
                out.push_str(&rep);
                i = j;
                continue;
            }
            out.extend(&c[i..j]);
            i = j;
            continue;
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

/// Drops unit words; "and" or "or" between answers becomes a list comma.
/// Nothing is dropped if that would leave no answer at all ("points" alone).
fn remove_unit_words(s: &str) -> String {
    let out = replace_words(s, |w| {
        let lw = w.to_ascii_lowercase();
        if UNIT_WORDS.contains(&lw.as_str()) {
            Some(String::new())
        } else if lw == "and" || lw == "or" {
            Some(",".to_string())
        } else {
            None
        }
    });
    if out.trim().trim_matches(',').trim().is_empty() {
        s.to_string()
    } else {
        out
    }
}

/// Final full stops and dangling separators: "5." → "5", "1, 2," → "1, 2".
///
/// A trailing `!` is kept: in a final answer it is a factorial (`5!` = 120),
/// and dropping it as an exclamation mark made `\boxed{5!}` equal to 5, a
/// reward a policy could farm. An excited "42!" now reads as 42!, which costs
/// at most a false negative, never a false positive.
fn trim_trailing_punctuation(s: &str) -> String {
    let mut t = s.trim();
    loop {
        let next = t.trim_end_matches(['.', ',', ';']).trim_end();
        let next = next.strip_suffix("\\\\").unwrap_or(next).trim_end();
        if next.len() == t.len() {
            break;
        }
        t = next;
    }
    t.trim_start_matches(',').trim().to_string()
}

/// "1,000" and "-12,345.5" lose their commas; "1, 2" and "1,2" do not (they
/// are lists). The rule is Minerva's: a comma counts as a thousands separator
/// only when the whole answer is one number with every group after the
/// first exactly three digits and no space after the comma. So "1,234" reads
/// as one thousand two hundred thirty-four, never as the pair (1, 234).
fn remove_thousands_separators(s: &str) -> String {
    let t = s.trim();
    let body = t.strip_prefix(['-', '+']).unwrap_or(t);
    let (int_part, frac) = match body.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (body, None),
    };
    let groups: Vec<&str> = int_part.split(',').collect();
    let ok = groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3)
        && frac.is_none_or(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_digit()));
    if ok {
        t.replace(',', "")
    } else {
        t.to_string()
    }
}

/// Removes whitespace, keeping one space where it ends a control word before
/// a letter (`\pi r` must not become the unknown `\pir`).
fn collapse_whitespace(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut in_word = false; // inside `\letters`
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            let mut j = i;
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            if in_word && j < c.len() && c[j].is_ascii_alphabetic() {
                out.push(' ');
            }
            in_word = false;
            i = j;
            continue;
        }
        if ch == '\\' {
            in_word = c.get(i + 1).is_some_and(char::is_ascii_alphabetic);
            out.push(ch);
            if !in_word {
                // Control symbol: keep the escaped char verbatim (`\ ` is gone already).
                if let Some(&n) = c.get(i + 1) {
                    out.push(n);
                    i += 1;
                }
            }
        } else {
            in_word = in_word && ch.is_ascii_alphabetic();
            out.push(ch);
        }
        i += 1;
    }
    out
}

/// Depth-0 positions of `sep` in `s` (brackets of all kinds nest together,
/// which is what intervals like `[1, 3)` need).
pub(crate) fn split_top_level<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    let mut parts = Vec::new();
    let mut depth = 0i64;
    let mut start = 0;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && s.is_char_boundary(i) && s[i..].starts_with(sep) {
            parts.push(&s[start..i]);
            i += sep.len();
            start = i;
            continue;
        }
        i += 1;
    }
    parts.push(&s[start..]);
    parts
}

/// `x=5` → `5`, `f(x)=2x` → `2x`. Only a short left side that looks like a
/// name (letters, digits, `_`, `\`, `(`, `)`, `{`, `}`, `'`) is dropped, so
/// equations such as `2x+1=5` stay intact. Lists are handled per element by
/// the comparison, so `x=1,y=2` keeps its structure here.
pub(crate) fn strip_assignment(s: &str) -> &str {
    let name_like = |lhs: &str| {
        let lhs = lhs.trim();
        !lhs.is_empty()
            && lhs.chars().count() <= 12
            && lhs.chars().all(|c| c.is_ascii_alphanumeric() || "_\\(){}' ".contains(c))
            && lhs.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '\\')
    };
    // `x \in [1, 3)`: membership states the answer like an assignment does.
    for (i, _) in s.match_indices("\\in") {
        let rhs = &s[i + 3..];
        if !rhs.starts_with(|c: char| c.is_ascii_alphabetic()) && name_like(&s[..i]) {
            return rhs.trim();
        }
    }
    if s.contains(['<', '>']) || s.contains("\\le") || s.contains("\\ge") || s.contains("\\ne") {
        return s;
    }
    let parts = split_top_level(s, "=");
    if parts.len() < 2 {
        return s;
    }
    let lhs_ok = parts[..parts.len() - 1].iter().all(|lhs| name_like(lhs));
    if lhs_ok {
        parts[parts.len() - 1].trim()
    } else {
        s
    }
}

fn strip_assignment_top(s: &str) -> String {
    if split_top_level(s, ",").len() > 1 {
        s.to_string()
    } else {
        strip_assignment(s).to_string()
    }
}

/// `\frac12` → `\frac{1}{2}`, `\frac1{2}` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`:
/// the single-token arguments TeX allows, braced so strings compare equal.
fn expand_shorthand(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 8);
    let mut i = 0;
    while i < c.len() {
        let rest = &c[i..];
        let (name, nargs) = if rest.starts_with(&['\\', 'f', 'r', 'a', 'c']) {
            ("\\frac", 2)
        } else if rest.starts_with(&['\\', 's', 'q', 'r', 't']) {
            ("\\sqrt", 1)
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        };
        let mut j = i + name.len();
        if c.get(j).is_some_and(char::is_ascii_alphabetic) {
            // A longer control word such as `\fracx`? Leave it alone.
            out.push(c[i]);
            i += 1;
            continue;
        }
        out.push_str(name);
        for _ in 0..nargs {
            while c.get(j) == Some(&' ') {
                j += 1;
            }
            match c.get(j) {
                Some('{') => match group_end(&c, j) {
                    Some(end) => {
                        out.extend(&c[j..end]);
                        j = end;
                    }
                    None => break,
                },
                // `\sqrt[3]{x}` keeps its index and brace argument.
                Some('[') if nargs == 1 => break,
                Some(&ch) if ch.is_ascii_alphanumeric() => {
                    out.push('{');
                    out.push(ch);
                    out.push('}');
                    j += 1;
                }
                _ => break,
            }
        }
        i = j;
    }
    out
}

/// `{5}` → `5`, but not `{1}{2}` or `\{1\}` (a set).
fn strip_outer_braces(s: &str) -> String {
    let mut t = s;
    for _ in 0..8 {
        let c: Vec<char> = t.chars().collect();
        if c.len() >= 2 && c[0] == '{' && group_end(&c, 0) == Some(c.len()) {
            t = &t[1..t.len() - 1];
        } else {
            break;
        }
    }
    t.to_string()
}

/// Multiple-choice answers: `(B)` and `B)` → `B`.
fn choice_letter(s: &str) -> Option<String> {
    let c: Vec<char> = s.chars().collect();
    match c.as_slice() {
        ['(', l, ')'] | [l, ')'] if l.is_ascii_uppercase() => Some(l.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> String {
        normalize(s).text
    }

    #[test]
    fn dollar_and_display_wrappers_go() {
        assert_eq!(n("$5$"), "5");
        assert_eq!(n("$$\\frac{1}{2}$$"), "\\frac{1}{2}");
        assert_eq!(n("\\(x^2\\)"), "x^2");
        assert_eq!(n("\\[7\\]"), "7");
        assert_eq!(n("\\$12"), "12");
    }

    #[test]
    fn boxed_content_is_unwrapped() {
        assert_eq!(n("\\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
    }

    #[test]
    fn text_like_commands_are_unwrapped() {
        assert_eq!(n("\\text{5 cm}"), "5");
        assert_eq!(n("\\mbox{Monday}"), "Monday");
        assert_eq!(n("\\mathrm{Evelyn}"), "Evelyn");
        assert_eq!(n("10\\text{ m}"), "10");
        assert_eq!(n("\\textbf{\\text{3}}"), "3");
    }

    #[test]
    fn left_right_and_frac_variants() {
        assert_eq!(n("\\left( 1, 2 \\right)"), "(1,2)");
        assert_eq!(n("\\left\\{1\\right\\}"), "\\{1\\}");
        assert_eq!(n("\\dfrac{1}{2}"), "\\frac{1}{2}");
        assert_eq!(n("\\tfrac12"), "\\frac{1}{2}");
        assert_eq!(n("\\frac 1 2"), "\\frac{1}{2}");
        assert_eq!(n("\\sqrt2"), "\\sqrt{2}");
        assert_eq!(n("\\sqrt[3]{2}"), "\\sqrt[3]{2}");
    }

    #[test]
    fn units_degrees_percent() {
        assert_eq!(n("12 ways"), "12");
        assert_eq!(n("5 square feet"), "5");
        assert_eq!(n("9 cm^2"), "9");
        assert_eq!(n("10^\\circ"), "10");
        assert_eq!(n("10^{\\circ}"), "10");
        assert_eq!(n("45 degrees"), "45");
        let p = normalize("50\\%");
        assert_eq!((p.text.as_str(), p.percent), ("50", true));
        assert!(normalize("20 percent").percent);
        assert!(!normalize("20").percent);
        // A unit word alone is the answer, not nothing.
        assert_eq!(n("points"), "points");
    }

    #[test]
    fn trailing_punctuation_and_spaces() {
        assert_eq!(n("5."), "5");
        assert_eq!(n(" 3 . "), "3");
        assert_eq!(n("1, 2,"), "1,2");
        // A factorial is not punctuation.
        assert_eq!(n("5!"), "5!");
        assert_eq!(n("\\boxed{5!}"), "5!");
        assert_eq!(n("5!."), "5!");
        assert_eq!(n("2 \\pi r"), "2\\pi r");
    }

    #[test]
    fn thousands_separators_versus_lists() {
        assert_eq!(n("1,000"), "1000");
        assert_eq!(n("-12,345.5"), "-12345.5");
        assert_eq!(n("1{,}000"), "1000");
        assert_eq!(n("1, 000"), "1,000");
        assert_eq!(n("1,2"), "1,2");
        assert_eq!(n("12,34"), "12,34");
    }

    #[test]
    fn assignments_are_stripped_only_for_names() {
        assert_eq!(n("x = 5"), "5");
        assert_eq!(n("f(x)=2x+1"), "2x+1");
        assert_eq!(n("2x+1=5"), "2x+1=5");
        assert_eq!(n("x \\le 3"), "x\\le3");
        assert_eq!(n("x=1, y=2"), "x=1,y=2");
        assert_eq!(n("x \\in [1, 3)"), "[1,3)");
        assert_eq!(n("x \\in \\mathbb{R}"), "(-\\infty,\\infty)");
        assert_eq!(n("32,\\! 349"), "32349");
        assert_eq!(n("1\\,000"), "1000");
        assert_eq!(n("1,\\!2"), "1,2");
        assert_eq!(n("\\infty"), "\\infty");
        assert_eq!(n("3{,}5"), "3.5");
        assert_eq!(n("0.\\overline{3}"), "\\frac{1}{3}");
        assert_eq!(n("0.1\\overline{6}"), "\\frac{1}{6}");
        assert_eq!(n("0.\\overline{9}"), "1");
        assert_eq!(n("½"), "\\frac{1}{2}");
    }

    #[test]
    fn unicode_and_choices() {
        assert_eq!(n("−3"), "-3");
        assert_eq!(n("2π"), "2\\pi");
        assert_eq!(n("(B)"), "B");
        assert_eq!(n("{7}"), "7");
    }
}
