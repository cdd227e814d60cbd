//! The learner across processes: where this process sits in a distributed
//! job ([`Launch`], read from the variables torchrun, `srun` and
//! `r2vpo launch` set) and, with the `torch` feature, torch.distributed's
//! process groups ([`c10d`]).
//!
//! The launch conventions are PyTorch's, so a job starts as users start
//! one: `torchrun --standalone --nproc-per-node 8 --no-python r2vpo …`,
//! `srun r2vpo …` (with `MASTER_ADDR`/`MASTER_PORT` exported), or
//! `r2vpo launch --nproc-per-node 8 -- …` where PyTorch's Python is absent.

#[cfg(feature = "torch")]
pub mod c10d;
#[cfg(feature = "torch")]
pub mod local_job;

use std::collections::HashMap;
use std::fmt;

/// A failed rendezvous or collective: what was attempted, and the engine's
/// message.
#[derive(Debug, Clone)]
pub struct DistError(pub String);

impl fmt::Display for DistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DistError {}

/// The ranks of a data-parallel job as the trainer sees them: collectives
/// on host values and byte strings, and (with the `torch` feature) on
/// libtorch tensors for the backend's gradients. Every rank calls the same
/// collectives in the same order; each returns once all ranks have, or
/// fails after the group's timeout. The implementations are
/// [`c10d::ProcessGroup`] and, for a process alone, [`Solo`].
pub trait Group: Send {
    /// This process's rank.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// Sums `values` element-wise over the ranks, in place on every rank
    /// (in f64).
    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), DistError>;

    /// Every rank's `mine`, in rank order, on every rank.
    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, DistError>;

    /// `root`'s `bytes` on every rank (the others' are ignored).
    fn broadcast_bytes(&mut self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>, DistError>;

    /// Sums `t` over the ranks, in place on every rank.
    #[cfg(feature = "torch")]
    fn sum_tensor(&mut self, t: &mut tch::Tensor) -> Result<(), DistError>;

    /// Every rank's `t` becomes `root`'s, in place.
    #[cfg(feature = "torch")]
    fn broadcast_tensor(&mut self, t: &mut tch::Tensor, root: usize) -> Result<(), DistError>;

    /// `root`'s `t` becomes the sum over the ranks of `t`, in place; the
    /// others' `t` is left with unspecified values.
    #[cfg(feature = "torch")]
    fn reduce_tensor(&mut self, t: &mut tch::Tensor, root: usize) -> Result<(), DistError>;
}

/// The group of one process alone: every collective returns this rank's
/// own values (a sum over one rank, a gather of one part, a broadcast from
/// itself), so code written for ranks runs unchanged without a job.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Group for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn sum_f64(&mut self, _: &mut [f64]) -> Result<(), DistError> {
        Ok(())
    }

    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        Ok(vec![mine.to_vec()])
    }

    fn broadcast_bytes(&mut self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>, DistError> {
        solo_root(root)?;
        Ok(bytes)
    }

    #[cfg(feature = "torch")]
    fn sum_tensor(&mut self, _: &mut tch::Tensor) -> Result<(), DistError> {
        Ok(())
    }

    #[cfg(feature = "torch")]
    fn broadcast_tensor(&mut self, _: &mut tch::Tensor, root: usize) -> Result<(), DistError> {
        solo_root(root)
    }

    #[cfg(feature = "torch")]
    fn reduce_tensor(&mut self, _: &mut tch::Tensor, root: usize) -> Result<(), DistError> {
        solo_root(root)
    }
}

/// One group used from two places, one call at a time on one thread: the
/// trainer's [`crate::train`] data-parallel plan, and the torch backend's
/// backward under ZeRO-2, which sums each layer's gradients into their
/// owners as soon as that layer's are complete
/// ([`crate::backend::Sharding::reduce_in_backward`]). Both hold a clone;
/// the calls keep the order every rank makes them in.
#[derive(Clone)]
pub struct Shared(std::sync::Arc<std::sync::Mutex<Box<dyn Group>>>);

