//! Scores a JSONL file of cases with r2vpo-verify and, where cases carry a
//! `correct` label (and a `math_verify` verdict file is given), says how the
//! verdicts compare. Also times the verifier: answers per second on one
//! thread, and the slowest case.
//!
//! ```text
//! cargo run --release -p r2vpo-verify --example score -- CASES.jsonl [MATH_VERIFY.jsonl] [--out VERDICTS.jsonl] [--literal]
//! ```
//!
//! `--literal` scores with `require_literal_answer = true`, the setting of
//! the arithmetic training configs.
//!
//! Each case is `{"id", "response", "gold", "correct"?, "category"?}`, the
//! format of `tests/fixtures/cases.jsonl`; `MATH_VERIFY.jsonl` is what
//! `scripts/math_verify/judge.py` prints for the same file.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use r2vpo_verify::{verify, VerifyConfig};
use serde_json::{json, Value};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let literal = args.iter().any(|a| a == "--literal");
    args.retain(|a| a != "--literal");
    let out_at = args.iter().position(|a| a == "--out");
    let out_path = out_at.map(|i| args.get(i + 1).expect("--out needs a path").clone());
    let files: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, _)| out_at.is_none_or(|o| *i != o && *i != o + 1))
        .map(|(_, a)| a)
        .collect();
    let Some(cases_path) = files.first() else {
        eprintln!("usage: score CASES.jsonl [MATH_VERIFY.jsonl] [--out VERDICTS.jsonl]");
        std::process::exit(2);
    };
    let read = |p: &str| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{p}:{}: {e}", i + 1)))
            .collect()
    };
    let cases = read(cases_path);
    let reference: BTreeMap<String, bool> = files
        .get(1)
        .map(|p| {
            read(p)
                .into_iter()
                .map(|v| (v["id"].as_str().unwrap().to_string(), v["math_verify"].as_bool().unwrap()))
                .collect()
        })
        .unwrap_or_default();

    let cfg = VerifyConfig { require_literal_answer: literal, ..VerifyConfig::default() };
    let mut out = out_path.as_ref().map(|p| std::io::BufWriter::new(std::fs::File::create(p).unwrap()));
    let (mut n, mut labelled, mut agree, mut fp, mut fneg, mut ref_agree, mut ref_fp, mut ref_label_agree) =
        (0, 0, 0, 0, 0, 0, 0, 0);
    let mut total = Duration::ZERO;
    let mut slowest = (Duration::ZERO, String::new());
    let mut disagreements = Vec::new();
    for c in &cases {
        let id = c["id"].as_str().unwrap_or("?").to_string();
        let (response, gold) = (c["response"].as_str().unwrap_or(""), c["gold"].as_str().unwrap_or(""));
        let t = Instant::now();
        let v = verify(response, gold, &cfg);
        let dt = t.elapsed();
        total += dt;
        if dt > slowest.0 {
            slowest = (dt, id.clone());
        }
        n += 1;
        if let Some(w) = out.as_mut() {
            writeln!(w, "{}", json!({"id": id, "r2vpo": v.correct, "reason": v.reason.to_string()})).unwrap();
        }
        let mv = reference.get(&id).copied();
        if let Some(label) = c["correct"].as_bool() {
            labelled += 1;
            agree += usize::from(v.correct == label);
            fp += usize::from(v.correct && !label);
            fneg += usize::from(!v.correct && label);
            if let Some(mv) = mv {
                ref_label_agree += usize::from(mv == label);
                ref_fp += usize::from(mv && !label);
            }
            if v.correct != label {
                disagreements.push(format!("{id} (label {label}, r2vpo {}): {}", v.correct, v.reason));
            }
        }
        if let Some(mv) = mv {
            ref_agree += usize::from(mv == v.correct);
        }
    }
    let pct = |a: usize, b: usize| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
    println!("{n} cases from {cases_path}{}", if literal { " (require_literal_answer)" } else { "" });
    if labelled > 0 {
        println!(
            "r2vpo-verify against the labels: {agree}/{labelled} ({:.1} %), {fp} false positives ({:.1} %), {fneg} false negatives",
            pct(agree, labelled),
            pct(fp, labelled)
        );
    }
    if !reference.is_empty() {
        println!("r2vpo-verify against math-verify: {ref_agree}/{n} ({:.1} %)", pct(ref_agree, n));
        if labelled > 0 {
            println!(
                "math-verify against the labels: {ref_label_agree}/{labelled} ({:.1} %), {ref_fp} false positives ({:.1} %)",
                pct(ref_label_agree, labelled),
                pct(ref_fp, labelled)
            );
        }
    }
    println!(
        "speed, one thread: {:.0} answers/s (mean {:.1} µs), slowest {} at {:.1} µs",
        n as f64 / total.as_secs_f64(),
        total.as_secs_f64() * 1e6 / n as f64,
        slowest.1,
        slowest.0.as_secs_f64() * 1e6
    );
    for d in &disagreements {
        println!("  {d}");
    }
}
