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

#[cfg(not(feature = "torch"))]
pub fn launch(_: &LaunchArgs) -> Result<()> {
    bail!("this r2vpo was built without the torch backend, which the distributed learner runs on: build it with `make build-torch` (or `make build-gpu`)")
}

#[cfg(not(feature = "torch"))]
pub fn check(_: &CheckArgs) -> Result<()> {
    bail!("this r2vpo was built without the torch backend, which the distributed learner runs on: build it with `make build-torch` (or `make build-gpu`)")
}

/// Starts `nproc_per_node` ranks of the command
/// ([`r2vpo_llm::parallel::local_job::LocalJob`]). The exit status is the
/// first failed rank's, or 0; SIGINT/SIGTERM to `launch` are passed on to
/// the ranks.
#[cfg(feature = "torch")]
pub fn launch(a: &LaunchArgs) -> Result<()> {
    use std::time::Duration;

    use r2vpo_llm::parallel::local_job::{JobEnd, LocalJob};

    let stop = r2vpo_report::edge::Stop::install().context("installing the SIGINT/SIGTERM handlers")?;
    // As torchrun does (it sets OMP_NUM_THREADS=1): unless a count was
    // chosen, each rank gets its share of this machine's cores.
    let threads = if *crate::THREADS_CHOSEN.get().unwrap_or(&false) {
        std::env::var("RAYON_NUM_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1)
    } else {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let share = (cores / a.nproc_per_node.max(1)).max(1);
        eprintln!(
            "r2vpo launch: {share} thread(s) per rank ({cores} cores over {} ranks; --threads N before `launch` \
             chooses)",
            a.nproc_per_node
        );
        share
    };
    let job = LocalJob {
        nproc_per_node: a.nproc_per_node,
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        master_addr: a.master_addr.clone(),
        master_port: a.master_port,
        grace: Duration::from_secs(a.grace_secs),
        threads,
    };
    let exe = std::env::current_exe().context("locating the running binary")?;
    match job.run(&exe, &a.command, &|| stop.requested().is_some())? {
        JobEnd::RankFailed { rank, status } => bail!("rank {rank} failed ({status})"),
        JobEnd::Stopped | JobEnd::Finished => {
            if let Some(s) = stop.requested() {
                std::process::exit(s.exit_code() as i32);
            }
            Ok(())
        }
    }
}

/// Joins the job this process was launched into (torchrun, `srun`,
/// `r2vpo launch`, or alone as a job of one), checks that every rank runs
/// the same binary and arguments, checks each collective's results and
/// times them; rank 0 prints the table.
#[cfg(feature = "torch")]
pub fn check(a: &CheckArgs) -> Result<()> {
    use std::time::Duration;

    use r2vpo_llm::parallel::c10d::ProcessGroup;
    use r2vpo_llm::parallel::Launch;

    let timeout = Duration::from_secs(a.timeout_secs);
    let launch = Launch::from_env()?.unwrap_or_else(Launch::alone);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cuda = (a.device == "cuda").then_some(launch.local_rank);
    let mut pg =
        ProcessGroup::join_checked(&launch, timeout, cuda.is_some(), &[("argument list", &format!("{args:?}"))])?;
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
