//! A real `redis-server` for tests: started on a free loopback port with
//! its own data folder (append-only file on, so a restart keeps the data),
//! stopped by PID. Shared by the queue's tests and the CLI's async tests
//! (`#[path]`-included).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Redis {
    /// Starts redis-server on `port` and waits for its own "Ready" line, so
    /// a port another test's server holds is noticed (the process exits)
    /// instead of connecting to the wrong server.
    pub fn try_start(dir: &Path, port: u16) -> Option<Redis> {
        let mut child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "yes"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-server not found: run `make deps` (it installs Debian's redis-server)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.by_ref().map_while(Result::ok).any(|l| l.contains("Ready to accept connections"));
        // Keep draining its log so the server never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        if ready {
            Some(Redis { child, port })
        } else {
            let _ = child.wait();
            None
        }
    }

    pub fn start(dir: &Path, port: u16) -> Redis {
        let t0 = Instant::now();
        loop {
            if let Some(r) = Self::try_start(dir, port) {
                return r;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "redis-server did not start on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A server on some free port.
    pub fn start_anywhere(dir: &Path) -> Redis {
        (0..20).find_map(|_| Self::try_start(dir, free_port())).expect("no free port for redis-server")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// SIGTERM: Redis flushes its append-only file and exits.
    pub fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
