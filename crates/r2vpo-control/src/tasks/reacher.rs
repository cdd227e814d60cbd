//! Reacher: easy / hard.

use mujoco_rs::prelude::*;

use super::{
    check_model, expect_len, geom_id, randomize_limited_and_rotational_joints, uniform, ObsWriter, Task, TaskRng,
};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{in_bounds, norm};

const BIG_TARGET: f64 = 0.05;
const SMALL_TARGET: f64 = 0.015;

fn edit(model: &mut MjModel, task: &'static str, size: f64) -> Result<()> {
    let g = geom_id(model, task, "target")?;
    model.geom_size_mut()[g][0] = size;
    Ok(())
}

/// Target size of `reacher-easy` (the reacher model has contacts disabled, so
/// this only matters to the reward, which the task computes itself).
pub fn edit_easy(model: &mut MjModel) -> Result<()> {
    edit(model, "reacher-easy", BIG_TARGET)
}

/// Target size of `reacher-hard`.
pub fn edit_hard(model: &mut MjModel) -> Result<()> {
    edit(model, "reacher-hard", SMALL_TARGET)
}

/// Reacher (dm_control `reacher.Reacher`).
#[derive(Debug)]
pub struct Reacher {
    name: &'static str,
    target_size: f64,
    finger_size: f64,
    finger: usize,
    /// Target geom position (x, y) on the world body, this episode.
    target: [f64; 2],
    /// The target geom and its (fixed) height.
    target_geom: usize,
    target_z: f64,
}

fn make(model: &MjModel, name: &'static str, target_size: f64) -> Result<Box<dyn Task>> {
    check_model(model, name, 2, 2, 2)?;
    let finger = geom_id(model, name, "finger")?;
    let target_geom = geom_id(model, name, "target")?;
    let tp = model.geom_pos()[target_geom];
    Ok(Box::new(Reacher {
        name,
        target_size,
        finger_size: model.geom_size()[finger][0],
        finger,
        target: [tp[0], tp[1]],
        target_geom,
        target_z: tp[2],
    }))
}

/// `reacher-easy`.
pub fn easy(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "reacher-easy", BIG_TARGET)
}
/// `reacher-hard`.
pub fn hard(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "reacher-hard", SMALL_TARGET)
}

impl Reacher {
    fn to_target(&self, physics: &Physics) -> [f64; 2] {
        let f = physics.data().geom_xpos()[self.finger];
        [self.target[0] - f[0], self.target[1] - f[1]]
    }
}

impl Task for Reacher {
    fn name(&self) -> &'static str {
        self.name
    }

    fn observation_dim(&self) -> usize {
        6
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        randomize_limited_and_rotational_joints(physics, rng);
        let angle = uniform(rng, 0.0, 2.0 * std::f64::consts::PI);
        let radius = uniform(rng, 0.05, 0.20);
        self.target = [radius * angle.sin(), radius * angle.cos()];
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        out.extend(physics.data().qpos());
        out.extend(&self.to_target(physics));
        out.extend(physics.data().qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let radii = self.target_size + self.finger_size;
        in_bounds(norm(&self.to_target(physics)), (0.0, radii))
    }

    fn episode_params(&self) -> Vec<f64> {
        self.target.to_vec()
    }

    fn moved_objects(&self) -> Vec<super::MovedObject> {
        vec![super::MovedObject::Geom { id: self.target_geom, pos: [self.target[0], self.target[1], self.target_z] }]
    }

    fn set_episode_params(&mut self, params: &[f64]) -> Result<()> {
        expect_len(self.name, "episode_params", params.len(), 2)?;
        self.target = [params[0], params[1]];
        Ok(())
    }
}
