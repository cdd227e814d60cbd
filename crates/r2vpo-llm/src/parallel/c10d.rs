//! torch.distributed's process groups from Rust: a TCPStore rendezvous and
//! collectives on libtorch tensors, through the C++ shim
//! `src/parallel/c10d.cpp` (libtorch exports c10d; tch-rs binds none of it).
//!
//! Collectives are libtorch's own — Gloo on CPU tensors and, built with
//! the `nccl` feature, NCCL on CUDA tensors, as torch.distributed's
//! `"cpu:gloo,cuda:nccl"` backend routes them: nothing here sends a byte
//! itself. Every call is bounded by the group's timeout, so a rank that
//! died or hangs ends the others with an error instead of a hang.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::time::Duration;

use tch::Tensor;

use super::{Group, Launch, Rendezvous};

unsafe extern "C" {
    fn r2vpo_c10d_log_level(level: c_int);
    fn r2vpo_c10d_torch_versions(compiled: *mut c_char, compiled_len: c_int, runtime: *mut c_char, runtime_len: c_int);
    fn r2vpo_c10d_store(
        host: *const c_char,
        port: c_int,
        is_server: c_int,
        world: c_int,
        timeout_ms: i64,
        prefix: *const c_char,
        err: *mut c_char,
        err_len: c_int,
    ) -> *mut c_void;
    fn r2vpo_c10d_store_port(store: *mut c_void) -> c_int;
    fn r2vpo_c10d_store_drop(store: *mut c_void);
    fn r2vpo_c10d_store_set(
        store: *mut c_void,
        key: *const c_char,
        data: *const u8,
        len: usize,
        err: *mut c_char,
        err_len: c_int,
    ) -> c_int;
    fn r2vpo_c10d_store_get(
        store: *mut c_void,
        key: *const c_char,
        out: *mut *mut u8,
        out_len: *mut usize,
        err: *mut c_char,
        err_len: c_int,
    ) -> c_int;
    fn r2vpo_c10d_free(p: *mut c_void);
    fn r2vpo_c10d_group(
        store: *mut c_void,
        name: *const c_char,
        engine: c_int,
        rank: c_int,
        world: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: c_int,
    ) -> *mut c_void;
    fn r2vpo_c10d_group_drop(group: *mut c_void);
    fn r2vpo_c10d_collective(
        group: *mut c_void,
        op: c_int,
        a: *mut c_void,
        b: *mut c_void,
        root: c_int,
        err: *mut c_char,
        err_len: c_int,
    ) -> c_int;
}

pub use super::DistError;

/// `Result` of this module.
pub type Result<T> = std::result::Result<T, DistError>;

const ERR_LEN: usize = 2048;

/// Runs `f` with an error buffer; `Err` names `what` with the shim's
/// message when `failed` says the call failed.
fn call<T>(what: &str, f: impl FnOnce(*mut c_char, c_int) -> T, failed: impl Fn(&T) -> bool) -> Result<T> {
    let mut err = vec![0 as c_char; ERR_LEN];
    let out = f(err.as_mut_ptr(), ERR_LEN as c_int);
    if failed(&out) {
        // SAFETY: the shim wrote a NUL-terminated message into the buffer.
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
        // libtorch appends a C++ backtrace to some messages: the first
        // lines say what happened.
        let msg: Vec<&str> = msg.lines().take_while(|l| !l.starts_with("Exception raised from")).collect();
        return Err(DistError(format!("{what}: {}", msg.join(" ").trim())));
    }
    Ok(out)
}

/// Keeps libtorch's own log off stderr unless the user asked for it with
/// libtorch's switch, `TORCH_CPP_LOG_LEVEL` (INFO, WARNING, ERROR). A
/// store client that cannot connect logs every retry and then a C++ stack
/// trace (about 48 lines) before its exception, whose message r2vpo turns
/// into one clear error ([`call`]); the rest is detail for debugging.
fn quiet_libtorch() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TORCH_CPP_LOG_LEVEL").is_none() {
            // SAFETY: sets an int flag that libtorch reads when it logs.
            unsafe { r2vpo_c10d_log_level(3) };
        }
    });
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| DistError(format!("{s:?} holds a NUL byte")))
}

