//! Distributed jobs through the binary, as real processes on loopback:
//! `r2vpo launch` (hosting torchrun's agent store), ranks started by hand
//! with torchrun's variables (rank 0 hosting the store), and the failures
//! a user meets — ranks that disagree, bad variables, an unreachable store,
//! a rank that dies or hangs — each ending every rank with a named error
//! within the timeout.
#![cfg(feature = "torch")]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn r2vpo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_r2vpo"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Its exit status (a signal shows there), stdout and stderr.
fn text(o: &Output) -> String {
    format!("[{}] ", o.status) + &String::from_utf8_lossy(&o.stdout) + &String::from_utf8_lossy(&o.stderr)
}

/// Rank `rank` of `world` with torchrun's variables, rank 0 hosting the
/// store on `port`.
fn rank(rank: usize, world: usize, port: u16, args: &[&str]) -> Child {
    r2vpo()
        .args(["dist", "check"])
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `c` up to `limit`, killing it past that (the test then fails).
fn finish(c: Child, limit: Duration) -> (Output, Duration) {
    let t0 = Instant::now();
    let pid = c.id() as i32;
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        // Kills only a child not yet reaped: once it has exited, its pid may
        // belong to another process.
        if wait.recv_timeout(limit).is_err() {
            // SAFETY: kill(2) on the child, still running (not reaped).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = c.wait_with_output();
    let _ = done.send(());
    let _ = watchdog.join();
    let out = out.unwrap();
    let took = t0.elapsed();
    assert!(took < limit, "still running after {limit:?}: {}", text(&out));
    (out, took)
}

/// `r2vpo launch` starts three ranks that rendezvous through the store it
/// hosts (torchrun's agent store), agree, and get every collective right.
#[test]
fn launch_runs_three_ranks_that_check_their_collectives() {
    let c = r2vpo()
        .args(["launch", "--nproc-per-node", "3", "--master-port", "0", "--", "dist", "check", "--numel", "3000"])
        .args(["--iters", "2"])
        // No thread count chosen (the Makefile exports one).
        .env_remove("RAYON_NUM_THREADS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, _) = finish(c, Duration::from_secs(120));
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("dist check: 3 ranks (3 per node, Torchrun)")
            && log.contains("| reduce-scatter |")
            && log.contains("| reduce |"),
        "{log}"
    );
    // Unless a count is chosen, the ranks split the cores (as torchrun's
    // OMP_NUM_THREADS=1 keeps N ranks from fighting over them).
    assert!(log.contains("thread(s) per rank"), "{log}");
}

/// Buffers longer than 2^24 elements (where f32 stops counting exactly)
/// are checked element for element too: the check's own expected values
/// once went wrong there.
#[test]
fn collectives_past_two_to_the_24_elements() {
    let c = r2vpo()
        .args(["launch", "--nproc-per-node", "2", "--master-port", "0", "--", "dist", "check"])
        .args(["--numel", &((1usize << 24) + 2048).to_string(), "--iters", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, _) = finish(c, Duration::from_secs(180));
    assert!(out.status.success(), "{}", text(&out));
}

/// Ranks started by hand (rank 0 hosts the store) form a job too; ranks
/// whose arguments differ are refused on every rank, naming the one that
/// differs.
#[test]
fn hand_started_ranks_join_and_disagreeing_ranks_are_refused() {
    let port = free_port();
    let ranks: Vec<_> = (0..2).map(|r| rank(r, 2, port, &["--numel", "100", "--iters", "1"])).collect();
    for c in ranks {
        let (out, _) = finish(c, Duration::from_secs(120));
        assert!(out.status.success(), "{}", text(&out));
    }
    let port = free_port();
    let ranks = [rank(0, 2, port, &["--iters", "1"]), rank(1, 2, port, &["--iters", "2"])];
    for c in ranks {
        let (out, _) = finish(c, Duration::from_secs(120));
        let log = text(&out);
        assert!(!out.status.success(), "{log}");
        assert!(log.contains("the ranks run different argument lists") && log.contains("rank 1 has"), "{log}");
    }
}

/// Inconsistent variables and an unreachable store are named, the latter
/// after the timeout rather than never.
#[test]
fn bad_variables_and_an_unreachable_store_are_named() {
    let (out, _) = finish(rank(2, 2, free_port(), &[]), Duration::from_secs(60));
    assert!(!out.status.success() && text(&out).contains("RANK 2 is not below WORLD_SIZE 2"), "{}", text(&out));
    // Rank 1 of a job whose rank 0 never comes: nothing listens there.
    let port = free_port();
    let (out, took) = finish(rank(1, 2, port, &["--timeout-secs", "3"]), Duration::from_secs(60));
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains(&format!("reaching the rendezvous store at 127.0.0.1:{port}")), "{log}");
    assert!(took >= Duration::from_secs(3), "{took:?}");
    // The clear error alone: libtorch's retry log and stack trace (about
    // 48 lines) stay behind its own switch, TORCH_CPP_LOG_LEVEL.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("[c10d]") && !stderr.contains("Exception raised from"), "{stderr}");
    assert!(stderr.lines().count() <= 3, "{stderr}");
    let verbose = r2vpo()
        .args(["dist", "check", "--timeout-secs", "3"])
        .envs([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")])
        .envs([("MASTER_ADDR", "127.0.0.1"), ("TORCH_CPP_LOG_LEVEL", "INFO")])
        .env("MASTER_PORT", port.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&verbose.stderr);
    assert!(!verbose.status.success() && stderr.contains("[c10d]"), "libtorch's log, asked for: {stderr}");
    // CUDA tensors need NCCL, which only `make build-gpu` compiles in.
    if !cfg!(feature = "nccl") {
        let (out, _) = finish(rank(0, 1, free_port(), &["--device", "cuda"]), Duration::from_secs(60));
        let log = text(&out);
        assert!(!out.status.success() && log.contains("NCCL") && log.contains("make build-gpu"), "{log}");
    }
}

/// `llm train` on the candle backend, started as one of several ranks,
/// refuses before joining or writing anything: data-parallel training runs
/// on the torch backend (`tests/llm_dist.rs` trains on it).
#[test]
fn llm_train_under_a_launcher_needs_the_torch_backend() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = r2vpo()
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["llm", "train", "--config", "configs/llm/smollm2-arith.toml", "--out", out.to_str().unwrap()])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", free_port().to_string())
        .output()
        .unwrap();
    let log = text(&o);
    assert!(!o.status.success() && log.contains("started as rank 1 of 2") && log.contains("torch backend"), "{log}");
    assert!(!out.exists());
}

/// A rank that dies in the middle of the job ends the other with an error
/// naming the collective, well within the timeout; one that hangs
/// (stopped) ends it once the timeout passes; `launch` reports the rank
/// that failed and stops the others.
#[test]
fn a_dead_or_hung_rank_ends_every_rank() {
    let args = ["--numel", "4096", "--iters", "100000000", "--timeout-secs", "5"];
    for signal in [libc::SIGKILL, libc::SIGSTOP] {
        let port = free_port();
        let r0 = rank(0, 2, port, &args);
        let mut r1 = rank(1, 2, port, &args);
        // Once rank 1 is past the rendezvous (a loaded machine may take
        // seconds to start it), it dies or hangs inside the collectives.
        let stderr = r1.stderr.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
        assert!(lines.any(|l| l.is_ok_and(|l| l.contains("joined; checking and timing"))), "rank 1 never joined");
        // SAFETY: kill(2) on a child of this test.
        unsafe { libc::kill(r1.id() as i32, signal) };
        let (out, took) = finish(r0, Duration::from_secs(60));
        let log = text(&out);
        assert!(!out.status.success(), "signal {signal}: {log}");
        assert!(log.contains("on rank 0 of 2"), "signal {signal}: {log}");
        assert!(took < Duration::from_secs(40), "signal {signal}: {took:?}");
        // SAFETY: as above; the stopped one must go too.
        unsafe { libc::kill(r1.id() as i32, libc::SIGKILL) };
        let _ = r1.wait_with_output();
    }
    let c = r2vpo()
        .args(["launch", "--nproc-per-node", "2", "--master-port", "0", "--grace-secs", "5", "--", "dist", "check"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", c.id(), c.id())).unwrap();
    let victim: i32 = children.split_whitespace().nth(1).expect("two ranks").parse().unwrap();
    // SAFETY: kill(2) on a rank `launch` started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let (out, _) = finish(c, Duration::from_secs(60));
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("exited with signal: 9") && log.contains("failed"), "{log}");
}
