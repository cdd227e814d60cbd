//! Starting the ranks of a job on this machine as torchrun does, for
//! machines without PyTorch's Python (`r2vpo launch`): each rank is a
//! process of the same binary with torchrun's variables, node 0 hosts the
//! rendezvous store as torchrun's agent does
//! (`TORCHELASTIC_USE_AGENT_STORE=True`), and a rank that fails stops the
//! others (SIGTERM, so they write a checkpoint, then SIGKILL after a
//! grace period).

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::c10d::Store;
use super::LaunchError;

/// The ranks this machine runs, and where they meet.
#[derive(Clone, Debug)]
pub struct LocalJob {
    /// Processes (ranks) on this machine: one per GPU.
    pub nproc_per_node: usize,
    /// Machines in the job.
    pub nnodes: usize,
    /// This machine's place among them (0 hosts the store).
    pub node_rank: usize,
    /// The store's host.
    pub master_addr: String,
    /// The store's port (0 on one machine: any free port).
    pub master_port: u16,
    /// How long ranks still running get to exit after one failed or a stop
    /// was asked for, before SIGKILL.
    pub grace: Duration,
    /// `RAYON_NUM_THREADS`/`OMP_NUM_THREADS` of each rank (torchrun sets 1):
    /// N ranks that each take every core would fight over them.
    pub threads: usize,
}

/// How a job's ranks on this machine ended.
#[derive(Debug)]
pub enum JobEnd {
    /// Every rank exited with status 0.
    Finished,
    /// This rank failed first (its status); the others were stopped.
    RankFailed {
        /// The global rank.
        rank: usize,
        /// Its exit status.
        status: ExitStatus,
    },
    /// A stop was asked for and passed on to every rank, none of which
    /// failed.
    Stopped,
}

impl LocalJob {
    /// Checks the layout: at least one rank and node, this node among
    /// them, and a fixed port when several machines must find the store.
    pub fn validate(&self) -> Result<(), LaunchError> {
        if self.nproc_per_node == 0 || self.nnodes == 0 {
            return Err(LaunchError("--nproc-per-node and --nnodes must be at least 1".into()));
        }
        if self.node_rank >= self.nnodes {
            return Err(LaunchError(format!("--node-rank {} is not below --nnodes {}", self.node_rank, self.nnodes)));
        }
        if self.master_port == 0 && self.nnodes > 1 {
            return Err(LaunchError(
                "--master-port 0 (any free port) works on one machine only: the other nodes must know the port".into(),
            ));
        }
        Ok(())
    }

    /// Runs `exe args…` as this machine's ranks until all have exited.
    /// `stop_requested` is polled every 50 ms; once it (or a failed rank)
    /// says so, the ranks still running get SIGTERM, then SIGKILL after
    /// [`LocalJob::grace`].
    pub fn run(&self, exe: &Path, args: &[String], stop_requested: &dyn Fn() -> bool) -> Result<JobEnd, LaunchError> {
        self.validate()?;
        // Node 0 hosts the store for the whole job and keeps it until every
        // local rank has exited.
        let store = if self.node_rank == 0 {
            Some(
                Store::serve(&self.master_addr, self.master_port, None, Duration::from_secs(300))
                    .map_err(|e| LaunchError(format!("hosting the rendezvous store: {e}")))?,
            )
        } else {
            None
        };
        let port = store.as_ref().map_or(self.master_port, Store::port);
        let world = self.nnodes * self.nproc_per_node;
        let run_id = format!("r2vpo-{}-{port}", std::process::id());
        let threads = self.threads.to_string();
        let mut children: Vec<(usize, Child)> = Vec::new();
        for local in 0..self.nproc_per_node {
            let rank = self.node_rank * self.nproc_per_node + local;
            let started = Command::new(exe)
                .args(args)
                .env("RAYON_NUM_THREADS", &threads)
                .env("OMP_NUM_THREADS", &threads)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string())
                .env("GROUP_RANK", self.node_rank.to_string())
                .env("GROUP_WORLD_SIZE", self.nnodes.to_string())
                .env("MASTER_ADDR", &self.master_addr)
                .env("MASTER_PORT", port.to_string())
                .env("TORCHELASTIC_RUN_ID", &run_id)
                .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                .env("TORCHELASTIC_RESTART_COUNT", "0")
                .env("TORCHELASTIC_MAX_RESTARTS", "0")
                .spawn();
            match started {
                Ok(child) => children.push((rank, child)),
                Err(e) => {
                    signal_all(&children, libc::SIGKILL);
                    return Err(LaunchError(format!("starting rank {rank}: {}: {e}", exe.display())));
                }
            }
        }
        let mut failed: Option<(usize, ExitStatus)> = None;
        let mut deadline: Option<Instant> = None;
        let mut forwarded = false;
        let mut stopped = false;
        while !children.is_empty() {
            let mut i = 0;
            while i < children.len() {
                match children[i].1.try_wait() {
                    Ok(Some(status)) => {
                        let (rank, _) = children.remove(i);
                        if !status.success() && failed.is_none() {
                            eprintln!("r2vpo launch: rank {rank} exited with {status}; stopping the other ranks");
                            failed = Some((rank, status));
                        }
                    }
                    Ok(None) => i += 1,
                    Err(e) => {
                        signal_all(&children, libc::SIGKILL);
                        return Err(LaunchError(format!("waiting for rank {}: {e}", children[i].0)));
                    }
                }
            }
            if children.is_empty() {
                break;
            }
            stopped |= stop_requested();
            if (failed.is_some() || stopped) && !forwarded {
                signal_all(&children, libc::SIGTERM);
                forwarded = true;
                deadline = Some(Instant::now() + self.grace);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                let ranks: Vec<String> = children.iter().map(|(r, _)| r.to_string()).collect();
                eprintln!(
                    "r2vpo launch: rank(s) {} still running after {} s; killing them",
                    ranks.join(", "),
                    self.grace.as_secs()
                );
                signal_all(&children, libc::SIGKILL);
                deadline = None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(store);
        Ok(match failed {
            Some((rank, status)) => JobEnd::RankFailed { rank, status },
            None if stopped => JobEnd::Stopped,
            None => JobEnd::Finished,
        })
    }
}

/// Sends `sig` to every rank still running.
fn signal_all(children: &[(usize, Child)], sig: i32) {
    for (_, c) in children {
        // SAFETY: kill(2) on a child this process started and has not
        // reaped (a reaped one was removed from the list).
        unsafe { libc::kill(c.id() as i32, sig) };
    }
}
