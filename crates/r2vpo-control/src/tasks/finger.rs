//! Finger: spin / turn_easy / turn_hard.

use mujoco_rs::prelude::*;

use super::{
    check_model, expect_len, geom_id, joint_id, randomize_limited_and_rotational_joints, site_id, uniform, ObsWriter,
    Sensor, Task, TaskRng,
};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::norm;

const EASY_TARGET_SIZE: f64 = 0.07;
const HARD_TARGET_SIZE: f64 = 0.03;
const SPIN_VELOCITY: f64 = 15.0;

/// Sets the spinner's hinge damping, as `Spin.initialize_episode` does every
/// episode (a constant, so it is applied once to the model).
pub fn edit_spin(model: &mut MjModel) -> Result<()> {
    let j = joint_id(model, "finger-spin", "hinge")?;
    let dof = model.jnt_dofadr()[j] as usize;
    model.dof_damping_mut()[dof] = 0.03;
    Ok(())
}

fn edit_turn(model: &mut MjModel, task: &'static str, radius: f64) -> Result<()> {
    let s = site_id(model, task, "target")?;
    model.site_size_mut()[s][0] = radius;
    Ok(())
}

/// Target radius of `finger-turn_easy` (cosmetic in the model, used by the task).
pub fn edit_turn_easy(model: &mut MjModel) -> Result<()> {
    edit_turn(model, "finger-turn_easy", EASY_TARGET_SIZE)
}

/// Target radius of `finger-turn_hard`.
pub fn edit_turn_hard(model: &mut MjModel) -> Result<()> {
    edit_turn(model, "finger-turn_hard", HARD_TARGET_SIZE)
}

/// Finger task (dm_control `finger.Spin` / `finger.Turn`).
#[derive(Debug)]
pub struct Finger {
    name: &'static str,
    /// `Some(target radius)` for the turn tasks.
    turn: Option<f64>,
    hinge_jnt: usize,
    cap1_radius: f64,
    proximal: Sensor,
    distal: Sensor,
    proximal_velocity: Sensor,
    distal_velocity: Sensor,
    hinge_velocity: Sensor,
    tip: Sensor,
    spinner: Sensor,
    touchtop: Sensor,
    touchbottom: Sensor,
    /// Target site position (x, z) in the world, this episode.
    target: [f64; 2],
    /// The target site and its (fixed) y.
    target_site: usize,
    target_y: f64,
}

fn make(model: &MjModel, name: &'static str, turn: Option<f64>) -> Result<Box<dyn Task>> {
    check_model(model, name, 3, 3, 2)?;
    let cap1 = model.geom_size()[geom_id(model, name, "cap1")?];
    let target_site = site_id(model, name, "target")?;
    let tp = model.site_pos()[target_site];
    Ok(Box::new(Finger {
        name,
        turn,
        hinge_jnt: joint_id(model, name, "hinge")?,
        // NumPy sums the three size entries left to right.
        cap1_radius: cap1[0] + cap1[1] + cap1[2],
        proximal: Sensor::find(model, name, "proximal")?,
        distal: Sensor::find(model, name, "distal")?,
        proximal_velocity: Sensor::find(model, name, "proximal_velocity")?,
        distal_velocity: Sensor::find(model, name, "distal_velocity")?,
        hinge_velocity: Sensor::find(model, name, "hinge_velocity")?,
        tip: Sensor::find(model, name, "tip")?,
        spinner: Sensor::find(model, name, "spinner")?,
        touchtop: Sensor::find(model, name, "touchtop")?,
        touchbottom: Sensor::find(model, name, "touchbottom")?,
        target: [tp[0], tp[2]],
        target_site,
        target_y: tp[1],
    }))
}

/// `finger-spin`.
pub fn spin(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "finger-spin", None)
}
/// `finger-turn_easy`.
pub fn turn_easy(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "finger-turn_easy", Some(EASY_TARGET_SIZE))
}
/// `finger-turn_hard`.
pub fn turn_hard(m: &MjModel) -> Result<Box<dyn Task>> {
    make(m, "finger-turn_hard", Some(HARD_TARGET_SIZE))
}

impl Finger {
    fn tip_position(&self, physics: &Physics) -> [f64; 2] {
        let (t, s) = (self.tip.read(physics), self.spinner.read(physics));
        [t[0] - s[0], t[2] - s[2]]
    }

    fn target_position(&self, physics: &Physics) -> [f64; 2] {
        let s = self.spinner.read(physics);
        [self.target[0] - s[0], self.target[1] - s[2]]
    }

    fn dist_to_target(&self, physics: &Physics, radius: f64) -> f64 {
        let (g, t) = (self.target_position(physics), self.tip_position(physics));
        norm(&[g[0] - t[0], g[1] - t[1]]) - radius
    }
}

impl Task for Finger {
    fn name(&self) -> &'static str {
        self.name
    }

    fn observation_dim(&self) -> usize {
        if self.turn.is_some() {
            12
        } else {
            9
        }
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        if self.turn.is_some() {
            use std::f64::consts::PI;
            let angle = uniform(rng, -PI, PI);
            let anchor = physics.data().xanchor()[self.hinge_jnt];
            self.target = [anchor[0] + self.cap1_radius * angle.sin(), anchor[2] + self.cap1_radius * angle.cos()];
        }
        // dm_control gives up after 1000 attempts; a state with contacts is
        // still a valid start, so keep the last one then.
        for _ in 0..1000 {
            randomize_limited_and_rotational_joints(physics, rng);
            physics.forward()?;
            if physics.ncon() == 0 {
                break;
            }
        }
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        out.push(self.proximal.read(physics)[0]);
        out.push(self.distal.read(physics)[0]);
        out.extend(&self.tip_position(physics));
        out.push(self.proximal_velocity.read(physics)[0]);
        out.push(self.distal_velocity.read(physics)[0]);
        out.push(self.hinge_velocity.read(physics)[0]);
        out.push(self.touchtop.read(physics)[0].ln_1p());
        out.push(self.touchbottom.read(physics)[0].ln_1p());
        if let Some(r) = self.turn {
            out.extend(&self.target_position(physics));
            out.push(self.dist_to_target(physics, r));
        }
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let hit = match self.turn {
            Some(r) => self.dist_to_target(physics, r) <= 0.0,
            None => self.hinge_velocity.read(physics)[0] <= -SPIN_VELOCITY,
        };
        if hit {
            1.0
        } else {
            0.0
        }
    }

    fn episode_params(&self) -> Vec<f64> {
        if self.turn.is_some() {
            self.target.to_vec()
        } else {
            Vec::new()
        }
    }

    fn moved_objects(&self) -> Vec<super::MovedObject> {
        match self.turn {
            Some(_) => vec![super::MovedObject::Site {
                id: self.target_site,
                pos: [self.target[0], self.target_y, self.target[1]],
            }],
            None => Vec::new(),
        }
    }

    fn set_episode_params(&mut self, params: &[f64]) -> Result<()> {
        if self.turn.is_some() {
            expect_len(self.name, "episode_params", params.len(), 2)?;
            self.target = [params[0], params[1]];
            Ok(())
        } else {
            expect_len(self.name, "episode_params", params.len(), 0)
        }
    }
}