impl Shared {
    /// `group`, to be shared.
    pub fn new(group: Box<dyn Group>) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(group)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn Group>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Group for Shared {
    fn rank(&self) -> usize {
        self.lock().rank()
    }

    fn world(&self) -> usize {
        self.lock().world()
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), DistError> {
        self.lock().sum_f64(values)
    }

    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        self.lock().all_gather_bytes(mine)
    }

    fn broadcast_bytes(&mut self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>, DistError> {
        self.lock().broadcast_bytes(root, bytes)
    }

    #[cfg(feature = "torch")]
    fn sum_tensor(&mut self, t: &mut tch::Tensor) -> Result<(), DistError> {
        self.lock().sum_tensor(t)
    }

    #[cfg(feature = "torch")]
    fn broadcast_tensor(&mut self, t: &mut tch::Tensor, root: usize) -> Result<(), DistError> {
        self.lock().broadcast_tensor(t, root)
    }

    #[cfg(feature = "torch")]
    fn reduce_tensor(&mut self, t: &mut tch::Tensor, root: usize) -> Result<(), DistError> {
        self.lock().reduce_tensor(t, root)
    }
}

/// A collective rooted at a rank a group of one does not have.
fn solo_root(root: usize) -> Result<(), DistError> {
    if root == 0 {
        Ok(())
    } else {
        Err(DistError(format!("rank {root} is the root of a collective in a group of one process")))
    }
}

/// A launch variable that is missing, unparsable or inconsistent, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchError(pub String);

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LaunchError {}

/// Who started the processes (which variables were read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun (`TORCHELASTIC_RUN_ID` set), or `r2vpo launch`, which sets
    /// the same variables.
    Torchrun,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`).
    Slurm,
    /// `RANK`/`WORLD_SIZE` set by hand or by another launcher.
    Env,
}

/// Where to find the rendezvous store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0 hosts a TCPStore at `MASTER_ADDR:MASTER_PORT`, the others
    /// connect to it (`init_process_group`'s `env://`).
    RankZeroHosts,
    /// The launcher's agent already hosts one there
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`): every rank connects as a
    /// client and keys go under this prefix, torchrun's
    /// `/worker/attempt_{TORCHELASTIC_RESTART_COUNT}`.
    AgentStore {
        /// The key prefix.
        prefix: String,
    },
}

/// This process's place in a distributed job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank on this machine: the CUDA device this rank uses.
    pub local_rank: usize,
    /// Processes on this machine.
    pub local_world_size: usize,
    /// The rendezvous store's host.
    pub master_addr: String,
    /// The rendezvous store's port (0 for a job of one without
    /// `MASTER_PORT`: its store takes any free port).
    pub master_port: u16,
    /// Who hosts the store.
    pub rendezvous: Rendezvous,
    /// Which variables this was read from.
    pub launcher: Launcher,
    /// How many times the launcher restarted the job before this attempt
    /// (torchrun's `TORCHELASTIC_RESTART_COUNT` under `--max-restarts`,
    /// Slurm's `SLURM_RESTART_COUNT` for a requeued job; 0 otherwise): a
    /// restarted `llm train` resumes its run folder.
    pub restart: u32,
}

impl Launch {
    /// A process alone as a job of one: rank 0 of 1, hosting its own store
    /// on any free loopback port (what `r2vpo dist check` joins when no
    /// launcher started it).
    pub fn alone() -> Launch {
        Launch {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            rendezvous: Rendezvous::RankZeroHosts,
            launcher: Launcher::Env,
            restart: 0,
        }
    }

    /// Reads this process's environment: `None` when no launcher set it
    /// (neither `RANK`/`WORLD_SIZE` nor Slurm's task variables), a
    /// single-process run.
    pub fn from_env() -> Result<Option<Launch>, LaunchError> {
        Self::from_vars(&std::env::vars().collect())
    }

    /// [`Launch::from_env`] on the given variables.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Option<Launch>, LaunchError> {
        let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let num = |k: &str| -> Result<Option<usize>, LaunchError> {
            get(k)
                .map(|v| {
                    v.parse::<usize>().map_err(|_| LaunchError(format!("{k}={v:?} is not a non-negative integer")))
                })
                .transpose()
        };
        let need = |k: &str, launcher: &str| -> Result<usize, LaunchError> {
            num(k)?.ok_or_else(|| LaunchError(format!("{launcher} sets {k}, and it is missing")))
        };
        let (rank, world_size, local_rank, local_world_size, launcher) = if get("RANK").is_some()
            || get("WORLD_SIZE").is_some()
        {
            let launcher = if get("TORCHELASTIC_RUN_ID").is_some() { Launcher::Torchrun } else { Launcher::Env };
            let rank = need("RANK", "a distributed launch (WORLD_SIZE is set)")?;
            let world = need("WORLD_SIZE", "a distributed launch (RANK is set)")?;
            // Without LOCAL_RANK the launcher said nothing about this
            // machine, and the ones that set RANK but not LOCAL_RANK start
            // one process per machine or pod (Kubeflow's PyTorchJob: pod k
            // of a one-GPU-per-pod job has only `cuda:0`). torchrun and
            // `r2vpo launch`, which start several per machine, set it.
            let (local_rank, local_world) = match num("LOCAL_RANK")? {
                Some(l) => (l, num("LOCAL_WORLD_SIZE")?.unwrap_or(world)),
                None => (0, num("LOCAL_WORLD_SIZE")?.unwrap_or(1)),
            };
            (rank, world, local_rank, local_world, launcher)
        } else if get("SLURM_PROCID").is_some() {
            let rank = need("SLURM_PROCID", "srun")?;
            let world = need("SLURM_NTASKS", "srun")?;
            let local_rank = need("SLURM_LOCALID", "srun")?;
            // SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node;
            // the step's per-node task count is in SLURM_STEP_TASKS_PER_NODE
            // ("8" or "8(x2)").
            let local_world = match get("SLURM_NTASKS_PER_NODE").or(get("SLURM_STEP_TASKS_PER_NODE")) {
                Some(v) => {
                    let head = v.split(['(', ',']).next().unwrap_or(v);
                    head.parse().map_err(|_| LaunchError(format!("SLURM_STEP_TASKS_PER_NODE={v:?} is not a count")))?
                }
                None => 1,
            };
            (rank, world, local_rank, local_world, Launcher::Slurm)
        } else {
            return Ok(None);
        };
        if world_size == 0 {
            return Err(LaunchError("WORLD_SIZE is 0: a job has at least one process".into()));
        }
        if rank >= world_size {
            return Err(LaunchError(format!(
                "RANK {rank} is not below WORLD_SIZE {world_size}: ranks run from 0 to WORLD_SIZE − 1"
            )));
        }
        if local_world_size == 0 || local_rank >= local_world_size {
            return Err(LaunchError(format!(
                "LOCAL_RANK {local_rank} is not below LOCAL_WORLD_SIZE {local_world_size}"
            )));
        }
        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a.to_string(),
            None if world_size == 1 => "127.0.0.1".into(),
            None => {
                let hint = if launcher == Launcher::Slurm {
                    " (in the batch script: export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | \
                     head -n 1))"
                } else {
                    ""
                };
                return Err(LaunchError(format!("MASTER_ADDR is not set: the rendezvous store's host{hint}")));
            }
        };
        let master_port = match get("MASTER_PORT") {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| LaunchError(format!("MASTER_PORT={p:?} is not a port (1–65535)")))?,
            // No other rank has to find a job of one's store: any free port.
            None if world_size == 1 => 0,
            None => {
                let hint =
                    if launcher == Launcher::Slurm { " (export MASTER_PORT=29500 in the batch script)" } else { "" };
                return Err(LaunchError(format!("MASTER_PORT is not set: the rendezvous store's port{hint}")));
            }
        };
        let rendezvous = if get("TORCHELASTIC_USE_AGENT_STORE") == Some("True") {
            let attempt = need("TORCHELASTIC_RESTART_COUNT", "torchrun (TORCHELASTIC_USE_AGENT_STORE is True)")?;
            Rendezvous::AgentStore { prefix: format!("/worker/attempt_{attempt}") }
        } else {
            Rendezvous::RankZeroHosts
        };
        Ok(Some(Launch {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            rendezvous,
            launcher,
            restart: ["TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"]
                .iter()
                .find_map(|k| get(k).and_then(|v| v.parse().ok()))
                .unwrap_or(0),
        }))
    }
}

/// The first 16 hex digits of the running binary's SHA-256: ranks that
/// run different builds would compute different things, so a job's ranks
/// agree on it before they train ([`c10d::ProcessGroup::join_checked`]).
pub fn binary_hash() -> std::io::Result<String> {
    use sha2::Digest;
    let exe = std::env::current_exe()?;
    let mut h = sha2::Sha256::new();
    let mut f = std::fs::File::open(&exe)?;
    std::io::copy(&mut f, &mut h)?;
    Ok(format!("{:x}", h.finalize())[..16].to_string())
}

/// Starts [`peak_rss_mib`] again from the resident set now (Linux ≥ 4.0:
/// `5` into /proc/self/clear_refs); false where the kernel refuses, and
/// the peak then runs on from the process's start.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak resident memory in MiB (Linux's `VmHWM`) since its
/// start or the last [`reset_peak_rss`], `None` where /proc does not say.
pub fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

/// This process's resident memory now in MiB (Linux's `VmRSS`).
pub fn rss_mib() -> Option<f64> {
    status_mib("VmRSS:")
}

fn status_mib(key: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix(key))?.split_whitespace().next()?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Consecutive runs of tensors, by their sizes, holding at most 32 Mi
/// values each (a run of one where a tensor alone is larger): the units a
/// data-parallel collective sends, one collective per bucket instead of
/// one per tensor, without a second copy of every tensor at once.
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) fn buckets(sizes: impl IntoIterator<Item = i64>) -> Vec<std::ops::Range<usize>> {
    const BUCKET: i64 = 32 << 20;
    let mut out = Vec::new();
    let (mut start, mut n, mut len) = (0, 0i64, 0);
    for (i, k) in sizes.into_iter().enumerate() {
        if i > start && n + k > BUCKET {
            out.push(start..i);
            (start, n) = (i, 0);
        }
        n += k;
        len = i + 1;
    }
    if len > start {
        out.push(start..len);
    }
    out
}

/// The device a rank trains on: `cuda` (no number) becomes the rank's own
/// GPU, `cuda:LOCAL_RANK`, as torchrun users expect; `cpu` and an explicit
/// `cuda:N` stay as they are (a user who numbers the device chose it, e.g.
/// one GPU per process through `CUDA_VISIBLE_DEVICES`).
pub fn rank_device(device: &str, local_rank: usize) -> String {
    if device == "cuda" {
        format!("cuda:{local_rank}")
    } else {
        device.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// What torchrun sets for the third of four workers, with its agent
    /// store, is read as torchrun means it.
    #[test]
    fn torchrun_variables_with_the_agent_store() {
        let l = Launch::from_vars(&vars(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29511"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((l.rank, l.world_size, l.local_rank, l.local_world_size), (2, 4, 2, 4));
        assert_eq!(l.rendezvous, Rendezvous::AgentStore { prefix: "/worker/attempt_1".into() });
        assert_eq!((l.master_addr.as_str(), l.master_port, l.launcher), ("127.0.0.1", 29511, Launcher::Torchrun));
        assert_eq!(l.restart, 1, "the second attempt of a torchrun job");
    }

    /// srun's variables, with the address exported by the batch script.
    #[test]
    fn slurm_variables() {
        let l = Launch::from_vars(&vars(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "8(x2)"),
            ("MASTER_ADDR", "node017"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((l.rank, l.world_size, l.local_rank, l.local_world_size), (9, 16, 1, 8));
        assert_eq!((l.rendezvous, l.launcher), (Rendezvous::RankZeroHosts, Launcher::Slurm));
        let e = Launch::from_vars(&vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")]))
            .unwrap_err()
            .0;
        assert!(e.contains("MASTER_ADDR") && e.contains("scontrol show hostnames"), "{e}");
    }

    /// No launcher: a single process. Inconsistent or malformed variables
    /// are named.
    #[test]
    fn absent_and_bad_variables() {
        assert_eq!(Launch::from_vars(&vars(&[])).unwrap(), None);
        let err = |kv: &[(&str, &str)]| Launch::from_vars(&vars(kv)).unwrap_err().0;
        let base = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
        let with = |extra: &[(&'static str, &'static str)]| [&base[..], extra].concat();
        assert!(err(&with(&[("RANK", "3"), ("WORLD_SIZE", "3")])).contains("RANK 3 is not below WORLD_SIZE 3"));
        assert!(err(&with(&[("RANK", "0")])).contains("WORLD_SIZE"));
        assert!(err(&with(&[("RANK", "x"), ("WORLD_SIZE", "2")])).contains("RANK=\"x\""));
        assert!(err(&with(&[("RANK", "0"), ("WORLD_SIZE", "0")])).contains("WORLD_SIZE is 0"));
        assert!(err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "0")])
            .contains("MASTER_PORT=\"0\""));
        assert!(err(&[("RANK", "0"), ("WORLD_SIZE", "2")]).contains("MASTER_ADDR is not set"));
        assert!(err(&with(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_USE_AGENT_STORE", "True")]))
            .contains("TORCHELASTIC_RESTART_COUNT"));
        // One process needs no store address.
        let one = Launch::from_vars(&vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap().unwrap();
        assert_eq!((one.master_addr.as_str(), one.master_port), ("127.0.0.1", 0));
    }

    /// A PyTorchJob pod gets RANK and WORLD_SIZE but no LOCAL_RANK: it is
    /// the only rank on its machine, and `cuda` means its one GPU, not
    /// `cuda:RANK` (which a one-GPU pod does not have).
    #[test]
    fn a_rank_without_local_variables_is_alone_on_its_machine() {
        let pod = Launch::from_vars(&vars(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "r2vpo-master-0"),
            ("MASTER_PORT", "23456"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((pod.rank, pod.local_rank, pod.local_world_size), (5, 0, 1));
        assert_eq!(rank_device("cuda", pod.local_rank), "cuda:0");
        assert_eq!(pod.launcher, Launcher::Env);
    }

    #[test]
    fn each_rank_takes_its_own_gpu_unless_the_device_is_numbered() {
        assert_eq!(rank_device("cuda", 3), "cuda:3");
        assert_eq!(rank_device("cuda:1", 3), "cuda:1");
        assert_eq!(rank_device("cpu", 3), "cpu");
    }

    #[test]
    fn a_group_of_one_returns_its_own_values() {
        let mut g = Solo;
        let mut v = [1.5, -2.0];
        g.sum_f64(&mut v).unwrap();
        assert_eq!(v, [1.5, -2.0]);
        assert_eq!(g.all_gather_bytes(b"ab").unwrap(), vec![b"ab".to_vec()]);
        assert_eq!(g.broadcast_bytes(0, b"cd".to_vec()).unwrap(), b"cd".to_vec());
        let e = g.broadcast_bytes(1, Vec::new()).unwrap_err().0;
        assert!(e.contains("rank 1") && e.contains("group of one"), "{e}");
        assert_eq!((g.rank(), g.world()), (0, 1));
    }

    #[test]
    fn buckets_cover_every_tensor_in_order_within_the_limit() {
        const B: i64 = 32 << 20;
        assert_eq!(buckets([]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(buckets([1, 2, 3]), vec![0..3]);
        // A tensor larger than a bucket travels alone.
        assert_eq!(buckets([1, B + 1, 1]), vec![0..1, 1..2, 2..3]);
        assert_eq!(buckets([B / 2, B / 2, 1]), vec![0..2, 2..3]);
        assert_eq!(buckets([B, 0]), vec![0..2]);
    }
}
