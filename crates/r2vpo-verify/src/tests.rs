//! One test per rule, through the public API, with positive and negative cases.

use super::*;

/// The default config with the evaluator reachable from a plain-number
/// gold: most rules below test how answers are evaluated (`\sqrt[3]{8}`
/// is 2), which `refuse_undone_arithmetic` would cut short;
/// [`undone_arithmetic_is_refused_by_default`] tests that switch.
fn cfg() -> VerifyConfig {
    VerifyConfig { refuse_undone_arithmetic: false, ..VerifyConfig::default() }
}

#[track_caller]
fn yes(answer: &str, gold: &str) {
    let v = is_equivalent(answer, gold, &cfg());
    assert!(v.correct, "expected {answer:?} == {gold:?}\n{v}");
}

#[track_caller]
fn no(answer: &str, gold: &str) {
    let v = is_equivalent(answer, gold, &cfg());
    assert!(!v.correct, "expected {answer:?} != {gold:?}\n{v}");
}

#[test]
fn integers_and_signs() {
    yes("42", "42");
    yes("-7", "-7");
    yes("+7", "7");
    no("42", "24");
    no("-7", "7");
    no("123456789", "123456790");
}

#[test]
fn decimals() {
    yes("0.5", "0.50");
    yes(".5", "0.5");
    yes("2.0", "2");
    no("0.5", "0.05");
}

#[test]
fn fractions_slash_and_latex() {
    yes("\\dfrac{1}{2}", "0.5");
    yes("1/2", "\\frac{1}{2}");
    yes("\\tfrac{3}{4}", "0.75");
    yes("\\frac12", "\\frac{1}{2}");
    yes("-\\frac{1}{3}", "\\frac{-1}{3}");
    no("\\frac{1}{3}", "0.333");
    no("\\frac{1}{2}", "\\frac{2}{1}");
}

#[test]
fn mixed_numbers() {
    yes("2\\frac{1}{2}", "5/2");
    yes("-1\\frac{1}{4}", "-1.25");
    no("2\\frac{1}{2}", "1");
}

#[test]
fn radicals_and_pi() {
    yes("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}");
    yes("3\\sqrt{2}", "\\sqrt{18}");
    yes("3\\sqrt2", "3\\sqrt{2}");
    yes("\\sqrt[3]{8}", "2");
    yes("2\\pi", "\\pi \\cdot 2");
    yes("\\frac{\\pi}{2}", "0.5\\pi");
    no("\\sqrt{2}", "1.414");
    no("\\pi", "3.14");
    no("2\\sqrt{3}", "3\\sqrt{2}");
}

#[test]
fn arithmetic_expressions() {
    yes("2 \\times 3", "6");
    yes("12 \\div 4", "3");
    yes("(1+2)^2", "9");
    yes("2^{10}", "1024");
    no("2^{10}", "1000");
}

#[test]
fn scientific_notation() {
    yes("1.5\\times10^{3}", "1500");
    yes("1e3", "1000");
    yes("1000", "1e3");
    yes("2.5E-2", "0.025");
    yes("2.5 \\cdot 10^{-2}", "0.025");
    no("1.5\\times10^{3}", "150");
    no("1e3", "3");
    no("1e3", "1");
    // Beyond f64: read whole, never as its exponent; equal only to itself.
    yes("1e999999", "1e999999");
    no("1e999999", "999999");
    no("999999", "1e999999");
    no("1e999999", "1e999998");
    no("1e999999", "1");
}

/// Issue #17: `!` was trimmed as punctuation, so `\boxed{5!}` scored as 5.
#[test]
fn factorials_are_evaluated_not_dropped() {
    no("\\boxed{5!}", "5");
    no("5!", "5");
    no("5", "5!");
    yes("\\boxed{5!}", "120");
    yes("5!", "120");
    yes("120", "5!");
    yes("5!", "5!");
    yes("3!+1", "7");
    yes("0!", "1");
    no("3!", "3");
    // Beyond 170! or ambiguous: only the identical expression matches.
    yes("171!", "171!");
    no("171!", "171");
    yes("5!!", "5!!");
    no("5!!", "15");
    no("5!!", "5");
    let v = is_equivalent("\\boxed{5!}", "5", &cfg());
    assert_eq!((v.normalized_answer.as_str(), v.parsed_answer.as_str()), ("5!", "120"), "{v}");
}

