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

/// What [`keep_complete_lines`] kept of a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// Lines kept.
    pub lines: usize,
    /// The first line (1-based) that was torn or not JSON and was cut with
    /// everything after it, if there was one within the first `n`.
    pub torn: Option<usize>,
    /// What was left of that line (its first 200 bytes), to tell whose
    /// record it was.
    pub torn_text: Option<String>,
}

impl Kept {
    /// The number after `"key":` in the torn line (a record's iteration,
    /// written first in every log here), if the cut left it whole.
    pub fn torn_field(&self, key: &str) -> Option<u64> {
        let text = self.torn_text.as_deref()?;
        let pat = format!("\"{key}\":");
        let at = text.find(&pat)? + pat.len();
        let digits: String = text[at..].trim_start().chars().take_while(char::is_ascii_digit).collect();
        // A number the cut may have shortened is no evidence.
        let rest = text[at..].trim_start()[digits.len()..].chars().next();
        if digits.is_empty() || rest.is_none() {
            return None;
        }
        digits.parse().ok()
    }
}

/// Keeps the first `n` lines of a log, atomically (what a resumed run does
/// to drop what a killed run wrote after its checkpoint), and leaves a log
/// every reader accepts: only up to the first line that
/// does not end in a newline or is not a JSON value (a write cut short by
/// a crash or power loss: the lines after a torn one were appended to it).
/// A missing file is left missing.
pub fn keep_complete_lines(path: &Path, n: usize) -> Result<Kept, ReportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Kept::default()),
        Err(source) => return Err(ReportError::Io { path: path.to_path_buf(), source }),
    };
    let mut end = 0;
    let mut kept = Kept::default();
    for line in text.split_inclusive('\n').take(n) {
        let complete = line.ends_with('\n') && serde_json::from_str::<serde_json::Value>(line).is_ok();
        if !complete {
            kept.torn = Some(kept.lines + 1);
            let mut cut = line.len().min(200);
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            kept.torn_text = Some(line[..cut].to_string());
            break;
        }
        end += line.len();
        kept.lines += 1;
    }
    if end != text.len() {
        atomic_write_string(path, &text[..end])?;
    }
    Ok(kept)
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
        keep_complete_lines(&p, 1).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"update\":1}\n");
        keep_complete_lines(&dir.path().join("missing"), 3).unwrap();
        assert!(!dir.path().join("missing").exists());
    }

    /// A torn line (no newline, or half a record) and whatever follows it
    /// go; complete lines beyond `n` go too.
    #[test]
    fn keep_complete_lines_cuts_at_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        let kept =
            |lines, torn: Option<usize>, text: Option<&str>| Kept { lines, torn, torn_text: text.map(String::from) };
        std::fs::write(&p, "{\"i\":0}\n{\"i\":1}\n{\"i\":2}\n").unwrap();
        assert_eq!(keep_complete_lines(&p, 2).unwrap(), kept(2, None, None));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"i\":0}\n{\"i\":1}\n");
        std::fs::write(&p, "{\"i\":0}\n{\"i\":1,\"re").unwrap();
        let k = keep_complete_lines(&p, 2).unwrap();
        assert_eq!(k, kept(1, Some(2), Some("{\"i\":1,\"re")));
        assert_eq!(k.torn_field("i"), Some(1), "the torn record's number, when it is whole");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"i\":0}\n");
        std::fs::write(&p, "{\"i\":0}\n{\"i\":1\n{\"i\":2}\n").unwrap();
        assert_eq!(keep_complete_lines(&p, 3).unwrap(), kept(1, Some(2), Some("{\"i\":1\n")));
        // A complete last line without its newline is torn too: the next
        // record would be appended to it.
        std::fs::write(&p, "{\"i\":0}\n{\"i\":1}").unwrap();
        assert_eq!(keep_complete_lines(&p, 2).unwrap(), kept(1, Some(2), Some("{\"i\":1}")));
        assert_eq!(keep_complete_lines(&dir.path().join("missing"), 3).unwrap(), kept(0, None, None));
        // A number the cut may have shortened ("12" of "123") is not read.
        std::fs::write(&p, "{\"i\":12").unwrap();
        assert_eq!(keep_complete_lines(&p, 1).unwrap().torn_field("i"), None);
    }
}
