//! A single DM Control environment: task logic over one [`Physics`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use mujoco_rs::prelude::*;
use rand::SeedableRng;

use crate::error::{Error, PhysicsWarning, Result};
use crate::physics::{load_edited_model, load_model, Physics, PhysicsState};
use crate::tasks::{task_spec, ObsWriter, Task, TaskRng, TaskSpec};

/// Most consecutive resets that may fail with MuJoCo warnings.
const MAX_RESET_ATTEMPTS: usize = 100;

/// Outcome of one control step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Reward in `[0, 1]` (0 when the step was unstable).
    pub reward: f64,
    /// The episode reached its time limit (truncation: bootstrap from the
    /// returned observation). DM Control tasks never terminate otherwise.
    pub truncated: bool,
    /// MuJoCo warnings raised during the step: the state is invalid and the
    /// environment must be reset (dm_control raises `PhysicsError` here).
    pub warning: Option<PhysicsWarning>,
}

/// Models compiled so far in this process, by task and suite folder.
type ModelCache = Mutex<HashMap<(&'static str, PathBuf), Arc<MjModel>>>;
static MODELS: OnceLock<ModelCache> = OnceLock::new();

/// Loads a task's model with its constant edits (XML, then compiled model)
/// applied, ready to share between environments.
///
/// Each task's model is compiled once per process and shared afterwards:
/// models are never changed after these edits, and recompiling for every
/// vectorised env (each evaluation and each run of `control compare` builds
/// new ones) cost the compile itself (≈ 40 ms; 1 s for dog's meshes) and
/// repeated MuJoCo's compiler warnings (cheetah's `settotalmass`) each time.
pub fn load_task_model(spec: &'static TaskSpec, suite: Option<&Path>) -> Result<Arc<MjModel>> {
    let key = (spec.name, crate::physics::suite_dir(suite));
    let cache = MODELS.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(m) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Arc::clone(m));
    }
    let mut model = match spec.edit_xml {
        Some(edit) => load_edited_model(spec.domain, suite, edit)?,
        None => load_model(spec.domain, suite)?,
    };
    (spec.edit_model)(&mut model)?;
    let model = Arc::new(model);
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Arc::clone(&model));
    Ok(model)
}

/// One environment of a registered task.
#[derive(Debug)]
pub struct Env {
    spec: &'static TaskSpec,
    physics: Physics,
    task: Box<dyn Task>,
    rng: TaskRng,
    step_count: usize,
    episode_steps: usize,
    needs_reset: bool,
}

/// Builds the environment `name` (e.g. `cartpole-swingup`) with its own
/// model, seeded with `seed`. The environment starts un-reset; call
/// [`Env::reset`].
pub fn make_env(name: &str, seed: u64, suite: Option<&Path>) -> Result<Env> {
    let spec = task_spec(name)?;
    let model = load_task_model(spec, suite)?;
    Env::with_model(spec, model, seed)
}

impl Env {
    /// An environment over an already loaded (shared) model of `spec`.
    pub fn with_model(spec: &'static TaskSpec, model: Arc<MjModel>, seed: u64) -> Result<Self> {
        let task = (spec.build)(&model)?;
        let dt = model.opt().timestep;
        let n_sub = spec.n_sub_steps(dt)?;
        let episode_steps = spec.episode_steps(dt, n_sub);
        Ok(Self {
            spec,
            physics: Physics::new(model, n_sub),
            task,
            rng: TaskRng::seed_from_u64(seed),
            step_count: 0,
            episode_steps,
            needs_reset: true,
        })
    }

