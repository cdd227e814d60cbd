//! The verifier runs inside rollout workers on model output, which can be
//! anything. A panic or a pathological slowdown there turns into lost or
//! silently zero rewards, so these properties feed it arbitrary and
//! adversarial text and require that every call returns, quickly.
//!
//! Time is a correctness bound for blowups (exponential backtracking,
//! exponent loops), not a benchmark: each call must finish in under 50 ms.
//! The minimum of three runs is taken so that a descheduled test thread on a
//! busy machine does not fail the property; a real blowup is slow every time.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use r2vpo_verify::{extract_answer, is_equivalent, normalize_answer, verify, AnswerFormat, VerifyConfig};

const BOUND: Duration = Duration::from_millis(50);

fn configs() -> Vec<VerifyConfig> {
    let mut out = Vec::new();
    for format in [AnswerFormat::Auto, AnswerFormat::Boxed, AnswerFormat::AnswerLine, AnswerFormat::LastNumber] {
        out.push(VerifyConfig { format, answer_line_window: None, ..VerifyConfig::default() });
    }
    out.push(VerifyConfig { equivalence: r2vpo_verify::Equivalence::MinervaExact, ..VerifyConfig::dapo() });
    out
}

/// Runs every entry point on (`text`, `gold`) and checks the time bound.
fn check(text: &str, gold: &str) {
    for cfg in configs() {
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            let v = verify(text, gold, &cfg);
            let _ = is_equivalent(text, gold, &cfg);
            let _ = is_equivalent(gold, text, &cfg);
            let _ = extract_answer(text, &cfg);
            let _ = normalize_answer(text);
            best = best.min(t0.elapsed());
            // A verdict is always internally consistent.
            assert!(!v.correct || v.extracted.is_some());
            if best < BOUND {
                break;
            }
        }
        assert!(best < BOUND, "took {best:?} on {:?} (format {:?})", truncate(text), cfg.format);
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(120).collect()
}

/// LaTeX-flavoured tokens, so random strings reach the deep code paths.
fn latex_soup() -> impl Strategy<Value = String> {
    let tok = prop_oneof![
        Just("\\frac"),
        Just("\\dfrac"),
        Just("\\sqrt"),
        Just("\\sqrt["),
        Just("\\boxed{"),
        Just("\\fbox"),
        Just("\\text{"),
        Just("\\left("),
        Just("\\right)"),
        Just("\\{"),
        Just("\\}"),
        Just("\\cup"),
        Just("\\pi"),
        Just("\\infty"),
        Just("\\cdot"),
        Just("\\times"),
        Just("\\%"),
        Just("^\\circ"),
        Just("{"),
        Just("}"),
        Just("("),
        Just(")"),
        Just("["),
        Just("]"),
        Just(","),
        Just("="),
        Just("^"),
        Just("**"),
        Just("!"),
        Just("-"),
        Just("/"),
        Just("."),
        Just("e"),
        Just(" "),
        Just("$"),
        Just("Answer:"),
        Just("\n"),
        Just("<think>"),
        Just("</think>"),
        Just("1"),
        Just("9"),
        Just("0"),
        Just("x"),
        Just("cm"),
        Just("π"),
        Just("√"),
    ];
    prop::collection::vec(tok, 0..400).prop_map(|v| v.concat())
}

/// Deep nesting of every bracket-like construct.
fn deep_nesting() -> impl Strategy<Value = String> {
    let opener = prop_oneof![
        Just(("{", "}")),
        Just(("(", ")")),
        Just(("[", "]")),
        Just(("\\{", "\\}")),
        Just(("\\frac{1}{", "}")),
        Just(("\\sqrt{", "}")),
        Just(("\\sqrt[2]{", "}")),
        Just(("2^{", "}")),
        Just(("\\text{", "}")),
        Just(("\\boxed{", "}")),
        Just(("-", "")),
        Just(("\\left(", "\\right)")),
    ];
    (opener, 0usize..1200, any::<bool>()).prop_map(|((o, c), n, balanced)| {
        let close = if balanced { c.repeat(n) } else { String::new() };
        format!("{}1{}", o.repeat(n), close)
    })
}

/// Exponent towers and huge powers that must not loop or overflow the stack.
fn huge_exponents() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,30}".prop_map(|e| format!("10^{{{e}}}")),
        "[0-9]{1,30}".prop_map(|e| format!("1e{e}")),
        "[0-9]{1,30}".prop_map(|e| format!("1.5\\times10^{{-{e}}}")),
        (1usize..400).prop_map(|n| "9^".repeat(n) + "9"),
        (1usize..200).prop_map(|n| "2^{".repeat(n) + "9" + &"}".repeat(n)),
        "[0-9]{1,6}".prop_map(|n| format!("{n}!")),
        "[0-9]{1,4}".prop_map(|n| format!("\\sqrt[{n}]{{-8}}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_unicode_never_panics(text in any::<String>(), gold in any::<String>()) {
        check(&text, &gold);
    }

    #[test]
    fn latex_soup_never_panics(text in latex_soup(), gold in latex_soup()) {
        check(&text, &gold);
    }

    #[test]
    fn deep_nesting_is_bounded(text in deep_nesting(), gold in prop_oneof![Just("1".to_string()), deep_nesting()]) {
        check(&text, &gold);
        check(&format!("\\boxed{{{text}}}"), &gold);
    }

    #[test]
    fn huge_exponents_are_bounded(text in huge_exponents(), gold in huge_exponents()) {
        check(&text, &gold);
    }

    #[test]
    fn long_digit_strings_are_bounded(digits in "[0-9]{1,5000}", sep in prop_oneof![Just(""), Just(","), Just("."), Just("/")]) {
        let text = digits.chars().enumerate().map(|(i, c)| if i % 3 == 2 { format!("{c}{sep}") } else { c.to_string() }).collect::<String>();
        check(&digits, &digits);
        check(&text, &digits);
        check(&format!("Answer: {text}"), "1000");
    }

    #[test]
    fn unbalanced_boxes_are_bounded(n in 1usize..2000, tail in latex_soup()) {
        let text = format!("{}{tail}", "\\boxed{".repeat(n));
        check(&text, "1");
        let text = format!("{tail}{}", "\\boxed{1}}".repeat(n / 10 + 1));
        check(&text, "1");
    }
}

#[test]
fn long_responses_extract_in_linear_time() {
    // A realistic long chain of thought: 200k characters, answer at the end.
    let body = "We compute 12 + 30 = 42, then check (1, 2) and \\frac{1}{2}. ".repeat(3500);
    let text = format!("<think>{body}</think>{body}\\boxed{{42}}");
    let t0 = Instant::now();
    let v = verify(&text, "42", &VerifyConfig::default());
    assert!(v.correct, "{v}");
    assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
}

#[test]
fn inputs_at_the_length_limit_are_bounded() {
    let limit = VerifyConfig::default().max_input_chars;
    let cases = [
        "(".repeat(limit - 1),
        "\\{".repeat(limit / 2 - 1),
        "1,".repeat(limit / 2 - 1) + "1",
        "(1,".repeat(limit / 3),
        "\\sqrt{".repeat(limit / 6),
        "2^".repeat(limit / 2 - 1) + "2",
        "\\text{".repeat(limit / 6),
        "x=".repeat(limit / 2 - 1) + "1",
        "\\{1,\\{2,".repeat(limit / 8),
        "[1,(2,".repeat(limit / 6),
    ];
    for a in &cases {
        for g in &cases {
            check(a, g);
        }
    }
}
