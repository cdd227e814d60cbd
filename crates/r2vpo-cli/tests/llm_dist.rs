//! Data-parallel `llm train` (torch backend on libtorch's CPU kernels, real
//! ranks over Gloo on loopback, each sampling its share of the batch)
//! against the one-process run on the same global batch: the samples,
//! per-iteration metrics (loss, gradient norm, E[(ρ−1)²], λ, ratio
//! statistics) and the weights after the last step agree within a
//! stated tolerance, for each loss aggregation mode, for R²VPO-OFF with
//! replay, and across a resume on another number of ranks.
//!
//! Tolerance: a rank sums its share of the micro-batches' gradients and
//! the ranks' sums are added, where one process adds them one after the
//! other; the two differ by the rounding of f32 sums (≈ 1e-7 relative).
//! AdamW divides each gradient element by its running RMS, so on elements
//! whose gradient is near zero that rounding can flip an update's sign: a
//! weight may then differ by up to about 2·lr per step, 8e-5 over the four
//! steps at lr 1e-5 here (measured: at most 3e-6), and the figures of later
//! steps by a few 1e-5 relative (measured: at most 2.5e-5, on λ). The test
//! allows 1e-5 on weights and 1e-4 relative on figures; an error in the
//! reduction (a rank's share of the gradient left out, a rank-local
//! instead of the global normaliser, λ moved by one rank's statistics)
//! changes the gradient norm or λ by percents.
#![cfg(feature = "torch")]

use std::path::Path;
use std::process::Command;

mod common;

use common::root;

fn sets(extra: &[&str]) -> Vec<String> {
    let mut s = common::tiny_torch_run();
    s.extend([
        "iterations=2".into(),
        "prompts_per_iter=4".into(),
        // One group (8 samples) per sampler call: the batch's four calls
        // are dealt to the ranks 2/2 or 2/1/1.
        "rollout_batch=8".into(),
        // Two optimizer steps per iteration (ρ ≠ 1 on the second), each
        // of four micro-batches: ranks hold 2/2 or 2/1/1 of them.
        "minibatch_size=16".into(),
        "micro_batch_size=4".into(),
        "histogram_every=1".into(),
        "eval_at_end=false".into(),
        "optim.lr=1e-5".into(),
        // λ moves every step (a tiny δ, a large η), so a λ that one rank moved
        // alone would show.
        "dual.mode=adaptive".into(),
        "dual.eta=1000".into(),
        "dual.delta=1e-9".into(),
    ]);
    s.extend(extra.iter().map(|x| x.to_string()));
    s
}

/// Runs `llm train` into `out`, alone (`ranks` 1) or under `r2vpo launch`.
fn train(out: &Path, ranks: usize, extra: &[&str], resume: bool) {
    run(out, (ranks > 1).then_some(ranks), extra, resume);
}

