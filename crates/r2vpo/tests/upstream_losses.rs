//! The 2026 loss menu against the published code: each objective's loss and
//! its gradient with respect to the log-probs, on seeded batches, compared
//! with verl 0.9.1's policy-loss registry and TRL 1.16.0's
//! `GRPOTrainer._compute_loss`, run by scripts/losses/cases.py in the pinned
//! venv `make deps` makes (scripts/losses/venv.sh). Float64 on both sides.
//!
//! M2PO's mask is AReaL 1.0.4's own (`_apply_m2po_masking`, read out of
//! the installed file), with the M2PO paper's objective on the kept tokens
//! written in the harness. Losses without importable upstream code are
//! checked against their papers' equations in `objective.rs`'s unit tests
//! instead: SPO (its code is Atari/MuJoCo only) and the log-ratio² penalty
//! (prime-rl is not a library).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use candle_core::{DType, Device, Tensor, Var};
use r2vpo::aggregate::GlobalBatch;
use r2vpo::correction::{self, RolloutCorrection};
use r2vpo::objective::{ObjectiveConfig, ObjectiveKind, PolicyBatch};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

type Grid = Vec<Vec<f64>>;

/// One seeded batch: rows of different lengths, one advantage per row (the
/// GRPO shape TRL takes), behaviour and engine log-probs near the current.
struct Batch {
    logp: Grid,
    old: Grid,
    rollout: Grid,
    adv: Grid,
    mask: Grid,
}

fn batch(seed: u64, b: usize, t: usize, spread: f64) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x = Batch { logp: vec![], old: vec![], rollout: vec![], adv: vec![], mask: vec![] };
    for i in 0..b {
        let len = if i == 0 { t } else { rng.random_range(2..=t) };
        let logp: Vec<f64> = (0..t).map(|_| rng.random_range(-3.0..-0.02)).collect();
        let old: Vec<f64> = logp.iter().map(|l| (l - rng.random_range(-spread..spread)).min(-1e-3)).collect();
        x.rollout.push(old.iter().map(|l| (l - rng.random_range(-0.4..0.4)).min(-1e-3)).collect());
        x.old.push(old);
        x.logp.push(logp);
        let a = rng.random_range(-1.5..1.5);
        x.adv.push(vec![a; t]);
        x.mask.push((0..t).map(|j| f64::from(u8::from(j < len))).collect());
    }
    x
}

fn tensor(g: &Grid) -> Tensor {
    Tensor::from_vec(g.concat(), (g.len(), g[0].len()), &Device::Cpu).unwrap()
}

/// Our loss, d loss / d logp, and the fraction of tokens the objective masked.
fn ours(cfg: &ObjectiveConfig, x: &Batch, weights: Option<&Grid>) -> (f64, Grid, f64) {
    let var = Var::from_tensor(&tensor(&x.logp)).unwrap();
    let (old, adv, mask) = (tensor(&x.old), tensor(&x.adv), tensor(&x.mask));
    let w = weights.map(tensor);
    let global = GlobalBatch::from_mask(&mask).unwrap();
    let pb = PolicyBatch { logp: var.as_tensor(), old_logp: &old, advantages: &adv, mask: &mask, weights: w.as_ref() };
    let out = cfg.loss(&pb, 0.0, &global).unwrap();
    let grad = out.loss.backward().unwrap().get(var.as_tensor()).unwrap().to_dtype(DType::F64).unwrap();
    (out.loss.to_scalar::<f64>().unwrap(), grad.to_vec2().unwrap(), out.stats.masked_frac)
}

/// The correction's weights, row by row as the trainer computes them.
fn correction_weights(x: &Batch, mode: RolloutCorrection, cap: f64) -> Grid {
    x.old
        .iter()
        .zip(&x.rollout)
        .zip(&x.mask)
        .map(|((o, r), m)| {
            let n = m.iter().filter(|&&v| v > 0.0).count();
            let f = |v: &[f64]| v[..n].iter().map(|&y| y as f32).collect::<Vec<f32>>();
            let (w, _) = correction::weights(mode, cap, &f(o), &f(r));
            let mut row: Vec<f64> = w.into_iter().map(f64::from).collect();
            row.resize(o.len(), 0.0);
            row
        })
        .collect()
}

