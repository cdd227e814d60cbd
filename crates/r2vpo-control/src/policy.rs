//! Gaussian MLP actor and value MLP (candle, f32, CPU).
//!
//! Two action distributions ([`ActionDistribution`]):
//!
//! - **`normal`, clipped (CleanRL's).** The actor defines a diagonal
//!   Gaussian over an unbounded action `u`; the log-probability, the entropy
//!   and the stored action are those of `u`, and the environment receives
//!   `clip(u, −1, 1)` (CleanRL's `ClipAction`). Clipping is outside the
//!   policy, so log-probabilities and entropy have closed forms
//!   ([`gaussian_log_prob`], [`gaussian_entropy`]).
//! - **`tanh-normal` (Brax's `NormalTanhDistribution`,
//!   `brax/training/distribution.py`).** The actor's head outputs `(μ, s)`
//!   per action dimension, `σ = softplus(s) + min_std` (state-dependent), the
//!   stored action is the pre-tanh sample `u = μ + σε`, and the environment
//!   receives `tanh(u)`. `log π(u) = log N(u; μ, σ) − Σ log(1 − tanh²u)`
//!   (`crate::native`), and the entropy is Brax's one-sample estimate
//!   `Σ_j [½ + ½ ln 2π + ln σ_j + log(1 − tanh² x_j)]` at a reparameterised
//!   sample `x = μ + σε'`: an estimate of the squashed action's entropy,
//!   which is bounded (a larger σ piles mass at ±1 and lowers it).
//!
//! Weights are stored `(in, out)`, so a layer is one `x·W + b` matmul over
//! the whole batch (all environments of a step, or a whole minibatch).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var, D};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal, Uniform};
use serde::{Deserialize, Serialize};

use crate::error::{TrainError as Error, TrainResult as Result};

/// `ln(2π)`.
const LN_2PI: f64 = 1.837_877_066_409_345_3;

/// Hidden-layer nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// `tanh` (CleanRL).
    Tanh,
    /// `max(0, x)`.
    Relu,
    /// `x·σ(x)`, a.k.a. swish (Brax's default).
    Silu,
    /// `x` for `x > 0`, `eˣ − 1` otherwise.
    Elu,
}

impl Activation {
    fn apply(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.relu(),
            Activation::Silu => x.silu(),
            Activation::Elu => x.elu(1.0),
        }
    }
}

/// Weight initialisation (biases always start at 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Init {
    /// Orthogonal matrices scaled by a gain: √2 for hidden layers, then
    /// [`PolicyConfig::actor_out_gain`] / [`PolicyConfig::critic_out_gain`]
    /// (CleanRL's `layer_init`).
    Orthogonal,
    /// `U(±√(3/fan_in))` for every layer (Brax / flax `lecun_uniform`); the
    /// gains are not used.
    LecunUniform,
}

/// How the standard deviation of the Gaussian is parameterised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogStdMode {
    /// One learnt log-std per action dimension, independent of the state
    /// (kept within `[min_log_std, max_log_std]` after every step).
    StateIndependent,
    /// The actor's last layer outputs the log-std too (clamped to
    /// `[min_log_std, max_log_std]`).
    StateDependent,
}

/// The action distribution (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionDistribution {
    /// A diagonal Gaussian whose samples the environment clips to [−1, 1]
    /// (CleanRL), σ = exp(log-std) as [`PolicyConfig::log_std`] says.
    #[default]
    Normal,
    /// Brax's tanh-squashed Gaussian: σ = softplus(s) + `min_std` from a
    /// state-dependent head (needs `log_std = "state-dependent"`; the log-std
    /// bounds do not apply) and the `brax` trainer flavour.
    TanhNormal,
}

