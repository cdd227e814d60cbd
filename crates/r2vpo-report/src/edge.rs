//! The run loop's edge, shared by every trainer: the run folder's overwrite
//! rule, the console (a progress bar on a terminal, plain lines otherwise),
//! and stop signals with their exit codes. The trainers stay free of
//! terminals and signals; the CLI wires these around them.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::io::{ReportError, RunDir};
use crate::lock::{RunLock, LOCK_FILE};

/// What a command does with an `--out` folder that already holds files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Refuse, naming the folder and the ways out (the default of every command).
    Refuse,
    /// Delete what is there first (`--overwrite`).
    Overwrite,
    /// Keep it: the command continues the run inside (`--resume`).
    Resume,
}

/// Creates (or, per `existing`, reuses or empties) the run folder `path`
/// and takes its lock ([`RunLock`], held by the returned [`RunDir`]): a
/// folder another live process holds is refused, naming that process,
/// before anything in it is touched, also for `--overwrite` and
/// `--resume`. Call it only after the command's config has validated, so
/// a rejected command leaves no empty folder behind.
pub fn open_run_folder(path: &Path, existing: Existing) -> Result<RunDir, ReportError> {
    let folder = |message: String| ReportError::OutputFolder { path: path.to_path_buf(), message };
    if path.exists() && !path.is_dir() {
        return Err(folder("exists and is not a folder".into()));
    }
    let holds_files =
        std::fs::read_dir(path).is_ok_and(|d| d.flatten().any(|e| e.file_name() != std::ffi::OsStr::new(LOCK_FILE)));
    // The folder's current holder is asked first: even `--overwrite` may
    // not delete the files of a run that is still writing them.
    let take =
        |p: &Path| RunLock::take(p).map_err(|message| ReportError::OutputFolder { path: p.to_path_buf(), message });
    let held = if path.is_dir() { Some(take(path)?) } else { None };
    if holds_files {
        match existing {
            Existing::Refuse => {
                return Err(folder(
                    "already holds files; choose another --out, pass --overwrite to replace them, or --resume \
                     the run there (where the command has it)"
                        .into(),
                ))
            }
            Existing::Overwrite => {
                // Everything but the lock file, which stays locked: a
                // process starting meanwhile is refused.
                for entry in std::fs::read_dir(path).map_err(|e| folder(format!("cannot empty it: {e}")))?.flatten() {
                    if entry.file_name() == std::ffi::OsStr::new(LOCK_FILE) {
                        continue;
                    }
                    let p = entry.path();
                    let removed = if p.is_dir() && !p.is_symlink() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                    removed.map_err(|e| folder(format!("cannot empty it ({}): {e}", p.display())))?;
                }
            }
            Existing::Resume => {}
        }
    }
    let run = RunDir::create(path).map_err(|e| match e {
        ReportError::Io { source, .. } => folder(format!("cannot create it: {source}")),
        other => other,
    })?;
    let lock = match held {
        Some(l) => l,
        None => take(path)?,
    };
    Ok(run.holding(lock))
}

/// Which signal asked the run to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (`kill`, SLURM's time limit, a container stop).
    Terminate,
}

impl StopSignal {
    /// The shell's convention, 128 + the signal number: 130 for SIGINT, 143
    /// for SIGTERM, so scripts can tell a stopped run from a finished one.
    pub fn exit_code(self) -> u8 {
        match self {
            StopSignal::Interrupt => 130,
            StopSignal::Terminate => 143,
        }
    }
}

/// SIGINT/SIGTERM turned into a flag that a run loop polls between steps, so
/// it can write a checkpoint and exit with [`StopSignal::exit_code`]. A
/// second signal exits at once with that code; the last complete checkpoint
/// is untouched because every checkpoint is written atomically.
#[derive(Clone, Debug)]
pub struct Stop {
    any: Arc<AtomicBool>,
    which: Arc<AtomicUsize>,
}

impl Stop {
    /// A flag that no signal sets (library use, tests).
    pub fn never() -> Stop {
        Stop { any: Arc::new(AtomicBool::new(false)), which: Arc::new(AtomicUsize::new(0)) }
    }