/// A c10d TCPStore: the key-value store ranks rendezvous through.
pub struct Store {
    handle: *mut c_void,
    port: u16,
}

// SAFETY: c10d's TCPStore is safe to call from any thread (its client
// serialises requests on its socket under a lock).
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// A TCPStore server on `host:port` (port 0: a free one, see
    /// [`Store::port`]). With `wait_for` workers it returns once that many
    /// clients (itself included) have connected, as rank 0's does; with
    /// `None` it serves whoever comes, as torchrun's agent's does.
    pub fn serve(host: &str, port: u16, wait_for: Option<usize>, timeout: Duration) -> Result<Store> {
        Self::open(host, port, true, wait_for.unwrap_or(0), timeout, "")
    }

    /// A client of the TCPStore at `host:port`, its keys under `prefix`
    /// (empty: none); waits up to `timeout` for the server. A client of a
    /// job of `world` ranks counts itself in, which a server waiting for
    /// that many workers waits for (as torch.distributed's clients do);
    /// `None` does not.
    pub fn connect(host: &str, port: u16, prefix: &str, world: Option<usize>, timeout: Duration) -> Result<Store> {
        Self::open(host, port, false, world.unwrap_or(0), timeout, prefix)
    }

    fn open(host: &str, port: u16, server: bool, world: usize, timeout: Duration, prefix: &str) -> Result<Store> {
        quiet_libtorch();
        let (h, p) = (cstring(host)?, cstring(prefix)?);
        let what = if server {
            format!("hosting the rendezvous store on {host}:{port}")
        } else {
            format!("reaching the rendezvous store at {host}:{port} (MASTER_ADDR:MASTER_PORT)")
        };
        let handle = call(
            &what,
            // SAFETY: the strings outlive the call; the shim catches
            // every C++ exception.
            |e, n| unsafe {
                r2vpo_c10d_store(
                    h.as_ptr(),
                    port as c_int,
                    server as c_int,
                    world as c_int,
                    timeout.as_millis() as i64,
                    p.as_ptr(),
                    e,
                    n,
                )
            },
            |h| h.is_null(),
        )?;
        // SAFETY: a live handle.
        let port = unsafe { r2vpo_c10d_store_port(handle) } as u16;
        Ok(Store { handle, port })
    }

    /// The port the store's server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let k = cstring(key)?;
        // SAFETY: live handle, key and value for the call's length.
        call(
            &format!("setting {key:?} in the rendezvous store"),
            |e, n| unsafe { r2vpo_c10d_store_set(self.handle, k.as_ptr(), value.as_ptr(), value.len(), e, n) },
            |rc| *rc != 0,
        )?;
        Ok(())
    }

    /// The value of `key`, waiting for another rank to set it up to the
    /// store's timeout.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let k = cstring(key)?;
        let (mut out, mut len) = (std::ptr::null_mut::<u8>(), 0usize);
        // SAFETY: live handle and key; the shim fills `out` with a
        // malloc'd buffer of `len` bytes on success.
        call(
            &format!("waiting for {key:?} in the rendezvous store"),
            |e, n| unsafe { r2vpo_c10d_store_get(self.handle, k.as_ptr(), &mut out, &mut len, e, n) },
            |rc| *rc != 0,
        )?;
        // SAFETY: `out` holds `len` bytes from malloc, freed right after.
        let v = unsafe { std::slice::from_raw_parts(out, len) }.to_vec();
        unsafe { r2vpo_c10d_free(out.cast()) };
        Ok(v)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        unsafe { r2vpo_c10d_store_drop(self.handle) }
    }
}

