//! The decoding seam: what the sampler ([`crate::sample`]) and the serving
//! engine ([`crate::engine`]) ask of a model, so that one sampling loop and
//! one continuous-batching loop run on either compute backend.
//!
//! A [`Decoder`] appends tokens to a [`DecodeCache`] of the rows' keys and
//! values and answers the next-token logits of each row's last position.
//! Rows carry their own attention masks and positions, so left-padded
//! prompts, finished rows feeding padding and rows that join a running
//! batch decode together. Implementations: the candle
//! [`Transformer`](crate::backend::candle::Transformer) with its
//! [`KvCache`](crate::backend::candle::KvCache), and (with the `torch` feature) the
//! libtorch model of `crate::backend::torch`.

use candle_core::{Device, Tensor};

use crate::model::{ModelConfig, Result};

/// The keys and values of a batch of rows being decoded.
pub trait DecodeCache: Send {
    /// Rows in the batch.
    fn batch(&self) -> usize;

    /// Tokens cached so far (padding included), the same for every row.
    fn len(&self) -> usize;

    /// Whether nothing has been cached yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the given rows, in the given order (repeats allowed:
    /// a prompt's prefill serves several samples).
    fn select_rows(&mut self, rows: &[usize]) -> Result<()>;

    /// Appends the rows of `other` below this cache's rows, the shorter of
    /// the two padded on the left with masked columns.
    fn append_rows(&mut self, other: Self) -> Result<()>
    where
        Self: Sized;

    /// Drops the leading columns that are padding in every row.
    fn trim_padding(&mut self) -> Result<()>;
}

/// A model that decodes incrementally.
pub trait Decoder: Send + Sync {
    /// Its cache.
    type Cache: DecodeCache;

    /// The decoder's description.
    fn config(&self) -> &ModelConfig;

    /// Where token ids and masks are handed over (candle tensors).
    fn input_device(&self) -> &Device;

    /// An empty cache for `batch` rows, with room for `tokens` columns
    /// (0: grow as needed).
    fn new_cache(&self, batch: usize, tokens: usize) -> Self::Cache;

    /// Appends `ids (B, T)` with their `mask (B, T)` (1 = real token) to
    /// `cache` and returns the logits of each row's last new position,
    /// `(B, V)`, in f32.
    fn forward_step(&self, ids: &Tensor, mask: &Tensor, cache: &mut Self::Cache) -> Result<Tensor>;

    /// Log-probs of `targets (B, T)` given `ids (B, T)` and a left-padding
    /// `mask`, without a graph (the learner's scoring of whole sequences).
    fn score_logprobs(&self, ids: &Tensor, mask: &Tensor, targets: &Tensor) -> Result<Tensor>;

    /// Whether its steps run best on rayon's pool with the pool's other
    /// threads kept awake ([`crate::pool::on_pool_awake`]): candle's kernels
    /// are rayon's; libtorch runs its own threads, which spinning rayon
    /// threads would only slow down.
    fn wants_pool(&self) -> bool {
        true
    }
}
