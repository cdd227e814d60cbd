//! The torch backend's data-parallel half ([`Sharding`]): ZeRO's
//! mechanics on libtorch tensors. Which rank owns each parameter (balanced
//! by values at [`Sharding::shard_optimizer`]), the gradient sum or
//! reduction into owners (after a round, or layer by layer during a
//! checkpointed backward), the owners' parameters sent after a step, and a
//! checkpoint's optimizer state streamed into rank 0's file tensor by
//! tensor; the collectives go through [`crate::parallel::Group`], in
//! buckets of at most 32 Mi values ([`crate::parallel::buckets`]).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use tch::{Kind, Tensor as T};

use super::{guarded, set_grad, unflatten_into, Shard, State, TorchBackend};
use crate::backend::{ShardSizes, Sharding};
use crate::model::{ModelError, Result};

impl Sharding for TorchBackend {
    fn shard_optimizer(&mut self, rank: usize, world: usize) -> Result<ShardSizes> {
        let st = self.lock();
        // Each parameter to the rank holding the fewest values so far, in
        // order: balanced to within one tensor, the same on every rank.
        let mut load = vec![0usize; world.max(1)];
        let mut owner = vec![0usize; st.params.len()];
        for (i, p) in st.params.iter().enumerate() {
            if self.learns(i) {
                let r = (0..load.len()).min_by_key(|&r| (load[r], r)).unwrap_or(0);
                owner[i] = r;
                load[r] += p.numel();
            }
        }
        let total: usize = load.iter().sum();
        let mine = load.get(rank).copied().unwrap_or(0);
        let masters = world > 1 && self.kind != Kind::Float;
        drop(st);
        self.shard = Some(Shard { rank, owner, masters });
        let mut st = self.lock();
        guarded("torch optimizer shards", || {
            tch::no_grad(|| {
                for i in 0..st.params.len() {
                    if !self.steps_here(i) && self.learns(i) {
                        // Moments loaded for every parameter (a resumed run)
                        // keep only this rank's.
                        if !st.m.is_empty() {
                            st.m[i] = T::zeros([0], (Kind::Float, self.device));
                            st.v[i] = T::zeros([0], (Kind::Float, self.device));
                        }
                        if self.remote(i) {
                            // Another rank's master: held in the compute kind.
                            st.params[i] = st.params[i].detach().to_kind(self.kind).set_requires_grad(true);
                        }
                    }
                }
            });
            Ok(())
        })?;
        drop(st);
        self.changed();
        Ok(ShardSizes {
            moments: 2 * mine,
            moments_total: 2 * total,
            masters: if masters { mine } else { total },
            masters_total: total,
        })
    }