/// Issue #17: an expression with no representable value was read as its last
/// number (`9^{9^{9^{9}}}` as 9, `1e999999` as 999999) by the Auto fallback.
#[test]
fn unevaluable_expressions_are_kept_whole() {
    yes("9^{9^{9^{9}}}", "9^{9^{9^{9}}}");
    yes("10^{400}", "10^{400}");
    no("9^{9^{9^{9}}}", "9");
    no("9^{9^{9^{9}}}", "9^{9^{9^{8}}}");
    no("10^{400}", "400");
    no("10^{400}", "10^{401}");
    // The whole path `r2vpo llm verify --answer X --gold Y` takes.
    for (answer, gold, correct) in [
        ("9^{9^{9^{9}}}", "9^{9^{9^{9}}}", true),
        ("9^{9^{9^{9}}}", "9", false),
        ("1e999999", "999999", false),
        ("1e999999", "1e999999", true),
        ("1e3", "1000", true),
        ("10^{400}", "400", false),
        ("\\boxed{5!}", "5", false),
        ("\\boxed{5!}", "120", true),
        ("5!", "5", false),
        ("171!", "171", false),
        ("$9^{9^{9^{9}}}$", "9", false),
        ("so it is 9^{9^{9^{9}}}", "9", false),
        ("so it is 9^{9^{9^{9}}}", "9^{9^{9^{9}}}", true),
        ("roughly 1e999999", "999999", false),
        ("the answer is 5!", "5", false),
        ("Answer: 5!", "5", false),
        // Ordinary answers are unaffected.
        ("\\boxed{42}", "42", true),
        ("\\frac{1}{2}", "0.5", true),
        ("-7", "-7", true),
        ("3.5", "3.50", true),
        ("1,000", "1000", true),
        ("The answer is **42**.", "42", true),
        ("2^{10}", "1024", true),
        ("so it is 2^{10}", "10", false),
    ] {
        let v = verify(answer, gold, &cfg());
        assert_eq!(v.correct, correct, "{answer:?} vs {gold:?}\n{v}");
    }
    let v = verify("9^{9^{9^{9}}}", "9^{9^{9^{9}}}", &cfg());
    assert_eq!((v.extracted.as_deref(), &v.reason), (Some("9^{9^{9^{9}}}"), &Reason::StringMatch), "{v}");
    let v = verify("1e999999", "999999", &cfg());
    assert_eq!(v.extracted.as_deref(), Some("1e999999"), "{v}");
    assert!(matches!(&v.reason, Reason::Mismatch(why) if why.contains("without a value")), "{v}");
    // The last-number format reads the same notation whole.
    let last = VerifyConfig { format: AnswerFormat::LastNumber, ..cfg() };
    assert!(!verify("it is 1e999999", "999999", &last).correct);
    assert!(!verify("it is 5!", "5", &last).correct);
    assert!(verify("it is 5!", "120", &last).correct);
    assert!(!verify("we get 2^{10}", "10", &last).correct);
    assert!(verify("we get 2^{10}", "1024", &last).correct);
}

#[test]
fn thousands_separators_versus_tuples() {
    yes("1,000", "1000");
    yes("\\$1,234,567", "1234567");
    yes("1{,}000", "1000");
    no("1, 2", "12");
    no("1,000", "1");
}

#[test]
fn trailing_periods_and_spaces() {
    yes("5.", "5");
    yes("  7 ", "7");
    yes("\\frac{1} {2}", "\\frac{1}{2}");
    no("5.1", "5");
}

#[test]
fn dollar_wrappers() {
    yes("$5$", "5");
    yes("$$\\frac{1}{2}$$", "1/2");
    yes("\\(3\\)", "3");
}

#[test]
fn text_commands_and_units() {
    yes("\\text{5 cm}", "5");
    yes("5 \\mbox{ inches}", "5");
    yes("\\mathrm{12}", "12");
    yes("12 ways", "12");
    yes("8 \\text{cm}^2", "8");
    yes("\\text{Evelyn}", "Evelyn");
    no("\\text{6 cm}", "5");
    no("\\text{Evelyn}", "Alice");
}

