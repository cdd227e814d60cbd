//! The lock that keeps one process per run folder
//! ([`crate::edge::open_run_folder`] takes it, [`crate::RunDir`] holds it).

use std::path::Path;

/// The lock file inside every run folder ([`RunLock`]). Hidden, and never
/// committed (`.gitignore`); [`crate::edge::open_run_folder`] does not count it as a
/// file the folder holds.
pub const LOCK_FILE: &str = ".r2vpo-lock";

/// A run folder held by one process: an advisory `flock` on
/// [`LOCK_FILE`], whose text names the holder (pid, host, start time,
/// command) for the refusal another process gets. The kernel drops a
/// `flock` when its process ends however it ends (SIGKILL, power loss on
/// a local disk), so a lock file left by a dead process is stale by
/// construction: the next command takes it. On drop the text is cleared
/// and the lock released; the file stays (unlinking it would let two
/// processes lock two different files of one name).
#[derive(Debug)]
pub struct RunLock {
    file: std::fs::File,
}

impl RunLock {
    /// Takes the lock of the folder `dir` (which exists), or says who
    /// holds it (the message of the folder's error).
    pub(crate) fn take(dir: &Path) -> Result<RunLock, String> {
        use std::io::{Read, Seek, Write};
        let path = dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("cannot open its lock file {LOCK_FILE}: {e}"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() { "another process (starting up)" } else { holder };
                return Err(format!(
                    "is in use by {holder}; two processes writing one run folder corrupt its logs and \
                     checkpoints: stop that one first (SIGTERM writes a checkpoint), or choose another --out"
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!("cannot lock {LOCK_FILE}: {e}"));
            }
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "an unnamed host".into());
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let command: Vec<String> = std::env::args().collect();
        let text = format!("pid {} on {host} (since unix time {since}): {}\n", std::process::id(), command.join(" "));
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.flush())
            .map_err(|e| format!("cannot write its lock file {LOCK_FILE}: {e}"))?;
        Ok(RunLock { file })
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        let _ = self.file.unlock();
    }
}
