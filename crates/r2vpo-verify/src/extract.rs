//! Pulling the final answer out of a model response.
//!
//! Every function here is linear in the response length: responses are long
//! chains of thought (tens of thousands of characters), and extraction runs
//! once per rollout.

/// Removes the reasoning block of "slow thinking" models.
///
/// Text after the last `</think>` is the answer part. Qwen3-style chat
/// templates put `<think>` in the prompt, so a response may carry only the
/// closing tag; that case is covered by the same rule. A response with an
/// opening `<think>` and no closing tag was cut off while thinking, so it has
/// no final answer and this returns an empty string: an unfinished thought's
/// last number must not earn reward. So does a second `<think>` opened after
/// the last `</think>` and never closed.
pub fn strip_think(text: &str) -> &str {
    const CLOSE: &str = "</think>";
    if let Some(i) = text.rfind(CLOSE) {
        let after = &text[i + CLOSE.len()..];
        // A second reasoning block opened and never closed: cut off again.
        if after.contains("<think>") {
            ""
        } else {
            after
        }
    } else if text.contains("<think>") {
        ""
    } else {
        text
    }
}

/// Content of the last `\boxed{…}` or `\fbox{…}`, with nested braces.
///
/// Also accepts the space form `\boxed 5` (content up to the next `$` or end
/// of line) and the one-token form `\boxed5`. Escaped braces `\{ \}` do not
/// count towards nesting, so `\boxed{\{1, 2\}}` yields `\{1, 2\}`. If the last
/// box is never closed (a truncated response) this returns `None` rather than
/// falling back to an earlier box, as verl's `last_boxed_only_string` does: an
/// earlier box is usually a draft the model went on to revise. An empty box
/// (`\boxed{}`, often in "put your answer in \boxed{}" prose) is `None` too.
pub fn last_boxed(text: &str) -> Option<&str> {
    let (start, name_len) = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|name| text.rfind(name).map(|i| (i, name.len())))
        .max_by_key(|&(i, _)| i)?;
    let rest = &text[start + name_len..];
    let content = if let Some(body) = rest.strip_prefix('{') {
        &body[..group_close(body)?]
    } else if rest.starts_with([' ', '\t']) {
        let body = rest.trim_start_matches([' ', '\t']);
        body.split(['$', '\n']).next().unwrap_or("")
    } else {
        // `\boxed5`: TeX takes a single token as the argument.
        let c = rest.chars().next()?;
        if c.is_alphabetic() {
            return None; // `\boxedx` is some other command, not a box
        }
        &rest[..c.len_utf8()]
    };
    let content = content.trim();
    (!content.is_empty()).then_some(content)
}

/// Every `\boxed{…}` / `\fbox{…}` in `text`: (start of the command, end
/// past the closing brace, content). Unclosed boxes end the scan. Linear:
/// each box is scanned once, and nested boxes are part of their parent.
pub(crate) fn all_boxed(text: &str) -> Vec<(usize, usize, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some((start, name_len)) = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|name| text[from..].find(name).map(|i| (from + i, name.len())))
        .min_by_key(|&(i, _)| i)
    {
        let body_start = start + name_len;
        let Some(body) = text[body_start..].strip_prefix('{') else {
            from = body_start;
            continue;
        };
        let Some(end) = group_close(body) else { break };
        let content_start = body_start + 1;
        out.push((start, content_start + end + 1, text[content_start..content_start + end].trim()));
        from = content_start + end + 1;
    }
    out
}

