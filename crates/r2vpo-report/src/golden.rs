//! Golden files for tests that pin a run's output bit for bit (the trainers'
//! `seeded_runs_are_unchanged_bit_for_bit`): one comparison, one way to
//! re-record.

use std::path::Path;

/// Compares `got` with the golden file at `path`, panicking with the first
/// differing line. With `R2VPO_BLESS` set in the environment it writes `got`
/// there instead: do that only when the pinned arithmetic is meant to
/// change (say why in the commit), never to make a refactor pass.
pub fn assert_golden(path: &Path, got: &str) {
    if std::env::var_os("R2VPO_BLESS").is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (record it with R2VPO_BLESS=1)", path.display()));
    if let Some((i, (w, g))) = want.lines().zip(got.lines()).enumerate().find(|(_, (w, g))| w != g) {
        panic!("{} differs at line {}:\n  golden: {w}\n  now:    {g}", path.display(), i + 1);
    }
    assert_eq!(want.lines().count(), got.lines().count(), "{}: different length", path.display());
}

/// Says what a check compared and how: on standard error, and appended as
/// a line to `dir/check-report.txt` (tests pass `CARGO_TARGET_TMPDIR`), which
/// `make test` prints above its totals, so that a pin compared on another
/// path, or not compared at all, is seen even when the test passes and
/// cargo hides its output.
pub fn report(dir: &Path, line: &str) {
    use std::io::Write;
    eprintln!("{line}");
    let _ = std::fs::create_dir_all(dir);
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("check-report.txt")) {
        let _ = writeln!(f, "{line}");
    }
}

/// [`assert_golden`] for a pinned run that holds bit for bit only where
/// `caveat` is `None`: elsewhere (unless re-recording) it is not compared,
/// and the reason is reported instead. Either way the outcome is a line of
/// [`report`] into `dir`, naming `what` ran.
pub fn assert_pinned(dir: &Path, path: &Path, got: &str, what: &str, caveat: Option<&str>) {
    match caveat {
        Some(why) if std::env::var_os("R2VPO_BLESS").is_none() => {
            report(dir, &format!("pin: ran {what}; NOT compared with {}: {why}", path.display()))
        }
        _ => {
            assert_golden(path, got);
            report(dir, &format!("pin: {what} equal {} bit for bit", path.display()));
        }
    }
}
