//! DM Control Suite task logic (dm_control 1.0.50), one module per domain.
//!
//! Each task reproduces dm_control's observation (the `OrderedDict` entries
//! flattened in order), reward, episode initialisation and per-episode model
//! edits. Randomness uses a seeded ChaCha RNG: the distributions match
//! dm_control, the draws cannot (dm_control uses NumPy's `RandomState`).
//!
//! Per-task XML edits (dog's `make_model`) are applied to the model file's
//! text before compiling, via [`TaskSpec::edit_xml`].
//!
//! Per-episode model edits (reacher's and finger's targets) are kept in the
//! task instead of the model, because all environments of a vector share one
//! read-only `MjModel`; the targets sit on the world body and never collide,
//! so their world position equals the edited model field bit-for-bit.

use mujoco_rs::prelude::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::error::{Error, PhysicsWarning, Result};
use crate::physics::Physics;

pub mod acrobot;
pub mod ball_in_cup;
pub mod cartpole;
pub mod cheetah;
pub mod dog;
pub mod finger;
pub mod hopper;
pub mod humanoid;
pub mod pendulum;
pub mod reacher;
pub mod walker;

/// The RNG tasks draw their initial states from.
pub type TaskRng = ChaCha8Rng;

/// The logic of one control task, bound to element ids of its model.
pub trait Task: Send + std::fmt::Debug {
    /// Registry name, e.g. `cartpole-swingup`.
    fn name(&self) -> &'static str;

    /// Length of the flat observation.
    fn observation_dim(&self) -> usize;

    /// dm_control's `initialize_episode`, run after `mj_resetData` +
    /// `mj_forward`; the environment runs `mj_forward` afterwards.
    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning>;

    /// Writes the flat observation (dm_control order) into `out`.
    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>);

    /// The reward of the current state (in `[0, 1]`).
    fn reward(&self, physics: &Physics) -> f64;

    /// Per-episode parameters that stand in for model edits (e.g. a target's
    /// position); empty for most tasks.
    fn episode_params(&self) -> Vec<f64> {
        Vec::new()
    }

    /// Sets the per-episode parameters (golden replays use this).
    fn set_episode_params(&mut self, params: &[f64]) -> Result<()> {
        expect_len(self.name(), "episode_params", params.len(), 0)
    }

    /// The world positions of the objects [`Task::episode_params`] moved
    /// (dm_control edits the model; the shared model here keeps its
    /// defaults), for a rendered frame to show them where the reward sees
    /// them. Empty for most tasks.
    fn moved_objects(&self) -> Vec<MovedObject> {
        Vec::new()
    }
}

/// An object on the world body that a task moved for this episode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MovedObject {
    /// A geom, by id, at a world position.
    Geom {
        /// Geom id.
        id: usize,
        /// World position.
        pos: [f64; 3],
    },
    /// A site, by id, at a world position.
    Site {
        /// Site id.
        id: usize,
        /// World position.
        pos: [f64; 3],
    },
}

/// Sequential writer of a flat observation.
#[derive(Debug)]
pub struct ObsWriter<'a> {
    buf: &'a mut [f64],
    pos: usize,
}

