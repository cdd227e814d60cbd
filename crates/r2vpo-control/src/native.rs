//! Hand-written forward and backward passes of the actor-critic MLPs.
//!
//! The control trainer takes hundreds of gradient steps per update on
//! minibatches of ~128 rows through 2×64 networks. At that size each candle
//! op costs more in dispatch and allocation than in arithmetic (a step was
//! ≈ 1 ms, almost all overhead), so the networks run here on flat `f32`
//! buffers with the same `gemm` kernels candle uses. The policy objective
//! itself still comes from the core crate (candle autograd on the `(B, 1)`
//! log-probs only), so every equation of the paper keeps a single
//! implementation; this module supplies only the chain rule through the
//! Gaussian head and the MLPs. [`crate::policy::ActorCritic`] stays the
//! canonical parameter store (checkpoints, evaluation); a [`NativeNet`] is a
//! working copy the trainer syncs back after each update. Gradients are
//! tested against candle's autograd.
//!
//! Small passes run on one thread. Two ways of using a second one for
//! `cpu.toml`'s 128-row minibatches were measured on cheetah-run (2-core
//! machine) and dropped: cutting each minibatch into 64-row chunks on two
//! threads (26–28k vs 30–36k env-steps/s: each chunk repeats the small
//! products' fixed costs and the gradients must be summed), and running the
//! actor's and the critic's passes side by side with `rayon::join` (no
//! gain: each of the hundreds of joins per update has to wake a sleeping
//! worker). Large products (`paper.toml`'s 30,720-row minibatches through
//! 256-wide layers) split their output tiles over the rayon pool
//! ([`PARALLEL_MACS`]), and their activations split over rows: neither
//! changes any output's summation order, so the bits are those of one
//! thread (tested).

use crate::policy::{ActionDistribution, Activation, ActorCritic, LogStdMode};

/// `½ (1 + ln 2π)`, the per-dimension entropy constant of a Gaussian.
const ENTROPY_CONST: f32 = 1.418_938_5;
/// `½ ln 2π`.
const HALF_LN_2PI: f32 = 0.918_938_5;

pub use r2vpo_kernels::dispatch::control::{kernel, kernel_path, Kernel};

/// Products of at least this many multiply-adds run on every thread of the
/// rayon pool (gemm's `Parallelism::Rayon`, which splits output tiles and
/// keeps each output's `k` order); smaller ones stay on one thread, where a
/// second thread's wake-up costs more than it saves (module doc). A 128-row
/// 64×64 product is 2¹⁹; a 30,720-row 256×256 one is ≈ 2³¹.
pub const PARALLEL_MACS: usize = 1 << 22;

/// Elementwise passes over at least this many values split over rows.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// Rows of elementwise work per rayon task.
const ELEMENT_CHUNK: usize = 1 << 14;

/// `out (m×n) = a (m×k) · b (k×n)` (or `+=` when `accumulate`), row-major,
/// with `a` read transposed from a `k×m` buffer when `a_t` and `b` from an
/// `n×k` buffer when `b_t`, on [`kernel`]'s choice. Products of at least
/// [`PARALLEL_MACS`] run on every thread of the rayon pool, smaller ones on
/// the calling thread; on every kernel the bits are the same either way.
#[allow(clippy::too_many_arguments)]
fn matmul(out: &mut [f32], a: &[f32], a_t: bool, b: &[f32], b_t: bool, m: usize, n: usize, k: usize, accumulate: bool) {
    matmul_on(kernel(), out, a, a_t, b, b_t, m, n, k, accumulate)
}

/// [`matmul`] on a given kernel (the tests run every one this CPU has).
#[allow(clippy::too_many_arguments)]
fn matmul_on(
    kernel: Kernel,
    out: &mut [f32],
    a: &[f32],
    a_t: bool,
    b: &[f32],
    b_t: bool,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) {
    assert!(out.len() == m * n && a.len() == m * k && b.len() == k * n, "matmul shapes");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out.fill(0.0);
        }
        return;
    }
    match kernel {
        Kernel::Reference => {
            let a_s = if a_t { (1, m) } else { (k, 1) };
            let b_s = if b_t { (1, k) } else { (n, 1) };
            r2vpo_kernels::product([m, k, n], (a, a_s), (b, b_s), out, n, accumulate);
            return;
        }
        Kernel::Avx2 => {
            use r2vpo_kernels::avx2::{self, Layout};
            let la = if a_t { Layout::Cols(m) } else { Layout::Rows(k) };
            let lb = if b_t { Layout::Cols(k) } else { Layout::Rows(n) };
            let parallel = m * n * k >= PARALLEL_MACS && rayon::current_num_threads() > 1;
            let done = if parallel {
                avx2::product_into([m, k, n], (a, la), (b, lb), out, n, accumulate)
            } else {
                avx2::product_here([m, k, n], (a, la), (b, lb), out, n, accumulate)
            };
            // Only a failed allocation of a few hundred KiB gets here.
            done.unwrap_or_else(|e| panic!("{e}"));
            return;
        }
        Kernel::Gemm => {}
    }
    // (column stride, row stride) of each operand as gemm wants them.
    let (a_cs, a_rs) = if a_t { (m as isize, 1) } else { (1, k as isize) };
    let (b_cs, b_rs) = if b_t { (k as isize, 1) } else { (1, n as isize) };
    // SAFETY: the asserts above bound every index gemm forms from these
    // strides and sizes inside the three slices, and `out` does not alias
    // `a` or `b` (it is borrowed mutably while they are borrowed shared).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(m * n * k),
        );
    }
}

