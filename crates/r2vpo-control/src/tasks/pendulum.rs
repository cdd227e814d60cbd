//! Pendulum swingup.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, mat, qpos_adr, uniform, ObsWriter, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::in_bounds;

/// Pendulum swingup (dm_control `pendulum.SwingUp`).
#[derive(Debug)]
pub struct Pendulum {
    pole: usize,
    hinge: usize,
}

/// `pendulum-swingup`.
pub fn swingup(model: &MjModel) -> Result<Box<dyn Task>> {
    let name = "pendulum-swingup";
    check_model(model, name, 1, 1, 1)?;
    Ok(Box::new(Pendulum { pole: body_id(model, name, "pole")?, hinge: qpos_adr(model, name, "hinge")? }))
}

impl Task for Pendulum {
    fn name(&self) -> &'static str {
        "pendulum-swingup"
    }

    fn observation_dim(&self) -> usize {
        3
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        use std::f64::consts::PI;
        physics.data_mut().qpos_mut()[self.hinge] = uniform(rng, -PI, PI);
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        let x = physics.xmat(self.pole);
        out.push(x[mat::ZZ]);
        out.push(x[mat::XZ]);
        out.push(physics.data().qvel()[self.hinge]);
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let cos_bound = 8f64.to_radians().cos();
        in_bounds(physics.xmat(self.pole)[mat::ZZ], (cos_bound, 1.0))
    }
}