/// Runs `llm train` into `out`: under `r2vpo launch` with `launched`
/// ranks, or (`None`) as a plain process; returns its stderr.
fn run(out: &Path, launched: Option<usize>, extra: &[&str], resume: bool) -> String {
    let ranks = launched.unwrap_or(1);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    cmd.current_dir(root()).args(["--threads", "1"]);
    if let Some(n) = launched {
        cmd.args(["launch", "--nproc-per-node", &n.to_string(), "--master-port", "0", "--"]);
    }
    cmd.args(["llm", "train", "--quiet", "--no-export"]);
    if resume {
        cmd.args(["--resume", out.to_str().unwrap()]);
    } else {
        cmd.args(["--config", "configs/llm/gpu-smoke.toml", "--out", out.to_str().unwrap()]);
    }
    for s in sets(extra) {
        cmd.args(["--set", &s]);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{ranks} rank(s) {extra:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What must agree; the last three depend only on the samples, so they
/// show that ranks sampling their shares drew the one-process batch.
const FIGURES: [&str; 9] =
    ["loss", "grad_norm", "sq_dev", "lambda", "ratio_mean", "ratio_max", "reward_mean", "response_len_mean", "entropy"];

fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn weights(run: &Path) -> Vec<f32> {
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let dir = run.join("checkpoints").join(latest.trim());
    let adapter = dir.join("adapter/adapter_model.safetensors");
    let file = if adapter.exists() { adapter } else { dir.join("model.safetensors") };
    let t = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
    let mut names: Vec<&String> = t.keys().collect();
    names.sort();
    names.iter().flat_map(|n| t[*n].flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect()
}

fn assert_same(one: &Path, many: &Path, what: &str) {
    let (a, b) = (metrics(one), metrics(many));
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(&b) {
        for k in FIGURES {
            let (p, q) = (x[k].as_f64().unwrap(), y[k].as_f64().unwrap());
            assert!((p - q).abs() <= 1e-4 * p.abs().max(q.abs()).max(1e-3), "{what}: {k} {p} vs {q}\n{x}\n{y}");
        }
        assert!(x["lambda"].as_f64().unwrap() > 0.0, "{what}: λ never moved: {x}");
    }
    // Each rank's peak memory, on rank 0's record.
    let rss = b.last().unwrap()["rank_peak_rss_mib"].as_array().cloned().unwrap_or_default();
    assert!(!rss.is_empty() && rss.iter().all(|v| v.as_f64().unwrap() > 10.0), "{what}: {rss:?}");
    // And what its checkpoints cost each rank (the run ends with one).
    let events = std::fs::read_to_string(many.join("events.jsonl")).unwrap();
    let ckpt: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "checkpoint_memory")
        .collect();
    assert!(!ckpt.is_empty(), "{what}: no checkpoint_memory event");
    for c in &ckpt {
        let peaks = c["rank_peak_rss_mib"].as_array().unwrap();
        assert!(!peaks.is_empty() && peaks.iter().all(|v| v.as_f64().unwrap() > 10.0), "{what}: {c}");
    }
    // The last is the last run's (a resumed run may have another size).
    let last = ckpt.last().unwrap()["rank_peak_rss_mib"].as_array().unwrap().len();
    assert_eq!(last, rss.len(), "{what}: {}", ckpt.last().unwrap());
    // Each rank trained its share of the tokens, which add up to the
    // step's (a rank that trained every micro-batch would report all).
    for x in &b {
        let tokens: Vec<u64> = x["rank_train_tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let all = x["trained_tokens"].as_u64().unwrap();
        assert_eq!(tokens.iter().sum::<u64>(), all, "{what}: {x}");
        assert!(tokens.len() == 1 || tokens.iter().all(|&t| t < all), "{what}: {x}");
    }
    // Each rank sampled its calls' groups (a resumed run's ranks may
    // change from one iteration to the next).
    for x in b.iter().filter(|x| x["queue"].is_null()) {
        let n = x["rank_peak_rss_mib"].as_array().unwrap().len();
        let got: Vec<u64> = x["rank_rollout_groups"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let dealt: Vec<u64> = (0..n).map(|r| (0..4).filter(|c| c % n == r).count() as u64).collect();
        assert_eq!(got, dealt, "{what}: groups sampled per rank");
    }
    // Four calls over two or three ranks: every rank samples, and nothing
    // says otherwise.
    let events = std::fs::read_to_string(many.join("events.jsonl")).unwrap();
    assert!(!events.contains("ranks_idle_in_rollout"), "{what}: {events}");
    // `--threads 1` reached libtorch in the single process and in each rank.
    for run in [one, many] {
        let started = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
        let line = started.lines().find(|l| l.contains("run_started")).expect("a run_started event");
        assert!(line.contains("cpu (1 threads)"), "{what}: {line}");
    }
    let hist = |r: &Path| std::fs::read_to_string(r.join("ratio_hist.jsonl")).unwrap().lines().count();
    assert_eq!(hist(one), hist(many), "{what}: histogram lines");
    let (w1, w2) = (weights(one), weights(many));
    assert_eq!(w1.len(), w2.len());
    let worst = w1.iter().zip(&w2).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "{what}: weights differ by {worst}");
}

/// Two and three ranks give the one-process run, in every aggregation
/// mode, with the optimizer state sharded (ZeRO-1, the default) or not,
/// and with LoRA adapters.
#[test]
fn ranks_train_what_one_process_trains_in_every_aggregation_mode() {
    let tmp = tempfile::tempdir().unwrap();
    for (agg, ranks) in
        [("token-mean", 3), ("seq-mean-token-mean", 2), ("seq-mean-token-sum", 2), ("seq-mean-token-sum-norm", 2)]
    {
        let set = format!("objective.aggregation={agg}");
        let one = tmp.path().join(format!("{agg}-1"));
        let many = tmp.path().join(format!("{agg}-{ranks}"));
        train(&one, 1, &[&set], false);
        train(&many, ranks, &[&set], false);
        assert_same(&one, &many, &format!("{agg}, {ranks} ranks"));
        if agg == "token-mean" {
            // ZeRO-1 (the default): the ranks' moments add up to the
            // model's; unsharded (every rank keeps every moment), the same run.
            let shard = sharding(&many);
            let per = per_rank(&shard);
            assert_eq!((per.len(), per.iter().sum::<u64>()), (3, shard["moment_values_total"].as_u64().unwrap()));
            // In f32 the masters are the compute weights: every rank holds all.
            let all = shard["master_values_total"].as_u64().unwrap();
            assert_eq!(per_rank_of(&shard, "master_values_per_rank"), vec![all; 3], "{shard}");
            let replicated = tmp.path().join("token-mean-3-zero0");
            train(&replicated, 3, &[&set, "dist.zero_stage=0"], false);
            assert_same(&one, &replicated, "token-mean, 3 ranks, ZeRO-0");
            assert!(!std::fs::read_to_string(replicated.join("events.jsonl")).unwrap().contains("optimizer_sharded"));
            // ZeRO-2: the gradients summed into their owners after every
            // round of micro-batches (4 micro-batches: rounds of 3 and 1).
            let zero2 = tmp.path().join("token-mean-3-zero2");
            train(&zero2, 3, &[&set, "dist.zero_stage=2"], false);
            assert_same(&one, &zero2, "token-mean, 3 ranks, ZeRO-2");
            assert_eq!(sharding(&zero2)["zero_stage"], 2);
        }
    }
    // With LoRA the trained tensors are many small adapters (the tiny
    // model's embedding, at the tokenizer's 49,152 rows, would otherwise
    // hold 95 % of the moments in one tensor): each of 3 ranks keeps a
    // third of the moments, to within one adapter.
    let lora = ["model.lora.rank=4", "model.lora.alpha=8"];
    let one = tmp.path().join("lora-1");
    let many = tmp.path().join("lora-3");
    train(&one, 1, &lora, false);
    train(&many, 3, &lora, false);
    assert_same(&one, &many, "LoRA, 3 ranks");
    let shard = sharding(&many);
    let (per, total) = (per_rank(&shard), shard["moment_values_total"].as_u64().unwrap());
    let adapter = 2 * 4 * (256 + 128); // the largest adapter's A and B (down_proj), m and v
    assert!(per.iter().all(|&p| p.abs_diff(total / 3) <= adapter as u64), "{shard}");
}

/// With bf16 compute the f32 master weights are sharded too (Megatron's
/// distributed optimizer): each rank holds the others' parameters in bf16
/// only, adds their bf16 gradients into f32 after every backward pass, and
/// receives them in bf16 after each step; rank 0 gathers the masters
/// before a checkpoint. The run is the one-process bf16 run, and the ranks'
/// masters add up to the model's.
#[test]
fn sharded_master_weights_train_what_one_process_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = ["model.compute_dtype=bf16"];
    let one = tmp.path().join("bf16-1");
    let many = tmp.path().join("bf16-3");
    train(&one, 1, &bf16, false);
    train(&many, 3, &bf16, false);
    assert_same(&one, &many, "bf16, 3 ranks, sharded masters");
    let shard = sharding(&many);
    let masters = per_rank_of(&shard, "master_values_per_rank");
    let total = shard["master_values_total"].as_u64().unwrap();
    assert_eq!(masters.iter().sum::<u64>(), total, "{shard}");
    // The embedding (49,152 × 64) is most of the tiny model, so one rank
    // holds it and the others the rest: every rank holds less than all.
    assert!(masters.iter().all(|&m| m > 0 && m < total), "{shard}");
    // The checkpoint holds every master (rank 0 gathered them), so a run
    // of 2 ranks resumes on 3 as the one-process run goes on.
    let whole = tmp.path().join("bf16-whole");
    train(&whole, 1, &["model.compute_dtype=bf16", "iterations=3"], false);
    let split = tmp.path().join("bf16-split");
    train(&split, 2, &["model.compute_dtype=bf16", "iterations=2"], false);
    train(&split, 3, &["model.compute_dtype=bf16", "iterations=3"], true);
    assert_same(&whole, &split, "bf16, 2 ranks, then resumed on 3");
    // ZeRO-2 with sharded masters: the gradients of other ranks' bf16
    // parameters go to their owners every round.
    let zero2 = tmp.path().join("bf16-3-zero2");
    train(&zero2, 3, &["model.compute_dtype=bf16", "dist.zero_stage=2"], false);
    assert_same(&one, &zero2, "bf16, 3 ranks, ZeRO-2");
}

/// A batch of fewer sampler calls than ranks leaves ranks idle in the
/// rollout: rank 0 says so once, with the `rollout_batch` that spreads it
/// (on stderr and as an `events.jsonl` line), and the run still trains.
/// Four groups of 8 at `rollout_batch = 32` are one call, so only rank 0
/// of 2 samples; 16 or less would give both ranks a call.
#[test]
fn ranks_left_without_a_sampler_call_are_named_with_the_remedy() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("one-call");
    let stderr = run(&out, Some(2), &["rollout_batch=32", "iterations=1"], false);
    assert!(stderr.contains("only 1 of 2 ranks sample") && stderr.contains("rollout_batch = 16 or less"), "{stderr}");
    assert_eq!(stderr.matches("ranks sample").count(), 1, "said once, by rank 0: {stderr}");
    let events = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    let line = events.lines().find(|l| l.contains("ranks_idle_in_rollout")).expect("an idle-ranks event");
    let e: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!((e["sampling_ranks"].as_u64(), e["world"].as_u64()), (Some(1), Some(2)), "{e}");
    assert_eq!(e["rollout_batch_for_every_rank"].as_u64(), Some(16), "{e}");
    let m = metrics(&out);
    let groups: Vec<u64> =
        m[0]["rank_rollout_groups"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(groups, vec![4, 0], "rank 0 sampled the one call");
}

/// A launched job of one rank (`torchrun --nproc-per-node 1`) runs the
/// data-parallel path — the process group, the sampled groups exchanged,
/// gradients summed in buckets, the optimizer "sharded" over one rank,
/// ZeRO-2's per-round reduce — and trains what a plain process trains:
/// what the GPU check times against the plain step (scripts/gpu/check.sh).
#[test]
fn a_launched_job_of_one_rank_trains_what_one_process_trains() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, extra) in [("f32", &[][..]), ("bf16-zero2", &["model.compute_dtype=bf16", "dist.zero_stage=2"][..])] {
        let one = tmp.path().join(format!("{name}-plain"));
        let launched = tmp.path().join(format!("{name}-launched"));
        run(&one, None, extra, false);
        run(&launched, Some(1), extra, false);
        assert_same(&one, &launched, &format!("{name}, a launched job of one rank"));
        // The plain process has no group; the launched one shards over one.
        assert!(!std::fs::read_to_string(one.join("events.jsonl")).unwrap().contains("optimizer_sharded"));
        let shard = sharding(&launched);
        assert_eq!(per_rank(&shard), vec![shard["moment_values_total"].as_u64().unwrap()], "{name}: {shard}");
        assert!(metrics(&one).iter().all(|x| x["rank_rollout_groups"].is_null()), "{name}: the plain run");
    }
}

fn per_rank_of(shard: &serde_json::Value, key: &str) -> Vec<u64> {
    shard[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

fn per_rank(shard: &serde_json::Value) -> Vec<u64> {
    per_rank_of(shard, "moment_values_per_rank")
}

/// The `optimizer_sharded` event rank 0 wrote.
fn sharding(run: &Path) -> serde_json::Value {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["event"] == "optimizer_sharded")
        .expect("an optimizer_sharded event")
}

/// R²VPO-OFF's replay draws are the same on every rank, so its steps are
/// the one-process steps too; and a run of 2 ranks resumes on 3.
#[test]
fn replay_and_a_resume_on_another_number_of_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let off = ["mode=off", "replay.capacity_iters=2", "replay.utd=1.5", "replay.minibatch_size=16"];
    let one = tmp.path().join("off-1");
    let many = tmp.path().join("off-2");
    train(&one, 1, &off, false);
    train(&many, 2, &off, false);
    assert_same(&one, &many, "R²VPO-OFF, 2 ranks");

    let whole = tmp.path().join("whole");
    train(&whole, 1, &["iterations=3"], false);
    let split = tmp.path().join("split");
    train(&split, 2, &["iterations=2"], false);
    train(&split, 3, &["iterations=3"], true);
    assert_same(&whole, &split, "2 ranks, then resumed on 3");
    // With ZeRO-2 the checkpoint is the same: the moments gathered, the
    // gradients (dropped after every step) never in it.
    let split2 = tmp.path().join("split-zero2");
    train(&split2, 2, &["iterations=2", "dist.zero_stage=2"], false);
    train(&split2, 3, &["iterations=3", "dist.zero_stage=2"], true);
    assert_same(&whole, &split2, "ZeRO-2, 2 ranks, then resumed on 3");
}

/// The asynchronous learner across ranks: rank 0 holds the queue and its
/// actor thread, takes each iteration's groups and sends them to rank 1.
/// With `actors.max_staleness = 0` every batch is sampled with the weights
/// of the iteration that learns from it, so the job trains what one
/// synchronous process trains.
#[test]
fn the_asynchronous_learner_trains_across_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("sync-1");
    let many = tmp.path().join("async-2");
    train(&one, 1, &[], false);
    train(&many, 2, &["actors.async=true", "actors.max_staleness=0"], false);
    assert_same(&one, &many, "asynchronous learner, 2 ranks");
    for x in metrics(&many) {
        assert_eq!((x["queue"]["groups"].as_u64(), x["queue"]["stale_dropped"].as_u64()), (Some(4), Some(0)), "{x}");
        assert!(x["rank_rollout_groups"].is_null(), "{x}");
    }
}

