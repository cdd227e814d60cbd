//! Cartpole: balance / balance_sparse / swingup / swingup_sparse.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, mat, qpos_adr, randn, uniform, ObsWriter, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{in_bounds, tolerance, Sigmoid, DEFAULT_VALUE_AT_MARGIN};

/// Cartpole task (dm_control `cartpole.Balance`, one pole).
#[derive(Debug)]
pub struct Cartpole {
    name: &'static str,
    swing_up: bool,
    sparse: bool,
    pole: usize,
    slider: usize,
    hinge: usize,
}

fn make(model: &MjModel, name: &'static str, swing_up: bool, sparse: bool) -> Result<Box<dyn Task>> {
    check_model(model, name, 2, 2, 1)?;
    Ok(Box::new(Cartpole {
        name,
        swing_up,
        sparse,
        pole: body_id(model, name, "pole_1")?,
        slider: qpos_adr(model, name, "slider")?,
        hinge: qpos_adr(model, name, "hinge_1")?,
    }))
}

/// `cartpole-balance`.
pub fn balance(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "cartpole-balance", false, false)
}
/// `cartpole-balance_sparse`.
pub fn balance_sparse(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "cartpole-balance_sparse", false, true)
}
/// `cartpole-swingup`.
pub fn swingup(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "cartpole-swingup", true, false)
}
/// `cartpole-swingup_sparse`.
pub fn swingup_sparse(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "cartpole-swingup_sparse", true, true)
}

impl Task for Cartpole {
    fn name(&self) -> &'static str {
        self.name
    }

    fn observation_dim(&self) -> usize {
        5
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        let qpos = physics.data_mut().qpos_mut();
        if self.swing_up {
            qpos[self.slider] = 0.01 * randn(rng);
            qpos[self.hinge] = std::f64::consts::PI + 0.01 * randn(rng);
        } else {
            qpos[self.slider] = uniform(rng, -0.1, 0.1);
            qpos[self.hinge] = uniform(rng, -0.034, 0.034);
        }
        for v in physics.data_mut().qvel_mut() {
            *v = 0.01 * randn(rng);
        }
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        let x = physics.xmat(self.pole);
        out.push(physics.data().qpos()[self.slider]);
        out.push(x[mat::ZZ]);
        out.push(x[mat::XZ]);
        out.extend(physics.data().qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let cart = physics.data().qpos()[self.slider];
        let cos = physics.xmat(self.pole)[mat::ZZ];
        if self.sparse {
            in_bounds(cart, (-0.25, 0.25)) * in_bounds(cos, (0.995, 1.0))
        } else {
            let upright = (cos + 1.0) / 2.0;
            let centered = tolerance(cart, (0.0, 0.0), 2.0, Sigmoid::Gaussian, DEFAULT_VALUE_AT_MARGIN);
            let centered = (1.0 + centered) / 2.0;
            let u = physics.data().ctrl()[0];
            let small_control = tolerance(u, (0.0, 0.0), 1.0, Sigmoid::Quadratic, 0.0);
            let small_control = (4.0 + small_control) / 5.0;
            let omega = physics.data().qvel()[self.hinge];
            let small_velocity = tolerance(omega, (0.0, 0.0), 5.0, Sigmoid::Gaussian, DEFAULT_VALUE_AT_MARGIN);
            let small_velocity = (1.0 + small_velocity) / 2.0;
            upright * small_control * small_velocity * centered
        }
    }
}