fn parallelism(macs: usize) -> gemm::Parallelism {
    let threads = rayon::current_num_threads();
    if macs >= PARALLEL_MACS && threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

/// `tanh` as a clamped odd/even rational function (the minimax fit Eigen
/// uses for `float`), within 5e-7 of the exact value (tested against f64 `tanh`).
/// libm's `tanhf` goes through `expm1f` one scalar at a time and was a third
/// of a whole training update; this form has no branches and vectorises.
/// (Plain `*`/`+`, not `mul_add`: without a `target-feature` of `fma`,
/// `mul_add` is a slow software call.)
fn fast_tanh(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    const A: [f32; 7] =
        [4.893_524_6e-3, 6.372_619_3e-4, 1.485_722_4e-5, 5.122_297e-8, -8.604_672e-11, 2.000_188e-13, -2.760_768_5e-16];
    const B: [f32; 4] = [4.893_525e-3, 2.268_434_6e-3, 1.185_347_1e-4, 1.198_258_4e-6];
    let x = x.clamp(-CLAMP, CLAMP);
    let x2 = x * x;
    let mut p = A[6];
    for &a in A[..6].iter().rev() {
        p = p * x2 + a;
    }
    let mut q = B[3];
    for &b in B[..3].iter().rev() {
        q = q * x2 + b;
    }
    x * p / q
}

/// `eˣ` within 2 ulp of the exact value for `x` in [−87, 88] (tested
/// against f64 `exp`; outside, the clamped ends' values), for SiLU. libm's `expf` is one scalar call per
/// value: at the paper's 256 × 5 SiLU networks the forward's and
/// backward's `expf` calls and their loops were 17 % of a learner pass
/// (perf, one thread, 960-row minibatches, a 2-core AMD EPYC). This form
/// (Cephes' `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`, `2ⁿ`
/// put into the exponent bits) has no branches and vectorises. Inputs are
/// clamped to [−87, 88], where the result is still normal and finite; NaN
/// stays NaN.
#[inline(always)]
fn fast_exp(x: f32) -> f32 {
    // 1.5 · 2²³: adding it rounds to an integer, which its low bits hold.
    const ROUND: f32 = 12_582_912.0;
    // ln 2 split so that `n · LN2_HI` is exact for |n| < 2⁹.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    // Cephes' 5.0000001201e-1, which rounds to ½ in f32.
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // n + 127 into the exponent field: 2ⁿ.
    let scale = f32::from_bits(((t.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23) as u32);
    e * scale
}

/// `act` applied to every element of `h`, in parallel chunks when `h` is
/// large (elementwise, so the values do not depend on the split).
fn activate_in_place(act: Activation, h: &mut [f32]) {
    use rayon::prelude::*;
    if h.len() >= PARALLEL_ELEMENTS && rayon::current_num_threads() > 1 {
        h.par_chunks_mut(ELEMENT_CHUNK).for_each(|c| activate_chunk(act, c));
    } else {
        activate_chunk(act, h);
    }
}

/// One loop per activation (the `match` outside), so each loop is a plain
/// map the compiler vectorises.
fn activate_chunk(act: Activation, h: &mut [f32]) {
    match act {
        Activation::Tanh => h.iter_mut().for_each(|v| *v = fast_tanh(*v)),
        Activation::Relu => h.iter_mut().for_each(|v| *v = v.max(0.0)),
        Activation::Silu => h.iter_mut().for_each(|v| *v /= 1.0 + fast_exp(-*v)),
        Activation::Elu => h.iter_mut().for_each(|v| {
            if *v <= 0.0 {
                *v = v.exp_m1();
            }
        }),
    }
}

/// `g *= d act(x)/dx` elementwise, from the pre-activations `x` and the
/// outputs `y`; in parallel chunks when large, as [`activate_in_place`].
fn scale_by_activation_grad(act: Activation, g: &mut [f32], x: &[f32], y: &[f32]) {
    use rayon::prelude::*;
    if g.len() >= PARALLEL_ELEMENTS && rayon::current_num_threads() > 1 {
        g.par_chunks_mut(ELEMENT_CHUNK)
            .zip(x.par_chunks(ELEMENT_CHUNK))
            .zip(y.par_chunks(ELEMENT_CHUNK))
            .for_each(|((g, x), y)| scale_chunk(act, g, x, y));
    } else {
        scale_chunk(act, g, x, y);
    }
}

fn scale_chunk(act: Activation, g: &mut [f32], x: &[f32], y: &[f32]) {
    let it = g.iter_mut().zip(x).zip(y);
    match act {
        Activation::Tanh => it.for_each(|((g, _), &y)| *g *= 1.0 - y * y),
        Activation::Relu => it.for_each(|((g, &x), _)| {
            if x <= 0.0 {
                *g = 0.0;
            }
        }),
        Activation::Silu => it.for_each(|((g, &x), _)| {
            let s = 1.0 / (1.0 + fast_exp(-x));
            *g *= s * (1.0 + x * (1.0 - s));
        }),
        Activation::Elu => it.for_each(|((g, &x), &y)| {
            if x <= 0.0 {
                *g *= y + 1.0;
            }
        }),
    }
}

/// One linear layer: `weight` is `(in, out)` row-major, as candle stores it.
#[derive(Clone, Debug)]
struct Layer {
    weight: Vec<f32>,
    bias: Vec<f32>,
    n_in: usize,
    n_out: usize,
}

/// What a forward pass keeps for its backward pass.
#[derive(Clone, Debug, Default)]
struct Tape {
    /// Input of every layer (`B × n_in`).
    inputs: Vec<Vec<f32>>,
    /// Pre-activation of every hidden layer (`B × n_out`).
    pre: Vec<Vec<f32>>,
}

/// An MLP `x → (act ∘ linear)* → linear` on flat buffers.
#[derive(Clone, Debug)]
struct Mlp {
    layers: Vec<Layer>,
    act: Activation,
}

impl Mlp {
    /// `(B, in) → (B, out)`; records a tape when asked.
    fn forward(&self, x: &[f32], rows: usize, mut tape: Option<&mut Tape>) -> Vec<f32> {
        if let Some(t) = tape.as_deref_mut() {
            t.inputs.clear();
            t.pre.clear();
        }
        let mut h = x.to_vec();
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            let mut out = Vec::with_capacity(rows * l.n_out);
            for _ in 0..rows {
                out.extend_from_slice(&l.bias);
            }
            matmul(&mut out, &h, false, &l.weight, false, rows, l.n_out, l.n_in, true);
            let input = std::mem::replace(&mut h, out);
            if let Some(t) = tape.as_deref_mut() {
                t.inputs.push(input);
            }
            if i < last {
                if let Some(t) = tape.as_deref_mut() {
                    t.pre.push(h.clone());
                }
                activate_in_place(self.act, &mut h);
            }
        }
        h
    }

    /// Adds the parameter gradients of `dout` (`B × out`, the loss's
    /// gradient at the output) to `grads` (weight, bias per layer).
    fn backward(&self, tape: &Tape, dout: Vec<f32>, rows: usize, grads: &mut [Vec<f32>]) {
        let mut d = dout;
        for (i, l) in self.layers.iter().enumerate().rev() {
            let input = &tape.inputs[i];
            matmul(&mut grads[2 * i], input, true, &d, false, l.n_in, l.n_out, rows, true);
            let gb = &mut grads[2 * i + 1];
            for row in d.chunks_exact(l.n_out) {
                gb.iter_mut().zip(row).for_each(|(g, &x)| *g += x);
            }
            if i == 0 {
                break;
            }
            let mut dh = vec![0f32; rows * l.n_in];
            matmul(&mut dh, &d, false, &l.weight, true, rows, l.n_in, l.n_out, false);
            // Through the previous layer's activation: its output is this
            // layer's input.
            scale_by_activation_grad(self.act, &mut dh, &tape.pre[i - 1], input);
            d = dh;
        }
    }
}

/// The action distribution and values of a batch, with the tapes the
/// backward pass needs.
#[derive(Clone, Debug, Default)]
pub struct Forward {
    rows: usize,
    actor: Tape,
    critic: Tape,
    /// Means `(B, A)`.
    pub mean: Vec<f32>,
    /// Log-stds: `(B, A)` (state-dependent) or `(A,)` (state-independent).
    pub log_std: Vec<f32>,
    /// Raw (unclamped) log-std head outputs `(B, A)`, state-dependent only.
    raw_log_std: Vec<f32>,
    /// State values `(B,)`.
    pub value: Vec<f32>,
    /// σ `(B, A)`, tanh-normal only.
    sigma: Vec<f32>,
    /// The standard-normal draws `(B, A)` of the tanh-normal's sampled
    /// entropy estimate ([`Forward::set_entropy_noise`]).
    entropy_noise: Vec<f32>,
}

impl Forward {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Sets the standard-normal draws `ε'` `(B, A)` of the tanh-normal's
    /// entropy estimate at `x = μ + σε'` (Brax draws them per minibatch;
    /// the normal distribution's entropy has a closed form and ignores
    /// them). [`NativeNet::entropy`] and [`NativeNet::backward`] read them.
    pub fn set_entropy_noise(&mut self, noise: Vec<f32>) {
        assert_eq!(noise.len(), self.mean.len(), "entropy noise shape");
        self.entropy_noise = noise;
    }

    /// The log-std of row `r`, dimension `j`.
    fn ls(&self, r: usize, j: usize, a: usize) -> f32 {
        if self.log_std.len() == a {
            self.log_std[j]
        } else {
            self.log_std[r * a + j]
        }
    }
}

/// A working copy of an [`ActorCritic`] on flat buffers.
#[derive(Clone, Debug)]
pub struct NativeNet {
    actor: Mlp,
    critic: Mlp,
    /// State-independent log-std `(A,)`.
    log_std: Option<Vec<f32>>,
    act_dim: usize,
    obs_dim: usize,
    min_log_std: f32,
    max_log_std: f32,
    distribution: ActionDistribution,
    min_std: f32,
    /// `(mean, std)` the observations are normalised with inside the
    /// networks (Brax's `preprocess_observations_fn`); `None`: fed as given.
    obs_norm: Option<(Vec<f32>, Vec<f32>)>,
}

/// `softplus(x) = ln(1 + eˣ)` in the stable form jax's `logaddexp(x, 0)`
/// takes: `max(x, 0) + ln(1 + e^{−|x|})`.
fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// `1/(1 + e^{−x})`, the derivative of [`softplus`].
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `log(1 − tanh² u) = 2(ln 2 − u − softplus(−2u))` (Brax's
/// `TanhBijector.forward_log_det_jacobian`).
fn tanh_log_det(u: f32) -> f32 {
    2.0 * (std::f32::consts::LN_2 - u - softplus(-2.0 * u))
}

impl NativeNet {
    /// Copies the parameters of `net`.
    pub fn from_net(net: &ActorCritic) -> candle_core::Result<Self> {
        let cfg = net.config();
        let params = net.named_params();
        let mut it = params.iter();
        let mut take = |sizes: &[usize]| -> candle_core::Result<Mlp> {
            let mut layers = Vec::new();
            for w in sizes.windows(2) {
                let (_, wv) = it.next().expect("a weight per layer");
                let (_, bv) = it.next().expect("a bias per layer");
                layers.push(Layer {
                    weight: wv.as_tensor().flatten_all()?.to_vec1()?,
                    bias: bv.as_tensor().flatten_all()?.to_vec1()?,
                    n_in: w[0],
                    n_out: w[1],
                });
            }
            Ok(Mlp { layers, act: cfg.activation })
        };
        let (d, a) = (net.obs_dim(), net.act_dim());
        let state_dep = cfg.log_std == LogStdMode::StateDependent;
        let sizes = |hidden: &[usize], out: usize| [&[d][..], hidden, &[out]].concat();
        let actor = take(&sizes(&cfg.actor_hidden, if state_dep { 2 * a } else { a }))?;
        let critic = take(&sizes(&cfg.critic_hidden, 1))?;
        let log_std = match it.next() {
            Some((_, v)) => Some(v.as_tensor().flatten_all()?.to_vec1()?),
            None => None,
        };
        Ok(Self {
            actor,
            critic,
            log_std,
            act_dim: a,
            obs_dim: d,
            min_log_std: cfg.min_log_std as f32,
            max_log_std: cfg.max_log_std as f32,
            distribution: cfg.distribution,
            min_std: cfg.min_std as f32,
            obs_norm: None,
        })
    }

    /// Normalises every observation as `(x − mean)/std` inside the networks
    /// from now on (Brax's in-network normaliser); `None` feeds them as
    /// given.
    pub fn set_obs_norm(&mut self, norm: Option<(Vec<f32>, Vec<f32>)>) {
        if let Some((m, s)) = &norm {
            assert!(m.len() == self.obs_dim && s.len() == self.obs_dim, "normaliser shape");
        }
        self.obs_norm = norm;
    }

    /// The action distribution.
    pub fn distribution(&self) -> ActionDistribution {
        self.distribution
    }

    /// Action length.
    pub fn act_dim(&self) -> usize {
        self.act_dim
    }

    /// The action the environment receives for the stored action `u`:
    /// `clip(u, −1, 1)` (normal) or `tanh(u)` (tanh-normal).
    pub fn env_action(&self, u: f32) -> f64 {
        match self.distribution {
            ActionDistribution::Normal => f64::from(u).clamp(-1.0, 1.0),
            ActionDistribution::TanhNormal => f64::from(u).tanh(),
        }
    }

    /// σ of row `r`, dimension `j` of `f`.
    pub fn sigma(&self, f: &Forward, r: usize, j: usize) -> f32 {
        match self.distribution {
            ActionDistribution::Normal => f.ls(r, j, self.act_dim).exp(),
            ActionDistribution::TanhNormal => f.sigma[r * self.act_dim + j],
        }
    }

    /// Mean σ over the rows and action dimensions of `f`.
    pub fn mean_sigma(&self, f: &Forward) -> f64 {
        let (a, rows) = (self.act_dim, f.rows);
        let sum: f64 =
            (0..rows).flat_map(|r| (0..a).map(move |j| (r, j))).map(|(r, j)| f64::from(self.sigma(f, r, j))).sum();
        sum / (rows * a).max(1) as f64
    }

    /// `obs` normalised by [`NativeNet::set_obs_norm`]'s statistics, or
    /// borrowed as is.
    fn normalized<'a>(&self, obs: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        match &self.obs_norm {
            None => std::borrow::Cow::Borrowed(obs),
            Some((mean, std)) => std::borrow::Cow::Owned(
                obs.chunks_exact(self.obs_dim)
                    .flat_map(|row| row.iter().zip(mean).zip(std).map(|((&x, &m), &s)| (x - m) / s))
                    .collect(),
            ),
        }
    }

    /// Writes the parameters back into `net`'s variables.
    pub fn write_to(&self, net: &ActorCritic) -> candle_core::Result<()> {
        for ((_, var), p) in net.named_params().iter().zip(self.params()) {
            var.set(&candle_core::Tensor::from_slice(p, var.shape(), &candle_core::Device::Cpu)?)?;
        }
        Ok(())
    }

    /// The parameters in [`ActorCritic::named_params`] order.
    pub fn params(&self) -> Vec<&Vec<f32>> {
        let mut out = Vec::new();
        for l in self.actor.layers.iter().chain(&self.critic.layers) {
            out.push(&l.weight);
            out.push(&l.bias);
        }
        out.extend(self.log_std.as_ref());
        out
    }

    /// Mutable parameters, in the same order as [`NativeNet::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Vec<f32>> {
        let mut out = Vec::new();
        for l in self.actor.layers.iter_mut().chain(self.critic.layers.iter_mut()) {
            out.push(&mut l.weight);
            out.push(&mut l.bias);
        }
        out.extend(self.log_std.as_mut());
        out
    }

    /// Keeps a state-independent log-std inside `[min_log_std,
    /// max_log_std]` after an optimizer step (projected gradient descent:
    /// at a bound the next step can still move it back inside). Without it
    /// nothing bounded σ in this mode: an entropy bonus with nothing to
    /// oppose it (the ratios of a collapsed R²VPO run) drove log σ from 0 to
    /// ≈ 7.3 (σ ≈ 1,500) on cheetah-run. The state-dependent head is
    /// clamped in [`NativeNet::forward`] instead.
    pub fn project_log_std(&mut self) {
        let (lo, hi) = (self.min_log_std, self.max_log_std);
        if let Some(ls) = &mut self.log_std {
            ls.iter_mut().for_each(|x| *x = x.clamp(lo, hi));
        }
    }

    /// Zeroed gradient buffers shaped like [`NativeNet::params`].
    pub fn zero_grads(&self) -> Vec<Vec<f32>> {
        self.params().iter().map(|p| vec![0f32; p.len()]).collect()
    }

    /// Distribution and values at `obs` (`rows × obs_dim`), keeping what
    /// [`NativeNet::backward`] needs.
    pub fn forward(&self, obs: &[f32], rows: usize) -> Forward {
        self.forward_with(obs, rows, true)
    }

    /// [`NativeNet::forward`] without the tapes (acting, no learning).
    pub fn infer(&self, obs: &[f32], rows: usize) -> Forward {
        self.forward_with(obs, rows, false)
    }

    fn forward_with(&self, obs: &[f32], rows: usize, keep: bool) -> Forward {
        assert_eq!(obs.len(), rows * self.obs_dim, "observation batch shape");
        let obs = &*self.normalized(obs);
        let a = self.act_dim;
        let mut f = Forward { rows, ..Forward::default() };
        let out = self.actor.forward(obs, rows, keep.then_some(&mut f.actor));
        match &self.log_std {
            Some(ls) => {
                f.mean = out;
                // Within its bounds already ([`NativeNet::project_log_std`])
                // unless it was loaded from elsewhere.
                f.log_std = ls.iter().map(|&x| x.clamp(self.min_log_std, self.max_log_std)).collect();
            }
            None => {
                f.mean = Vec::with_capacity(rows * a);
                f.raw_log_std = Vec::with_capacity(rows * a);
                for row in out.chunks_exact(2 * a) {
                    f.mean.extend_from_slice(&row[..a]);
                    f.raw_log_std.extend_from_slice(&row[a..]);
                }
                match self.distribution {
                    ActionDistribution::Normal => {
                        f.log_std =
                            f.raw_log_std.iter().map(|&x| x.clamp(self.min_log_std, self.max_log_std)).collect();
                    }
                    ActionDistribution::TanhNormal => {
                        f.sigma = f.raw_log_std.iter().map(|&x| softplus(x) + self.min_std).collect();
                        f.log_std = f.sigma.iter().map(|s| s.ln()).collect();
                    }
                }
            }
        }
        f.value = self.critic.forward(obs, rows, keep.then_some(&mut f.critic));
        f
    }

    /// State values at `obs` (`rows × obs_dim`), without tapes.
    pub fn value(&self, obs: &[f32], rows: usize) -> Vec<f32> {
        self.critic.forward(&self.normalized(obs), rows, None)
    }

    /// Log-density of the stored actions `u` (`rows × A`) under `f`, summed
    /// over the action dimension: the Gaussian's (as
    /// [`crate::policy::gaussian_log_prob`]), minus `Σ log(1 − tanh² u)`
    /// under the tanh-normal (Brax's `ParametricDistribution.log_prob`).
    pub fn log_prob(&self, f: &Forward, actions: &[f32]) -> Vec<f32> {
        let a = self.act_dim;
        let tanh = self.distribution == ActionDistribution::TanhNormal;
        (0..f.rows)
            .map(|r| {
                (0..a)
                    .map(|j| {
                        let ls = f.ls(r, j, a);
                        let u = actions[r * a + j];
                        let z = (u - f.mean[r * a + j]) / self.sigma(f, r, j);
                        let lp = -0.5 * z * z - HALF_LN_2PI - ls;
                        if tanh {
                            lp - tanh_log_det(u)
                        } else {
                            lp
                        }
                    })
                    .sum()
            })
            .collect()
    }

    /// Mean entropy over the batch: the Gaussian's closed form, or under the
    /// tanh-normal Brax's one-sample estimate at `x = μ + σε'` with the
    /// draws of [`Forward::set_entropy_noise`]: `Σ_j [½(1 + ln 2π) + ln σ_j +
    /// log(1 − tanh² x_j)]` (`ParametricDistribution.entropy`). Panics under
    /// the tanh-normal when no draws were set.
    pub fn entropy(&self, f: &Forward) -> f32 {
        let a = self.act_dim;
        match self.distribution {
            ActionDistribution::Normal => {
                let rows = if f.log_std.len() == a { 1 } else { f.rows };
                f.log_std.iter().map(|&ls| ls + ENTROPY_CONST).sum::<f32>() / rows as f32
            }
            ActionDistribution::TanhNormal => {
                assert_eq!(f.entropy_noise.len(), f.rows * a, "the tanh-normal's entropy needs its noise");
                let mut sum = 0f32;
                for i in 0..f.rows * a {
                    let x = f.mean[i] + f.sigma[i] * f.entropy_noise[i];
                    sum += ENTROPY_CONST + f.log_std[i] + tanh_log_det(x);
                }
                sum / f.rows.max(1) as f32
            }
        }
    }

    /// Floating-point operations of the products of one [`NativeNet::forward`]
    /// and [`NativeNet::backward`] over `rows` rows: every layer's forward
    /// and weight-gradient product, and every input-gradient product but the
    /// first layer's (2 per multiply-add). Elementwise work is not counted.
    pub fn learn_flops(&self, rows: usize) -> f64 {
        [&self.actor, &self.critic]
            .iter()
            .map(|mlp| {
                mlp.layers
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (l.n_in * l.n_out) as f64 * if i == 0 { 2.0 } else { 3.0 })
                    .sum::<f64>()
            })
            .sum::<f64>()
            * 2.0
            * rows as f64
    }

    /// Gradients of `Σ_i dlogp_i · log π(a_i) + Σ_i dvalue_i · V(s_i) +
    /// dentropy · mean-entropy` with respect to every parameter, in
    /// [`NativeNet::params`] order (added to `grads`).
    pub fn backward(
        &self,
        f: &Forward,
        actions: &[f32],
        dlogp: &[f32],
        dvalue: &[f32],
        dentropy: f32,
        grads: &mut [Vec<f32>],
    ) {
        let (a, rows) = (self.act_dim, f.rows);
        let n_actor = 2 * self.actor.layers.len();
        let n_critic = 2 * self.critic.layers.len();
        let state_dep = self.log_std.is_none();
        let head = if state_dep { 2 * a } else { a };
        let mut dout = vec![0f32; rows * head];
        let mut dls_shared = vec![0f32; if state_dep { 0 } else { a }];
        let tanh = self.distribution == ActionDistribution::TanhNormal;
        if tanh && dentropy != 0.0 {
            assert_eq!(f.entropy_noise.len(), rows * a, "the tanh-normal's entropy needs its noise");
        }
        for r in 0..rows {
            for j in 0..a {
                // (−ln σ).exp() for the normal keeps the bits the pinned
                // runs were made with.
                let inv_sigma = if tanh { 1.0 / f.sigma[r * a + j] } else { (-f.ls(r, j, a)).exp() };
                let z = (actions[r * a + j] - f.mean[r * a + j]) * inv_sigma;
                // d log π / dμ = z/σ, d log π / d log σ = z² − 1.
                dout[r * head + j] = dlogp[r] * z * inv_sigma;
                let dls = dlogp[r] * (z * z - 1.0);
                if tanh {
                    // σ = softplus(s) + min_std: dσ/ds = sigmoid(s). The
                    // entropy estimate at x = μ + σε' adds −2·tanh(x) to
                    // d/dμ and 1/σ − 2·tanh(x)·ε' to d/dσ (the tanh log-det
                    // of the stored action does not depend on θ).
                    let i = r * a + j;
                    let ds = sigmoid(f.raw_log_std[i]);
                    let mut dsigma = dls * inv_sigma;
                    if dentropy != 0.0 {
                        let c = dentropy / rows as f32;
                        let x = f.mean[i] + f.sigma[i] * f.entropy_noise[i];
                        let t = x.tanh();
                        dout[r * head + j] += c * (-2.0 * t);
                        dsigma += c * (inv_sigma - 2.0 * t * f.entropy_noise[i]);
                    }
                    dout[r * head + a + j] = dsigma * ds;
                } else if state_dep {
                    let raw = f.raw_log_std[r * a + j];
                    // clamp passes the gradient only strictly inside its range.
                    let inside = raw > self.min_log_std && raw < self.max_log_std;
                    let g = dls + dentropy / rows as f32;
                    dout[r * head + a + j] = if inside { g } else { 0.0 };
                } else {
                    dls_shared[j] += dls;
                }
            }
        }
        self.actor.backward(&f.actor, dout, rows, &mut grads[..n_actor]);
        self.critic.backward(&f.critic, dvalue.to_vec(), rows, &mut grads[n_actor..n_actor + n_critic]);
        if !state_dep {
            let g = &mut grads[n_actor + n_critic];
            for (gj, d) in g.iter_mut().zip(dls_shared) {
                *gj += d + dentropy;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large products and activations split over threads give the bits of
    /// one thread: every operand layout of the passes, at a size above
    /// [`PARALLEL_MACS`], on a 1-thread and a 2-thread pool.
    #[test]
    fn parallel_products_equal_one_thread_bit_for_bit() {
        let (m, k, n) = (2048, 256, 192);
        assert!(m * k * n >= PARALLEL_MACS);
        let fill = |len: usize, seed: u32| -> Vec<f32> {
            (0..len)
                .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 16_777_216.0 - 0.5)
                .collect()
        };
        for kernel in fast_kernels() {
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    let mut outs = Vec::new();
                    for (a_t, b_t) in [(false, false), (true, false), (false, true)] {
                        let a = fill(m * k, 1);
                        let b = fill(k * n, 2);
                        let mut out = fill(m * n, 3);
                        matmul_on(kernel, &mut out, &a, a_t, &b, b_t, m, n, k, true);
                        activate_in_place(Activation::Silu, &mut out);
                        let mut g = fill(m * n, 4);
                        scale_by_activation_grad(Activation::Silu, &mut g, &a[..m * n], &out);
                        outs.push((out, g));
                    }
                    outs
                })
            };
            let (one, two) = (run(1), run(2));
            for ((o1, g1), (o2, g2)) in one.iter().zip(&two) {
                assert!(
                    o1.iter().zip(o2).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{kernel:?}: products differ across threads"
                );
                assert!(
                    g1.iter().zip(g2).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{kernel:?}: activation gradients differ"
                );
            }
        }
    }

    /// The kernels other than the reference that [`kernel`] can choose
    /// here; those this CPU cannot run are named on stderr as skipped.
    fn fast_kernels() -> Vec<Kernel> {
        let mut ks = vec![Kernel::Gemm];
        if r2vpo_kernels::avx2::runs() {
            ks.push(Kernel::Avx2);
        } else {
            eprintln!("skipped: the AVX2 kernel (this CPU lacks AVX2 and FMA, or the build has none)");
        }
        ks
    }
    use crate::policy::{gaussian_entropy, gaussian_log_prob, Init, PolicyConfig};
    use candle_core::{Device, Tensor};

    fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let scale = b.iter().fold(1f32, |s, x| s.max(x.abs()));
        let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(d <= tol * scale, "{what}: max |Δ| {d} (scale {scale})");
    }

    /// Forward values and every parameter's gradient equal candle autograd
    /// on the same loss, for each activation and both log-std modes.
    #[test]
    fn gradients_match_candle_autograd() {
        let (d, a, rows) = (5, 3, 7);
        for act in [Activation::Tanh, Activation::Relu, Activation::Silu, Activation::Elu] {
            for mode in [LogStdMode::StateIndependent, LogStdMode::StateDependent] {
                let cfg = PolicyConfig {
                    actor_hidden: vec![8, 6],
                    critic_hidden: vec![9],
                    activation: act,
                    init: Init::LecunUniform,
                    log_std: mode,
                    init_log_std: -0.3,
                    // Tight clamp so some state-dependent log-stds sit outside it.
                    min_log_std: -0.6,
                    max_log_std: 0.1,
                    ..PolicyConfig::default()
                };
                let net = ActorCritic::new(&cfg, d, a, 3).unwrap();
                let nat = NativeNet::from_net(&net).unwrap();
                let obs: Vec<f32> = (0..rows * d).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.4).collect();
                let actions: Vec<f32> = (0..rows * a).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.5).collect();
                let coef: Vec<f32> = (0..rows).map(|i| (i as f32 - 3.0) * 0.3).collect();
                let vcoef: Vec<f32> = (0..rows).map(|i| 0.2 - i as f32 * 0.05).collect();
                let ent_coef = -0.7f32;

                let dev = &Device::Cpu;
                let obs_t = Tensor::from_slice(&obs, (rows, d), dev).unwrap();
                let act_t = Tensor::from_slice(&actions, (rows, a), dev).unwrap();
                let dist = net.dist(&obs_t).unwrap();
                let logp = gaussian_log_prob(&dist.mean, &dist.log_std, &act_t).unwrap();
                let value = net.value(&obs_t).unwrap();
                let ent = gaussian_entropy(&dist.log_std).unwrap().mean_all().unwrap();
                let loss = (logp.mul(&Tensor::new(coef.as_slice(), dev).unwrap()).unwrap().sum_all().unwrap()
                    + value.mul(&Tensor::new(vcoef.as_slice(), dev).unwrap()).unwrap().sum_all().unwrap()
                    + ent.affine(f64::from(ent_coef), 0.0).unwrap())
                .unwrap();
                let grads = loss.backward().unwrap();

                let f = nat.forward(&obs, rows);
                close(&nat.log_prob(&f, &actions), &logp.to_vec1::<f32>().unwrap(), 1e-5, "log-prob");
                close(&f.value, &value.to_vec1::<f32>().unwrap(), 1e-5, "value");
                close(&[nat.entropy(&f)], &[ent.to_scalar::<f32>().unwrap()], 1e-5, "entropy");
                let mut g = nat.zero_grads();
                nat.backward(&f, &actions, &coef, &vcoef, ent_coef, &mut g);
                for ((name, var), gn) in net.named_params().iter().zip(&g) {
                    let gc = grads.get(var.as_tensor()).map_or_else(
                        || vec![0f32; var.elem_count()],
                        |t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    );
                    close(gn, &gc, 1e-4, &format!("{act:?} {mode:?} {name}"));
                }
            }
        }
    }

    /// Parameters survive a round trip through the working copy.
    #[test]
    fn write_back_round_trips() {
        let net = ActorCritic::new(&PolicyConfig::default(), 4, 2, 1).unwrap();
        let mut nat = NativeNet::from_net(&net).unwrap();
        nat.params_mut().iter_mut().for_each(|p| p.iter_mut().for_each(|x| *x += 0.5));
        nat.write_to(&net).unwrap();
        let again = NativeNet::from_net(&net).unwrap();
        for (x, y) in again.params().iter().zip(nat.params()) {
            assert_eq!(*x, y);
        }
    }

    /// The polynomial `exp` stays within 2 ulp of f64's over [−87, 88],
    /// is clamped outside, keeps NaN, and SiLU keeps its limits.
    #[test]
    fn fast_exp_is_accurate() {
        // Every 97th f32 bit pattern in [−87, 88], and the ends.
        let (lo, hi) = (-87.0f32, 88.0f32);
        let mut worst = 0f64;
        let mut check = |x: f32| {
            let want = (x as f64).exp();
            let got = fast_exp(x) as f64;
            // In units of the last place of the exact value's f32.
            let ulp = (want as f32).abs().next_up() as f64 - (want as f32).abs() as f64;
            let e = (got - want).abs() / ulp;
            assert!(e <= 2.0, "exp({x}) = {got} against {want}: {e:.2} ulp");
            worst = worst.max(e);
        };
        for x in [lo, hi, 0.0, -0.0, 1.0, -1.0, f32::MIN_POSITIVE, 1e-30] {
            check(x);
        }
        for bits in (0u32..0x4300_0000).step_by(97) {
            let x = f32::from_bits(bits);
            if x <= hi {
                check(x);
            }
            if -x >= lo {
                check(-x);
            }
        }
        assert!(worst > 0.0, "no value checked");
        // Clamped outside: finite, and SiLU's limits hold.
        assert!(fast_exp(1e6).is_finite() && fast_exp(-1e6) > 0.0);
        assert!(fast_exp(f32::NAN).is_nan());
        let mut h = vec![-200.0f32, -20.0, 0.0, 20.0, 200.0, f32::NAN];
        activate_chunk(Activation::Silu, &mut h);
        assert!(h[0].abs() < 1e-30 && (h[1] - (-20.0 / (1.0 + 20f32.exp()))).abs() < 1e-12);
        assert_eq!((h[2], h[3], h[4]), (0.0, 20.0 / (1.0 + (-20f32).exp()), 200.0));
        assert!(h[5].is_nan());
    }

    /// The rational tanh stays within a few f32 ulp of the exact value.
    #[test]
    fn fast_tanh_is_accurate() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5;
            let exact = f64::from(x).tanh();
            worst = worst.max((f64::from(fast_tanh(x)) - exact).abs());
        }
        for x in [10.0f32, -10.0, 1e3, -1e3, f32::MAX, f32::MIN] {
            assert!((fast_tanh(x) - x.signum()).abs() < 1e-6, "{x}");
        }
        // Measured 4.1e-7 (about 7 ulp of values near ±1; 3.1e-7 with fused
        // multiply-adds); libm's tanhf is within 1 ulp. Far below what a
        // gradient step on these nets feels.
        assert!(worst < 5e-7, "max |fast_tanh − tanh| = {worst:e}");
    }

    /// The gemm wrapper against a naive triple loop, all transpose cases.
    #[test]
    fn matmul_matches_naive() {
        let (m, n, k) = (5, 4, 3);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
        let at = |i: usize, p: usize, t: bool| if t { a[p * m + i] } else { a[i * k + p] };
        let bt = |p: usize, j: usize, t: bool| if t { b[j * k + p] } else { b[p * n + j] };
        for kernel in [Kernel::Reference].into_iter().chain(fast_kernels()) {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut out = vec![1f32; m * n];
                matmul_on(kernel, &mut out, &a, ta, &b, tb, m, n, k, true);
                for i in 0..m {
                    for j in 0..n {
                        let want = 1.0 + (0..k).map(|p| at(i, p, ta) * bt(p, j, tb)).sum::<f32>();
                        assert!((out[i * n + j] - want).abs() < 1e-5, "{kernel:?} {ta} {tb} ({i},{j})");
                    }
                }
            }
        }
    }
}
