//! Humanoid run.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, mat, randomize_limited_and_rotational_joints, ObsWriter, Sensor, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{norm, np_mean, tolerance, Sigmoid, DEFAULT_VALUE_AT_MARGIN};

const STAND_HEIGHT: f64 = 1.4;
const RUN_SPEED: f64 = 10.0;

/// Humanoid run (dm_control `humanoid.Humanoid`, `move_speed = 10`,
/// feature observations).
#[derive(Debug)]
pub struct Humanoid {
    torso: usize,
    head: usize,
    /// left_hand, left_foot, right_hand, right_foot (dm_control's order).
    limbs: [usize; 4],
    subtreelinvel: Sensor,
}

/// `humanoid-run`.
pub fn run(model: &MjModel) -> Result<Box<dyn Task>> {
    let name = "humanoid-run";
    check_model(model, name, 28, 27, 21)?;
    Ok(Box::new(Humanoid {
        torso: body_id(model, name, "torso")?,
        head: body_id(model, name, "head")?,
        limbs: [
            body_id(model, name, "left_hand")?,
            body_id(model, name, "left_foot")?,
            body_id(model, name, "right_hand")?,
            body_id(model, name, "right_foot")?,
        ],
        subtreelinvel: Sensor::find(model, name, "torso_subtreelinvel")?,
    }))
}

impl Task for Humanoid {
    fn name(&self) -> &'static str {
        "humanoid-run"
    }

    fn observation_dim(&self) -> usize {
        67
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        loop {
            randomize_limited_and_rotational_joints(physics, rng);
            physics.forward()?;
            if physics.ncon() == 0 {
                return Ok(());
            }
        }
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        let d = physics.data();
        out.extend(&d.qpos()[7..]);
        out.push(physics.xpos(self.head)[2]);
        let r = physics.xmat(self.torso);
        let t = physics.xpos(self.torso);
        for &limb in &self.limbs {
            let p = physics.xpos(limb);
            let v = [p[0] - t[0], p[1] - t[1], p[2] - t[2]];
            // Row vector times the torso frame: v · R.
            for j in 0..3 {
                out.push(v[0] * r[j] + v[1] * r[3 + j] + v[2] * r[6 + j]);
            }
        }
        out.extend(&[r[mat::ZX], r[mat::ZY], r[mat::ZZ]]);
        out.extend(self.subtreelinvel.read(physics));
        out.extend(d.qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let standing = tolerance(
            physics.xpos(self.head)[2],
            (STAND_HEIGHT, f64::INFINITY),
            STAND_HEIGHT / 4.0,
            Sigmoid::Gaussian,
            DEFAULT_VALUE_AT_MARGIN,
        );
        let upright = tolerance(physics.xmat(self.torso)[mat::ZZ], (0.9, f64::INFINITY), 1.9, Sigmoid::Linear, 0.0);
        let stand_reward = standing * upright;
        let costs: Vec<f64> =
            physics.data().ctrl().iter().map(|&u| tolerance(u, (0.0, 0.0), 1.0, Sigmoid::Quadratic, 0.0)).collect();
        let small_control = (4.0 + np_mean(&costs)) / 5.0;
        let v = self.subtreelinvel.read(physics);
        let com_velocity = norm(&v[..2]);
        let mv = tolerance(com_velocity, (RUN_SPEED, f64::INFINITY), RUN_SPEED, Sigmoid::Linear, 0.0);
        let mv = (5.0 * mv + 1.0) / 6.0;
        small_control * stand_reward * mv
    }
}