#[test]
fn left_right() {
    yes("\\left( 1, 2 \\right)", "(1,2)");
    yes("\\left[0, 1\\right)", "[0,1)");
    no("\\left( 1, 2 \\right)", "(1,3)");
}

#[test]
fn degrees() {
    yes("10^\\circ", "10");
    yes("10^{\\circ}", "10");
    yes("30 degrees", "30");
    yes("45°", "45");
    no("10^\\circ", "11");
}

#[test]
fn percent_rule() {
    // Marks are stripped: 50% and 50 agree.
    yes("50\\%", "50");
    yes("50%", "50\\%");
    yes("25 percent", "25");
    // One-sided percent also accepts the fraction reading.
    yes("50\\%", "0.5");
    yes("0.5", "50\\%");
    no("50\\%", "0.05");
    let strict = VerifyConfig { percent_as_fraction: false, ..cfg() };
    assert!(!is_equivalent("50\\%", "0.5", &strict).correct);
    assert_eq!(is_equivalent("50\\%", "0.5", &cfg()).reason, Reason::PercentMatch);
}

#[test]
fn tuples_are_ordered() {
    yes("(1,2)", "(1, 2)");
    yes("(1, \\frac{1}{2})", "(1, 0.5)");
    no("(1,2)", "(2,1)");
    no("(1,2)", "1,2");
}

#[test]
fn intervals_bracket_types_matter() {
    yes("[1,3)", "[1, 3)");
    yes("(-\\infty, 2]", "(-\\infty,2]");
    yes("(-\\infty,1)\\cup(2,\\infty)", "(2,\\infty) \\cup (-\\infty,1)");
    no("[1,3)", "[1,3]");
    no("(1,3)", "[1,3]");
    let v = is_equivalent("[1,3)", "[1,3]", &cfg());
    assert!(matches!(&v.reason, Reason::Mismatch(why) if why.contains("brackets")), "{v}");
}

#[test]
fn sets_are_unordered() {
    yes("\\{1,2\\}", "\\{2,1\\}");
    yes("\\left\\{ 3, \\frac{1}{2} \\right\\}", "\\{0.5, 3\\}");
    no("\\{1,2\\}", "\\{1,3\\}");
    no("\\{1,2\\}", "\\{1,2,3\\}");
}

#[test]
fn comma_lists_are_unordered_by_default() {
    yes("3, 1, 2", "1,2,3");
    yes("x = 1, x = 2", "2, 1");
    yes("1 and 2", "1, 2");
    no("1, 2", "1, 2, 3");
    let ordered = VerifyConfig { unordered_lists: false, ..cfg() };
    assert!(!is_equivalent("2, 1", "1, 2", &ordered).correct);
}

#[test]
fn assignments() {
    yes("x = 5", "5");
    yes("x \\in [1, 3)", "[1,3)");
    no("x \\in [1, 3)", "[1,3]");
    yes("k=\\frac{1}{2}", "0.5");
    no("x = 5", "6");
}

#[test]
fn boxed_gold_is_unwrapped() {
    yes("5", "\\boxed{5}");
    yes("\\boxed{\\frac{1}{2}}", "0.5");
}

#[test]
fn relative_tolerance_with_absolute_floor() {
    yes("1.0000000001\\sqrt{2}", "\\sqrt{2}");
    // A terminating decimal is rational: never the irrational gold, to any
    // number of digits, unless decimal approximations are accepted.
    no("0.7071067811865476", "\\frac{\\sqrt{2}}{2}");
    no("3.14159265358979323846264338327950288", "\\pi");
    no("0.7071", "\\frac{\\sqrt{2}}{2}");
    let approx = VerifyConfig { accept_decimal_approximation: true, ..cfg() };
    assert!(is_equivalent("0.7071067811865476", "\\frac{\\sqrt{2}}{2}", &approx).correct);
    assert!(!is_equivalent("0.7071", "\\frac{\\sqrt{2}}{2}", &approx).correct);
    let loose = VerifyConfig { rel_tol: 1e-3, accept_decimal_approximation: true, ..cfg() };
    assert!(is_equivalent("0.7071", "\\frac{\\sqrt{2}}{2}", &loose).correct);
    // Near zero the absolute floor decides.
    yes("\\sqrt{2}-\\sqrt{2}", "0");
}