impl<'a> ObsWriter<'a> {
    /// Writes from the start of `buf`.
    pub fn new(buf: &'a mut [f64]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Appends one value.
    pub fn push(&mut self, x: f64) {
        self.buf[self.pos] = x;
        self.pos += 1;
    }

    /// Appends a slice.
    pub fn extend(&mut self, xs: &[f64]) {
        self.buf[self.pos..self.pos + xs.len()].copy_from_slice(xs);
        self.pos += xs.len();
    }

    /// Values written so far.
    pub fn written(&self) -> usize {
        self.pos
    }
}

/// Static description of a registered task.
#[derive(Debug)]
pub struct TaskSpec {
    /// Registry name: domain and task joined by a dash.
    pub name: &'static str,
    /// Model file stem in the suite folder.
    pub domain: &'static str,
    /// dm_control's control timestep, if the task sets one (else one physics
    /// step per control step).
    pub control_timestep: Option<f64>,
    /// dm_control's episode time limit in seconds.
    pub time_limit: f64,
    /// Rewrites the model file's text before it is compiled, for tasks whose
    /// dm_control constructor edits the XML (elements removed, sizes changed).
    pub edit_xml: Option<XmlEdit>,
    /// Edits applied once to the loaded model (constant per task).
    pub edit_model: fn(&mut MjModel) -> Result<()>,
    /// Binds the task logic to the model.
    pub build: fn(&MjModel) -> Result<Box<dyn Task>>,
}

/// A rewrite of a model file's text (see [`TaskSpec::edit_xml`]).
pub type XmlEdit = fn(&str) -> Result<String>;

impl TaskSpec {
    /// Physics steps per control step (dm_control's `compute_n_steps`).
    pub fn n_sub_steps(&self, physics_timestep: f64) -> Result<usize> {
        let Some(ct) = self.control_timestep else {
            return Ok(1);
        };
        let ratio = ct / physics_timestep;
        if ct < physics_timestep || (ratio - ratio.round()).abs() > 1e-8 {
            return Err(Error::ModelMismatch {
                task: self.name,
                message: format!("control timestep {ct} is not a multiple of physics timestep {physics_timestep}"),
            });
        }
        Ok(ratio.round() as usize)
    }

    /// Control steps per episode (dm_control truncates at
    /// `step_count >= time_limit / control_timestep`).
    pub fn episode_steps(&self, physics_timestep: f64, n_sub_steps: usize) -> usize {
        (self.time_limit / (physics_timestep * n_sub_steps as f64)).ceil() as usize
    }
}

fn no_edit(_: &mut MjModel) -> Result<()> {
    Ok(())
}

macro_rules! spec {
    ($name:literal, $domain:literal, $ct:expr, $tl:expr, $edit:expr, $build:expr) => {
        spec!($name, $domain, $ct, $tl, None, $edit, $build)
    };
    ($name:literal, $domain:literal, $ct:expr, $tl:expr, $xml:expr, $edit:expr, $build:expr) => {
        TaskSpec {
            name: $name,
            domain: $domain,
            control_timestep: $ct,
            time_limit: $tl,
            edit_xml: $xml,
            edit_model: $edit,
            build: $build,
        }
    };
}

/// Every registered task, in registry order.
pub static TASKS: &[TaskSpec] = &[
    spec!("cartpole-balance", "cartpole", None, 10.0, no_edit, cartpole::balance),
    spec!("cartpole-balance_sparse", "cartpole", None, 10.0, no_edit, cartpole::balance_sparse),
    spec!("cartpole-swingup", "cartpole", None, 10.0, no_edit, cartpole::swingup),
    spec!("cartpole-swingup_sparse", "cartpole", None, 10.0, no_edit, cartpole::swingup_sparse),
    spec!("pendulum-swingup", "pendulum", None, 20.0, no_edit, pendulum::swingup),
    spec!("acrobot-swingup", "acrobot", None, 10.0, no_edit, acrobot::swingup),
    spec!("ball_in_cup-catch", "ball_in_cup", Some(0.02), 20.0, no_edit, ball_in_cup::catch),
    spec!("cheetah-run", "cheetah", None, 10.0, no_edit, cheetah::run),
    spec!("walker-stand", "walker", Some(0.025), 25.0, no_edit, walker::stand),
    spec!("walker-walk", "walker", Some(0.025), 25.0, no_edit, walker::walk),
    spec!("walker-run", "walker", Some(0.025), 25.0, no_edit, walker::run),
    spec!("hopper-stand", "hopper", Some(0.02), 20.0, no_edit, hopper::stand),
    spec!("hopper-hop", "hopper", Some(0.02), 20.0, no_edit, hopper::hop),
    spec!("finger-spin", "finger", Some(0.02), 20.0, finger::edit_spin, finger::spin),
    spec!("finger-turn_easy", "finger", Some(0.02), 20.0, finger::edit_turn_easy, finger::turn_easy),
    spec!("finger-turn_hard", "finger", Some(0.02), 20.0, finger::edit_turn_hard, finger::turn_hard),
    spec!("reacher-easy", "reacher", None, 20.0, reacher::edit_easy, reacher::easy),
    spec!("reacher-hard", "reacher", None, 20.0, reacher::edit_hard, reacher::hard),
    spec!("humanoid-run", "humanoid", Some(0.025), 25.0, no_edit, humanoid::run),
    spec!("dog-run", "dog", Some(0.015), 15.0, Some(dog::edit_run_xml), no_edit, dog::run),
];

/// Names of all registered tasks (`domain-task`).
pub fn task_names() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| TASKS.iter().map(|s| s.name).collect())
}

