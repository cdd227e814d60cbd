//! Parquet and verl-schema datasets, on the committed fixtures in
//! `tests/data/` (made by `scripts/parquet_fixture.py` with pyarrow; no
//! Python needed here).

use std::path::{Path, PathBuf};
use std::time::Instant;

use r2vpo_llm::data::{
    load_jsonl_with, load_parquet, load_problems, DataConfig, DataError, DataSchema, Position, Problem, PromptTemplate,
    RecordLayout,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("data").join(name)
}

fn flat() -> RecordLayout {
    RecordLayout::flat("question", "answer", Some("subject"))
}

const Q0: &str = "In triangle $ABC$, $AB = 13$, $BC = 14$ and $CA = 15$. Find the area of triangle $ABC$.";

fn verl_expected() -> Vec<Problem> {
    let dapo = |q: &str| PromptTemplate::Dapo.render(q);
    let p = |id: &str, question: String, answer: &str, source: &str| Problem {
        id: id.into(),
        question,
        answer: answer.into(),
        source: source.into(),
    };
    vec![
        p("a1f3c2d4-0000-4000-8000-000000000001", dapo(Q0), "84", "math_dapo"),
        // The system message is skipped.
        p(
            "a1f3c2d4-0000-4000-8000-000000000002",
            dapo("How many positive divisors does $2^{4} \\cdot 3^{2}$ have?"),
            "15",
            "math_dapo",
        ),
        p(
            "a1f3c2d4-0000-4000-8000-000000000003",
            dapo("Функция $f(x) = x^2 - 2x$ задана на ℝ. Найдите её минимум (数学, ≤, π, café)."),
            "-1",
            "math_dapo",
        ),
        p("a1f3c2d4-0000-4000-8000-000000000004", dapo(Q0), "84", "math_dapo"),
        // Multi-turn: the last user message is the question.
        p(
            "a1f3c2d4-0000-4000-8000-000000000005",
            dapo("Compute $\\dfrac{1}{2} + \\dfrac{1}{3}$."),
            "\\frac{5}{6}",
            "aime",
        ),
        // extra_info is null: the id falls back to file stem and 1-based row.
        p("verl:6", dapo("What is $7 \\times 8$?"), "56", "aime"),
    ]
}

#[test]
fn verl_parquet_fields() {
    let got = load_parquet(&fixture("verl.parquet"), &RecordLayout::Verl).unwrap();
    assert_eq!(got, verl_expected());
    // verl prompts arrive templated: only the plain template leaves them as
    // the dataset meant them.
    assert_eq!(PromptTemplate::Plain.render(&got[0].question), got[0].question);
    assert!(got[0].question.starts_with("Solve the following math problem step by step."));
}

#[test]
fn verl_jsonl_gives_the_same_problems_as_verl_parquet() {
    let jsonl = load_jsonl_with(&fixture("verl.jsonl"), &RecordLayout::Verl).unwrap();
    let parquet = load_parquet(&fixture("verl.parquet"), &RecordLayout::Verl).unwrap();
    assert_eq!(jsonl, parquet);
    for name in ["verl.jsonl", "verl.parquet"] {
        let cfg =
            DataConfig { path: fixture(name).display().to_string(), schema: DataSchema::Verl, ..Default::default() };
        assert_eq!(load_problems(&cfg).unwrap().len(), 5, "{name}");
    }
}

#[test]
fn verl_dedupe_and_limit_through_config() {
    let cfg = DataConfig {
        path: fixture("verl.parquet").display().to_string(),
        schema: DataSchema::Verl,
        ..Default::default()
    };
    let kept = load_problems(&cfg).unwrap();
    let mut expected = verl_expected();
    expected.remove(3); // the repeated triangle question
    assert_eq!(kept, expected);
    assert_eq!(load_problems(&DataConfig { dedupe: false, ..cfg.clone() }).unwrap(), verl_expected());
    let first4 = load_problems(&DataConfig { limit: Some(4), ..cfg.clone() }).unwrap();
    assert_eq!(first4.last().unwrap().source, "aime", "the limit counts kept (distinct) problems");
    assert_eq!(first4.len(), 4);
}