#[test]
fn symbolic_answers_compare_as_text() {
    yes("x^{2}+1", "x^2+1");
    no("x+1", "x+2");
}

#[test]
fn empty_and_long_inputs_are_reported_not_scored() {
    assert_eq!(is_equivalent("5", "", &cfg()).reason, Reason::EmptyGold);
    assert!(!is_equivalent("", "5", &cfg()).correct);
    let long = "1".repeat(2000);
    let v = is_equivalent(&long, &long, &cfg());
    assert_eq!((v.correct, v.reason), (false, Reason::TooLong));
}

#[test]
fn verify_extracts_per_format() {
    let r = "Let me think.\nSo the total is \\boxed{\\frac{1}{2}}.";
    assert!(verify(r, "0.5", &VerifyConfig::boxed()).correct);
    let r = "Some work, 17 steps...\nAnswer: 42";
    assert!(verify(r, "42", &VerifyConfig::dapo()).correct);
    let r = "3 + 4 = 7";
    assert!(verify(r, "7", &VerifyConfig { format: AnswerFormat::LastNumber, ..cfg() }).correct);
    // Boxed format ignores an Answer line.
    let v = verify("Answer: 42", "42", &VerifyConfig::boxed());
    assert_eq!((v.correct, v.reason, v.extracted), (false, Reason::NoAnswer, None));
}

#[test]
fn auto_format_takes_whole_bare_answers() {
    assert!(verify("\\frac{1}{2}", "0.5", &cfg()).correct);
    assert!(verify("(1, 2)", "(1,2)", &cfg()).correct);
    assert!(verify("so it is 12 apples", "12", &cfg()).correct);
    assert!(verify("ok \\boxed{3} and 9", "3", &cfg()).correct);
    assert!(verify("The answer is $\\frac{1}{2}$.", "0.5", &cfg()).correct);
    assert!(verify("With $x$ apples we get 12", "12", &cfg()).correct);
}

#[test]
fn think_blocks_are_stripped_when_configured() {
    let r = "<think>maybe \\boxed{4}</think> The answer is \\boxed{5}";
    assert!(verify(r, "5", &cfg()).correct);
    // An unclosed think block is a truncated response: no answer.
    let r = "<think>I believe \\boxed{5}";
    assert_eq!(verify(r, "5", &cfg()).reason, Reason::NoAnswer);
    let keep = VerifyConfig { strip_think: false, ..cfg() };
    assert!(verify(r, "5", &keep).correct);
}

#[test]
fn reward_values_are_configurable() {
    let dapo = VerifyConfig::dapo();
    assert_eq!(reward("Answer: 3", "3", &dapo), 1.0);
    assert_eq!(reward("Answer: 4", "3", &dapo), -1.0);
    assert_eq!(reward("no answer at all", "3", &dapo), -1.0);
    assert_eq!(reward("\\boxed{3}", "3", &cfg()), 1.0);
    assert_eq!(reward("\\boxed{4}", "3", &cfg()), 0.0);
}

#[test]
fn minerva_exact_mode_reproduces_verl_math_dapo() {
    let m = VerifyConfig { equivalence: Equivalence::MinervaExact, ..VerifyConfig::dapo() };
    assert!(verify("Answer: $1,000$", "1000", &m).correct);
    assert!(verify("Answer: \\boxed{42}", "42", &m).correct);
    // verl's exact match rejects what the default mode accepts.
    assert!(!verify("Answer: 0.5", "\\frac{1}{2}", &m).correct);
    assert!(verify("Answer: 0.5", "\\frac{1}{2}", &VerifyConfig::dapo()).correct);
}

