//! Differential test of the brax flavour against Brax itself: on the same
//! parameters, minibatch and entropy draws, [`r2vpo_control::brax`]'s loss,
//! its terms and every parameter's gradient equal Brax 0.14.2's
//! `compute_ppo_loss` and `jax.grad` of it (JAX on the CPU, in the pinned
//! venv `make deps` makes: scripts/brax/venv.sh); the same with R²VPO's
//! policy term (the paper's Eq. primal_dual, negated, written out in the
//! harness) in place of the clipped surrogate; and the running observation
//! statistics equal Brax's after two updates. The cases come from
//! `scripts/brax/loss_cases.py` (three seeds: truncated and terminal steps,
//! ratios inside and outside 1 ± ε, every parameter perturbed off its
//! initialisation).
//!
//! Tolerance: both sides are f32; Brax's XLA sums and ours run in different
//! orders and our SiLU uses a polynomial `exp` (within 2 ulp), so values
//! agree to a few f32 ulps of the largest term. The test allows 2e-5 of the
//! largest magnitude per compared quantity (loss terms: of 1; gradients:
//! of the largest gradient entry of that tensor, or 1e-3 if larger), which
//! is about 170 ulps at 1.0: far below any real difference (a wrong sign,
//! a missing term or a λ on the wrong side moves them by orders more;
//! dropping the tanh correction moves the policy loss by ~1e-1).

use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;

use r2vpo::dual::{DualConfig, DualMode};
use r2vpo::learner::Learner;
use r2vpo::objective::{ObjectiveConfig, ObjectiveKind};
use r2vpo_control::brax::{loss_and_grads, LossConfig, Minibatch, ObsNormalizer};
use r2vpo_control::native::NativeNet;
use r2vpo_control::policy::{ActionDistribution, Activation, ActorCritic, Init, LogStdMode, PolicyConfig};

#[derive(Deserialize)]
struct Layer {
    kernel: Vec<f32>,
    bias: Vec<f32>,
}

#[derive(Deserialize)]
struct Norm {
    mean: Vec<f32>,
    summed_variance: Vec<f32>,
    std: Vec<f32>,
}

#[derive(Deserialize)]
struct Settings {
    entropy_cost: f64,
    discounting: f64,
    reward_scaling: f32,
    gae_lambda: f64,
    clipping_epsilon: f64,
    normalize_advantage: bool,
    vf_coefficient: f64,
}

#[derive(Deserialize)]
struct Result {
    total: f64,
    policy_loss: f64,
    v_loss: f64,
    entropy_loss: f64,
    grads: Vec<Layer>,
}

#[derive(Deserialize)]
struct Case {
    seed: u64,
    obs_dim: usize,
    act_dim: usize,
    policy_hidden: Vec<usize>,
    value_hidden: Vec<usize>,
    unroll: usize,
    seqs: usize,
    settings: Settings,
    lambda: f64,
    norm_batches: Vec<Vec<f32>>,
    norm: Norm,
    params: Vec<Layer>,
    obs: Vec<f32>,
    bootstrap_obs: Vec<f32>,
    actions: Vec<f32>,
    target_logp: Vec<f32>,
    behaviour_logp: Vec<f32>,
    rewards: Vec<f32>,
    truncation: Vec<bool>,
    termination: Vec<bool>,
    entropy_noise: Vec<f32>,
    ppo: Result,
    r2vpo: Result,
}

/// The cases, made once per test binary (JAX's tracing takes ~20 s).
fn cases() -> &'static [Case] {
    static CASES: std::sync::OnceLock<Vec<Case>> = std::sync::OnceLock::new();
    CASES.get_or_init(make_cases)
}

fn make_cases() -> Vec<Case> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".deps/venv-brax/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make deps` (it runs scripts/brax/venv.sh), which installs the pinned Brax and JAX",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root.join("scripts/brax/loss_cases.py"))
        .args(["0", "1", "2"])
        // JAX on the CPU, quietly, on the threads the test has.
        .env("JAX_PLATFORMS", "cpu")
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .expect("run loss_cases.py");
    assert!(out.status.success(), "loss_cases.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let cases: Vec<Case> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("loss_cases.py printed {l:.200}…: {e}")))
        .collect();
    assert_eq!(cases.len(), 3);
    cases
}

fn close(ours: &[f32], theirs: &[f32], floor: f32, what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let scale = theirs.iter().fold(floor, |s, x| s.max(x.abs()));
    let (i, d) = ours.iter().zip(theirs).map(|(x, y)| (x - y).abs()).enumerate().fold((0, 0f32), |b, (i, d)| {
        if d > b.1 {
            (i, d)
        } else {
            b
        }
    });
    assert!(d <= 2e-5 * scale, "{what}: |Δ| {d:e} at {i} ({} against Brax's {}), scale {scale}", ours[i], theirs[i]);
}