    /// The task's registry name.
    pub fn name(&self) -> &'static str {
        self.spec.name
    }

    /// The task's static description.
    pub fn spec(&self) -> &'static TaskSpec {
        self.spec
    }

    /// Observation length.
    pub fn observation_dim(&self) -> usize {
        self.task.observation_dim()
    }

    /// Action length (`nu`); actions live in `[-1, 1]`.
    pub fn action_dim(&self) -> usize {
        self.physics.model().nu() as usize
    }

    /// Control steps per episode (1000 for every registered task).
    pub fn episode_steps(&self) -> usize {
        self.episode_steps
    }

    /// Control steps taken in the current episode.
    pub fn step_count(&self) -> usize {
        self.step_count
    }

    /// The simulation.
    pub fn physics(&self) -> &Physics {
        &self.physics
    }

    /// The task logic.
    pub fn task(&self) -> &dyn Task {
        self.task.as_ref()
    }

    /// Writes the current observation into `out` (length
    /// [`Env::observation_dim`]).
    pub fn observe_into(&self, out: &mut [f64]) {
        let mut w = ObsWriter::new(out);
        self.task.observe(&self.physics, &mut w);
        debug_assert_eq!(w.written(), self.task.observation_dim(), "{}", self.spec.name);
    }

    /// The current observation.
    pub fn observation(&self) -> Vec<f64> {
        let mut obs = vec![0.0; self.observation_dim()];
        self.observe_into(&mut obs);
        obs
    }

    /// The reward of the current state.
    pub fn reward(&self) -> f64 {
        self.task.reward(&self.physics)
    }

    /// Starts a new episode (dm_control's `reset`: `mj_resetData`,
    /// `mj_forward`, task initialisation, `mj_forward`) and writes the first
    /// observation. Initial states that raise MuJoCo warnings are redrawn.
    pub fn reset_into(&mut self, out: &mut [f64]) -> Result<()> {
        let mut last = None;
        for _ in 0..MAX_RESET_ATTEMPTS {
            self.physics.reset();
            let res =
                self.task.initialize_episode(&mut self.physics, &mut self.rng).and_then(|()| self.physics.forward());
            match res {
                Ok(()) => {
                    self.step_count = 0;
                    self.needs_reset = false;
                    self.observe_into(out);
                    return Ok(());
                }
                Err(w) => last = Some(w),
            }
        }
        Err(Error::ResetFailed {
            task: self.spec.name,
            attempts: MAX_RESET_ATTEMPTS,
            reason: last.map(|w| w.to_string()).unwrap_or_default(),
        })
    }

    /// [`Env::reset_into`] returning the observation.
    pub fn reset(&mut self) -> Result<Vec<f64>> {
        let mut obs = vec![0.0; self.observation_dim()];
        self.reset_into(&mut obs)?;
        Ok(obs)
    }

    /// Applies `action` for one control step and writes the next observation.
    /// After a truncated or unstable step the environment must be reset.
    ///
    /// # Panics
    /// When `action` does not have [`Env::action_dim`] entries.
    pub fn step_into(&mut self, action: &[f64], out: &mut [f64]) -> StepResult {
        assert_eq!(action.len(), self.action_dim(), "{}: action length", self.spec.name);
        debug_assert!(!self.needs_reset, "{}: step before reset", self.spec.name);
        self.physics.set_control(action);
        let warning = self.physics.step().err();
        self.step_count += 1;
        self.observe_into(out);
        let reward = if warning.is_some() { 0.0 } else { self.reward() };
        let truncated = warning.is_none() && self.step_count >= self.episode_steps;
        self.needs_reset = truncated || warning.is_some();
        StepResult { reward, truncated, warning }
    }

    /// [`Env::step_into`] returning the observation.
    pub fn step(&mut self, action: &[f64]) -> (Vec<f64>, StepResult) {
        let mut obs = vec![0.0; self.observation_dim()];
        let r = self.step_into(action, &mut obs);
        (obs, r)
    }

    /// The physics state and per-episode task parameters, enough to replay
    /// the episode from here.
    pub fn snapshot(&self) -> (PhysicsState, Vec<f64>) {
        (self.physics.state(), self.task.episode_params())
    }

    /// Puts the environment in a recorded state (as after a reset: zero
    /// controls, `mj_forward` run, step count 0) and returns the observation.
    /// Golden replays use this, since dm_control's RNG cannot be reproduced.
    pub fn restore(&mut self, state: &PhysicsState, episode_params: &[f64]) -> Result<Vec<f64>> {
        self.physics.set_state(state, self.spec.name)?;
        self.task.set_episode_params(episode_params)?;
        self.physics.forward().map_err(|warning| Error::Physics { task: self.spec.name, warning })?;
        self.step_count = 0;
        self.needs_reset = false;
        Ok(self.observation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's model is compiled once per process and shared afterwards;
    /// another task gets its own.
    #[test]
    fn task_models_are_compiled_once() {
        let spec = task_spec("cartpole-swingup").unwrap();
        let a = load_task_model(spec, None).unwrap();
        let b = load_task_model(spec, None).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let other = load_task_model(task_spec("cartpole-balance").unwrap(), None).unwrap();
        assert!(!Arc::ptr_eq(&a, &other));
    }
}
