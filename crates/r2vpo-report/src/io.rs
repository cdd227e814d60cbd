//! Atomic writes, run folders and append-only metric logs.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Errors from writing reports; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// An I/O operation on `path` failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A value could not be serialised for `path`.
    #[error("{path}: cannot serialise: {source}")]
    Json {
        /// The file being written.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A file's contents could not be read as expected.
    #[error("{path}: {message}")]
    Parse {
        /// The file being read.
        path: PathBuf,
        /// What was wrong, with the line where it applies.
        message: String,
    },
    /// A command's output folder (`--out`) cannot be used.
    #[error("output folder {path}: {message}")]
    OutputFolder {
        /// The folder.
        path: PathBuf,
        /// Why, and the way out.
        message: String,
    },
    /// A plot could not be drawn into `path`.
    #[error("{path}: plot failed: {message}")]
    Plot {
        /// The image being written.
        path: PathBuf,
        /// What the drawing backend reported.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io { path: path.to_path_buf(), source }
}

/// Writes `bytes` to `path` atomically: a temporary sibling is written and
/// fsynced, then renamed over `path`. A crash leaves either the old file or
/// the new one, never a torn mix. Parent folders are created.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The pid keeps two processes writing the same file from sharing a temp.
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err(path))
}

/// Gives `path` the permissions a file created by this process gets
/// (`0o666` less the umask). Writers that go through a private temporary
/// file (the `safetensors` crate's `NamedTempFile`, mode `0o600`) would
/// otherwise leave weight files that a server or actor running as another
/// user cannot read from a shared folder. The umask is read from
/// `/proc/self/status` (Linux ≥ 4.7), else taken as `0o022`.
pub fn permissions_as_created(path: &Path) -> Result<(), ReportError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let umask = fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("Umask:")).and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o022);
        fs::set_permissions(path, fs::Permissions::from_mode(0o666 & !umask)).map_err(io_err(path))?;
    }
    let _ = path;
    Ok(())
}

/// [`atomic_write`] for text.
pub fn atomic_write_string(path: &Path, text: &str) -> Result<(), ReportError> {
    atomic_write(path, text.as_bytes())
}

/// [`atomic_write`] of a value as pretty JSON.
pub fn atomic_write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), ReportError> {
    let mut text =
        serde_json::to_string_pretty(value).map_err(|source| ReportError::Json { path: path.to_path_buf(), source })?;
    text.push('\n');
    atomic_write(path, text.as_bytes())
}

/// A run's output folder: resolved config, metric logs, checkpoints, plots.
/// One opened by [`crate::edge::open_run_folder`] holds the folder's lock
/// (shared by its clones) until the last clone is dropped.
#[derive(Clone, Debug)]
pub struct RunDir {
    root: PathBuf,
    lock: Option<std::sync::Arc<crate::lock::RunLock>>,
}

impl RunDir {
    /// Creates (or reuses) the folder `root`, without taking its lock.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self, ReportError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io_err(&root))?;
        Ok(Self { root, lock: None })
    }

    /// This folder, holding `lock` for as long as it (or a clone) lives.
    pub(crate) fn holding(mut self, lock: crate::lock::RunLock) -> Self {
        self.lock = Some(std::sync::Arc::new(lock));
        self
    }

    /// The folder itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `root/name`.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.root.join(name)
    }

    /// Writes the fully resolved config (TOML text) as `config.toml`.
    pub fn write_config(&self, toml_text: &str) -> Result<PathBuf, ReportError> {
        let p = self.join("config.toml");
        atomic_write_string(&p, toml_text)?;
        Ok(p)
    }

    /// Opens `metrics.jsonl` for appending.
    pub fn metrics(&self) -> Result<JsonlWriter, ReportError> {
        JsonlWriter::append(self.join("metrics.jsonl"))
    }
}

/// Append-only JSON-lines log, one record per line, flushed after each
/// record so a killed run keeps every completed step.
pub struct JsonlWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonlWriter {
    /// Opens `path` for appending, creating it and its parents.
    pub fn append(path: impl Into<PathBuf>) -> Result<Self, ReportError> {
        let path = path.into();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let f = OpenOptions::new().create(true).append(true).open(&path).map_err(io_err(&path))?;
        Ok(Self { path, out: BufWriter::new(f) })
    }

    /// Appends one record and flushes it.
    pub fn write<T: Serialize + ?Sized>(&mut self, record: &T) -> Result<(), ReportError> {
        let line =
            serde_json::to_string(record).map_err(|source| ReportError::Json { path: self.path.clone(), source })?;
        writeln!(self.out, "{line}").and_then(|_| self.out.flush()).map_err(io_err(&self.path))
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A CSV table built in memory and written atomically on [`CsvWriter::save`].
/// Fields containing commas, quotes or newlines are quoted (RFC 4180).
#[derive(Clone, Debug, Default)]
pub struct CsvWriter {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl CsvWriter {
    /// A table with the given column names.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self { header: header.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Appends a row; it must have one field per column.
    ///
    /// # Panics
    /// If the row's length differs from the header's: a programming error.
    pub fn row<S: ToString>(&mut self, fields: impl IntoIterator<Item = S>) {
        let row: Vec<String> = fields.into_iter().map(|f| f.to_string()).collect();
        assert_eq!(row.len(), self.header.len(), "CSV row has {} fields, header has {}", row.len(), self.header.len());
        self.rows.push(row);
    }

    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as CSV text.
    pub fn to_csv(&self) -> String {
        fn field(s: &str) -> String {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            out.push_str(&r.iter().map(|f| field(f)).collect::<Vec<_>>().join(","));
            out.push('\n');
        }
        out
    }

    /// Writes the table to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), ReportError> {
        atomic_write_string(path, &self.to_csv())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/out.txt");
        atomic_write_string(&p, "one").unwrap();
        atomic_write_string(&p, "two").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        let names: Vec<_> = fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "temporary files left: {names:?}");
    }

    #[test]
    fn atomic_write_failure_keeps_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keep.txt");
        atomic_write_string(&p, "old").unwrap();
        // A folder where the temp file would go makes the write fail.
        let blocker = dir.path().join(format!(".keep.txt.{}.tmp", std::process::id()));
        fs::create_dir(&blocker).unwrap();
        let err = atomic_write_string(&p, "new").unwrap_err();
        assert!(err.to_string().contains("keep.txt"), "{err}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
    }

    #[test]
    fn jsonl_appends_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path().join("run")).unwrap();
        run.metrics().unwrap().write(&serde_json::json!({"step": 1})).unwrap();
        run.metrics().unwrap().write(&serde_json::json!({"step": 2})).unwrap();
        let text = fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        assert_eq!(text, "{\"step\":1}\n{\"step\":2}\n");
    }

    #[test]
    fn csv_quotes_fields() {
        let mut c = CsvWriter::new(["a", "b"]);
        c.row(["1,5", "say \"hi\""]);
        c.row(["2", "x"]);
        assert_eq!(c.to_csv(), "a,b\n\"1,5\",\"say \"\"hi\"\"\"\n2,x\n");
    }
}