/// The `[policy]` table: both networks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Hidden widths of the actor.
    pub actor_hidden: Vec<usize>,
    /// Hidden widths of the critic.
    pub critic_hidden: Vec<usize>,
    /// Hidden nonlinearity of both networks.
    pub activation: Activation,
    /// Weight initialisation.
    pub init: Init,
    /// Orthogonal gain of the actor's output layer (0.01 makes the initial
    /// mean ≈ 0, so the first policy is the pure exploration noise).
    pub actor_out_gain: f64,
    /// Orthogonal gain of the critic's output layer.
    pub critic_out_gain: f64,
    /// State-independent or state-dependent log-std.
    pub log_std: LogStdMode,
    /// Initial log-std (state-independent), or bias of the log-std head
    /// (state-dependent). 0 gives σ = 1, as CleanRL and Brax's `normal`.
    /// Under the tanh-normal it is the bias of the pre-softplus head `s`:
    /// 0 (Brax's zero bias) gives σ ≈ softplus(0) + 0.001 ≈ 0.69.
    pub init_log_std: f64,
    /// Lower bound of the log-std, in both modes (normal distribution only).
    pub min_log_std: f64,
    /// Upper bound of the log-std, in both modes (normal distribution only).
    pub max_log_std: f64,
    /// The action distribution: `"normal"` (clipped) or `"tanh-normal"` (Brax).
    pub distribution: ActionDistribution,
    /// The smallest σ of the tanh-normal, added to `softplus(s)` (Brax's
    /// `min_std`, 0.001). Not used by the normal distribution.
    pub min_std: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            actor_hidden: vec![64, 64],
            critic_hidden: vec![64, 64],
            activation: Activation::Tanh,
            init: Init::Orthogonal,
            actor_out_gain: 0.01,
            critic_out_gain: 1.0,
            log_std: LogStdMode::StateIndependent,
            init_log_std: 0.0,
            min_log_std: -5.0,
            max_log_std: 2.0,
            distribution: ActionDistribution::Normal,
            min_std: 1e-3,
        }
    }
}

impl PolicyConfig {
    /// Checks ranges; errors name the field as `policy.<field>`.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, message: String| Error::Config { field: field.into(), message };
        for (field, h) in [("policy.actor_hidden", &self.actor_hidden), ("policy.critic_hidden", &self.critic_hidden)] {
            if h.contains(&0) {
                return Err(bad(field, format!("widths must be at least 1, got {h:?}")));
            }
        }
        if self.min_log_std.partial_cmp(&self.max_log_std) != Some(std::cmp::Ordering::Less) {
            return Err(bad(
                "policy.min_log_std",
                format!("must be below max_log_std = {}, got {}", self.max_log_std, self.min_log_std),
            ));
        }
        if !(self.min_log_std..=self.max_log_std).contains(&self.init_log_std) {
            return Err(bad(
                "policy.init_log_std",
                format!("must lie in [min_log_std, max_log_std], got {}", self.init_log_std),
            ));
        }
        if !(self.min_std.is_finite() && self.min_std > 0.0) {
            return Err(bad("policy.min_std", format!("must be finite and > 0, got {}", self.min_std)));
        }
        if self.distribution == ActionDistribution::TanhNormal && self.log_std != LogStdMode::StateDependent {
            return Err(bad(
                "policy.log_std",
                "policy.distribution = \"tanh-normal\" takes σ from the actor's head (Brax's \
                 softplus head): set policy.log_std = \"state-dependent\""
                    .into(),
            ));
        }
        for (field, g) in
            [("policy.actor_out_gain", self.actor_out_gain), ("policy.critic_out_gain", self.critic_out_gain)]
        {
            if !(g.is_finite() && g > 0.0) {
                return Err(bad(field, format!("must be finite and > 0, got {g}")));
            }
        }
        Ok(())
    }
}

/// A multilayer perceptron `x → (act ∘ linear)* → linear`.
#[derive(Debug)]
pub struct Mlp {
    weights: Vec<Var>,
    biases: Vec<Var>,
    activation: Activation,
}