/// The final boxed answer, joining boxes that together state it.
///
/// Models box each part of a several-part answer (`\boxed{2}` and
/// `\boxed{3}`, `$x = \boxed{-1}$ or $x = \boxed{4}$`, `(a) \boxed{5}
/// \quad (b) \boxed{7}`). Boxes count as one answer when only connectives
/// separate them: `$`, spaces, commas, "and"/"or", `\quad`, part labels
/// such as `(b)` or `Part (b):`, and a `name =` label, which is kept with
/// its box (`a = \boxed{3}` reads as `a=3`). Anything longer between two
/// boxes ("but after checking, the answer is") makes the earlier box a
/// draft, and only the last counts, as in [`last_boxed`].
///
/// The joined answer is a comma list, so it matches a gold list or set and
/// never a single value: listing candidates earns nothing.
pub fn final_boxed(text: &str) -> Option<String> {
    let last = last_boxed(text)?;
    let boxes = all_boxed(text);
    if boxes.last().is_none_or(|b| b.2 != last) {
        // The last box is `\boxed 5`-style, which only `last_boxed` reads.
        return Some(last.to_string());
    }
    let mut first = boxes.len() - 1;
    while first > 0 && connective(&text[boxes[first - 1].1..boxes[first].0]) {
        first -= 1;
    }
    let parts: Vec<String> = (first..boxes.len())
        .filter(|&k| !boxes[k].2.is_empty())
        .map(|k| {
            let before = if k == first {
                let mut from = boxes[k].0.saturating_sub(12);
                while !text.is_char_boundary(from) {
                    from -= 1;
                }
                &text[from..boxes[k].0]
            } else {
                &text[boxes[k - 1].1..boxes[k].0]
            };
            match label_before(before) {
                Some(name) if !boxes[k].2.contains('=') => format!("{name}={}", boxes[k].2),
                _ => boxes[k].2.to_string(),
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Whether the text between two boxes only joins them (see [`final_boxed`]).
fn connective(gap: &str) -> bool {
    if gap.chars().count() > 40 {
        return false;
    }
    let mut t = gap.to_ascii_lowercase();
    let joined = [" and ", ",", ";"].iter().any(|j| t.contains(j));
    for w in [
        "\\text{", "\\quad", "\\qquad", "\\\\", "\\,", "\\;", "\\(", "\\)", "\\[", "\\]", "part", "and", "or", "}",
        "$", ",", ";", ":", "\n",
    ] {
        t = t.replace(w, " ");
    }
    // "\boxed{4} apples and \boxed{7} pears": a joining word with the
    // first box's unit or noun beside it; a longer gap, or any word of a
    // revision ("but", "is", "actually"), makes the earlier box a draft.
    const REVISING: &[&str] = &["but", "is", "was", "not", "no", "actually", "wait", "instead", "so", "thus", "answer"];
    let words: Vec<&str> = t.split_whitespace().collect();
    if joined
        && !words.is_empty()
        && words.len() <= 2
        && words.iter().all(|w| w.len() <= 12 && w.chars().all(|c| c.is_ascii_alphabetic()) && !REVISING.contains(w))
    {
        return true;
    }
    // Part labels `(a)`/`(ii)` and a `name =` label before the next box.
    let mut rest = t.trim().to_string();
    loop {
        let r = rest.trim_start();
        if let Some(after) = r.strip_prefix('(') {
            if let Some(close) = after.find(')') {
                if close <= 4 && after[..close].chars().all(|c| c.is_ascii_alphanumeric()) {
                    rest = after[close + 1..].to_string();
                    continue;
                }
            }
        }
        break;
    }
    let r = rest.trim();
    r.is_empty() || label_before(r).is_some_and(|name| r.trim_end_matches('=').trim() == name)
}

/// `x =` (or `a_1 =`) right before a box: the label a several-part answer
/// gives each box.
fn label_before(before: &str) -> Option<&str> {
    let t = before.trim_end_matches(['$', ' ']).strip_suffix('=')?.trim_end();
    let start = t
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let name = &t[start..];
    (!name.is_empty() && name.len() <= 4 && name.starts_with(|c: char| c.is_ascii_alphabetic())).then_some(name)
}

/// The answer a prose sentence states: the last "the final answer is …",
/// "the answer is …" or GSM8K's `#### …`, to the end of its sentence.
pub fn answer_phrase(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let mut best: Option<(usize, usize)> = None;
    for phrase in ["final answer is", "the answer is", "####"] {
        if let Some(i) = lower.rfind(phrase) {
            if best.is_none_or(|(b, _)| i > b) {
                best = Some((i, phrase.len()));
            }
        }
    }
    let (i, len) = best?;
    let line = text[i + len..].split('\n').next().unwrap_or("");
    let answer = clean_answer(line);
    (!answer.is_empty()).then_some(answer)
}

/// An answer line's text without what surrounds the answer in prose:
/// Markdown bold, "The final answer is", math delimiters, and a trailing
/// sentence such as "I hope it is correct." (Minerva's and Qwen-Math's
/// answer line). A decimal point is not a sentence end.
pub fn clean_answer(line: &str) -> String {
    let mut t = line.trim().trim_start_matches([':', '*', ' ']).trim();
    for lead in ["the final answer is", "final answer is", "the answer is", "answer is"] {
        if t.len() >= lead.len() && t.is_char_boundary(lead.len()) && t[..lead.len()].eq_ignore_ascii_case(lead) {
            t = t[lead.len()..].trim_start_matches([':', ' ']).trim();
        }
    }
    // Cut at the first sentence end outside math: ". " or a final ".".
    let mut in_math = false;
    let mut end = t.len();
    let b = t.as_bytes();
    for (k, &c) in b.iter().enumerate() {
        match c {
            b'$' => in_math = !in_math,
            b'.' if !in_math
                && (k + 1 == b.len() || b[k + 1] == b' ')
                && !(k > 0 && b[k - 1].is_ascii_digit() && k + 1 < b.len() && b[k + 1].is_ascii_digit()) =>
            {
                end = k;
                break;
            }
            _ => {}
        }
    }
    let mut t = t[..end].trim().trim_end_matches(['*', ' ']).trim();
    // "The smallest $k$ is 12": a sentence naming the answer, whose value
    // follows its last " is ".
    let lower = t.to_ascii_lowercase();
    let names_it = ["the ", "so the ", "thus the ", "hence the ", "therefore the ", "therefore, the "]
        .iter()
        .any(|lead| lower.starts_with(lead));
    if names_it {
        if let Some(k) = lower.rfind(" is ") {
            t = t[k + 4..].trim();
        }
    }
    // "$12$ apples": the math span is the answer, the words after it are not.
    if let Some(inner) = t.strip_prefix('$') {
        let inner = inner.strip_prefix('$').unwrap_or(inner);
        // The closing `$`, not a currency `\$` inside the span.
        let close = inner.char_indices().find(|&(k, c)| c == '$' && !inner[..k].ends_with('\\')).map(|(k, _)| k);
        if let Some(close) = close {
            t = &t[..t.len() - inner.len() + close];
            t = t.trim_start_matches('$');
        }
    }
    let t = t.strip_prefix("\\(").and_then(|r| r.strip_suffix("\\)")).unwrap_or(t);
    let t = t.strip_prefix("\\[").and_then(|r| r.strip_suffix("\\]")).unwrap_or(t);
    t.trim().to_string()
}

/// Byte index of the `}` closing a group whose `{` came just before `body`;
/// escaped braces `\{ \}` do not nest.
fn group_close(body: &str) -> Option<usize> {
    let mut depth = 1usize;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '{' => depth += 1,
            '}' => {
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

/// The answer on the last "Answer:" line, as verl's `math_dapo` finds it.
///
/// verl (`verl/utils/reward_score/math_dapo.py`, `compute_score` and
/// `is_correct_minerva`) keeps only the last 300 characters of the response
/// and takes the last match of the case-insensitive regex
/// `Answer\s*:\s*([^\n]+)`. So "Final answer: 5" matches, whitespace
/// (including a newline) may separate the colon from the answer, and the
/// answer runs to the end of its line. `window` is that character count
/// (`Some(300)` for verl parity, `None` for the whole text). One deviation:
/// a capture that is only whitespace is skipped instead of returned, since
/// it cannot be right anyway.
pub fn answer_line(text: &str, window: Option<usize>) -> Option<&str> {
    let text = match window {
        Some(w) => tail_chars(text, w),
        None => text,
    };
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut last = None;
    while i + 6 <= bytes.len() {
        if !bytes[i..i + 6].eq_ignore_ascii_case(b"answer") {
            i += 1;
            continue;
        }
        // ASCII match, so `i + 6` is a char boundary.
        let after = &text[i + 6..];
        let after_ws = after.trim_start();
        if let Some(value) = after_ws.strip_prefix(':') {
            let value = value.trim_start();
            let line = value.split('\n').next().unwrap_or("");
            if !line.trim().is_empty() {
                last = Some(line.trim());
                // Non-overlapping, as `re.findall`: resume after this match.
                i = text.len() - value.len() + line.len();
                continue;
            }
        }
        i += 1;
    }
    last
}

/// The last `n` characters (not bytes) of `text`.
fn tail_chars(text: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    match text.char_indices().rev().nth(n - 1) {
        Some((i, _)) => &text[i..],
        None => text,
    }
}

/// Content of the last non-empty inline math span `$…$` (or `$$…$$`).
///
/// Used by [`super::AnswerFormat::Auto`] before falling back to the last
/// number, so "the answer is $\frac{1}{2}$" yields `\frac{1}{2}`, not `2`.
/// With an odd number of `$` the spans are ambiguous and this returns `None`.
pub fn last_math_span(text: &str) -> Option<String> {
    // `\(…\)` and `\[…\]` are the same spans as `$…$` and `$$…$$`.
    let text = text
        .replace("\\$", "")
        .replace("$$", "$")
        .replace("\\(", "$")
        .replace("\\)", "$")
        .replace("\\[", "$")
        .replace("\\]", "$");
    let segments: Vec<&str> = text.split('$').collect();
    if segments.len().is_multiple_of(2) {
        return None;
    }
    segments.iter().skip(1).step_by(2).rev().map(|s| s.trim()).find(|s| !s.is_empty()).map(str::to_string)
}

/// Longest `{…}` exponent group [`last_number`] reads (`2^{10}`,
/// `9^{9^{9^{9}}}`); the bound keeps extraction linear on unbalanced braces.
const MAX_EXPONENT_GROUP: usize = 64;

/// Whether the number at `b[start..end]` is an end or a coordinate of a
/// bracketed interval or tuple (`[0, 2)`, `(3, 4)`): one part of a larger
/// answer, never the answer itself. A comma must sit between it and the
/// bracket on one side, the bracket itself on the other.
fn coordinate(b: &[u8], start: usize, end: usize) -> bool {
    let before = b[..start].iter().rev().copied().find(|c| *c != b' ');
    let after = b[end..].iter().copied().find(|c| *c != b' ');
    let opens = |c: Option<u8>| matches!(c, Some(b'(' | b'['));
    let closes = |c: Option<u8>| matches!(c, Some(b')' | b']'));
    // Inside one line, a comma and then a bracket, looking `back`wards or not.
    let comma_then_bracket = |back: bool| {
        let mut seen_comma = false;
        let mut k = if back { start } else { end };
        for _ in 0..64 {
            let c = if back {
                if k == 0 {
                    return false;
                }
                k -= 1;
                b[k]
            } else {
                if k >= b.len() {
                    return false;
                }
                k += 1;
                b[k - 1]
            };
            match c {
                b',' | b';' => seen_comma = true,
                b'\n' => return false,
                b'(' | b'[' if back => return seen_comma,
                b')' | b']' if !back => return seen_comma,
                b'(' | b'[' | b')' | b']' => return false,
                _ => {}
            }
        }
        false
    };
    (closes(after) && comma_then_bracket(true)) || (opens(before) && comma_then_bracket(false))
}

/// The last plain number in the text, for tasks whose answers are numbers.
///
/// Accepts a leading minus (when not glued to a preceding word or number),
/// thousands groups (`1,234`: a comma followed by exactly three digits), a
/// decimal part and a trailing `/denominator` (`3/4`). A final sentence
/// period is not part of the number.
///
/// Notation that changes the value is taken whole, never truncated to a
/// number inside it: scientific notation (`1e999999`, not `999999`), powers
/// (`2^{10}` and `9^{9^{9^{9}}}`, not `10` or `9`) and factorials (`5!`, not
/// `5`; a `!` glued to a number is a factorial, not an exclamation mark). A
/// number that is itself an exponent (`x^2`) or whose exponent cannot be
/// delimited (`2^x`) is no answer and is skipped.
pub fn last_number(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let n = b.len();
    let digit = |i: usize| i < n && b[i].is_ascii_digit();
    let run = |mut i: usize| {
        while digit(i) {
            i += 1;
        }
        i
    };
    // Length of a power operator at `k`, 0 if none: `^`, or `**` directly
    // before digits (so Markdown bold `**42**` is not a power).
    let pow_at = |k: usize| match b.get(k..) {
        Some([b'^', ..]) => 1,
        Some([b'*', b'*', d, ..]) if d.is_ascii_digit() => 2,
        Some([b'*', b'*', b'-' | b'+', d, ..]) if d.is_ascii_digit() => 2,
        _ => 0,
    };
    // End of the `{…}` group opening at `open`, if it closes soon enough.
    let group_end = |open: usize| {
        let mut depth = 0usize;
        for (k, &c) in b.iter().enumerate().skip(open).take(MAX_EXPONENT_GROUP) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(k + 1);
                    }
                }
                _ => {}
            }
        }
        None
    };
    // Scientific exponent, powers and factorials after digits ending at
    // `end`; `None` when a power's exponent cannot be delimited.
    let suffix = |mut end: usize| -> Option<usize> {
        if end < n && matches!(b[end], b'e' | b'E') {
            let k = if matches!(b.get(end + 1), Some(b'+' | b'-')) { end + 2 } else { end + 1 };
            if digit(k) {
                end = run(k);
            }
        }
        loop {
            let op = pow_at(end);
            if op == 0 {
                break;
            }
            let k = end + op;
            end = if b.get(k) == Some(&b'{') {
                group_end(k)?
            } else if b[k..].starts_with(b"\\circ") {
                k + 5
            } else {
                let k = if matches!(b.get(k), Some(b'+' | b'-')) { k + 1 } else { k };
                if !digit(k) {
                    return None;
                }
                run(k)
            };
        }
        while end < n && b[end] == b'!' && b.get(end + 1) != Some(&b'=') {
            end += 1;
        }
        Some(end)
    };
    let mut last = None;
    let mut i = 0;
    while i < n {
        if !digit(i) {
            i += 1;
            continue;
        }
        // Digits glued to a letter before them belong to a word or a name
        // (`QX7TB`, `H2O`, `x2`), not a number of the answer.
        if i > 0 && b[i - 1].is_ascii_alphabetic() {
            i = run(i);
            continue;
        }
        let mut start = i;
        if i > 0 && b[i - 1] == b'-' && (i < 2 || !b[i - 2].is_ascii_alphanumeric()) {
            start = i - 1;
        }
        // An exponent (`x^2`, `x^{-2}`, `x**3`) is part of a power, not a number.
        let exponent = (start >= 1 && b[start - 1] == b'^')
            || (start >= 2 && &b[start - 2..start] == b"^{")
            || (start >= 3
                && &b[start - 2..start] == b"**"
                && (b[start - 3].is_ascii_alphanumeric() || b[start - 3] == b')'));
        let mut end = run(i);
        // Thousands groups: exactly three digits after each comma.
        while end < n && b[end] == b',' && run(end + 1) == end + 4 {
            end += 4;
        }
        if end + 1 < n && b[end] == b'.' && digit(end + 1) {
            end = run(end + 1);
        }
        let mut whole = suffix(end);
        if let Some(e) = whole {
            if e + 1 < n && b[e] == b'/' && digit(e + 1) {
                whole = suffix(run(e + 1));
            }
        }
        match whole {
            Some(e) => {
                if !exponent && !coordinate(b, start, e) {
                    last = Some(&text[start..e]);
                }
                i = e;
            }
            // `2^x`: skip the base and go on after the power sign.
            None => i = run(i),
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_block_is_removed_and_unclosed_think_has_no_answer() {
        assert_eq!(strip_think("<think>2+2=5</think>The answer is 4"), "The answer is 4");
        assert_eq!(strip_think("hmm 5</think> 4"), " 4");
        assert_eq!(strip_think("<think>still thinking, maybe \\boxed{3}"), "");
        assert_eq!(strip_think("no tags \\boxed{1}"), "no tags \\boxed{1}");
    }

    #[test]
    fn boxed_takes_the_last_box_with_nested_braces() {
        assert_eq!(last_boxed("first \\boxed{1} then \\boxed{\\frac{1}{2}}."), Some("\\frac{1}{2}"));
        assert_eq!(last_boxed("$\\boxed{\\{1, 2\\}}$"), Some("\\{1, 2\\}"));
        assert_eq!(last_boxed("\\boxed{{a}{b}}"), Some("{a}{b}"));
    }

    #[test]
    fn fbox_and_space_forms() {
        assert_eq!(last_boxed("so \\fbox{7}"), Some("7"));
        assert_eq!(last_boxed("\\boxed{1} and later \\fbox{2}"), Some("2"));
        assert_eq!(last_boxed("the answer is $\\boxed 5$."), Some("5"));
        assert_eq!(last_boxed("\\boxed 12\nmore"), Some("12"));
        assert_eq!(last_boxed("\\boxed5"), Some("5"));
    }

    #[test]
    fn boxed_rejects_unclosed_empty_and_absent() {
        assert_eq!(last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}"), None);
        assert_eq!(last_boxed("put it in \\boxed{}"), None);
        assert_eq!(last_boxed("no box here 42"), None);
        assert_eq!(last_boxed("\\boxedx"), None);
    }

    #[test]
    fn answer_line_follows_verl_math_dapo() {
        assert_eq!(answer_line("work...\nAnswer: 42", Some(300)), Some("42"));
        assert_eq!(answer_line("answer:7\nANSWER : 8", Some(300)), Some("8"));
        assert_eq!(answer_line("Final Answer: $\\frac{1}{2}$\nThanks", Some(300)), Some("$\\frac{1}{2}$"));
        assert_eq!(answer_line("Answer:\n  13", Some(300)), Some("13"));
        assert_eq!(answer_line("the answer is 5", Some(300)), None);
        assert_eq!(answer_line("Answer:   ", Some(300)), None);
    }

    #[test]
    fn answer_line_only_looks_at_the_window() {
        let text = format!("Answer: 1\n{}", "x".repeat(400));
        assert_eq!(answer_line(&text, Some(300)), None);
        assert_eq!(answer_line(&text, None), Some("1"));
        // The window counts characters, so multi-byte text cannot split a char.
        let text = format!("Answer: 2\n{}", "é".repeat(100));
        assert_eq!(answer_line(&text, Some(300)), Some("2"));
    }

    #[test]
    fn last_math_span_takes_the_last_balanced_span() {
        assert_eq!(last_math_span("so $x=1$ and then $\\frac{1}{2}$."), Some("\\frac{1}{2}".to_string()));
        assert_eq!(last_math_span("$$7$$"), Some("7".to_string()));
        assert_eq!(last_math_span("costs \\$5 and $3$"), Some("3".to_string()));
        assert_eq!(last_math_span("odd $ count"), None);
        assert_eq!(last_math_span("none"), None);
    }

    #[test]
    fn last_number_handles_signs_separators_decimals_fractions() {
        assert_eq!(last_number("so 3 apples and then 12."), Some("12"));
        assert_eq!(last_number("total: -7"), Some("-7"));
        assert_eq!(last_number("x-7"), Some("7"));
        assert_eq!(last_number("cost 1,234,567 dollars"), Some("1,234,567"));
        assert_eq!(last_number("points 1, 2"), Some("2"));
        assert_eq!(last_number("pi is 3.14."), Some("3.14"));
        assert_eq!(last_number("ratio 3/4"), Some("3/4"));
        assert_eq!(last_number("none"), None);
    }

    #[test]
    fn last_number_never_truncates_exponents_factorials_or_scientific_notation() {
        assert_eq!(last_number("so it is 9^{9^{9^{9}}}"), Some("9^{9^{9^{9}}}"));
        assert_eq!(last_number("we get 2^{10}."), Some("2^{10}"));
        assert_eq!(last_number("2^10 = 1024, or 2^-3"), Some("2^-3"));
        assert_eq!(last_number("2**10"), Some("2**10"));
        assert_eq!(last_number("x**3 is 8"), Some("8"));
        assert_eq!(last_number("7 or x**3"), Some("7"));
        // Markdown bold is not a power.
        assert_eq!(last_number("The answer is **42**."), Some("42"));
        assert_eq!(last_number("about 1e999999"), Some("1e999999"));
        assert_eq!(last_number("it is 2.5E-2 now"), Some("2.5E-2"));
        assert_eq!(last_number("the answer is 5!"), Some("5!"));
        assert_eq!(last_number("count 3/4!"), Some("3/4!"));
        assert_eq!(last_number("45^\\circ"), Some("45^\\circ"));
        // Exponents and undelimited powers are no answers.
        assert_eq!(last_number("area 12 is x^2"), Some("12"));
        assert_eq!(last_number("area 12 is x^{-2}"), Some("12"));
        assert_eq!(last_number("7 then 2^x"), Some("7"));
        // Plain words after numbers are not notation.
        assert_eq!(last_number("3 eggs"), Some("3"));
        assert_eq!(last_number("5 != 6"), Some("6"));
        assert_eq!(last_number("5!=6"), Some("6"));
        // An unbalanced exponent group does not swallow the text.
        assert_eq!(last_number(&format!("3 then 2^{{{}", "1".repeat(200))), Some("3"));
    }
}