    /// Installs the SIGINT and SIGTERM handlers (signal-hook: the handler
    /// only stores into atomics, which is async-signal-safe).
    /// Installed once per process: later calls return the same flag, so a
    /// command that trains many runs in turn registers the handlers once.
    pub fn install() -> std::io::Result<Stop> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        static INSTALLED: std::sync::Mutex<Option<Stop>> = std::sync::Mutex::new(None);
        let mut slot = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let stop = Stop::never();
        for (sig, code) in [(SIGINT, 130), (SIGTERM, 143)] {
            // The shutdown must be registered first: it fires only once the
            // flag below was set by an earlier signal.
            signal_hook::flag::register_conditional_shutdown(sig, code, Arc::clone(&stop.any))?;
            signal_hook::flag::register_usize(sig, Arc::clone(&stop.which), sig as usize)?;
            signal_hook::flag::register(sig, Arc::clone(&stop.any))?;
        }
        *slot = Some(stop.clone());
        Ok(stop)
    }

    /// The flag itself, for loops that take an `&AtomicBool`.
    pub fn flag(&self) -> &AtomicBool {
        &self.any
    }

    /// The flag, shared, for a value that outlives this borrow (a channel
    /// that must stop waiting when a signal arrives).
    pub fn shared(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.any)
    }

    /// The signal that asked to stop, if one did.
    pub fn requested(&self) -> Option<StopSignal> {
        if !self.any.load(Ordering::SeqCst) {
            return None;
        }
        Some(if self.which.load(Ordering::SeqCst) == signal_hook::consts::SIGTERM as usize {
            StopSignal::Terminate
        } else {
            StopSignal::Interrupt
        })
    }

    /// Raises the flag as if `signal` had arrived (tests, and a caller that
    /// must stop for its own reasons).
    pub fn raise(&self, signal: StopSignal) {
        let n = match signal {
            StopSignal::Interrupt => signal_hook::consts::SIGINT,
            StopSignal::Terminate => signal_hook::consts::SIGTERM,
        };
        self.which.store(n as usize, Ordering::SeqCst);
        self.any.store(true, Ordering::SeqCst);
    }
}

/// Progress of a long command: an indicatif bar when stderr is a terminal;
/// otherwise (nohup, SLURM, a pipe) one plain line per update, at most one
/// per `min_interval` but always the last, so log files show progress as it
/// happens. `quiet` shows nothing.
pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    total: u64,
    unit: &'static str,
    start: Instant,
    start_pos: Option<u64>,
    last_line: Option<Instant>,
    min_interval: Duration,
}