#[test]
fn verdict_carries_debug_information() {
    let v = verify("\\boxed{\\dfrac{1}{2}}", "0.5", &cfg());
    assert_eq!(v.extracted.as_deref(), Some("\\dfrac{1}{2}"));
    assert_eq!(v.normalized_answer, "\\frac{1}{2}");
    assert_eq!(v.normalized_gold, "0.5");
    assert_eq!(v.parsed_answer, "1/2");
    assert_eq!(v.reason, Reason::NumericMatch);
    let shown = v.to_string();
    assert!(shown.contains("CORRECT") && shown.contains("\\frac{1}{2}"), "{shown}");
}

#[test]
fn config_round_trips_through_serde_with_defaults() {
    // Serde defaults let dataset configs name only what differs.
    let c: VerifyConfig = serde_json_like();
    assert_eq!(c, VerifyConfig::default());
}

/// Deserialises `{}` without pulling a JSON crate into dependencies.
fn serde_json_like() -> VerifyConfig {
    use serde::de::value::{Error, MapDeserializer};
    let empty: Vec<(String, String)> = Vec::new();
    VerifyConfig::deserialize(MapDeserializer::<_, Error>::new(empty.into_iter())).unwrap()
}

#[test]
fn dapo_style_responses() {
    let dapo = VerifyConfig::dapo();
    let pad = "Lots of reasoning. ".repeat(50);
    assert!(verify(&format!("{pad}\nAnswer: $\\boxed{{204}}$"), "204", &dapo).correct);
    assert!(verify(&format!("{pad}\nAnswer: 204."), "204", &dapo).correct);
    assert!(verify(&format!("{pad}\nAnswer: 204\n\nI hope it is correct."), "204", &dapo).correct);
    // The last Answer line wins, earlier drafts do not.
    assert!(!verify(&format!("Answer: 204\n{pad}\nAnswer: 205"), "204", &dapo).correct);
    // Outside the 300-character window, as in verl.
    assert_eq!(verify(&format!("Answer: 204\n{pad}"), "204", &dapo).reason, Reason::NoAnswer);
}

#[test]
fn negative_numbers_inside_structures() {
    yes("(-1, -\\frac{1}{2})", "(-1,-0.5)");
    yes("\\{-2, 2\\}", "\\{2,-2\\}");
    no("(-1, 2)", "(1, 2)");
}

/// A multiple-choice letter with its value, against the value: the value
/// is the answer; against a letter gold, the letter is.
#[test]
fn choice_letters_with_values() {
    let d = VerifyConfig::default();
    for (answer, gold, want) in [
        ("\\boxed{\\textbf{(C)}\\ 12}", "12", true),
        ("$\\boxed{\\textbf{(E)}~36}$", "36", true),
        ("$\\boxed{\\text{(C) } \\frac{3}{4}}$", "\\frac{3}{4}", true),
        ("The answer is $\\boxed{\\mathrm{(A)}\\ 2\\sqrt{2}}$.", "2\\sqrt{2}", true),
        ("\\boxed{\\textbf{(C)}\\ 12}", "13", false),
        ("\\boxed{\\textbf{(C)}\\ 12}", "C", true),
        ("\\boxed{\\textbf{(C)}\\ 12}", "\\text{(D)}", false),
        ("\\boxed{(B)}", "6", false),
        ("\\boxed{\\textbf{(B)}\\ 2+4}", "6", false),
    ] {
        let v = verify(answer, gold, &d);
        assert_eq!(v.correct, want, "{answer} against {gold}: {v}");
    }
}