/// A process group: `world` ranks running the same collectives in the
/// same order, on Gloo for CPU tensors and (after
/// [`ProcessGroup::add_nccl`]) on NCCL for CUDA tensors.
pub struct ProcessGroup {
    handle: *mut c_void,
    // The NCCL group over the same store, for CUDA tensors.
    nccl: Option<*mut c_void>,
    timeout: Duration,
    rank: usize,
    world: usize,
    // Dropped after the group, which holds a reference of its own.
    store: Store,
}

// SAFETY: c10d backends are called from one thread at a time here
// (`&mut self` on every collective); moving one between threads is safe.
unsafe impl Send for ProcessGroup {}

/// The collectives of `r2vpo_c10d_collective`.
#[derive(Clone, Copy)]
enum Op {
    AllReduce = 0,
    Broadcast = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Barrier = 4,
    Reduce = 5,
}

/// The engines of `r2vpo_c10d_group`.
#[derive(Clone, Copy, Debug)]
enum Engine {
    Gloo = 0,
    Nccl = 1,
}

/// A process group on `engine` of `world` ranks over `store`, its keys
/// under `name`.
fn engine_group(
    store: &Store,
    name: &str,
    engine: Engine,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<*mut c_void> {
    let n = cstring(name)?;
    let what = match engine {
        Engine::Gloo => "Gloo",
        Engine::Nccl => "NCCL",
    };
    call(
        &format!("making the {what} process group (rank {rank} of {world})"),
        // SAFETY: live store handle and name; exceptions are caught.
        |e, l| unsafe {
            r2vpo_c10d_group(
                store.handle,
                n.as_ptr(),
                engine as c_int,
                rank as c_int,
                world as c_int,
                timeout.as_millis() as i64,
                e,
                l,
            )
        },
        |h| h.is_null(),
    )
}

impl ProcessGroup {
    /// Joins the job `launch` describes: connects to (rank 0: hosts) the
    /// rendezvous store and makes a Gloo group of every rank over it.
    /// Every wait — for the store, for the other ranks, for each
    /// collective — ends after `timeout` with an error.
    pub fn join(launch: &Launch, timeout: Duration) -> Result<ProcessGroup> {
        let store = match &launch.rendezvous {
            Rendezvous::AgentStore { prefix } => {
                Store::connect(&launch.master_addr, launch.master_port, prefix, Some(launch.world_size), timeout)?
            }
            Rendezvous::RankZeroHosts if launch.rank == 0 => {
                Store::serve(&launch.master_addr, launch.master_port, Some(launch.world_size), timeout)?
            }
            Rendezvous::RankZeroHosts => {
                Store::connect(&launch.master_addr, launch.master_port, "", Some(launch.world_size), timeout)?
            }
        };
        Self::over(store, "r2vpo/", launch.rank, launch.world_size, timeout)
    }

    /// Joins the job `launch` describes as one rank of a training job:
    /// [`ProcessGroup::join`], NCCL beside Gloo where the tensors live on
    /// GPUs (`nccl`), then every rank checks that all run the same binary
    /// ([`super::binary_hash`]) and agree on each of `agreements` (what,
    /// value: a hash of the resolved config), naming the first that
    /// differs.
    pub fn join_checked(
        launch: &Launch,
        timeout: Duration,
        nccl: bool,
        agreements: &[(&str, &str)],
    ) -> Result<ProcessGroup> {
        check_torch_version()?;
        let mut pg = Self::join(launch, timeout)?;
        if nccl {
            pg.add_nccl()?;
        }
        let binary = super::binary_hash().map_err(|e| DistError(format!("hashing the running binary: {e}")))?;
        pg.agree("binary", &binary)?;
        for (what, value) in agreements {
            pg.agree(what, value)?;
        }
        Ok(pg)
    }

    /// A Gloo group of `world` ranks over `store`, its keys under `name`.
    pub fn over(store: Store, name: &str, rank: usize, world: usize, timeout: Duration) -> Result<ProcessGroup> {
        let handle = engine_group(&store, name, Engine::Gloo, rank, world, timeout)?;
        Ok(ProcessGroup { handle, nccl: None, timeout, rank, world, store })
    }

    /// Adds an NCCL group of the same ranks over the same store, which
    /// every collective on CUDA tensors goes to from then on (CPU tensors
    /// stay on Gloo). Every rank calls it; NCCL makes its communicator at
    /// the first collective, on the GPU that collective's tensors are on
    /// (each rank's own). Needs a build with the `nccl` feature (`make
    /// build-gpu`); without it, an error that says so.
    pub fn add_nccl(&mut self) -> Result<()> {
        if self.nccl.is_none() {
            let (rank, world) = (self.rank, self.world);
            self.nccl = Some(engine_group(&self.store, "r2vpo-nccl/", Engine::Nccl, rank, world, self.timeout)?);
        }
        Ok(())
    }

    /// Whether CUDA tensors have an NCCL group ([`ProcessGroup::add_nccl`]).
    pub fn has_nccl(&self) -> bool {
        self.nccl.is_some()
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The rendezvous store the group was made over.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn collective(
        &mut self,
        op: Op,
        name: &str,
        a: Option<&mut Tensor>,
        b: Option<&mut Tensor>,
        root: usize,
    ) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        // CUDA tensors go to NCCL (Gloo's CUDA support covers only some
        // collectives, through host copies); the barrier stays on Gloo.
        let handle = match a.as_ref().map(|t| t.device()) {
            Some(tch::Device::Cuda(_)) => self.nccl.ok_or_else(|| {
                DistError(format!(
                    "{name} of a CUDA tensor on rank {rank} of {world}: the group has no NCCL backend (join it with \
                     ProcessGroup::add_nccl)"
                ))
            })?,
            _ => self.handle,
        };
        let ptr = |t: Option<&mut Tensor>| t.map_or(std::ptr::null_mut(), |t| t.as_mut_ptr().cast::<c_void>());
        let (pa, pb) = (ptr(a), ptr(b));
        call(
            &format!("{name} on rank {rank} of {world}"),
            // SAFETY: live group and tensor handles for the call, which
            // waits for the collective to finish.
            |e, n| unsafe { r2vpo_c10d_collective(handle, op as c_int, pa, pb, root as c_int, e, n) },
            |rc| *rc != 0,
        )?;
        Ok(())
    }

    /// Sums `t` over the ranks, in place on every rank.
    pub fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<()> {
        self.collective(Op::AllReduce, "all-reduce", Some(t), None, 0)
    }

    /// Every rank's `t` becomes `root`'s.
    pub fn broadcast(&mut self, t: &mut Tensor, root: usize) -> Result<()> {
        self.collective(Op::Broadcast, "broadcast", Some(t), None, root)
    }

    /// `out` (world × `input`'s elements) becomes every rank's `input` in
    /// rank order.
    pub fn all_gather(&mut self, out: &mut Tensor, input: &mut Tensor) -> Result<()> {
        self.collective(Op::AllGather, "all-gather", Some(out), Some(input), 0)
    }

    /// `out` becomes this rank's slice of the sum over ranks of `input`
    /// (world × `out`'s elements; rank r gets slice r).
    pub fn reduce_scatter_sum(&mut self, out: &mut Tensor, input: &mut Tensor) -> Result<()> {
        self.collective(Op::ReduceScatter, "reduce-scatter", Some(out), Some(input), 0)
    }

    /// `root`'s `t` becomes the sum over ranks of `t`; the others' `t`
    /// is left with unspecified values.
    pub fn reduce_sum(&mut self, t: &mut Tensor, root: usize) -> Result<()> {
        self.collective(Op::Reduce, "reduce", Some(t), None, root)
    }

    /// Returns once every rank has reached it.
    pub fn barrier(&mut self) -> Result<()> {
        self.collective(Op::Barrier, "barrier", None, None, 0)
    }

    /// Checks that every rank runs with the same `value` of `what` (a hash
    /// of the binary, of the config): every rank publishes its own and
    /// reads all the others', so all of them fail alike, each naming the
    /// ranks that differ from rank 0.
    pub fn agree(&self, what: &str, value: &str) -> Result<()> {
        let key = |r: usize| format!("r2vpo/agree/{what}/{r}");
        self.store.set(&key(self.rank), value.as_bytes())?;
        let all = (0..self.world)
            .map(|r| self.store.get(&key(r)).map(|v| String::from_utf8_lossy(&v).into_owned()))
            .collect::<Result<Vec<_>>>()?;
        let differ: Vec<String> =
            all.iter().enumerate().filter(|(_, v)| **v != all[0]).map(|(r, v)| format!("rank {r} has {v}")).collect();
        if differ.is_empty() {
            Ok(())
        } else {
            Err(DistError(format!(
                "the ranks run different {what}s: rank 0 has {}, {}; start every rank with the same binary and \
                 arguments",
                all[0],
                differ.join(", ")
            )))
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the handles are live and dropped once.
        if let Some(h) = self.nccl.take() {
            unsafe { r2vpo_c10d_group_drop(h) }
        }
        unsafe { r2vpo_c10d_group_drop(self.handle) }
    }
}

/// One collective's measurement in [`ProcessGroup::self_check`].
#[derive(Clone, Debug)]
pub struct Timing {
    /// The collective.
    pub name: &'static str,
    /// Bytes of each rank's full buffer (f32).
    pub bytes: usize,
    /// Mean seconds per call.
    pub seconds: f64,
    /// Bytes each rank moves per call over `seconds` by the nccl-tests
    /// convention ("bus bandwidth": 2(n−1)/n of the buffer for an
    /// all-reduce, (n−1)/n for all-gather, reduce-scatter and reduce), bytes/s.
    pub bus_bytes_per_s: f64,
}

impl ProcessGroup {
    /// Checks every collective the learner uses on this job's ranks and
    /// times the tensor ones: all-reduce, broadcast, all-gather,
    /// reduce-scatter and reduce (ZeRO-2's) of `numel` f32 values, whose
    /// results (small integers, exact in f32) are compared with the values
    /// worked out in closed form, and the host exchanges ([`Group`]'s sums
    /// of f64 values, all-gather and broadcast of bytes); then `iters`
    /// timed calls of each tensor collective but the broadcast, on the CPU
    /// (through Gloo) or with
    /// `cuda` on that GPU (through NCCL: [`ProcessGroup::add_nccl`] first).
    /// An `Err` names the collective, the rank and the first wrong element.
    pub fn self_check(&mut self, numel: usize, iters: usize, cuda: Option<usize>) -> Result<Vec<Timing>> {
        let device = cuda.map_or(tch::Device::Cpu, tch::Device::Cuda);
        let (rank, world) = (self.rank, self.world);
        let (r, n) = (rank as f64, world as f64);
        let opts = (tch::Kind::Float, device);
        let per = numel.div_ceil(self.world).max(1);
        let numel = per * self.world;
        let expect = |what: &str, t: &Tensor, want: &dyn Fn(usize) -> f64| -> Result<()> {
            let v = Vec::<f32>::try_from(t.flatten(0, -1).to_device(tch::Device::Cpu))
                .map_err(|e| DistError(e.to_string()))?;
            match v.iter().enumerate().find(|&(i, &x)| x as f64 != want(i)) {
                None => Ok(()),
                Some((i, &x)) => Err(DistError(format!(
                    "{what} gave {x} at element {i} on rank {rank} of {world}, where {} is right",
                    want(i)
                ))),
            }
        };
        // Values stay below 2^24, exact in f32: element i of rank r's
        // buffer is (i mod 1024) + r.
        // Counted in integers: f32 counts stop being exact past 2^24.
        let pattern =
            |n: usize| Tensor::arange(n as i64, (tch::Kind::Int64, device)).remainder(1024).to_kind(tch::Kind::Float);
        let base = || pattern(numel);
        let mut t = base() + r;
        self.all_reduce_sum(&mut t)?;
        expect("all-reduce", &t, &|i| n * (i % 1024) as f64 + n * (n - 1.0) / 2.0)?;
        let mut t = base() + r;
        let root = self.world - 1;
        self.broadcast(&mut t, root)?;
        expect("broadcast", &t, &|i| (i % 1024) as f64 + root as f64)?;
        let mut mine = pattern(per) + r;
        let mut all = Tensor::zeros([numel as i64], opts);
        self.all_gather(&mut all, &mut mine)?;
        expect("all-gather", &all, &|i| ((i % per) % 1024) as f64 + (i / per) as f64)?;
        let mut input = base() + r;
        let mut shard = Tensor::zeros([per as i64], opts);
        self.reduce_scatter_sum(&mut shard, &mut input)?;
        expect("reduce-scatter", &shard, &|i| n * ((rank * per + i) % 1024) as f64 + n * (n - 1.0) / 2.0)?;
        // ZeRO-2 sums each gradient bucket into its owner.
        let mut t = base() + r;
        let owner = self.world / 2;
        self.reduce_sum(&mut t, owner)?;
        if rank == owner {
            expect("reduce", &t, &|i| n * (i % 1024) as f64 + n * (n - 1.0) / 2.0)?;
        }
        // The host-side exchanges the trainer runs on CPU tensors (rollout
        // and evaluation shares, statistics, the stop vote), whatever the
        // tensors' backend.
        let mut sums = [r, 1.0];
        self.sum_f64(&mut sums)?;
        if sums != [n * (n - 1.0) / 2.0, n] {
            return Err(DistError(format!("sum of host values gave {sums:?} on rank {rank} of {world}")));
        }
        let mine_bytes: Vec<u8> = (0..rank + 3).map(|i| (i * 7 + rank) as u8).collect();
        let gathered = self.all_gather_bytes(&mine_bytes)?;
        for (q, got) in gathered.iter().enumerate() {
            let want: Vec<u8> = (0..q + 3).map(|i| (i * 7 + q) as u8).collect();
            if *got != want {
                return Err(DistError(format!("all-gather of bytes gave {got:?} from rank {q} on rank {rank}")));
            }
        }
        let said = self.broadcast_bytes(root, if rank == root { b"from the root".to_vec() } else { Vec::new() })?;
        if said != b"from the root" {
            return Err(DistError(format!("broadcast of bytes gave {said:?} on rank {rank} of {world}")));
        }
        self.barrier()?;

        let bytes = numel * 4;
        let mut out = Vec::new();
        let frac = (n - 1.0) / n;
        // A reduce moves what a reduce-scatter and a gather move (ring
        // algorithms): bus bytes (n − 1)/n of the buffer.
        for (name, factor) in
            [("all-reduce", 2.0 * frac), ("all-gather", frac), ("reduce-scatter", frac), ("reduce", frac)]
        {
            self.barrier()?;
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                match name {
                    "all-reduce" => self.all_reduce_sum(&mut input)?,
                    "all-gather" => self.all_gather(&mut all, &mut mine)?,
                    "reduce" => self.reduce_sum(&mut input, owner)?,
                    _ => self.reduce_scatter_sum(&mut shard, &mut input)?,
                }
            }
            if let tch::Device::Cuda(i) = device {
                // The last call's kernels, finished before the clock stops.
                tch::Cuda::synchronize(i as i64);
            }
            let seconds = t0.elapsed().as_secs_f64() / iters.max(1) as f64;
            out.push(Timing { name, bytes, seconds, bus_bytes_per_s: factor * bytes as f64 / seconds });
        }
        Ok(out)
    }
}

impl Group for ProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<()> {
        let mut t = Tensor::from_slice(values);
        self.all_reduce_sum(&mut t)?;
        let summed = Vec::<f64>::try_from(&t).map_err(|e| DistError(e.to_string()))?;
        values.copy_from_slice(&summed);
        Ok(())
    }

    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut len = Tensor::from_slice(&[mine.len() as i64]);
        let mut lens = Tensor::zeros([self.world as i64], (tch::Kind::Int64, tch::Device::Cpu));
        self.all_gather(&mut lens, &mut len)?;
        let lens = Vec::<i64>::try_from(&lens).map_err(|e| DistError(e.to_string()))?;
        // Every rank's bytes padded to the longest, gathered in one call.
        let max = lens.iter().copied().max().unwrap_or(0).max(1) as usize;
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let mut input = Tensor::from_slice(&padded);
        let mut all = Tensor::zeros([(max * self.world) as i64], (tch::Kind::Uint8, tch::Device::Cpu));
        self.all_gather(&mut all, &mut input)?;
        let all = Vec::<u8>::try_from(&all).map_err(|e| DistError(e.to_string()))?;
        Ok(lens.iter().enumerate().map(|(r, &n)| all[r * max..r * max + n as usize].to_vec()).collect())
    }

    fn broadcast_bytes(&mut self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>> {
        let mut len = Tensor::from_slice(&[bytes.len() as i64]);
        self.broadcast(&mut len, root)?;
        let n = len.int64_value(&[0]) as usize;
        let mut buf = if self.rank == root {
            Tensor::from_slice(&bytes)
        } else {
            Tensor::zeros([n as i64], (tch::Kind::Uint8, tch::Device::Cpu))
        };
        if n > 0 {
            self.broadcast(&mut buf, root)?;
        }
        Vec::<u8>::try_from(&buf).map_err(|e| DistError(e.to_string()))
    }

    fn sum_tensor(&mut self, t: &mut Tensor) -> Result<()> {
        self.all_reduce_sum(t)
    }

    fn broadcast_tensor(&mut self, t: &mut Tensor, root: usize) -> Result<()> {
        self.broadcast(t, root)
    }

    fn reduce_tensor(&mut self, t: &mut Tensor, root: usize) -> Result<()> {
        self.reduce_sum(t, root)
    }
}

