//! `r2vpo launch` (torchrun's job for machines without PyTorch's Python)
//! and `r2vpo dist check` (are the ranks of a job wired up, and how fast
//! are their collectives).

#[cfg(feature = "torch")]
use anyhow::Context;
use anyhow::{bail, Result};
use clap::Args;

/// `r2vpo launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Processes (ranks) to start on this machine: one per GPU.
    #[arg(long)]
    pub nproc_per_node: usize,
    /// Machines in the job, each running `r2vpo launch` once.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This machine's place among them (0 hosts the rendezvous store).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// The rendezvous store's host: this machine's address on node 0, node
    /// 0's address on the others.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The rendezvous store's port (0 on a single machine: any free port).
    #[arg(long, default_value_t = 29500)]
    pub master_port: u16,
    /// Seconds the ranks still running get to exit (and write their
    /// checkpoint) after one failed or a signal arrived, before SIGKILL.
    #[arg(long, default_value_t = 30)]
    pub grace_secs: u64,
    /// The r2vpo command each rank runs, after `--` (e.g. `-- llm train
    /// --config job.toml`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// `r2vpo dist check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// f32 elements of each timed buffer.
    #[arg(long, default_value_t = 1 << 20)]
    pub numel: usize,
    /// Timed calls of each collective.
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Seconds any wait (for the store, another rank, a collective) may
    /// take before every rank stops with an error.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
    /// Where the buffers live: `cpu` (Gloo) or `cuda` (NCCL, each rank on
    /// `cuda:LOCAL_RANK`; a `make build-gpu` binary).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
}

/// The hex SHA-256 of the running binary (its first 16 digits): ranks that
/// run different builds would compute different things.
#[cfg(feature = "torch")]
pub fn binary_hash() -> Result<String> {
    use sha2::Digest;
    let exe = std::env::current_exe().context("locating the running binary")?;
    let mut h = sha2::Sha256::new();
    let mut f = std::fs::File::open(&exe).with_context(|| format!("reading {}", exe.display()))?;
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", exe.display()))?;
    Ok(format!("{:x}", h.finalize())[..16].to_string())
}

#[cfg(not(feature = "torch"))]
pub fn launch(_: &LaunchArgs) -> Result<()> {
    bail!("this r2vpo was built without the torch backend, which the distributed learner runs on: build it with `make build-torch` (or `make build-gpu`)")
}

#[cfg(not(feature = "torch"))]
pub fn check(_: &CheckArgs) -> Result<()> {
    bail!("this r2vpo was built without the torch backend, which the distributed learner runs on: build it with `make build-torch` (or `make build-gpu`)")
}

