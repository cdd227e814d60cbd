//! The verifier on the labelled fixture set, and against the ecosystem's
//! reference verifier, Hugging Face's `math-verify`.
//!
//! `tests/fixtures/cases.jsonl` holds real-looking model responses and
//! dataset gold answers, each labelled with the true judgement (would a
//! careful grader accept it?). Two rules hold on it:
//!
//! - **Never fooled**: no case labelled wrong is accepted. There is no
//!   allow-list for that.
//! - **Every other difference is written down**: a correct case r2vpo
//!   rejects (a known gap), and every case where r2vpo and math-verify
//!   disagree, is listed in `tests/fixtures/allow.toml` with r2vpo's verdict
//!   and the reason. A listed case that no longer differs fails too, so the
//!   list stays the truth.
//!
//! math-verify runs for real: `make deps` installs the pinned package into
//! `.deps/venv-math-verify` (scripts/math_verify/), and
//! `scripts/math_verify/judge.py` calls it the way Open-R1's and TRL's
//! accuracy rewards do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use r2vpo_verify::{verify, VerifyConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    id: String,
    category: String,
    response: String,
    gold: String,
    correct: bool,
}

#[derive(Deserialize)]
struct Allowed {
    id: String,
    r2vpo: bool,
    reason: String,
}

#[derive(Deserialize)]
struct AllowList {
    case: Vec<Allowed>,
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cases() -> Vec<Case> {
    let path = crate_dir().join("tests/fixtures/cases.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1)))
        .collect()
}

fn allow_list() -> BTreeMap<String, Allowed> {
    let path = crate_dir().join("tests/fixtures/allow.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let list: AllowList = toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for a in list.case {
        assert!(!a.reason.trim().is_empty(), "{}: case {} has no reason", path.display(), a.id);
        let id = a.id.clone();
        assert!(out.insert(id.clone(), a).is_none(), "{}: case {id} is listed twice", path.display());
    }
    out
}

fn ours(c: &Case) -> bool {
    verify(&c.response, &c.gold, &VerifyConfig::default()).correct
}

/// math-verify's verdicts by case id, from the pinned venv.
fn reference() -> BTreeMap<String, bool> {
    let root = crate_dir().join("../..");
    let python = root.join(".deps/venv-math-verify/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make deps` (it runs scripts/math_verify/venv.sh), which installs the pinned math-verify",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root.join("scripts/math_verify/judge.py"))
        .arg(crate_dir().join("tests/fixtures/cases.jsonl"))
        .output()
        .expect("run judge.py");
    assert!(out.status.success(), "judge.py failed: {}", String::from_utf8_lossy(&out.stderr));
    #[derive(Deserialize)]
    struct Judged {
        id: String,
        math_verify: bool,
    }
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Judged>(l).unwrap_or_else(|e| panic!("judge.py printed {l:?}: {e}")))
        .map(|j| (j.id, j.math_verify))
        .collect()
}

#[derive(Default)]
struct Tally {
    n: usize,
    label_agree: usize,
    false_pos: usize,
    false_neg: usize,
    ref_agree: usize,
    ref_label_agree: usize,
    ref_false_pos: usize,
}

#[test]
fn fixture_set_against_labels_and_math_verify() {
    let cases = cases();
    assert!(cases.len() >= 400, "the fixture set shrank to {} cases", cases.len());
    let allowed = allow_list();
    let reference = reference();

    let mut by_cat: BTreeMap<String, Tally> = BTreeMap::new();
    let (mut fooled, mut unlisted, mut stale) = (Vec::new(), Vec::new(), Vec::new());
    for c in &cases {
        let us = ours(c);
        let mv = *reference.get(&c.id).unwrap_or_else(|| panic!("judge.py gave no verdict for {}", c.id));
        let t = by_cat.entry(c.category.clone()).or_default();
        t.n += 1;
        t.label_agree += usize::from(us == c.correct);
        t.false_pos += usize::from(us && !c.correct);
        t.false_neg += usize::from(!us && c.correct);
        t.ref_agree += usize::from(us == mv);
        t.ref_label_agree += usize::from(mv == c.correct);
        t.ref_false_pos += usize::from(mv && !c.correct);

        let show = format!(
            "{} (label {}, r2vpo {us}, math-verify {mv}): {:?} vs gold {:?}",
            c.id, c.correct, c.response, c.gold
        );
        if us && !c.correct {
            fooled.push(show);
            continue;
        }
        let differs = us != c.correct || us != mv;
        match allowed.get(&c.id) {
            Some(a) if !differs => {
                stale.push(format!("{} is listed but r2vpo now agrees with the label and math-verify", a.id))
            }
            Some(a) if a.r2vpo != us => {
                stale.push(format!("{} is listed with r2vpo = {}, but r2vpo now says {us}", a.id, a.r2vpo))
            }
            Some(_) => {}
            None if differs => unlisted.push(show),
            None => {}
        }
    }
    for id in allowed.keys().filter(|id| !cases.iter().any(|c| &c.id == *id)) {
        stale.push(format!("{id} is listed but is not a case"));
    }

    let mut total = Tally::default();
    println!("| category | n | r2vpo = label | r2vpo FP | r2vpo FN | r2vpo = math-verify | math-verify = label | math-verify FP |");
    println!("|---|---|---|---|---|---|---|---|");
    for (cat, t) in &by_cat {
        println!(
            "| {cat} | {} | {} | {} | {} | {} | {} | {} |",
            t.n, t.label_agree, t.false_pos, t.false_neg, t.ref_agree, t.ref_label_agree, t.ref_false_pos
        );
        total.n += t.n;
        total.label_agree += t.label_agree;
        total.false_pos += t.false_pos;
        total.false_neg += t.false_neg;
        total.ref_agree += t.ref_agree;
        total.ref_label_agree += t.ref_label_agree;
        total.ref_false_pos += t.ref_false_pos;
    }
    let pct = |a: usize| 100.0 * a as f64 / total.n as f64;
    r2vpo_report::golden::report(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &format!(
            "verifier on {} labelled cases: r2vpo agrees with the labels on {} ({:.1} %; {} false positives, {} false negatives) \
             and with math-verify on {} ({:.1} %); math-verify agrees with the labels on {} ({:.1} %; {} false positives)",
            total.n,
            total.label_agree,
            pct(total.label_agree),
            total.false_pos,
            total.false_neg,
            total.ref_agree,
            pct(total.ref_agree),
            total.ref_label_agree,
            pct(total.ref_label_agree),
            total.ref_false_pos
        ),
    );
    let mut problems = String::new();
    for (title, list) in [
        ("accepted although labelled wrong (never allowed)", &fooled),
        ("differ from the label or math-verify and are not in tests/fixtures/allow.toml", &unlisted),
        ("stale entries of tests/fixtures/allow.toml", &stale),
    ] {
        if !list.is_empty() {
            problems += &format!("\n{} cases {title}:\n  {}", list.len(), list.join("\n  "));
        }
    }
    assert!(problems.is_empty(), "{problems}");
}