/// The libtorch the c10d shim was compiled against and the one loaded now
/// agree on their version: a rank whose library path reaches another
/// libtorch (a Python environment's torch, a cluster module) would
/// otherwise call into a C++ ABI it was not built for. Checked before a
/// rank joins ([`ProcessGroup::join_checked`]).
pub fn check_torch_version() -> Result<()> {
    let (mut compiled, mut runtime) = (vec![0u8; 64], vec![0u8; 16 * 1024]);
    // SAFETY: both buffers outlive the call, which writes at most len
    // bytes into each, NUL-terminated.
    unsafe {
        r2vpo_c10d_torch_versions(
            compiled.as_mut_ptr().cast(),
            compiled.len() as c_int,
            runtime.as_mut_ptr().cast(),
            runtime.len() as c_int,
        )
    };
    let text = |b: &[u8]| String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]).into_owned();
    torch_versions_agree(&text(&compiled), &text(&runtime))
}

/// [`check_torch_version`]'s comparison: `compiled` ("2.11.0") against the
/// `TORCH_VERSION=` build setting in `config` (`at::show_config`), whose
/// local part (`+cu130`) does not count.
pub fn torch_versions_agree(compiled: &str, config: &str) -> Result<()> {
    let loaded = config
        .split(|c: char| c == ',' || c.is_whitespace())
        .find_map(|w| w.strip_prefix("TORCH_VERSION="))
        .map(|v| v.split('+').next().unwrap_or(v).to_string());
    match loaded {
        Some(v) if v == compiled => Ok(()),
        Some(v) => Err(DistError(format!(
            "this r2vpo's c10d layer was built against libtorch {compiled}, but the libtorch loaded at run time is {v}: \
             point LD_LIBRARY_PATH at the libtorch it was built with (`make build-torch`/`make build-gpu` put its \
             path in the binary; docs/distributed.md, \"library paths\")"
        ))),
        None => Err(DistError(format!(
            "the libtorch loaded at run time does not say its version (no TORCH_VERSION in at::show_config); this \
             r2vpo's c10d layer was built against libtorch {compiled}"
        ))),
    }
}
