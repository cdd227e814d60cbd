//! Planar walker: stand / walk / run.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, mat, randomize_limited_and_rotational_joints, ObsWriter, Sensor, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{tolerance, Sigmoid, DEFAULT_VALUE_AT_MARGIN};

const STAND_HEIGHT: f64 = 1.2;

/// Walker (dm_control `walker.PlanarWalker`).
#[derive(Debug)]
pub struct Walker {
    name: &'static str,
    move_speed: f64,
    torso: usize,
    nbody: usize,
    subtreelinvel: Sensor,
}

fn make(model: &MjModel, name: &'static str, move_speed: f64) -> Result<Box<dyn Task>> {
    check_model(model, name, 9, 9, 6)?;
    Ok(Box::new(Walker {
        name,
        move_speed,
        torso: body_id(model, name, "torso")?,
        nbody: model.nbody() as usize,
        subtreelinvel: Sensor::find(model, name, "torso_subtreelinvel")?,
    }))
}

/// `walker-stand`.
pub fn stand(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "walker-stand", 0.0)
}
/// `walker-walk`.
pub fn walk(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "walker-walk", 1.0)
}
/// `walker-run`.
pub fn run(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "walker-run", 8.0)
}

impl Task for Walker {
    fn name(&self) -> &'static str {
        self.name
    }

    fn observation_dim(&self) -> usize {
        2 * (self.nbody - 1) + 1 + 9
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        randomize_limited_and_rotational_joints(physics, rng);
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        for b in 1..self.nbody {
            let x = physics.xmat(b);
            out.push(x[mat::XX]);
            out.push(x[mat::XZ]);
        }
        out.push(physics.xpos(self.torso)[2]);
        out.extend(physics.data().qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let height = physics.xpos(self.torso)[2];
        let standing = tolerance(
            height,
            (STAND_HEIGHT, f64::INFINITY),
            STAND_HEIGHT / 2.0,
            Sigmoid::Gaussian,
            DEFAULT_VALUE_AT_MARGIN,
        );
        let upright = (1.0 + physics.xmat(self.torso)[mat::ZZ]) / 2.0;
        let stand_reward = (3.0 * standing + upright) / 4.0;
        if self.move_speed == 0.0 {
            return stand_reward;
        }
        let v = self.subtreelinvel.read(physics)[0];
        let move_reward = tolerance(v, (self.move_speed, f64::INFINITY), self.move_speed / 2.0, Sigmoid::Linear, 0.5);
        stand_reward * (5.0 * move_reward + 1.0) / 6.0
    }
}
