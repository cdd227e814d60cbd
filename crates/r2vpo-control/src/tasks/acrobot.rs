//! Acrobot swingup.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, mat, qpos_adr, site_id, uniform, ObsWriter, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{norm, tolerance, Sigmoid, DEFAULT_VALUE_AT_MARGIN};

/// Acrobot swingup (dm_control `acrobot.Balance`, dense).
#[derive(Debug)]
pub struct Acrobot {
    upper: usize,
    lower: usize,
    shoulder: usize,
    elbow: usize,
    target: usize,
    tip: usize,
    target_radius: f64,
}

/// `acrobot-swingup`.
pub fn swingup(model: &MjModel) -> Result<Box<dyn Task>> {
    let name = "acrobot-swingup";
    check_model(model, name, 2, 2, 1)?;
    let target = site_id(model, name, "target")?;
    Ok(Box::new(Acrobot {
        upper: body_id(model, name, "upper_arm")?,
        lower: body_id(model, name, "lower_arm")?,
        shoulder: qpos_adr(model, name, "shoulder")?,
        elbow: qpos_adr(model, name, "elbow")?,
        target,
        tip: site_id(model, name, "tip")?,
        target_radius: model.site_size()[target][0],
    }))
}

impl Task for Acrobot {
    fn name(&self) -> &'static str {
        "acrobot-swingup"
    }

    fn observation_dim(&self) -> usize {
        6
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        use std::f64::consts::PI;
        let a = uniform(rng, -PI, PI);
        let b = uniform(rng, -PI, PI);
        let qpos = physics.data_mut().qpos_mut();
        qpos[self.shoulder] = a;
        qpos[self.elbow] = b;
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        let (u, l) = (physics.xmat(self.upper), physics.xmat(self.lower));
        out.extend(&[u[mat::XZ], l[mat::XZ], u[mat::ZZ], l[mat::ZZ]]);
        out.extend(physics.data().qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let s = physics.data().site_xpos();
        let (t, p) = (s[self.target], s[self.tip]);
        let d = norm(&[t[0] - p[0], t[1] - p[1], t[2] - p[2]]);
        tolerance(d, (0.0, self.target_radius), 1.0, Sigmoid::Gaussian, DEFAULT_VALUE_AT_MARGIN)
    }
}