/// The spec of a registered task.
pub fn task_spec(name: &str) -> Result<&'static TaskSpec> {
    TASKS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Error::UnknownTask { name: name.to_string(), known: task_names().to_vec() })
}

// ---- helpers shared by the domains ----------------------------------------

pub(crate) fn expect_len(task: &'static str, field: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::BadLength { task, field, got, expected })
    }
}

fn lookup(model: &MjModel, task: &'static str, kind: &'static str, obj: MjtObjBase, name: &str) -> Result<usize> {
    model.name_to_id(obj, name).ok_or_else(|| Error::MissingElement { task, kind, name: name.to_string() })
}

pub(crate) fn body_id(model: &MjModel, task: &'static str, name: &str) -> Result<usize> {
    lookup(model, task, "body", MjtObjBase::mjOBJ_BODY, name)
}

pub(crate) fn joint_id(model: &MjModel, task: &'static str, name: &str) -> Result<usize> {
    lookup(model, task, "joint", MjtObjBase::mjOBJ_JOINT, name)
}

pub(crate) fn geom_id(model: &MjModel, task: &'static str, name: &str) -> Result<usize> {
    lookup(model, task, "geom", MjtObjBase::mjOBJ_GEOM, name)
}

pub(crate) fn site_id(model: &MjModel, task: &'static str, name: &str) -> Result<usize> {
    lookup(model, task, "site", MjtObjBase::mjOBJ_SITE, name)
}

/// `qpos` address of a joint.
pub(crate) fn qpos_adr(model: &MjModel, task: &'static str, joint: &str) -> Result<usize> {
    Ok(model.jnt_qposadr()[joint_id(model, task, joint)?] as usize)
}

/// A sensor's address and width in `sensordata`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sensor {
    pub adr: usize,
    pub dim: usize,
}

impl Sensor {
    pub fn find(model: &MjModel, task: &'static str, name: &str) -> Result<Self> {
        let id = lookup(model, task, "sensor", MjtObjBase::mjOBJ_SENSOR, name)?;
        Ok(Self { adr: model.sensor_adr()[id] as usize, dim: model.sensor_dim()[id] as usize })
    }

    pub fn read<'p>(&self, physics: &'p Physics) -> &'p [f64] {
        physics.sensor(self.adr, self.dim)
    }
}