/// Starts `llm train` on 2 ranks under `r2vpo launch` (`launch_args`
/// before its `--`) into `run`, with the test's settings and `extra`, and
/// returns the launcher once the run's first checkpoint exists.
fn launch_until_checkpoint(run: &Path, launch_args: &[&str], extra: &[&str]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    cmd.current_dir(root()).args(["--threads", "1", "launch", "--nproc-per-node", "2", "--master-port", "0"]);
    cmd.args(launch_args).args(["--", "llm", "train", "--quiet", "--no-export"]);
    cmd.args(["--config", "configs/llm/gpu-smoke.toml", "--out", run.to_str().unwrap()]);
    for s in sets(extra) {
        cmd.args(["--set", &s]);
    }
    let launch = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let t0 = std::time::Instant::now();
    while !run.join("checkpoints/latest").exists() {
        assert!(t0.elapsed().as_secs() < 120, "no checkpoint after 120 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    launch
}

/// SIGINT to `r2vpo launch` stops an asynchronous job of 2 ranks with a
/// checkpoint (whether rank 0 was waiting on its queue, when it tells rank
/// 1 to give its optimizer shares, or learning, when the ranks agree to
/// stop after the iteration), and the run resumes on 2 ranks to its end.
#[test]
fn an_interrupted_asynchronous_job_stops_with_a_checkpoint_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut launch = launch_until_checkpoint(&run, &[], &["iterations=40", "actors.async=true"]);
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(launch.id() as i32, libc::SIGINT) };
    let t_stop = std::time::Instant::now();
    let status = launch.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(launch.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(t_stop.elapsed().as_secs() < 60, "{:?}", t_stop.elapsed());
    assert!(!status.success() && err.contains("--resume"), "{status:?}\n{err}");
    let done = metrics(&run).len();
    assert!(done < 40, "the job ran to its end before the signal: {err}");
    train(&run, 2, &["iterations=40", "actors.async=true"], true);
    assert_eq!(metrics(&run).len(), 40);
}

/// A rank killed in the middle of a run ends the job with an error naming
/// it; the newest checkpoint is intact, and the run resumes from it (here
/// in one process) to the end.
#[test]
fn a_killed_rank_ends_the_job_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut launch = launch_until_checkpoint(&run, &["--grace-secs", "10"], &["iterations=40"]);
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", launch.id(), launch.id())).unwrap();
    let follower: i32 = children.split_whitespace().nth(1).expect("two ranks").parse().unwrap();
    // SAFETY: kill(2) on rank 1, which `launch` started.
    unsafe { libc::kill(follower, libc::SIGKILL) };
    let t_kill = std::time::Instant::now();
    let status = launch.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(launch.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    // Rank 1's death, or rank 0's error at its next collective (whichever
    // `launch` sees first) names the failure.
    assert!(err.contains("rank 1 exited with signal: 9") || err.contains("rank 0 exited with exit status"), "{err}");
    assert!(t_kill.elapsed().as_secs() < 60, "{:?}", t_kill.elapsed());
    // Resumed alone, with fewer iterations to go.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    cmd.current_dir(root()).args(["--threads", "1", "llm", "train", "--quiet", "--no-export", "--resume"]);
    cmd.args([run.to_str().unwrap(), "--set", "iterations=8"]);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(metrics(&run).len(), 8);
}

/// Evaluation across ranks: every rank decodes its share of the
/// evaluation's batches (no rank waits out a whole evaluation in a
/// collective), and rank 0's `eval.jsonl` and per-evaluation reports equal
/// the one-process run's sample for sample, the response texts in the
/// same order, at the start and at the end of a run, on 2 and 3 ranks
/// (6 batches: 3/3 and 2/2/2).
#[test]
fn ranks_evaluate_their_shares_and_rank_0_reports_the_one_process_evaluation() {
    let tmp = tempfile::tempdir().unwrap();
    let ev = [
        "iterations=1",
        "eval_at_start=true",
        "eval_at_end=true",
        "eval.data.count=12",
        "eval.k=2",
        "eval.batch_size=4",
        "eval.sampling.max_new_tokens=8",
        "eval.save_responses=true",
    ];
    let report = |run: &Path, iter: usize| -> serde_json::Value {
        let f = run.join("eval").join(format!("iter-{iter:06}.json"));
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        for timing in ["wall_seconds", "tokens_per_s"] {
            v.as_object_mut().unwrap().remove(timing);
        }
        v
    };
    // Each rank's share, on the record: 6 batches of 4 samples dealt in
    // turn; then the report without it.
    let shared = |run: &Path, iter: usize| -> (Vec<u64>, serde_json::Value) {
        let mut v = report(run, iter);
        let ranks = v.as_object_mut().unwrap().remove("rank_samples").unwrap_or_default();
        let ranks = ranks.as_array().map_or(vec![], |a| a.iter().map(|x| x.as_u64().unwrap()).collect());
        (ranks, v)
    };
    let evals = |run: &Path| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(run.join("eval.jsonl")).unwrap();
        text.lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("seconds");
                v
            })
            .collect()
    };
    let one = tmp.path().join("one");
    train(&one, 1, &ev, false);
    let base = evals(&one);
    assert_eq!(base.len(), 2, "{base:?}");
    assert_eq!(base[0]["problems"], 12);
    // 12 problems with their k = 2 response texts, which the ranks' reports
    // must give in the same order.
    let problems = report(&one, 1)["problems"].as_array().unwrap().clone();
    assert_eq!(problems.len(), 12);
    assert!(problems.iter().all(|p| p["responses"].as_array().is_some_and(|r| r.len() == 2)), "{problems:?}");
    for ranks in [2, 3] {
        let many = tmp.path().join(format!("ranks-{ranks}"));
        train(&many, ranks, &ev, false);
        assert_eq!(evals(&many), base, "{ranks} ranks: eval.jsonl");
        for iter in [0, 1] {
            let (split, rest) = shared(&many, iter);
            let want: Vec<u64> = (0..ranks).map(|r| (0..6).filter(|b| b % ranks == r).count() as u64 * 4).collect();
            assert_eq!(split, want, "{ranks} ranks: samples per rank after iteration {iter}");
            assert_eq!(rest, report(&one, iter), "{ranks} ranks: the report after iteration {iter}");
        }
        assert!(report(&one, 0).get("rank_samples").is_none(), "one process reports no split");
    }
}