impl Mlp {
    /// Builds the layers `sizes[0] → … → sizes[last]`; `out_gain` scales the
    /// last layer under orthogonal initialisation.
    pub fn new(
        sizes: &[usize],
        activation: Activation,
        init: Init,
        out_gain: f64,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self> {
        let mut weights = Vec::new();
        let mut biases = Vec::new();
        for (i, w) in sizes.windows(2).enumerate() {
            let last = i + 2 == sizes.len();
            let data = match init {
                Init::Orthogonal => orthogonal(w[0], w[1], if last { out_gain } else { 2f64.sqrt() }, rng),
                Init::LecunUniform => {
                    let lim = (3.0 / w[0] as f64).sqrt();
                    let u = Uniform::new_inclusive(-lim, lim).expect("finite bounds");
                    (0..w[0] * w[1]).map(|_| u.sample(rng) as f32).collect()
                }
            };
            let dev = &Device::Cpu;
            weights.push(Var::from_tensor(&Tensor::from_vec(data, (w[0], w[1]), dev)?)?);
            biases.push(Var::zeros(w[1], DType::F32, dev)?);
        }
        Ok(Self { weights, biases, activation })
    }

    /// `(B, in) → (B, out)`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        let n = self.weights.len();
        for (i, (w, b)) in self.weights.iter().zip(&self.biases).enumerate() {
            h = h.matmul(w.as_tensor())?.broadcast_add(b.as_tensor())?;
            if i + 1 < n {
                h = self.activation.apply(&h)?;
            }
        }
        Ok(h)
    }

    fn named(&self, prefix: &str, out: &mut Vec<(String, Var)>) {
        for (i, (w, b)) in self.weights.iter().zip(&self.biases).enumerate() {
            out.push((format!("{prefix}.{i}.weight"), w.clone()));
            out.push((format!("{prefix}.{i}.bias"), b.clone()));
        }
    }
}

/// An `(rows, cols)` matrix with orthonormal rows or columns (whichever are
/// fewer) times `gain`: Gram–Schmidt on a Gaussian matrix, which is the QR
/// with positive `diag(R)` that `torch.nn.init.orthogonal_` takes.
fn orthogonal(rows: usize, cols: usize, gain: f64, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let (long, short) = (rows.max(cols), rows.min(cols));
    // `short` vectors of length `long`.
    let mut q: Vec<Vec<f64>> = (0..short).map(|_| (0..long).map(|_| StandardNormal.sample(rng)).collect()).collect();
    for j in 0..short {
        for _pass in 0..2 {
            // Re-orthogonalising once more keeps Q orthonormal to ~1e-15.
            for k in 0..j {
                let dot: f64 = q[j].iter().zip(&q[k]).map(|(a, b)| a * b).sum();
                let qk = q[k].clone();
                q[j].iter_mut().zip(&qk).for_each(|(a, b)| *a -= dot * b);
            }
        }
        let norm = q[j].iter().map(|a| a * a).sum::<f64>().sqrt().max(1e-12);
        q[j].iter_mut().for_each(|a| *a /= norm);
    }
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let v = if rows >= cols { q[c][r] } else { q[r][c] };
            out[r * cols + c] = (gain * v) as f32;
        }
    }
    out
}

/// Log-density of a diagonal Gaussian, summed over the action dimension:
/// `Σ_i −½((a_i − μ_i)/σ_i)² − log σ_i − ½ ln 2π`. `mean` and `actions` are
/// `(B, A)`; `log_std` is `(B, A)` or `(1, A)`. Returns `(B,)`.
pub fn gaussian_log_prob(mean: &Tensor, log_std: &Tensor, actions: &Tensor) -> candle_core::Result<Tensor> {
    let z = actions.sub(mean)?.broadcast_div(&log_std.exp()?)?;
    let per_dim = z.sqr()?.affine(-0.5, -0.5 * LN_2PI)?.broadcast_sub(log_std)?;
    per_dim.sum(D::Minus1)
}

/// Entropy of a diagonal Gaussian, `Σ_i log σ_i + ½(1 + ln 2π)`; `log_std`
/// `(B, A)` or `(1, A)` gives `(B,)` or `(1,)`.
pub fn gaussian_entropy(log_std: &Tensor) -> candle_core::Result<Tensor> {
    log_std.affine(1.0, 0.5 * (1.0 + LN_2PI))?.sum(D::Minus1)
}

/// Output of [`ActorCritic::dist`].
#[derive(Debug, Clone)]
pub struct Dist {
    /// `(B, A)` means.
    pub mean: Tensor,
    /// `(B, A)` (state-dependent) or `(1, A)` (state-independent) log-stds.
    pub log_std: Tensor,
}

/// Actor and critic, with separate trunks.
#[derive(Debug)]
pub struct ActorCritic {
    actor: Mlp,
    critic: Mlp,
    log_std: Option<Var>,
    cfg: PolicyConfig,
    obs_dim: usize,
    act_dim: usize,
}