    fn sync_params(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()> {
        let Some(shard) = &self.shard else { return Ok(()) };
        let (owner, rank, masters) = (shard.owner.clone(), shard.rank, shard.masters);
        let mut st = self.lock();
        let (device, kind) = (self.device, self.kind);
        tch::no_grad(|| -> Result<()> {
            // Each owner's parameters go out in buckets, one collective per
            // bucket as in `sync_grads`: the f32 masters, or with sharded
            // masters their casts to the compute kind (what the others hold).
            let runs = self.by_owner(&owner, 0..owner.len());
            for (from, ids) in runs {
                for b in crate::parallel::buckets(ids.iter().map(|&i| st.params[i].numel() as i64)) {
                    let ps: Vec<T> = ids[b]
                        .iter()
                        .map(|&i| if masters { st.params[i].detach().to_kind(kind) } else { st.params[i].detach() })
                        .collect();
                    let flat: Vec<T> = ps.iter().map(|p| p.reshape([-1])).collect();
                    let mut bucket = T::cat(&flat, 0).to_device(device);
                    group.broadcast_tensor(&mut bucket, from).map_err(|e| {
                        ModelError::Torch(format!("sending rank {from}'s parameters to the others: {e}"))
                    })?;
                    if from != rank {
                        unflatten_into(&bucket, &ps);
                    }
                }
            }
            Ok(())
        })?;
        st.pending = None;
        drop(st);
        self.changed();
        Ok(())
    }

    fn gather_optimizer(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()> {
        let Some(shard) = &self.shard else { return Ok(()) };
        if !shard.masters {
            return Ok(());
        }
        let (owner, rank) = (shard.owner.clone(), shard.rank);
        let mut st = self.lock();
        let mut copies: HashMap<usize, T> = HashMap::new();
        tch::no_grad(|| -> Result<()> {
            for (i, &from) in owner.iter().enumerate() {
                if !self.learns(i) || from == 0 {
                    continue;
                }
                let shape = st.params[i].size();
                let what = || format!("{}'s master weight", self.names[i]);
                let t = self.sent_by_owner(group, &st.params[i].detach(), &shape, from, &what)?;
                // Rank 0 moves what it receives to host memory at once, so
                // its device never holds more than its own state and one
                // tensor in flight.
                if rank == 0 {
                    copies.insert(i, t.f_to_device(tch::Device::Cpu).map_err(super::torch_err)?);
                }
            }
            Ok(())
        })?;
        if rank == 0 {
            st.masters = copies;
        }
        Ok(())
    }

    fn write_optimizer(&mut self, group: &mut dyn crate::parallel::Group, path: Option<&Path>) -> Result<()> {
        let Some(shard) = &self.shard else {
            return path.map_or(Ok(()), |p| crate::backend::Backend::save_optimizer(self, p));
        };
        let (owner, rank) = (shard.owner.clone(), shard.rank);
        let mut st = self.lock();
        self.ensure_moments(&mut st)?;
        let learn: Vec<usize> = (0..st.params.len()).filter(|&i| self.learns(i)).collect();
        let entries: Vec<(String, Vec<i64>)> = learn
            .iter()
            .flat_map(|&i| ["m", "v"].map(|pre| (format!("{pre}.{}", self.names[i]), st.params[i].size())))
            .collect();
        let mut file = match (path, rank) {
            (Some(p), 0) => Some(StreamedSafetensors::create(p, &entries)?),
            _ => None,
        };
        tch::no_grad(|| -> Result<()> {
            for &i in &learn {
                let from = owner[i];
                let shape = st.params[i].size();
                for (own, moment) in [(&st.m[i], "first moment"), (&st.v[i], "second moment")] {
                    let what = || format!("{}'s {moment}", self.names[i]);
                    let t = self.sent_by_owner(group, own, &shape, from, &what)?;
                    if let Some(f) = file.as_mut() {
                        f.write(&t)?;
                    }
                }
            }
            Ok(())
        })?;
        file.map_or(Ok(()), StreamedSafetensors::finish)
    }

    fn reduce_grads(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()> {
        if self.shard.is_none() {
            return Err(ModelError::Spec {
                field: "dist.zero_stage".into(),
                message: "gradients are sharded over the optimizer's shards: shard_optimizer first".into(),
            });
        }
        let mut st = self.lock();
        for unit in self.backward_units() {
            self.reduce_unit(&mut st, &unit, group)?;
        }
        Ok(())
    }

    fn reduce_in_backward(&mut self, group: Box<dyn crate::parallel::Group>) -> bool {
        if !self.opts.checkpointing || self.shard.is_none() {
            return false;
        }
        self.lock().reducer = Some(group);
        true
    }

    fn sync_grads(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()> {
        let mut st = self.lock();
        let device = self.device;
        let dist = |e: crate::parallel::DistError| ModelError::Torch(format!("summing gradients over the ranks: {e}"));
        tch::no_grad(|| -> Result<()> {
            let trainable: Vec<usize> = (0..st.params.len()).filter(|&i| st.params[i].requires_grad()).collect();
            // A rank that ran no backward this step holds no gradient: it
            // adds zeros.
            for &i in &trainable {
                if self.remote(i) {
                    if st.grads[i].is_none() {
                        st.grads[i] = Some(T::zeros(st.params[i].size(), (Kind::Float, device)));
                    }
                } else if !st.params[i].grad().defined() {
                    let mut zeros = st.params[i].zeros_like();
                    set_grad(&mut st.params[i], &mut zeros)?;
                }
            }
            for b in crate::parallel::buckets(trainable.iter().map(|&i| st.params[i].numel() as i64)) {
                let grads: Vec<T> = trainable[b].iter().map(|&i| self.grad_of(&st, i)).collect();
                let flat: Vec<T> = grads.iter().map(|g| g.to_kind(Kind::Float).reshape([-1])).collect();
                let mut bucket = T::cat(&flat, 0).to_device(device);
                group.sum_tensor(&mut bucket).map_err(dist)?;
                unflatten_into(&bucket, &grads);
            }
            Ok(())
        })
    }
}

impl TorchBackend {
    /// The parameters that learn, in the units a checkpointed backward
    /// completes their gradients in: each decoder layer from the last to
    /// the first, then the rest (embedding, final norm, LM head: a tied
    /// embedding's gradient is complete only at the very end). Both ways of
    /// reducing (during the backward and [`Sharding::reduce_grads`]) go
    /// unit by unit in this order, so every rank makes the same
    /// collectives.
    pub(super) fn backward_units(&self) -> Vec<Vec<usize>> {
        let mut seen = vec![false; self.names.len()];
        let mut units: Vec<Vec<usize>> = Vec::with_capacity(self.layout.layers.len() + 1);
        for li in (0..self.layout.layers.len()).rev() {
            let unit: Vec<usize> = self.layer_params(li).into_iter().filter(|&i| self.learns(i)).collect();
            for &i in &unit {
                seen[i] = true;
            }
            units.push(unit);
        }
        units.push((0..self.names.len()).filter(|&i| !seen[i] && self.learns(i)).collect());
        units
    }

    /// An f32 tensor of `shape` from its owner `from` to every rank: the
    /// owner sends `own`, the others receive into a buffer of their own.
    /// `what` names it in an error.
    fn sent_by_owner(
        &self,
        group: &mut dyn crate::parallel::Group,
        own: &T,
        shape: &[i64],
        from: usize,
        what: &dyn Fn() -> String,
    ) -> Result<T> {
        let rank = self.shard.as_ref().map_or(0, |s| s.rank);
        let mut t = if from == rank { own.shallow_clone() } else { T::zeros(shape, (Kind::Float, self.device)) };
        group
            .broadcast_tensor(&mut t, from)
            .map_err(|e| ModelError::Torch(format!("sending {} from rank {from}: {e}", what())))?;
        Ok(t)
    }

    /// During a backward under ZeRO-2 ([`Sharding::reduce_in_backward`]):
    /// `unit`'s gradients, just completed, to their owners.
    pub(super) fn reduce_now(&self, st: &mut State, unit: &[usize]) -> Result<()> {
        let Some(mut group) = st.reducer.take() else { return Ok(()) };
        let done = self.reduce_unit(st, unit, group.as_mut());
        st.reducer = Some(group);
        done
    }

    /// Sums the gradients of `ids` into the ranks that step them, a reduce
    /// per bucket of one owner's parameters, and drops them on the other
    /// ranks (a rank that ran no backward for them adds zeros).
    pub(super) fn reduce_unit(
        &self,
        st: &mut State,
        ids: &[usize],
        group: &mut dyn crate::parallel::Group,
    ) -> Result<()> {
        let Some(shard) = &self.shard else { return Ok(()) };
        let rank = shard.rank;
        let device = self.device;
        let runs = self.by_owner(&shard.owner, ids.iter().copied());
        tch::no_grad(|| -> Result<()> {
            for (to, ids) in runs {
                for b in crate::parallel::buckets(ids.iter().map(|&i| st.params[i].numel() as i64)) {
                    let ids = &ids[b];
                    let grads: Vec<T> = ids.iter().map(|&i| self.grad_of(st, i)).collect();
                    let flat: Vec<T> = ids
                        .iter()
                        .zip(&grads)
                        .map(|(&i, g)| {
                            if g.defined() {
                                g.to_kind(Kind::Float).reshape([-1])
                            } else {
                                T::zeros([st.params[i].numel() as i64], (Kind::Float, device))
                            }
                        })
                        .collect();
                    let mut bucket = T::cat(&flat, 0).to_device(device);
                    drop(flat);
                    group.reduce_tensor(&mut bucket, to).map_err(|e| {
                        ModelError::Torch(format!("summing gradients into rank {to}, their owner: {e}"))
                    })?;
                    let mut off = 0;
                    for (&i, g) in ids.iter().zip(&grads) {
                        let k = st.params[i].numel() as i64;
                        if to == rank {
                            let sum = bucket.narrow(0, off, k).view_as(&st.params[i]);
                            if g.defined() {
                                g.shallow_clone().copy_(&sum);
                            } else {
                                let mut sum = sum.to_kind(st.params[i].kind());
                                set_grad(&mut st.params[i], &mut sum)?;
                            }
                        } else if self.remote(i) {
                            st.grads[i] = None;
                        } else {
                            set_grad(&mut st.params[i], &mut T::new())?;
                        }
                        off += k;
                    }
                }
            }
            Ok(())
        })
    }
}

/// A safetensors file written one tensor at a time, in the order the
/// tensors arrive: the header (every name, shape and offset, known before
/// the first byte) first, then each tensor's f32 values as they come.
///
/// Hand-written because both writers at hand need every tensor's bytes up
/// front, in an order of their own (`safetensors::serialize_to_file` sorts
/// by dtype and name before asking each view for its data; tch's writer
/// takes a list of tensors): here each moment comes out of a collective,
/// in parameter order, and is written and dropped before the next one is
/// received, so rank 0 holds one tensor where it held every other rank's
/// state (measured on CPU ranks: results/bench/dist-memory-*). The file is
/// the format's: an 8-byte little-endian header length, the JSON header
/// padded with spaces to 8 bytes, the data with contiguous offsets; the
/// readers check it (`MmapedSafetensors`, tested by every resume).
struct StreamedSafetensors {
    out: std::io::BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    /// The byte length each tensor must have, in the order they come.
    lengths: Vec<usize>,
    next: usize,
}

impl StreamedSafetensors {
    fn create(path: &Path, entries: &[(String, Vec<i64>)]) -> Result<Self> {
        let err = |m: String| ModelError::Format { path: path.to_path_buf(), message: m };
        let mut header = serde_json::Map::new();
        let (mut offset, mut lengths) = (0usize, Vec::with_capacity(entries.len()));
        for (name, shape) in entries {
            let len = 4 * shape.iter().product::<i64>() as usize;
            header.insert(
                name.clone(),
                serde_json::json!({ "dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len] }),
            );
            offset += len;
            lengths.push(len);
        }
        let mut json = serde_json::to_string(&header).map_err(|e| err(e.to_string()))?.into_bytes();
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let f = std::fs::File::create(path).map_err(|e| err(e.to_string()))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, f);
        out.write_all(&(json.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&json))
            .map_err(|e| err(e.to_string()))?;
        Ok(Self { out, path: path.to_path_buf(), lengths, next: 0 })
    }

    /// The next tensor's values (f32, any device).
    fn write(&mut self, t: &T) -> Result<()> {
        let err = |m: String| ModelError::Format { path: self.path.clone(), message: m };
        let want = *self.lengths.get(self.next).ok_or_else(|| err("more tensors than the header names".into()))?;
        let t = t.f_to_kind(Kind::Float).and_then(|t| t.f_contiguous()).map_err(super::torch_err)?;
        let n = t.numel();
        if 4 * n != want {
            return Err(err(format!("tensor {} has {} bytes, its header entry {want}", self.next, 4 * n)));
        }
        let mut bytes = vec![0u8; 4 * n];
        t.f_copy_data_u8(&mut bytes, n).map_err(super::torch_err)?;
        self.out.write_all(&bytes).map_err(|e| err(e.to_string()))?;
        self.next += 1;
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        if self.next != self.lengths.len() {
            return Err(ModelError::Format {
                path: self.path.clone(),
                message: format!("{} of {} tensors written", self.next, self.lengths.len()),
            });
        }
        self.out.flush().map_err(|e| ModelError::Format { path: self.path.clone(), message: e.to_string() })
    }
}