/// Starts `nproc_per_node` ranks of the command with torchrun's variables
/// and, on node 0, hosts the rendezvous store as torchrun's agent does
/// (`TORCHELASTIC_USE_AGENT_STORE=True`). When a rank fails, the others get
/// SIGTERM (they write a checkpoint and stop), then SIGKILL after the
/// grace period; SIGINT/SIGTERM to `launch` are passed on the same way. The
/// exit status is the first failed rank's, or 0.
#[cfg(feature = "torch")]
pub fn launch(a: &LaunchArgs) -> Result<()> {
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    use r2vpo_llm::dist::c10d::Store;

    if a.nproc_per_node == 0 || a.nnodes == 0 {
        bail!("--nproc-per-node and --nnodes must be at least 1");
    }
    if a.node_rank >= a.nnodes {
        bail!("--node-rank {} is not below --nnodes {}", a.node_rank, a.nnodes);
    }
    if a.master_port == 0 && a.nnodes > 1 {
        bail!("--master-port 0 (any free port) works on one machine only: the other nodes must know the port");
    }
    let stop = r2vpo_report::edge::Stop::install().context("installing the SIGINT/SIGTERM handlers")?;
    // Node 0 hosts the store for the whole job and keeps it until every
    // local rank has exited.
    let store = if a.node_rank == 0 {
        Some(Store::serve(&a.master_addr, a.master_port, None, Duration::from_secs(300))?)
    } else {
        None
    };
    let port = store.as_ref().map_or(a.master_port, Store::port);
    let world = a.nnodes * a.nproc_per_node;
    let exe = std::env::current_exe().context("locating the running binary")?;
    let run_id = format!("r2vpo-{}-{port}", std::process::id());
    // As torchrun does (it sets OMP_NUM_THREADS=1): N ranks that each
    // take every core would fight over them. Unless a count was chosen,
    // each rank gets its share of this machine's cores.
    let threads = if *crate::THREADS_CHOSEN.get().unwrap_or(&false) {
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "1".into())
    } else {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let share = (cores / a.nproc_per_node).max(1);
        eprintln!(
            "r2vpo launch: {share} thread(s) per rank ({cores} cores over {} ranks; --threads N before `launch` \
             chooses)",
            a.nproc_per_node
        );
        share.to_string()
    };
    let mut children: Vec<(usize, Child)> = Vec::new();
    for local in 0..a.nproc_per_node {
        let rank = a.node_rank * a.nproc_per_node + local;
        let child = Command::new(&exe)
            .args(&a.command)
            .env("RAYON_NUM_THREADS", &threads)
            .env("OMP_NUM_THREADS", &threads)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", a.nproc_per_node.to_string())
            .env("GROUP_RANK", a.node_rank.to_string())
            .env("GROUP_WORLD_SIZE", a.nnodes.to_string())
            .env("MASTER_ADDR", &a.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", &run_id)
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .env("TORCHELASTIC_RESTART_COUNT", "0")
            .env("TORCHELASTIC_MAX_RESTARTS", "0")
            .spawn()
            .with_context(|| format!("starting rank {rank}: {}", exe.display()))?;
        children.push((rank, child));
    }
    let signal_all = |children: &[(usize, Child)], sig: i32| {
        for (_, c) in children {
            // SAFETY: kill(2) on a child this process started and has not
            // reaped (a reaped one was removed from the list).
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    };
    let mut failed: Option<(usize, std::process::ExitStatus)> = None;
    let mut deadline: Option<Instant> = None;
    let mut forwarded = false;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait().context("waiting for a rank")? {
                Some(status) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() && failed.is_none() {
                        eprintln!("r2vpo launch: rank {rank} exited with {status}; stopping the other ranks");
                        failed = Some((rank, status));
                    }
                }
                None => i += 1,
            }
        }
        if children.is_empty() {
            break;
        }
        if (failed.is_some() || stop.requested().is_some()) && !forwarded {
            signal_all(&children, libc::SIGTERM);
            forwarded = true;
            deadline = Some(Instant::now() + Duration::from_secs(a.grace_secs));
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            let ranks: Vec<String> = children.iter().map(|(r, _)| r.to_string()).collect();
            eprintln!(
                "r2vpo launch: rank(s) {} still running after {} s; killing them",
                ranks.join(", "),
                a.grace_secs
            );
            signal_all(&children, libc::SIGKILL);
            deadline = None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(store);
    if let Some((rank, status)) = failed {
        bail!("rank {rank} failed ({status})");
    }
    if let Some(s) = stop.requested() {
        std::process::exit(s.exit_code() as i32);
    }
    Ok(())
}

/// Joins the job this process was launched into (torchrun, `srun`,
/// `r2vpo launch`, or alone as a job of one), checks that every rank runs
/// the same binary and arguments, checks each collective's results and
/// times them; rank 0 prints the table.
#[cfg(feature = "torch")]
pub fn check(a: &CheckArgs) -> Result<()> {
    use std::time::Duration;

    use r2vpo_llm::dist::c10d::ProcessGroup;
    use r2vpo_llm::dist::{Launch, Launcher, Rendezvous};

    let timeout = Duration::from_secs(a.timeout_secs);
    let launch = match Launch::from_env()? {
        Some(l) => l,
        None => Launch {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            // A job of one's store takes any free port, as `Launch` reads it.
            master_port: 0,
            rendezvous: Rendezvous::RankZeroHosts,
            launcher: Launcher::Env,
        },
    };
    let mut pg = ProcessGroup::join(&launch, timeout)?;
    let cuda = if a.device == "cuda" {
        pg.add_nccl()?;
        Some(launch.local_rank)
    } else {
        None
    };
    pg.agree("binary", &binary_hash()?)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    pg.agree("argument list", &format!("{args:?}"))?;
    pg.barrier()?;
    eprintln!("rank {} of {}: joined; checking and timing the collectives", pg.rank(), pg.world());
    let timings = pg.self_check(a.numel, a.iters, cuda)?;
    pg.barrier()?;
    if pg.rank() == 0 {
        println!(
            "dist check: {} ranks ({} per node, {:?}), {}: every collective's result exact",
            pg.world(),
            launch.local_world_size,
            launch.launcher,
            if pg.has_nccl() { "NCCL on CUDA tensors" } else { "Gloo on CPU tensors" }
        );
        println!("| collective | buffer (MiB) | time per call (ms) | bus bandwidth (GB/s) |");
        println!("|---|---:|---:|---:|");
        for t in &timings {
            println!(
                "| {} | {:.2} | {:.3} | {:.3} |",
                t.name,
                t.bytes as f64 / (1 << 20) as f64,
                t.seconds * 1e3,
                t.bus_bytes_per_s / 1e9
            );
        }
    }
    Ok(())
}
