//! Checkpoints: weights and Adam moments in safetensors, the rest in JSON.

use super::*;

/// The JSON half of a checkpoint (weights and Adam moments are in the
/// `.safetensors` file it names).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointState {
    /// Format version.
    pub format: u32,
    /// The run's resolved config.
    pub config: TrainConfig,
    /// Step counters.
    pub counters: Counters,
    /// Action-sampling and shuffling RNG.
    pub rng: ChaCha8Rng,
    /// Observation normalisation statistics (cleanrl flavour).
    pub obs_stats: RunningMeanStd,
    /// Brax's in-network normaliser (brax flavour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obs_norm: Option<ObsNormalizer>,
    /// λ and its settings.
    pub dual: DualVariable,
    /// Adam's step count.
    pub adam_steps: u64,
    /// File name (in the same folder) of the weights and Adam moments.
    pub weights: String,
}

const CHECKPOINT_FORMAT: u32 = 1;

impl Trainer {
    /// Writes `ckpt-<update>.safetensors` (weights, Adam moments) and then
    /// `ckpt-<update>.json` (everything else) into `dir`, both atomically,
    /// and keeps the two newest checkpoints. Returns the JSON path.
    ///
    /// Environment state is not saved: call this right after starting a new
    /// environment segment (as [`Trainer::run`] does) so that a resumed run
    /// continues exactly.
    pub fn save_checkpoint(&self, dir: &Path) -> TrainResult<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::File { path: dir.into(), message: e.to_string() })?;
        let stem = format!("ckpt-{:08}", self.counters.update);
        let weights = format!("{stem}.safetensors");
        let mut tensors = std::collections::HashMap::new();
        for (i, (name, p)) in self.params.iter().enumerate() {
            tensors.insert(format!("param/{name}"), p.as_tensor().detach());
            tensors.insert(format!("adam_m/{name}"), Tensor::from_slice(&self.adam.m[i], p.shape(), &Device::Cpu)?);
            tensors.insert(format!("adam_v/{name}"), Tensor::from_slice(&self.adam.v[i], p.shape(), &Device::Cpu)?);
        }
        // candle writes straight to a path; write a scratch file and move
        // its bytes into place atomically.
        let scratch = dir.join(format!(".{weights}.partial"));
        candle_core::safetensors::save(&tensors, &scratch)?;
        let bytes =
            std::fs::read(&scratch).map_err(|e| TrainError::File { path: scratch.clone(), message: e.to_string() })?;
        atomic_write(&dir.join(&weights), &bytes)?;
        let _ = std::fs::remove_file(&scratch);
        let state = CheckpointState {
            format: CHECKPOINT_FORMAT,
            config: self.cfg.clone(),
            counters: self.counters.clone(),
            rng: self.rng.clone(),
            obs_stats: self.segment_stats.clone(),
            obs_norm: self.obs_norm.clone(),
            dual: self.learner.dual().clone(),
            adam_steps: self.adam.t,
            weights,
        };
        let json = dir.join(format!("{stem}.json"));
        atomic_write_json(&json, &state)?;
        // Keep the two newest checkpoints.
        let mut all = list_checkpoints(dir)?;
        while all.len() > 2 {
            let (_, old) = all.remove(0);
            if let Ok(s) = read_state(&old) {
                let _ = std::fs::remove_file(dir.join(s.weights));
            }
            let _ = std::fs::remove_file(old);
        }
        Ok(json)
    }

    /// Restores the newest checkpoint in `dir`. `config` replaces the saved
    /// config (e.g. with a larger `total_env_steps`) when given; everything
    /// that shapes the networks must stay the same.
    pub fn resume(dir: &Path, config: Option<TrainConfig>) -> TrainResult<Self> {
        let json = latest_checkpoint(dir)?;
        let state = read_state(&json)?;
        let cfg = config.unwrap_or_else(|| state.config.clone());
        for (field, same) in [
            ("task", cfg.task == state.config.task),
            ("policy", cfg.policy == state.config.policy),
            ("num_envs", cfg.num_envs == state.config.num_envs),
            ("seed", cfg.seed == state.config.seed),
        ] {
            if !same {
                return Err(TrainError::Config {
                    field: field.into(),
                    message: format!("differs from the checkpoint {}; a resumed run must keep it", json.display()),
                });
            }
        }
        let mut t = Self::new(cfg)?;
        let wpath = dir.join(&state.weights);
        let tensors = candle_core::safetensors::load(&wpath, &Device::Cpu)
            .map_err(|e| TrainError::File { path: wpath.clone(), message: e.to_string() })?;
        let get = |key: String| -> TrainResult<Vec<f32>> {
            let t = tensors
                .get(&key)
                .ok_or_else(|| TrainError::File { path: wpath.clone(), message: format!("no tensor `{key}`") })?;
            Ok(t.flatten_all()?.to_vec1::<f32>()?)
        };
        let mut params = std::collections::HashMap::new();
        for (i, (name, p)) in t.params.iter().enumerate() {
            params.insert(
                name.clone(),
                tensors.get(&format!("param/{name}")).cloned().ok_or_else(|| TrainError::File {
                    path: wpath.clone(),
                    message: format!("no tensor `param/{name}`"),
                })?,
            );
            let (m, v) = (get(format!("adam_m/{name}"))?, get(format!("adam_v/{name}"))?);
            if m.len() != p.elem_count() || v.len() != p.elem_count() {
                return Err(TrainError::File {
                    path: wpath.clone(),
                    message: format!("Adam moments of `{name}` have the wrong size"),
                });
            }
            t.adam.m[i] = m;
            t.adam.v[i] = v;
        }
        t.net.load_state_dict(&params)?;
        t.fast = NativeNet::from_net(&t.net)?;
        if t.obs_norm.is_some() {
            t.obs_norm = Some(state.obs_norm.clone().ok_or_else(|| TrainError::File {
                path: json.clone(),
                message:
                    "the checkpoint has no observation normaliser (obs_norm), which this brax-flavour run needs".into(),
            })?);
        }
        t.fast.set_obs_norm(t.obs_norm.as_ref().map(ObsNormalizer::mean_std));
        t.adam.t = state.adam_steps;
        t.rng = state.rng;
        t.learner = Learner::with_dual(t.cfg.objective.clone(), state.dual)?;
        t.counters = state.counters;
        t.env.set_obs_stats(state.obs_stats)?;
        let seg = t.counters.segment;
        t.new_segment(seg)?;
        Ok(t)
    }
}