impl Progress {
    /// Progress over `total` `unit`s (e.g. "iterations", "env steps").
    pub fn new(total: u64, unit: &'static str, quiet: bool, min_interval: Duration) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (!quiet && terminal).then(|| {
            ProgressBar::new(total).with_style(
                ProgressStyle::with_template(&format!(
                    "{{bar:30}} {{human_pos}}/{{human_len}} {unit}  {{msg}}  [{{elapsed}} < {{eta}}]"
                ))
                .expect("static template"),
            )
        });
        Progress {
            bar,
            plain: !quiet && !terminal,
            total,
            unit,
            start: Instant::now(),
            start_pos: None,
            last_line: None,
            min_interval,
        }
    }

    /// Starts the count at `pos` (a resumed run), so rates and the ETA
    /// cover only this process's work. Without it the first update's
    /// position is taken, and the first plain line has no ETA.
    pub fn starting_at(mut self, pos: u64) -> Progress {
        self.start_pos = Some(pos);
        if let Some(b) = &self.bar {
            b.set_position(pos);
            b.reset_eta();
        }
        self
    }

    /// Moves to `pos` with a status message (`reward 0.41  λ 0.012 …`).
    pub fn update(&mut self, pos: u64, msg: &str) {
        let first = *self.start_pos.get_or_insert(pos);
        if let Some(b) = &self.bar {
            if b.position() == 0 && pos > 0 {
                b.reset_eta();
            }
            b.set_position(pos);
            b.set_message(msg.to_string());
        }
        if self.plain {
            let now = Instant::now();
            let due = self.last_line.is_none_or(|t| now.duration_since(t) >= self.min_interval) || pos >= self.total;
            if due {
                self.last_line = Some(now);
                eprintln!("{}", self.plain_line(pos, first, msg, now));
            }
        }
    }

    fn plain_line(&self, pos: u64, first: u64, msg: &str, now: Instant) -> String {
        let elapsed = now.duration_since(self.start).as_secs_f64();
        let done = pos.saturating_sub(first) as f64;
        let eta = if done > 0.0 { hms(elapsed / done * self.total.saturating_sub(pos) as f64) } else { "-".into() };
        format!("{} {pos}/{}  {msg}  elapsed {}  eta {eta}", self.unit, self.total, hms(elapsed))
    }

    /// Shows a passing status (a phase) at `pos` on the bar only: plain
    /// logs get one line per [`Progress::update`], not per phase.
    pub fn status(&self, pos: u64, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_position(pos);
            b.set_message(msg.to_string());
        }
    }

    /// Prints a line without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// A line printer for other threads and callbacks ([`Progress::println`]
    /// that owns what it needs).
    pub fn printer(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let bar = self.bar.clone();
        move |line| match &bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// `1h02m03s`-style duration.
fn hms(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuse_overwrite_resume() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        open_run_folder(&out, Existing::Refuse).unwrap();
        std::fs::write(out.join("metrics.jsonl"), "{}\n").unwrap();
        let e = open_run_folder(&out, Existing::Refuse).unwrap_err().to_string();
        assert!(e.starts_with("output folder") && e.contains("--overwrite"), "{e}");
        let e = open_run_folder(&out.join("metrics.jsonl").join("x"), Existing::Refuse).unwrap_err().to_string();
        assert!(e.starts_with("output folder") && e.contains("cannot create it"), "{e}");
        open_run_folder(&out, Existing::Resume).unwrap();
        assert!(out.join("metrics.jsonl").exists());
        open_run_folder(&out, Existing::Overwrite).unwrap();
        assert!(out.exists() && !out.join("metrics.jsonl").exists());
    }

    /// One process at a time: a held folder is refused for a fresh run,
    /// `--overwrite` and `--resume` alike, naming the holder, and nothing
    /// in it is deleted; once the holder is gone the folder opens again.
    #[test]
    fn a_held_run_folder_is_refused_naming_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let first = open_run_folder(&out, Existing::Refuse).unwrap();
        std::fs::write(out.join("metrics.jsonl"), "{}\n").unwrap();
        for existing in [Existing::Refuse, Existing::Overwrite, Existing::Resume] {
            let e = open_run_folder(&out, existing).unwrap_err().to_string();
            assert!(e.contains("is in use by pid") && e.contains(&std::process::id().to_string()), "{e}");
        }
        assert!(out.join("metrics.jsonl").exists(), "a refused --overwrite deleted the running run's files");
        let clone = first.clone();
        drop(first);
        assert!(open_run_folder(&out, Existing::Resume).is_err(), "a clone still holds the folder");
        drop(clone);
        assert_eq!(std::fs::read_to_string(out.join(LOCK_FILE)).unwrap(), "", "the holder's name outlived it");
        let again = open_run_folder(&out, Existing::Resume).unwrap();
        assert!(out.join("metrics.jsonl").exists());
        drop(again);
        // A folder holding only a (stale) lock file counts as empty.
        std::fs::remove_file(out.join("metrics.jsonl")).unwrap();
        open_run_folder(&out, Existing::Refuse).unwrap();
    }

    #[test]
    fn stop_reports_the_signal_and_its_exit_code() {
        let s = Stop::never();
        assert_eq!(s.requested(), None);
        s.raise(StopSignal::Terminate);
        assert_eq!(s.requested().map(StopSignal::exit_code), Some(143));
        let s = Stop::never();
        s.raise(StopSignal::Interrupt);
        assert_eq!(s.requested().map(StopSignal::exit_code), Some(130));
    }

    #[test]
    fn plain_lines_say_position_rate_and_eta() {
        let p = Progress::new(100, "iterations", false, Duration::ZERO);
        let line = p.plain_line(50, 0, "reward 0.5", p.start + Duration::from_secs(10));
        assert_eq!(line, "iterations 50/100  reward 0.5  elapsed 10s  eta 10s");
        assert_eq!(hms(3723.0), "1h02m03s");
        // A fresh run's first line already has an ETA.
        let p = Progress::new(10, "iterations", false, Duration::ZERO).starting_at(0);
        let line = p.plain_line(1, p.start_pos.unwrap(), "x", p.start + Duration::from_secs(2));
        assert!(line.ends_with("eta 18s"), "{line}");
    }
}