/// A rollout that fails under data parallelism (rollout servers that are
/// gone: rank 0 asks them for the batch) ends every rank at the same point
/// with the real error, names it on rank 0 with the resume command, and
/// leaves a checkpoint of the gathered optimizer state; the ranks do not
/// wait out the collective timeout. It guards against rank 0 writing a
/// checkpoint of ungathered ZeRO state and reporting that refusal in place
/// of the rollout error while rank 1 dies in the broadcast of the batch.
#[test]
fn a_failed_rollout_under_data_parallelism_keeps_the_real_error_and_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    cmd.current_dir(root()).args(["--threads", "1", "launch", "--nproc-per-node", "2", "--master-port", "0", "--"]);
    cmd.args(["llm", "train", "--quiet", "--no-export", "--config", "configs/llm/gpu-smoke.toml"]);
    cmd.args(["--out", out.to_str().unwrap()]);
    let extra = [
        "rollout.backend=\"http\"",
        // Nothing listens on port 9.
        "rollout.urls=[\"http://127.0.0.1:9\"]",
        "rollout.retries=1",
        "rollout.backoff_s=0.05",
        "rollout.connect_timeout_s=2",
        "dist.timeout_s=600",
    ];
    for s in sets(&[]).iter().map(String::as_str).chain(extra) {
        cmd.args(["--set", s]);
    }
    let t0 = std::time::Instant::now();
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(t0.elapsed().as_secs() < 120, "the ranks waited {:?}: {err}", t0.elapsed());
    assert!(err.contains("no rollout server is available"), "the real error: {err}");
    assert!(!err.contains("optimizer state is sharded"), "not a checkpoint refusal: {err}");
    assert!(err.contains("continue with: r2vpo llm train --resume"), "{err}");
    assert!(out.join("checkpoints/latest").exists(), "a checkpoint: {err}");
}