struct Pair {
    name: String,
    cfg: ObjectiveConfig,
    weights: Option<(RolloutCorrection, f64)>,
    upstream: Value,
    /// Relative tolerance on the loss and every gradient entry.
    tol: f64,
}

fn pair(name: &str, cfg: ObjectiveConfig, imp: &str, loss: &str, params: Value) -> Pair {
    Pair {
        name: name.to_string(),
        cfg,
        weights: None,
        upstream: json!({"impl": imp, "loss": loss, "params": params}),
        tol: 1e-10,
    }
}

fn kind(kind: ObjectiveKind) -> ObjectiveConfig {
    ObjectiveConfig { kind, ..ObjectiveConfig::default() }
}

fn preset(name: &str) -> ObjectiveConfig {
    ObjectiveConfig::preset(name).unwrap()
}

fn pairs(t: usize) -> Vec<Pair> {
    let nodual = |c: ObjectiveConfig| ObjectiveConfig { dual_clip: None, ..c };
    let mut v = vec![
        pair("grpo = verl vanilla", preset("grpo"), "verl", "vanilla", json!({"clip_ratio_c": 3.0})),
        pair(
            "grpo-ch = verl vanilla 0.2/0.28",
            preset("grpo-ch"),
            "verl",
            "vanilla",
            json!({"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}),
        ),
        pair(
            "clip-higher without dual-clip = TRL dapo",
            nodual(preset("grpo-ch")),
            "trl",
            "dapo",
            json!({"epsilon": 0.2, "epsilon_high": 0.28}),
        ),
        pair(
            "dr-grpo = TRL dr_grpo",
            nodual(preset("dr-grpo")),
            "trl",
            "dr_grpo",
            json!({"epsilon": 0.2, "max_completion_length": t}),
        ),
        pair(
            "dr-grpo = verl vanilla seq-mean-token-sum-norm",
            preset("dr-grpo"),
            "verl",
            "vanilla",
            json!({"loss_agg_mode": "seq-mean-token-sum-norm", "clip_ratio_c": 3.0}),
        ),
        pair(
            "gspo = verl gspo",
            preset("gspo"),
            "verl",
            "gspo",
            json!({"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4, "loss_agg_mode": "seq-mean-token-mean"}),
        ),
        pair(
            "gspo at ε 0.2 = verl gspo",
            ObjectiveConfig { eps_low: 0.2, eps_high: 0.2, ..preset("gspo") },
            "verl",
            "gspo",
            json!({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "loss_agg_mode": "seq-mean-token-mean"}),
        ),
        pair(
            "gspo at ε 0.2 = TRL grpo, sequence level",
            ObjectiveConfig { eps_low: 0.2, eps_high: 0.2, ..preset("gspo") },
            "trl",
            "grpo",
            json!({"epsilon": 0.2, "importance_sampling_level": "sequence"}),
        ),
        pair("cispo = TRL cispo", preset("cispo"), "trl", "cispo", json!({"epsilon_high": 5.0})),
        pair(
            "cispo = verl cispo (no lower clamp, cap 5)",
            preset("cispo"),
            "verl",
            "cispo",
            json!({"clip_ratio_low": 10.0, "clip_ratio_high": 4.0}),
        ),
        pair(
            "cispo cap 1.1 = TRL cispo",
            ObjectiveConfig { cispo_cap: 1.1, ..preset("cispo") },
            "trl",
            "cispo",
            json!({"epsilon_high": 1.1}),
        ),
        pair("sapo = verl sapo", preset("sapo"), "verl", "sapo", json!({"tau_pos": 1.0, "tau_neg": 1.05})),
        pair(
            "sapo τ 1/1 = TRL sapo",
            ObjectiveConfig { sapo_tau_neg: 1.0, ..preset("sapo") },
            "trl",
            "sapo",
            json!({"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.0}),
        ),
        pair(
            "dppo-tv = verl dppo_tv (authors' δ, no truncation)",
            preset("dppo-tv"),
            "verl",
            "dppo_tv",
            json!({"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 10000.0}),
        ),
        pair(
            "dppo-tv truncated at 3 = verl dppo_tv defaults",
            ObjectiveConfig { eps_low: 0.1, eps_high: 0.1, dual_clip: Some(1.3), ..kind(ObjectiveKind::DppoTv) },
            "verl",
            "dppo_tv",
            json!({"clip_ratio_low": 0.1, "clip_ratio_high": 0.1, "clip_ratio_c": 1.3}),
        ),
        pair(
            "dppo-kl = verl dppo_kl",
            preset("dppo-kl"),
            "verl",
            "dppo_kl",
            json!({"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 10000.0}),
        ),
        pair(
            "dppo-kl δ 0.01/0.03 = verl dppo_kl",
            ObjectiveConfig { eps_low: 0.01, eps_high: 0.03, dual_clip: Some(2.0), ..kind(ObjectiveKind::DppoKl) },
            "verl",
            "dppo_kl",
            json!({"clip_ratio_low": 0.01, "clip_ratio_high": 0.03, "clip_ratio_c": 2.0}),
        ),
    ];
    for tau in [0.04, 0.005] {
        v.push(pair(
            &format!("m2po τ {tau} = AReaL's mask"),
            ObjectiveConfig { m2po_tau: tau, ..preset("m2po") },
            "areal",
            "m2po",
            json!({"m2_threshold": tau}),
        ));
    }
    // The SAPO temperatures of TRL are float32 (`torch.where` on Python
    // floats): τ₋ = 1.05 is 1.0499999523 there.
    v.push(Pair {
        tol: 1e-6,
        ..pair("sapo τ 1/1.05 = TRL sapo (its τ in f32)", preset("sapo"), "trl", "sapo", json!({}))
    });
    // Mismatch corrections: the engine's log-probs go upstream as
    // `rollout_logp`; ours are weights from correction::weights (f32, like
    // the trainer's samples).
    for (mode, imp, loss, params) in [
        (RolloutCorrection::TokenTis, "verl", "vanilla", json!({"rollout_is": "token", "rollout_is_threshold": 2.0})),
        (RolloutCorrection::SeqTis, "verl", "vanilla", json!({"rollout_is": "sequence", "rollout_is_threshold": 2.0})),
        (
            RolloutCorrection::TokenTis,
            "trl",
            "dapo",
            json!({"epsilon": 0.2, "vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 2.0}),
        ),
        (
            RolloutCorrection::TokenMis,
            "trl",
            "dapo",
            json!({"epsilon": 0.2, "vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_max": 1.2}),
        ),
        (
            RolloutCorrection::SeqMis,
            "trl",
            "dapo",
            json!({"epsilon": 0.2, "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 1.5}),
        ),
    ] {
        let cap = params
            .get("rollout_is_threshold")
            .or_else(|| params.get("vllm_importance_sampling_clip_max"))
            .and_then(Value::as_f64)
            .unwrap();
        let base = if imp == "verl" { preset("grpo") } else { nodual(preset("grpo")) };
        let cfg = ObjectiveConfig { rollout_correction: mode, rollout_correction_cap: cap, ..base };
        let mut params = params;
        if imp == "verl" {
            params["clip_ratio_c"] = json!(3.0);
        }
        v.push(Pair {
            weights: Some((mode, cap)),
            tol: 1e-6,
            ..pair(&format!("{} = {imp} {loss} {params}", mode.as_str()), cfg, imp, loss, params)
        });
    }
    v
}

fn grid(v: &Value) -> Grid {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().expect("finite gradient")).collect())
        .collect()
}

#[test]
fn every_menu_loss_matches_its_published_code() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".deps/venv-losses/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make deps` (it runs scripts/losses/venv.sh), which installs the pinned verl and TRL",
        python.display()
    );
    let t = 7;
    // Two spreads: near on-policy (most tokens inside the bands) and stale
    // (many clipped, masked, truncated).
    let batches = [batch(11, 5, t, 0.15), batch(12, 6, t, 0.9)];
    let pairs = pairs(t);
    let mut cases = Vec::new();
    for (bi, x) in batches.iter().enumerate() {
        for p in &pairs {
            let mut c = p.upstream.clone();
            c["name"] = json!(format!("{} [batch {bi}]", p.name));
            c["logp"] = json!(x.logp);
            c["old_logp"] = json!(x.old);
            c["advantages"] = json!(x.adv);
            c["mask"] = json!(x.mask);
            if p.weights.is_some() {
                c["rollout_logp"] = json!(x.rollout);
            }
            cases.push(c);
        }
    }
    let mut child = Command::new(&python)
        .arg(root.join("scripts/losses/cases.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/losses/cases.py");
    child.stdin.take().unwrap().write_all(json!({"cases": cases}).to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "cases.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), cases.len());

    let mut report = Vec::new();
    let mut failed = Vec::new();
    let mut dppo_masked = std::collections::BTreeMap::<String, f64>::new();
    let mut areal_masked = std::collections::BTreeMap::<String, f64>::new();
    for (k, theirs) in lines.iter().enumerate() {
        let (x, p) = (&batches[k / pairs.len()], &pairs[k % pairs.len()]);
        let name = theirs["name"].as_str().unwrap();
        assert!(theirs.get("error").is_none(), "{name}: upstream refused the case: {}", theirs["error"]);
        let w = p.weights.map(|(mode, cap)| correction_weights(x, mode, cap));
        let (loss, grad, masked) = ours(&p.cfg, x, w.as_ref());
        // M2PO: the same tokens masked as AReaL's mask.
        if let Some(keep) = theirs["metrics"].get("keep") {
            let keep = grid(keep);
            let valid: f64 = x.mask.iter().flatten().sum();
            let kept: f64 = keep.iter().flatten().zip(x.mask.iter().flatten()).map(|(k, m)| k * m).sum();
            let f = 1.0 - kept / valid;
            assert!((masked - f).abs() < 1e-12, "{name}: masked {masked} vs AReaL's {f}");
            *areal_masked.entry(p.name.clone()).or_insert(0.0) += f;
        }
        // DPPO's trust region: the same tokens masked as verl's metric says.
        if let Some(f) = theirs["metrics"].get("actor/pg_clipfrac").and_then(Value::as_f64) {
            if p.upstream["loss"].as_str().unwrap().starts_with("dppo") {
                assert!((masked - f).abs() < 1e-6, "{name}: masked {masked} vs verl's pg_clipfrac {f}");
                *dppo_masked.entry(p.name.clone()).or_insert(0.0) += f;
            }
        }
        let their_loss = theirs["loss"].as_f64().unwrap();
        let their_grad = grid(&theirs["grad"]);
        let scale = their_grad.iter().flatten().fold(their_loss.abs().max(1e-3), |s, g| s.max(g.abs()));
        let mut worst = (loss - their_loss).abs();
        for (a, b) in grad.iter().flatten().zip(their_grad.iter().flatten()) {
            worst = worst.max((a - b).abs());
        }
        report.push(format!("{name}: loss {loss:.6} vs {their_loss:.6}, worst |Δ| {worst:.2e}"));
        if worst > p.tol * scale {
            failed.push(format!("{name}: worst |Δ| {worst:.3e} > {:.0e}·{scale:.3}", p.tol));
        }
        // A case where nothing moves would compare nothing.
        assert!(their_grad.iter().flatten().any(|g| *g != 0.0), "{name}: upstream gradient is all zero");
    }
    println!("{}", report.join("\n"));
    // Every DPPO pair has its region bind somewhere, else the mask went untested.
    assert_eq!((dppo_masked.len(), areal_masked.len()), (4, 2), "{dppo_masked:?} {areal_masked:?}");
    for (name, f) in dppo_masked.iter().chain(&areal_masked) {
        assert!(*f > 0.0, "{name}: no token left the trust region in either batch");
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
