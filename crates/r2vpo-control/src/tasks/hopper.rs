//! Hopper: stand / hop.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, randomize_limited_and_rotational_joints, ObsWriter, Sensor, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{in_bounds, np_mean, tolerance, Sigmoid};

const STAND_HEIGHT: f64 = 0.6;
const HOP_SPEED: f64 = 2.0;

/// Hopper (dm_control `hopper.Hopper`).
#[derive(Debug)]
pub struct Hopper {
    name: &'static str,
    hopping: bool,
    torso: usize,
    foot: usize,
    subtreelinvel: Sensor,
    touch_toe: Sensor,
    touch_heel: Sensor,
}

fn make(model: &MjModel, name: &'static str, hopping: bool) -> Result<Box<dyn Task>> {
    check_model(model, name, 7, 7, 4)?;
    Ok(Box::new(Hopper {
        name,
        hopping,
        torso: body_id(model, name, "torso")?,
        foot: body_id(model, name, "foot")?,
        subtreelinvel: Sensor::find(model, name, "torso_subtreelinvel")?,
        touch_toe: Sensor::find(model, name, "touch_toe")?,
        touch_heel: Sensor::find(model, name, "touch_heel")?,
    }))
}

/// `hopper-stand`.
pub fn stand(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "hopper-stand", false)
}
/// `hopper-hop`.
pub fn hop(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "hopper-hop", true)
}

impl Task for Hopper {
    fn name(&self) -> &'static str {
        self.name
    }

    fn observation_dim(&self) -> usize {
        15
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        randomize_limited_and_rotational_joints(physics, rng);
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        out.extend(&physics.data().qpos()[1..]);
        out.extend(physics.data().qvel());
        out.push(self.touch_toe.read(physics)[0].ln_1p());
        out.push(self.touch_heel.read(physics)[0].ln_1p());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let xipos = physics.data().xipos();
        let height = xipos[self.torso][2] - xipos[self.foot][2];
        let standing = in_bounds(height, (STAND_HEIGHT, 2.0));
        if self.hopping {
            let v = self.subtreelinvel.read(physics)[0];
            standing * tolerance(v, (HOP_SPEED, f64::INFINITY), HOP_SPEED / 2.0, Sigmoid::Linear, 0.5)
        } else {
            let costs: Vec<f64> =
                physics.data().ctrl().iter().map(|&u| tolerance(u, (0.0, 0.0), 1.0, Sigmoid::Quadratic, 0.0)).collect();
            let small_control = (np_mean(&costs) + 4.0) / 5.0;
            standing * small_control
        }
    }
}
