//! c10d through the shim: a TCPStore rendezvous and Gloo collectives, one
//! rank per thread (the process-level tests, through `r2vpo launch`, are
//! the CLI's `dist` tests). Values are small integers, exact in f32, so
//! every expected result is exact.
#![cfg(feature = "torch")]

use std::time::{Duration, Instant};

use r2vpo_llm::parallel::c10d::{ProcessGroup, Store};
use tch::{Kind, Tensor};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `f(group)` on `world` ranks, each in its own thread, over a store
/// the test hosts as torchrun's agent does.
fn on_ranks<T: Send + 'static>(
    world: usize,
    f: impl Fn(&mut ProcessGroup) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let server = Store::serve("127.0.0.1", 0, None, TIMEOUT).unwrap();
    let port = server.port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let f = f.clone();
            std::thread::spawn(move || {
                let store = Store::connect("127.0.0.1", port, "/worker/attempt_0", Some(world), TIMEOUT).unwrap();
                let mut pg = ProcessGroup::over(store, "test/", rank, world, TIMEOUT).unwrap();
                f(&mut pg)
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(server);
    out
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
}

/// All-reduce, broadcast, all-gather and reduce-scatter give, on every rank
/// of 3, the values worked out by hand.
#[test]
fn collectives_give_the_exact_results_on_every_rank() {
    let world = 3;
    let got = on_ranks(world, |pg| {
        let r = pg.rank() as f32;
        // Rank r holds [r, r+1, …, r+5].
        let mut sum = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)) + r as f64;
        pg.all_reduce_sum(&mut sum).unwrap();
        let mut b = Tensor::full([4], (10.0 * (r + 1.0)) as f64, (Kind::Float, tch::Device::Cpu));
        pg.broadcast(&mut b, 2).unwrap();
        let mut mine = Tensor::full([2], r as f64, (Kind::Float, tch::Device::Cpu));
        let mut gathered = Tensor::zeros([2 * 3], (Kind::Float, tch::Device::Cpu));
        pg.all_gather(&mut gathered, &mut mine).unwrap();
        // Rank r contributes (r+1)·[0, 1, …, 5]; slice k of the sum is
        // 6·[2k, 2k+1] (1+2+3 = 6).
        let mut input = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)) * (r as f64 + 1.0);
        let mut shard = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        pg.reduce_scatter_sum(&mut shard, &mut input).unwrap();
        // Rank r contributes [r, 2r]; rank 1 receives [0+1+2, 0+2+4].
        let mut reduced = Tensor::from_slice(&[r, 2.0 * r]);
        pg.reduce_sum(&mut reduced, 1).unwrap();
        pg.barrier().unwrap();
        (pg.rank(), values(&sum), values(&b), values(&gathered), values(&shard), values(&reduced))
    });
    for (rank, sum, b, gathered, shard, reduced) in got {
        if rank == 1 {
            assert_eq!(reduced, vec![3.0, 6.0]);
        }
        assert_eq!(sum, vec![3.0, 6.0, 9.0, 12.0, 15.0, 18.0], "rank {rank}");
        assert_eq!(b, vec![30.0; 4], "rank {rank}");
        assert_eq!(gathered, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0], "rank {rank}");
        let k = rank as f32;
        assert_eq!(shard, vec![6.0 * 2.0 * k, 6.0 * (2.0 * k + 1.0)], "rank {rank}");
    }
}

/// Ranks that publish different values are refused on every rank, and
/// the message names the rank that differs.
#[test]
fn ranks_that_disagree_are_named_on_every_rank() {
    let got = on_ranks(3, |pg| {
        let same = pg.agree("binary", "abc");
        let mine = if pg.rank() == 1 { "config-b" } else { "config-a" };
        (same.is_ok(), pg.agree("config", mine).map_err(|e| e.to_string()))
    });
    for (same, differ) in got {
        assert!(same);
        let e = differ.unwrap_err();
        assert!(e.contains("rank 1 has config-b") && e.contains("rank 0 has config-a"), "{e}");
    }
}

/// A rank that never joins ends the others' wait for it with an error
/// after the timeout, not a hang; an unreachable store is an error too.
#[test]
fn a_missing_rank_or_store_times_out_with_an_error() {
    let server = Store::serve("127.0.0.1", 0, None, TIMEOUT).unwrap();
    let store = Store::connect("127.0.0.1", server.port(), "", None, Duration::from_secs(2)).unwrap();
    let t0 = Instant::now();
    // Rank 0 of 2; rank 1 never comes.
    let e = ProcessGroup::over(store, "lonely/", 0, 2, Duration::from_secs(2)).err().expect("no second rank");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(e.to_string().contains("rank 0 of 2"), "{e}");
    // A port nothing listens on (the server's, after it closed).
    let port = {
        let s = Store::serve("127.0.0.1", 0, None, TIMEOUT).unwrap();
        s.port()
    };
    let e = Store::connect("127.0.0.1", port, "", None, Duration::from_secs(2)).err().expect("nothing listens");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
}

/// The libtorch loaded here is the one the shim was built against (the
/// pinned wheel), and a loaded libtorch of another version, or one that
/// does not say, is refused with both versions named; a local version
/// suffix (`+cu130`) does not count.
#[test]
fn a_libtorch_of_another_version_is_refused_before_joining() {
    use r2vpo_llm::parallel::c10d::{check_torch_version, torch_versions_agree};
    check_torch_version().unwrap();
    let config =
        |v: &str| format!("PyTorch built with:\n  - Build settings: BLAS_INFO=mkl, TORCH_VERSION={v}, USE_CUDA=ON,\n");
    torch_versions_agree("2.11.0", &config("2.11.0")).unwrap();
    torch_versions_agree("2.11.0", &config("2.11.0+cu130")).unwrap();
    let e = torch_versions_agree("2.11.0", &config("2.10.1")).unwrap_err().to_string();
    assert!(e.contains("2.11.0") && e.contains("2.10.1") && e.contains("LD_LIBRARY_PATH"), "{e}");
    let e = torch_versions_agree("2.11.0", "PyTorch built with:\n").unwrap_err().to_string();
    assert!(e.contains("does not say"), "{e}");
}