/// A launcher's restart (torchrun `--max-restarts`, a requeued Slurm job)
/// runs the same command again, with `TORCHELASTIC_RESTART_COUNT` (or
/// `SLURM_RESTART_COUNT`) above 0: it continues the run from its newest
/// checkpoint, and what was logged stays as it was.
#[test]
fn a_restarted_job_continues_its_run_with_the_same_command() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    // What an attempt that died after iteration 2's checkpoint leaves.
    train(&run_dir, 1, &["iterations=2"], false);
    let before = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let restart = |out: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
        cmd.current_dir(root()).args(["--threads", "1", "llm", "train", "--quiet", "--no-export"]);
        cmd.args(["--config", "configs/llm/gpu-smoke.toml"]);
        cmd.args(["--out", out.to_str().unwrap()]);
        for s in sets(&["iterations=3"]) {
            cmd.args(["--set", &s]);
        }
        for (k, v) in [("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("TORCHELASTIC_RESTART_COUNT", "1")] {
            cmd.env(k, v);
        }
        cmd.env("MASTER_ADDR", "127.0.0.1").output().unwrap()
    };
    let o = restart(&run_dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("resuming"), "{err}");
    let after = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    assert!(after.starts_with(&before), "the first attempt's lines changed:\n{before}\n{after}");
    assert_eq!(after.lines().count(), 3);
}
