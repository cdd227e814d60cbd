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
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "yes"]);
        Self::launch(cmd.arg("--dir").arg(dir), port)
    }

    /// Spawns `cmd` (a redis-server listening on `port`) and waits for its
    /// "Ready" line; `None` when it exited instead (the port was taken).
    fn launch(cmd: &mut Command, port: u16) -> Option<Redis> {
        let mut child = cmd
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

    /// A TLS-only server (`--port 0 --tls-port P`) on some free port, with
    /// a certificate for 127.0.0.1 signed by a CA made here; returns the
    /// server and the CA's PEM file (in `dir`).
    pub fn start_tls(dir: &Path) -> (Redis, std::path::PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "r2vpo test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let (ca_pem, cert_pem, key_pem) = (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        std::fs::write(&cert_pem, cert.pem()).unwrap();
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        let start = |port: u16| {
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--port", "0", "--tls-port", &port.to_string(), "--save", ""])
                .args(["--tls-auth-clients", "no", "--tls-cert-file"])
                .arg(&cert_pem)
                .arg("--tls-key-file")
                .arg(&key_pem)
                .arg("--tls-ca-cert-file")
                .arg(&ca_pem)
                .arg("--dir")
                .arg(dir);
            Self::launch(&mut cmd, port)
        };
        let r = (0..20).find_map(|_| start(free_port())).expect("redis-server with TLS did not start");
        (r, ca_pem)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `FLUSHALL`, as an operator types it into `redis-cli`: every key of
    /// every database goes, the server keeps running.
    pub fn flush_all(&self) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"*1\r\n$8\r\nFLUSHALL\r\n").unwrap();
        let mut reply = [0u8; 5];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+OK\r\n", "FLUSHALL failed");
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): a server that hangs without
    /// closing its connections, as behind a network partition.
    pub fn freeze(&self, frozen: bool) {
        let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: signals the server this test started.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGTERM: Redis flushes its append-only file and exits.
    pub fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // SAFETY: a stopped server is continued first, so the kill is
        // delivered at once (SIGKILL works on a stopped process anyway).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