/// `refuse_undone_arithmetic` (on by default): a computation is not an
/// answer when the gold is a number, but every way of writing one number is.
#[test]
fn undone_arithmetic_is_refused_by_default() {
    let d = VerifyConfig::default();
    assert!(d.refuse_undone_arithmetic);
    for (hack, gold) in [
        ("17 \\times 23", "391"),
        ("\\frac{1}{2} + \\frac{1}{3}", "\\frac{5}{6}"),
        ("92 + 35", "127"),
        ("\\sqrt{49}", "7"),
        ("5!", "120"),
        ("\\log_2 8", "3"),
        ("2 \\cdot 3", "6"),
        ("\\left(6-1\\right)", "5"),
        ("\\dfrac{3}{4} \\div 3", "\\frac{1}{4}"),
        ("17\\ast23", "391"),
        ("17(23)", "391"),
        ("(17)(23)", "391"),
        ("\\cos 0", "1"),
    ] {
        let v = is_equivalent(hack, gold, &d);
        assert!(!v.correct, "{hack} against {gold}: {v}");
        assert!(matches!(&v.reason, Reason::Mismatch(m) if m.contains("arithmetic left undone")), "{hack}: {v}");
        assert!(is_equivalent(hack, gold, &cfg()).correct, "{hack} evaluates to {gold} with the switch off");
    }
    for (ok, gold) in [
        ("\\frac{28}{6}", "\\frac{14}{3}"),
        ("4\\frac{2}{3}", "\\frac{14}{3}"),
        ("\\frac{-3}{4}", "-0.75"),
        ("-\\frac{3}{4}", "-0.75"),
        ("(-3)", "-3"),
        ("-(1/2)", "-\\frac{1}{2}"),
        ("-\\left(\\frac{1}{2}\\right)", "-0.5"),
        ("(((7)))", "7"),
        ("10^{6}", "1000000"),
        ("2^{10}", "1024"),
        ("-2^{3}", "-8"),
        ("1.5 \\times 10^{3}", "1500"),
        ("28/6", "\\frac{14}{3}"),
        ("x = 10 - 3 = 7", "7"),
        ("391", "391"),
        ("\\frac{1}{4}", "25\\%"),
    ] {
        let v = is_equivalent(ok, gold, &d);
        assert!(v.correct, "{ok} against {gold}: {v}");
    }
    // Golds that are not one number keep full equivalence.
    for (ok, gold) in [("2^{10}", "2^{10}"), ("\\sqrt{8}", "2\\sqrt{2}"), ("\\frac{\\pi}{2}", "\\pi/2")] {
        let v = is_equivalent(ok, gold, &d);
        assert!(v.correct, "{ok} against {gold}: {v}");
    }
}

/// `require_literal_answer`: restating the question is not an answer when
/// the gold answer is a number; math equivalence still applies otherwise.
#[test]
fn literal_answers_when_required() {
    let strict = VerifyConfig { require_literal_answer: true, ..cfg() };
    // Without the switch the expression evaluates to the gold value.
    assert!(is_equivalent("92 + 35", "127", &cfg()).correct);
    for hack in ["92 + 35", "92+35", "\\frac{254}{2}", "127 \\cdot 1", "130 - 3"] {
        let v = is_equivalent(hack, "127", &strict);
        assert!(!v.correct, "{hack}: {v:?}");
    }
    for ok in ["127", " 127 ", "$127$", "127.", "+127", "127.0", "\\boxed{127}"] {
        let v = verify(ok, "127", &strict);
        assert!(v.correct, "{ok}: {v:?}");
    }
    assert!(verify("-5", "-5", &strict).correct);
    assert!(verify("Answer: 3.50", "3.5", &strict).correct);
    // A gold that is not a plain number keeps full equivalence; a plain
    // number gold wants a plain number.
    assert!(is_equivalent("0.5", "\\frac{1}{2}", &strict).correct);
    // A fraction in lowest terms is a number written plainly; an unreduced
    // one is arithmetic left undone.
    assert!(is_equivalent("\\frac{1}{2}", "0.5", &strict).correct);
    assert!(!is_equivalent("\\frac{2}{4}", "0.5", &strict).correct);
    assert!(is_equivalent("1.5e3", "1500", &strict).correct);
    assert!(is_equivalent("x^{2}", "x^2", &strict).correct);
}

/// "The answer is …" phrases give the answer when it is one, and leave prose
/// to the later fallbacks.
#[test]
fn answer_phrases_take_answers_not_prose() {
    let c = cfg();
    assert_eq!(extract_answer("So the answer is $12$ apples.", &c).as_deref(), Some("12"));
    assert_eq!(
        extract_answer("Final Answer: The final answer is $100$. I hope it is correct.", &c).as_deref(),
        Some("100")
    );
    assert_eq!(extract_answer("Hence the answer is no.", &c).as_deref(), Some("no"));
    assert_eq!(extract_answer("#### 72", &c).as_deref(), Some("72"));
    let prose = "The answer is determined by the equation itself. It is simply 78.";
    assert_eq!(extract_answer(prose, &c).as_deref(), Some("78"));
}
