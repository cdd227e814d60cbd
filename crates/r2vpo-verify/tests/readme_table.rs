//! The verdict table in the crate's README is a claim about what the
//! verifier does; this test holds it to that, row by row, so the table
//! cannot drift from the code.

use r2vpo_verify::{verify, Equivalence, Reason, VerifyConfig};

fn config(name: &str) -> VerifyConfig {
    match name {
        "default" => VerifyConfig::default(),
        "dapo" => VerifyConfig::dapo(),
        "boxed" => VerifyConfig::boxed(),
        "minerva" => VerifyConfig { equivalence: Equivalence::MinervaExact, ..VerifyConfig::dapo() },
        "literal" => VerifyConfig { require_literal_answer: true, ..VerifyConfig::default() },
        "evaluate" => VerifyConfig { refuse_undone_arithmetic: false, ..VerifyConfig::default() },
        other => panic!("README table names an unknown config `{other}`"),
    }
}

fn reason_name(r: &Reason) -> &'static str {
    match r {
        Reason::StringMatch => "string_match",
        Reason::NumericMatch => "numeric_match",
        Reason::PercentMatch => "percent_match",
        Reason::StructuralMatch => "structural_match",
        Reason::SymbolicMatch => "symbolic_match",
        Reason::MinervaMatch => "minerva_match",
        Reason::NoAnswer => "no_answer",
        Reason::EmptyGold => "empty_gold",
        Reason::TooLong => "too_long",
        Reason::Mismatch(_) => "mismatch",
    }
}

/// The text inside a cell's backticks, with `↵` as a line break.
fn code(cell: &str) -> String {
    let cell = cell.trim();
    let inner = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'));
    inner.unwrap_or_else(|| panic!("README table cell {cell:?} is not in backticks")).replace('↵', "\n")
}

#[test]
fn every_row_of_the_readme_table_holds() {
    let readme = include_str!("../README.md");
    let mut lines = readme.lines().skip_while(|l| !l.starts_with("| Response | Gold | Config | Verdict | Reason |"));
    assert!(lines.next().is_some(), "README.md has no verdict table");
    let rows: Vec<&str> = lines.skip(1).take_while(|l| l.starts_with('|')).collect();
    assert!(rows.len() >= 30, "the verdict table shrank to {} rows", rows.len());
    let mut wrong = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
        assert_eq!(cells.len(), 5, "README table row {row:?} does not have 5 cells");
        let (response, gold, cfg) = (code(cells[0]), code(cells[1]), config(cells[2].trim()));
        let v = verify(&response, &gold, &cfg);
        let said = if v.correct { "correct" } else { "incorrect" };
        if said != cells[3].trim() || reason_name(&v.reason) != cells[4].trim() {
            wrong.push(format!("{row}\n    verifier says: {said}, {}", v.reason));
        }
    }
    assert!(wrong.is_empty(), "README verdict rows that do not hold:\n{}", wrong.join("\n"));
}

/// The crate's promise to be usable without the model stack: nothing in its
/// normal dependency tree is candle, a tokenizer or another r2vpo crate.
#[test]
fn dependency_tree_holds_no_model_stack() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "r2vpo-verify", "-e", "normal", "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(crates.first(), Some(&"r2vpo-verify"), "cargo tree printed {tree}");
    let banned: Vec<&&str> = crates
        .iter()
        .filter(|c| {
            c.starts_with("candle") || c.starts_with("tokenizers") || c.starts_with("r2vpo-") && **c != "r2vpo-verify"
        })
        .collect();
    assert!(banned.is_empty(), "r2vpo-verify depends on {banned:?}:\n{tree}");
}