#[test]
fn flat_parquet_fields_and_dedupe() {
    let got = load_parquet(&fixture("flat.parquet"), &flat()).unwrap();
    let rows: Vec<_> =
        got.iter().map(|p| (p.id.as_str(), p.question.as_str(), p.answer.as_str(), p.source.as_str())).collect();
    assert_eq!(
        rows,
        [
            ("flat:1", "What is 12 * 12?", "144", "arithmetic"),
            ("flat:2", "Ile to jest 2 + 2? Zażółć gęślą jaźń — ∑ 🙂", "4", "unicode"),
            ("flat:3", "  WHAT is 12 *   12?  ", "144", "arithmetic"),
            ("flat:4", "Solve x + 3 = 10 for x.", "7", "algebra"),
        ]
    );
    // Without a source column the file stem is the source; a double column
    // is accepted where a number is expected.
    let stem = load_parquet(&fixture("flat.parquet"), &RecordLayout::flat("question", "difficulty", None)).unwrap();
    assert_eq!(stem.iter().map(|p| p.answer.as_str()).collect::<Vec<_>>(), ["1.0", "0.5", "1.0", "2.25"]);
    assert!(stem.iter().all(|p| p.source == "flat"));

    let cfg = DataConfig {
        path: fixture("flat.parquet").display().to_string(),
        source_key: Some("subject".into()),
        ..Default::default()
    };
    let kept = load_problems(&cfg).unwrap();
    assert_eq!(kept.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["flat:1", "flat:2", "flat:4"]);
}

#[test]
fn codecs() {
    let snappy = load_parquet(&fixture("flat.parquet"), &flat()).unwrap();
    for codec in ["gzip", "lz4"] {
        let path = fixture(&format!("flat_{codec}.parquet"));
        let got = load_parquet(&path, &flat()).unwrap();
        assert_eq!(got.len(), snappy.len());
        for (a, b) in got.iter().zip(&snappy) {
            assert_eq!((&a.question, &a.answer, &a.source), (&b.question, &b.answer, &b.source), "{codec}");
        }
    }
    let zstd = load_parquet(&fixture("flat_zstd.parquet"), &flat());
    if cfg!(feature = "parquet-zstd") {
        assert_eq!(zstd.unwrap().len(), snappy.len());
    } else {
        let err = zstd.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(&err, DataError::UnsupportedCodec { codec, .. } if codec == "ZSTD"), "{msg}");
        assert!(msg.contains("flat_zstd.parquet") && msg.contains("parquet-zstd") && msg.contains("snappy"), "{msg}");
    }
    let err = load_parquet(&fixture("flat_brotli.parquet"), &flat()).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, DataError::UnsupportedCodec { codec, column, .. } if codec == "BROTLI" && column == "question")
    );
    assert!(msg.contains("flat_brotli.parquet") && msg.contains("snappy"), "{msg}");
}

#[test]
fn missing_columns_name_file_and_column() {
    let path = fixture("flat.parquet");
    let err = load_parquet(&path, &RecordLayout::flat("problem", "answer", None)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(&err, DataError::MissingColumn { column, .. } if column == "problem"), "{msg}");
    assert!(msg.contains("flat.parquet") && msg.contains("question, answer, subject"), "{msg}");

    let err = load_parquet(&path, &RecordLayout::Verl).unwrap_err();
    assert!(matches!(&err, DataError::MissingColumn { column, .. } if column == "prompt"), "{err}");

    // A missing extra_info column is fine (ids fall back to file:row) — but
    // the rest of the verl layout must be there.
    let err = load_parquet(&fixture("verl_prompt_string.parquet"), &flat()).unwrap_err();
    assert!(matches!(&err, DataError::MissingColumn { column, .. } if column == "question"), "{err}");
}

