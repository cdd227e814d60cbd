//! Ball-in-cup catch.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, geom_id, qpos_adr, site_id, uniform, ObsWriter, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;

/// Ball-in-cup catch (dm_control `ball_in_cup.BallInCup`).
#[derive(Debug)]
pub struct BallInCup {
    ball_x: usize,
    ball_z: usize,
    ball: usize,
    target: usize,
    /// `target_size[x|z] − ball radius`.
    limits: [f64; 2],
}

/// `ball_in_cup-catch`.
pub fn catch(model: &MjModel) -> Result<Box<dyn Task>> {
    let name = "ball_in_cup-catch";
    check_model(model, name, 4, 4, 2)?;
    let target = site_id(model, name, "target")?;
    let ball_r = model.geom_size()[geom_id(model, name, "ball")?][0];
    let ts = model.site_size()[target];
    Ok(Box::new(BallInCup {
        ball_x: qpos_adr(model, name, "ball_x")?,
        ball_z: qpos_adr(model, name, "ball_z")?,
        ball: body_id(model, name, "ball")?,
        target,
        limits: [ts[0] - ball_r, ts[2] - ball_r],
    }))
}

impl Task for BallInCup {
    fn name(&self) -> &'static str {
        "ball_in_cup-catch"
    }

    fn observation_dim(&self) -> usize {
        8
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        // dm_control loops until the ball does not penetrate the cup.
        loop {
            let x = uniform(rng, -0.2, 0.2);
            let z = uniform(rng, 0.2, 0.5);
            let qpos = physics.data_mut().qpos_mut();
            qpos[self.ball_x] = x;
            qpos[self.ball_z] = z;
            physics.forward()?;
            if physics.ncon() == 0 {
                return Ok(());
            }
        }
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        out.extend(physics.data().qpos());
        out.extend(physics.data().qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let t = physics.data().site_xpos()[self.target];
        let b = physics.xpos(self.ball);
        let inside = (t[0] - b[0]).abs() < self.limits[0] && (t[2] - b[2]).abs() < self.limits[1];
        if inside {
            1.0
        } else {
            0.0
        }
    }
}
