//! Cheetah run.

use mujoco_rs::prelude::*;

use super::{check_model, uniform, ObsWriter, Sensor, Task, TaskRng};
use crate::error::{PhysicsWarning, Result};
use crate::physics::Physics;
use crate::rewards::{tolerance, Sigmoid};

/// Cheetah run (dm_control `cheetah.Cheetah`).
#[derive(Debug)]
pub struct Cheetah {
    subtreelinvel: Sensor,
}

/// `cheetah-run`.
pub fn run(model: &MjModel) -> Result<Box<dyn Task>> {
    let name = "cheetah-run";
    check_model(model, name, 9, 9, 6)?;
    Ok(Box::new(Cheetah { subtreelinvel: Sensor::find(model, name, "torso_subtreelinvel")? }))
}

impl Task for Cheetah {
    fn name(&self) -> &'static str {
        "cheetah-run"
    }

    fn observation_dim(&self) -> usize {
        17
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        // Every cheetah joint is a 1-dof joint, so joint index = qpos index.
        let m = physics.model();
        let limited: Vec<(usize, [f64; 2])> = (0..m.njnt() as usize)
            .filter(|&j| m.jnt_limited()[j])
            .map(|j| (m.jnt_qposadr()[j] as usize, m.jnt_range()[j]))
            .collect();
        for (adr, [lo, hi]) in limited {
            physics.data_mut().qpos_mut()[adr] = uniform(rng, lo, hi);
        }
        // Let it settle: 200 physics steps in dm_control's legacy sequence.
        physics.step_n(200)?;
        physics.data_mut().set_time(0.0);
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        out.extend(&physics.data().qpos()[1..]);
        out.extend(physics.data().qvel());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let speed = self.subtreelinvel.read(physics)[0];
        tolerance(speed, (10.0, f64::INFINITY), 10.0, Sigmoid::Linear, 0.0)
    }
}
