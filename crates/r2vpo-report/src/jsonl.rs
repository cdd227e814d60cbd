//! Reading `*.jsonl` logs back, and cutting them to a checkpoint on resume.
//! One home for what the plots, summaries and resumes of every trainer need.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::io::{atomic_write_string, ReportError};

/// Every record of a JSONL log (blank lines skipped). A missing file has no
/// records; a line that does not parse is an error naming the file and line.
pub fn read_records<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, ReportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ReportError::Io { path: path.to_path_buf(), source }),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| ReportError::Parse { path: path.to_path_buf(), message: format!("line {}: {e}", i + 1) })
        })
        .collect()
}

/// Keeps the first `n` lines of a log, atomically (what a resumed run does
/// to drop what a killed run wrote after its last checkpoint). A missing
/// file is left missing.
pub fn truncate_lines(path: &Path, n: usize) -> Result<(), ReportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ReportError::Io { path: path.to_path_buf(), source }),
    };
    let kept: String = text.split_inclusive('\n').take(n).collect();
    if kept.len() != text.len() {
        atomic_write_string(path, &kept)?;
    }
    Ok(())
}

/// Keeps the records for which `keep` holds, atomically; lines that do not
/// parse (a torn last line of a killed run) are dropped. A missing file is
/// left missing.
pub fn retain_records(path: &Path, keep: impl Fn(&serde_json::Value) -> bool) -> Result<(), ReportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ReportError::Io { path: path.to_path_buf(), source }),
    };
    let mut kept = String::new();
    for line in text.lines() {
        if serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| keep(&v)) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    atomic_write_string(path, &kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_truncate_retain() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        assert!(read_records::<serde_json::Value>(&p).unwrap().is_empty());
        std::fs::write(&p, "{\"update\":1}\n\n{\"update\":2}\n{\"update\":3}\n{\"upd").unwrap();
        let e = read_records::<serde_json::Value>(&p).unwrap_err().to_string();
        assert!(e.contains("m.jsonl") && e.contains("line 5"), "{e}");
        retain_records(&p, |v| v["update"].as_u64().is_some_and(|u| u <= 2)).unwrap();
        let v: Vec<serde_json::Value> = read_records(&p).unwrap();
        assert_eq!(v.len(), 2);
        truncate_lines(&p, 1).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"update\":1}\n");
        truncate_lines(&dir.path().join("missing"), 3).unwrap();
        assert!(!dir.path().join("missing").exists());
    }
}