fn read_state(path: &Path) -> TrainResult<CheckpointState> {
    let text =
        std::fs::read_to_string(path).map_err(|e| TrainError::File { path: path.into(), message: e.to_string() })?;
    let s: CheckpointState = serde_json::from_str(&text)
        .map_err(|e| TrainError::File { path: path.into(), message: format!("invalid checkpoint: {e}") })?;
    if s.format != CHECKPOINT_FORMAT {
        return Err(TrainError::File {
            path: path.into(),
            message: format!("checkpoint format {} (this build reads {CHECKPOINT_FORMAT})", s.format),
        });
    }
    Ok(s)
}

/// `(update, path)` of every `ckpt-*.json` in `dir`, oldest first.
fn list_checkpoints(dir: &Path) -> TrainResult<Vec<(u64, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| TrainError::File { path: dir.into(), message: e.to_string() })?;
    let mut out: Vec<(u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let num = name.strip_prefix("ckpt-")?.strip_suffix(".json")?.parse::<u64>().ok()?;
            Some((num, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The newest checkpoint JSON in `dir`.
pub fn latest_checkpoint(dir: &Path) -> TrainResult<PathBuf> {
    list_checkpoints(dir)?.pop().map(|(_, p)| p).ok_or_else(|| TrainError::File {
        path: dir.into(),
        message: "no checkpoint (ckpt-*.json) in this folder".into(),
    })
}

/// A policy read back from a checkpoint (for evaluation).
#[derive(Debug)]
pub struct SavedPolicy {
    /// The run's config.
    pub config: TrainConfig,
    /// The networks.
    pub net: ActorCritic,
    /// The environments' observation statistics (cleanrl flavour).
    pub obs_stats: RunningMeanStd,
    /// Brax's in-network normaliser (brax flavour).
    pub obs_norm: Option<ObsNormalizer>,
}

impl SavedPolicy {
    /// The policy as [`evaluate_policy`] takes it.
    pub fn eval_policy(&self) -> EvalPolicy<'_> {
        EvalPolicy { net: &self.net, obs_stats: &self.obs_stats, obs_norm: self.obs_norm.as_ref() }
    }
}

/// Loads the networks and observation statistics of the newest checkpoint
/// in `dir` (for evaluation).
pub fn load_policy(dir: &Path) -> TrainResult<SavedPolicy> {
    let json = latest_checkpoint(dir)?;
    let state = read_state(&json)?;
    let spec = crate::tasks::task_spec(&state.config.task)?;
    let model = crate::env::load_task_model(spec, state.config.suite_dir.as_deref())?;
    let probe = crate::env::Env::with_model(spec, model, 0)?;
    let net = ActorCritic::new(&state.config.policy, probe.observation_dim(), probe.action_dim(), 0)?;
    let wpath = dir.join(&state.weights);
    let tensors = candle_core::safetensors::load(&wpath, &Device::Cpu)
        .map_err(|e| TrainError::File { path: wpath.clone(), message: e.to_string() })?;
    let params =
        tensors.into_iter().filter_map(|(k, v)| k.strip_prefix("param/").map(|n| (n.to_string(), v))).collect();
    net.load_state_dict(&params)?;
    Ok(SavedPolicy { config: state.config, net, obs_stats: state.obs_stats, obs_norm: state.obs_norm })
}