#[test]
fn bad_values_name_file_row_and_field() {
    // A list column where an answer is expected.
    let err = load_parquet(&fixture("flat.parquet"), &RecordLayout::flat("question", "tags", None)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, DataError::BadValue { at: Position::Row(1), key, found, .. } if key == "tags" && found == "an array"),
        "{msg}"
    );
    assert!(msg.contains("flat.parquet: row 1: field `tags` must be a string or a number, found an array"), "{msg}");

    // A null in the third row.
    let err = load_parquet(&fixture("flat.parquet"), &RecordLayout::flat("question", "note", None)).unwrap_err();
    assert!(matches!(&err, DataError::BadValue { at: Position::Row(3), found, .. } if found == "null"), "{err}");

    // A nested field absent from its struct.
    let path = fixture("verl_no_ground_truth.parquet");
    let err = load_parquet(&path, &RecordLayout::Verl).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, DataError::MissingKey { at: Position::Row(1), key, .. } if key == "reward_model.ground_truth"),
        "{msg}"
    );
    assert!(msg.starts_with(&format!("{}: row 1: ", path.display())), "{msg}");

    // A prompt that is a plain string rather than a chat list.
    let err = load_parquet(&fixture("verl_prompt_string.parquet"), &RecordLayout::Verl).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(&err, DataError::BadValue { at: Position::Row(1), key, .. } if key == "prompt"), "{msg}");
    assert!(msg.contains("verl_prompt_string.parquet: row 1: field `prompt` must be a list of"), "{msg}");
    assert!(msg.contains("found a string"), "{msg}");
}

#[test]
fn non_parquet_files_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("verl.parquet")).unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        ("jsonl_inside.parquet", std::fs::read(fixture("verl.jsonl")).unwrap()),
        ("empty.parquet", Vec::new()),
        ("truncated.parquet", good[..good.len() / 2].to_vec()),
        ("magic_only.parquet", b"PAR1PAR1".to_vec()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = load_parquet(&path, &RecordLayout::Verl).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::NotParquet { .. }), "{name}: {msg}");
        assert!(msg.contains(name) && msg.contains("not a readable Parquet file"), "{msg}");
        // load_problems picks the reader from the extension, and says the same.
        let cfg = DataConfig { path: path.display().to_string(), schema: DataSchema::Verl, ..Default::default() };
        assert!(matches!(load_problems(&cfg), Err(DataError::NotParquet { .. })), "{name}");
    }
    let absent = dir.path().join("absent.parquet");
    let err = load_parquet(&absent, &RecordLayout::Verl).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }) && err.to_string().contains("absent.parquet"), "{err}");
}

/// Flipping bytes anywhere in a valid file yields an error or (when the
/// damage lands in unread bytes) problems — never a panic or a hang.
#[test]
fn corrupted_bytes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("verl.parquet")).unwrap();
    let path = dir.path().join("corrupt.parquet");
    let start = Instant::now();
    let (mut errors, mut oks) = (0, 0);
    for i in (0..good.len()).step_by(7) {
        let mut bytes = good.clone();
        bytes[i] ^= 0x5a;
        std::fs::write(&path, &bytes).unwrap();
        match load_parquet(&path, &RecordLayout::Verl) {
            Ok(_) => oks += 1,
            Err(e) => {
                assert!(e.to_string().contains("corrupt.parquet"), "{e}");
                errors += 1;
            }
        }
    }
    assert!(errors > 0 && oks > 0, "errors {errors}, ok {oks}");
    assert!(start.elapsed().as_secs() < 60, "took {:?}", start.elapsed());
}

/// Load time of a large DAPO-shaped file:
/// `python3 scripts/parquet_fixture.py --bench /tmp/big.parquet 200000`, then
/// `R2VPO_PARQUET_BENCH=/tmp/big.parquet cargo test -p r2vpo-llm --test data_parquet -- --ignored --nocapture`.
#[test]
#[ignore = "needs a large file made by scripts/parquet_fixture.py --bench"]
fn bench_large_verl_file() {
    let path = std::env::var("R2VPO_PARQUET_BENCH").expect("set R2VPO_PARQUET_BENCH to a verl-schema parquet file");
    let start = Instant::now();
    let all = load_parquet(Path::new(&path), &RecordLayout::Verl).unwrap();
    let t_all = start.elapsed();
    let start = Instant::now();
    let cfg = DataConfig { path: path.clone(), schema: DataSchema::Verl, ..Default::default() };
    let distinct = load_problems(&cfg).unwrap();
    let t_dedupe = start.elapsed();
    println!(
        "{path}: {} rows in {:.2?} ({:.0} rows/s); load_problems with dedupe: {} distinct in {:.2?}",
        all.len(),
        t_all,
        all.len() as f64 / t_all.as_secs_f64(),
        distinct.len(),
        t_dedupe
    );
}