impl ActorCritic {
    /// Fresh networks for `obs_dim → act_dim`, initialised from `seed`.
    pub fn new(cfg: &PolicyConfig, obs_dim: usize, act_dim: usize, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let state_dep = cfg.log_std == LogStdMode::StateDependent;
        let mut sizes = vec![obs_dim];
        sizes.extend(&cfg.actor_hidden);
        sizes.push(if state_dep { 2 * act_dim } else { act_dim });
        let actor = Mlp::new(&sizes, cfg.activation, cfg.init, cfg.actor_out_gain, &mut rng)?;
        let mut sizes = vec![obs_dim];
        sizes.extend(&cfg.critic_hidden);
        sizes.push(1);
        let critic = Mlp::new(&sizes, cfg.activation, cfg.init, cfg.critic_out_gain, &mut rng)?;
        let dev = &Device::Cpu;
        let log_std = if state_dep {
            // The log-std half of the head starts at `init_log_std` through its bias.
            let b = actor.biases.last().expect("at least one layer");
            let mut v = vec![0f32; 2 * act_dim];
            v[act_dim..].iter_mut().for_each(|x| *x = cfg.init_log_std as f32);
            b.set(&Tensor::from_vec(v, 2 * act_dim, dev)?)?;
            None
        } else {
            Some(Var::from_tensor(&Tensor::full(cfg.init_log_std as f32, (1, act_dim), dev)?)?)
        };
        Ok(Self { actor, critic, log_std, cfg: cfg.clone(), obs_dim, act_dim })
    }

    /// Observation length.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// Action length.
    pub fn act_dim(&self) -> usize {
        self.act_dim
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// Every trainable variable with a stable name (the safetensors keys).
    pub fn named_params(&self) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        self.actor.named("actor", &mut out);
        self.critic.named("critic", &mut out);
        if let Some(l) = &self.log_std {
            out.push(("log_std".into(), l.clone()));
        }
        out
    }

    /// Number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.named_params().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The action distribution at `obs` `(B, obs_dim)`.
    pub fn dist(&self, obs: &Tensor) -> candle_core::Result<Dist> {
        let out = self.actor.forward(obs)?;
        match &self.log_std {
            // The trainer keeps it within its bounds; a loaded one is clamped.
            Some(l) => {
                Ok(Dist { mean: out, log_std: l.as_tensor().clamp(self.cfg.min_log_std, self.cfg.max_log_std)? })
            }
            None => {
                let a = self.act_dim;
                let mean = out.narrow(1, 0, a)?;
                let head = out.narrow(1, a, a)?;
                let log_std = match self.cfg.distribution {
                    ActionDistribution::Normal => head.clamp(self.cfg.min_log_std, self.cfg.max_log_std)?,
                    // ln(softplus(s) + min_std); softplus as ln(1 + eˢ),
                    // exact enough at the magnitudes the tests use.
                    ActionDistribution::TanhNormal => {
                        head.exp()?.affine(1.0, 1.0)?.log()?.affine(1.0, self.cfg.min_std)?.log()?
                    }
                };
                Ok(Dist { mean, log_std })
            }
        }
    }

    /// State values `(B,)` at `obs` `(B, obs_dim)`.
    pub fn value(&self, obs: &Tensor) -> candle_core::Result<Tensor> {
        self.critic.forward(obs)?.squeeze(1)
    }

    /// The parameters as a name → tensor map (copies, detached).
    pub fn state_dict(&self) -> HashMap<String, Tensor> {
        self.named_params().into_iter().map(|(n, v)| (n, v.as_tensor().detach())).collect()
    }

    /// Loads parameters saved by [`ActorCritic::state_dict`]; every name and
    /// shape must match.
    pub fn load_state_dict(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        for (name, var) in self.named_params() {
            let t = tensors.get(&name).ok_or_else(|| Error::Config {
                field: "checkpoint.weights".into(),
                message: format!("weights file has no tensor `{name}`"),
            })?;
            if t.dims() != var.dims() {
                return Err(Error::Config {
                    field: "checkpoint.weights".into(),
                    message: format!("tensor `{name}` has shape {:?}, the network expects {:?}", t.dims(), var.dims()),
                });
            }
            var.set(&t.to_dtype(DType::F32)?)?;
        }
        Ok(())
    }
}