/// The case's networks as r2vpo's: Brax's MLPs are `(in, out)` kernels with
/// swish, the tanh-normal head `(μ, s)`.
fn network(c: &Case) -> NativeNet {
    let cfg = PolicyConfig {
        actor_hidden: c.policy_hidden.clone(),
        critic_hidden: c.value_hidden.clone(),
        activation: Activation::Silu,
        init: Init::LecunUniform,
        log_std: LogStdMode::StateDependent,
        distribution: ActionDistribution::TanhNormal,
        min_std: 1e-3,
        ..PolicyConfig::default()
    };
    let mut net = NativeNet::from_net(&ActorCritic::new(&cfg, c.obs_dim, c.act_dim, 0).unwrap()).unwrap();
    let mut params = net.params_mut();
    assert_eq!(params.len(), 2 * c.params.len());
    for (i, layer) in c.params.iter().enumerate() {
        assert_eq!(params[2 * i].len(), layer.kernel.len(), "layer {i} shape");
        params[2 * i].copy_from_slice(&layer.kernel);
        params[2 * i + 1].copy_from_slice(&layer.bias);
    }
    drop(params);
    net.set_obs_norm(Some((c.norm.mean.clone(), c.norm.std.clone())));
    net
}

fn learner(c: &Case, kind: ObjectiveKind) -> Learner {
    let objective = ObjectiveConfig {
        kind,
        eps_low: c.settings.clipping_epsilon,
        eps_high: c.settings.clipping_epsilon,
        dual_clip: None,
        ..ObjectiveConfig::default()
    };
    let dual = DualConfig { mode: DualMode::Fixed, lambda0: c.lambda, ..DualConfig::control_default() };
    Learner::new(objective, &dual).unwrap()
}

#[test]
fn the_loss_terms_and_gradients_equal_braxs() {
    for c in cases() {
        let net = network(c);
        let tag = |s: &str| format!("seed {}: {s}", c.seed);

        // The behaviour policy's log-probabilities (the rollout's) are
        // Brax's log_prob with the tanh correction.
        let f = net.infer(&c.obs, c.unroll * c.seqs);
        close(&net.log_prob(&f, &c.actions), &c.target_logp, 1.0, &tag("log π(u)"));

        let rewards: Vec<f32> = c.rewards.iter().map(|r| r * c.settings.reward_scaling).collect();
        let mb = Minibatch {
            unroll: c.unroll,
            seqs: c.seqs,
            obs: &c.obs,
            bootstrap_obs: &c.bootstrap_obs,
            actions: &c.actions,
            behaviour_logp: &c.behaviour_logp,
            rewards: &rewards,
            truncation: &c.truncation,
            termination: &c.termination,
            entropy_noise: &c.entropy_noise,
        };
        let cfg = LossConfig {
            gamma: c.settings.discounting,
            gae_lambda: c.settings.gae_lambda,
            entropy_cost: c.settings.entropy_cost,
            value_coef: c.settings.vf_coefficient,
            normalize_advantage: c.settings.normalize_advantage,
        };
        for (name, kind, want) in [("ppo", ObjectiveKind::Clip, &c.ppo), ("r2vpo", ObjectiveKind::R2vpo, &c.r2vpo)] {
            let mut grads = net.zero_grads();
            let got = loss_and_grads(&net, &learner(c, kind), &mb, &cfg, &mut grads).unwrap();
            for (term, ours, theirs) in [
                ("total", got.total, want.total),
                ("policy_loss", got.policy_loss, want.policy_loss),
                ("v_loss", got.v_loss, want.v_loss),
                ("entropy_loss", got.entropy_loss, want.entropy_loss),
            ] {
                close(&[ours as f32], &[theirs as f32], 1.0, &tag(&format!("{name} {term}")));
            }
            assert_eq!(grads.len(), 2 * want.grads.len());
            for (i, layer) in want.grads.iter().enumerate() {
                close(&grads[2 * i], &layer.kernel, 1e-3, &tag(&format!("{name} ∂/∂kernel {i}")));
                close(&grads[2 * i + 1], &layer.bias, 1e-3, &tag(&format!("{name} ∂/∂bias {i}")));
            }
            // The test can fail: the policy term differs between the two
            // objectives, and so do the policy network's gradients.
            assert!((c.ppo.policy_loss - c.r2vpo.policy_loss).abs() > 1e-3, "{}", tag("degenerate case"));
        }
    }
}

#[test]
fn the_observation_statistics_equal_braxs() {
    for c in cases() {
        let mut norm = ObsNormalizer::new(c.obs_dim);
        for batch in &c.norm_batches {
            norm.update(batch);
        }
        let tag = |s: &str| format!("seed {}: {s}", c.seed);
        assert_eq!(norm.count as usize, c.norm_batches.iter().map(|b| b.len() / c.obs_dim).sum::<usize>());
        close(&norm.mean, &c.norm.mean, 1.0, &tag("mean"));
        close(&norm.summed_variance, &c.norm.summed_variance, 1.0, &tag("summed variance"));
        close(&norm.std, &c.norm.std, 1.0, &tag("std"));
    }
}