/// Checks the model's shape and that every actuator's force is exactly zero
/// when its control and activation are zero, which [`Physics::forward`]
/// relies on to reproduce dm_control's actuation-disabled forward pass:
/// gain-times-input actuators (no bias) whose activation dynamics keep a zero
/// activation at zero (none, integrator, filter), and no gravity compensation
/// routed through actuators.
pub(crate) fn check_model(model: &MjModel, task: &'static str, nq: usize, nv: usize, nu: usize) -> Result<()> {
    let got = (model.nq() as usize, model.nv() as usize, model.nu() as usize);
    if got != (nq, nv, nu) {
        return Err(Error::ModelMismatch {
            task,
            message: format!("(nq, nv, nu) = {got:?}, expected {:?}", (nq, nv, nu)),
        });
    }
    let inert = model.actuator_dyntype().iter().all(|&d| {
        matches!(d, MjtDyn::mjDYN_NONE | MjtDyn::mjDYN_INTEGRATOR | MjtDyn::mjDYN_FILTER | MjtDyn::mjDYN_FILTEREXACT)
    }) && model.actuator_gaintype().iter().all(|&g| g == MjtGain::mjGAIN_FIXED)
        && model.actuator_biastype().iter().all(|&b| b == MjtBias::mjBIAS_NONE)
        && !model.jnt_actgravcomp().iter().any(|&g| g);
    if !inert {
        let message = "unsupported actuators (bias, non-fixed gain, muscle dynamics or gravcomp)".into();
        return Err(Error::ModelMismatch { task, message });
    }
    Ok(())
}

/// NumPy's `uniform(lo, hi)`: `lo + (hi − lo)·U[0, 1)`.
pub(crate) fn uniform(rng: &mut TaskRng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

/// A standard normal draw.
pub(crate) fn randn(rng: &mut TaskRng) -> f64 {
    rng.sample(StandardNormal)
}

/// dm_control's `randomize_limited_and_rotational_joints`.
pub(crate) fn randomize_limited_and_rotational_joints(physics: &mut Physics, rng: &mut TaskRng) {
    let m = physics.model();
    let joints: Vec<(MjtJoint, bool, [f64; 2], usize)> = (0..m.njnt() as usize)
        .map(|j| (m.jnt_type()[j], m.jnt_limited()[j], m.jnt_range()[j], m.jnt_qposadr()[j] as usize))
        .collect();
    let qpos = physics.data_mut().qpos_mut();
    for (ty, limited, [lo, hi], adr) in joints {
        match (ty, limited) {
            (MjtJoint::mjJNT_HINGE | MjtJoint::mjJNT_SLIDE, true) => qpos[adr] = uniform(rng, lo, hi),
            (MjtJoint::mjJNT_BALL, true) => {
                let mut axis = [randn(rng), randn(rng), randn(rng)];
                let n = crate::rewards::norm(&axis);
                axis.iter_mut().for_each(|a| *a /= n);
                let angle = rng.random::<f64>() * hi;
                let (s, c) = (angle / 2.0).sin_cos();
                qpos[adr..adr + 4].copy_from_slice(&[c, axis[0] * s, axis[1] * s, axis[2] * s]);
            }
            (MjtJoint::mjJNT_HINGE, false) => qpos[adr] = uniform(rng, -std::f64::consts::PI, std::f64::consts::PI),
            (MjtJoint::mjJNT_BALL, false) => {
                let mut q = [randn(rng), randn(rng), randn(rng), randn(rng)];
                let n = crate::rewards::norm(&q);
                q.iter_mut().for_each(|a| *a /= n);
                qpos[adr..adr + 4].copy_from_slice(&q);
            }
            (MjtJoint::mjJNT_FREE, _) => {
                // dm_control draws rand(4), not randn(4), for free joints.
                let mut q: [f64; 4] = std::array::from_fn(|_| rng.random::<f64>());
                let n = crate::rewards::norm(&q);
                q.iter_mut().for_each(|a| *a /= n);
                qpos[adr + 3..adr + 7].copy_from_slice(&q);
            }
            _ => {}
        }
    }
}

/// Row-major matrix entry names used by dm_control's `xmat[..., 'zz']`.
pub(crate) mod mat {
    pub const XX: usize = 0;
    pub const XZ: usize = 2;
    pub const ZX: usize = 6;
    pub const ZY: usize = 7;
    pub const ZZ: usize = 8;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_dashed() {
        let names = task_names();
        let mut sorted = names.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert!(names.iter().all(|n| n.contains('-')));
        assert!(task_spec("nope-nope").unwrap_err().to_string().contains("cartpole-swingup"));
    }
}