/// f64 observations (row-major `rows × dim`) as an f32 `(rows, dim)` tensor.
pub fn obs_tensor(obs: &[f64], dim: usize) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = obs.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, (obs.len() / dim.max(1), dim), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_and_entropy_match_closed_forms() {
        let dev = &Device::Cpu;
        let mean = Tensor::new(&[[0.3f32, -1.0], [2.0, 0.5]], dev).unwrap();
        let log_std = Tensor::new(&[[-0.7f32, 0.4]], dev).unwrap();
        let act = Tensor::new(&[[0.1f32, 0.2], [-1.5, 0.5]], dev).unwrap();
        let lp = gaussian_log_prob(&mean, &log_std, &act).unwrap().to_vec1::<f32>().unwrap();
        let m = [[0.3f64, -1.0], [2.0, 0.5]];
        let a = [[0.1f64, 0.2], [-1.5, 0.5]];
        let ls = [-0.7f64, 0.4];
        for b in 0..2 {
            let mut want = 0.0;
            for i in 0..2 {
                let s = ls[i].exp();
                let pdf =
                    (-(a[b][i] - m[b][i]).powi(2) / (2.0 * s * s)).exp() / (s * (2.0 * std::f64::consts::PI).sqrt());
                want += pdf.ln();
            }
            assert!((lp[b] as f64 - want).abs() < 1e-5, "{} vs {want}", lp[b]);
        }
        let h = gaussian_entropy(&log_std).unwrap().to_vec1::<f32>().unwrap();
        let want: f64 =
            ls.iter().map(|l| 0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E * (2.0 * l).exp()).ln()).sum();
        assert!((h[0] as f64 - want).abs() < 1e-5);
    }

    #[test]
    fn orthogonal_init_is_orthogonal() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for (r, c) in [(5, 3), (3, 5), (4, 4)] {
            let w = orthogonal(r, c, 1.0, &mut rng);
            // Gram matrix of the shorter side is the identity.
            type Get<'a> = Box<dyn Fn(usize, usize) -> f32 + 'a>;
            let (n, len, get): (usize, usize, Get) =
                if r >= c { (c, r, Box::new(|j, k| w[k * c + j])) } else { (r, c, Box::new(|j, k| w[j * c + k])) };
            for a in 0..n {
                for b in 0..n {
                    let dot: f32 = (0..len).map(|k| get(a, k) * get(b, k)).sum();
                    assert!((dot - f32::from(a == b)).abs() < 1e-5, "{r}x{c} ({a},{b}) {dot}");
                }
            }
        }
    }

    #[test]
    fn state_dependent_head_and_state_dict_round_trip() {
        let cfg = PolicyConfig { log_std: LogStdMode::StateDependent, init_log_std: -0.5, ..PolicyConfig::default() };
        let net = ActorCritic::new(&cfg, 3, 2, 7).unwrap();
        let obs = obs_tensor(&[0.1, 0.2, 0.3, -1.0, 0.0, 2.0], 3).unwrap();
        let d = net.dist(&obs).unwrap();
        assert_eq!(d.mean.dims(), &[2, 2]);
        assert_eq!(d.log_std.dims(), &[2, 2]);
        // Output gain 0.01 keeps the log-std head near its bias at init.
        for v in d.log_std.flatten_all().unwrap().to_vec1::<f32>().unwrap() {
            assert!((v + 0.5).abs() < 0.1, "{v}");
        }
        assert_eq!(net.value(&obs).unwrap().dims(), &[2]);
        let other = ActorCritic::new(&cfg, 3, 2, 8).unwrap();
        other.load_state_dict(&net.state_dict()).unwrap();
        let v1 = net.value(&obs).unwrap().to_vec1::<f32>().unwrap();
        let v2 = other.value(&obs).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(v1, v2);
        let wrong = ActorCritic::new(&PolicyConfig::default(), 3, 2, 8).unwrap();
        assert!(wrong.load_state_dict(&net.state_dict()).is_err());
    }
}
