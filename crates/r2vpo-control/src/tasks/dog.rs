//! Dog run.

use mujoco_rs::prelude::*;

use super::{body_id, check_model, joint_id, mat, randn, uniform, ObsWriter, Sensor, Task, TaskRng};
use crate::error::{Error, PhysicsWarning, Result};
use crate::mjcf;
use crate::physics::Physics;
use crate::rewards::{np_sum, tolerance, Sigmoid, DEFAULT_VALUE_AT_MARGIN};

const NAME: &str = "dog-run";
const RUN_SPEED: f64 = 9.0;
/// dm_control's `_DEFAULT_TIME_LIMIT`; it also sizes the floor.
const DEFAULT_TIME_LIMIT: f64 = 15.0;
/// Local z within this angle of the world z earns the full upright reward.
const MAX_UPRIGHT_ANGLE_DEG: f64 = 30.0;
/// Torso and pelvis heights above this fraction of their default-pose height
/// earn the full standing reward.
const STAND_HEIGHT_FRACTION: f64 = 0.9;
/// Observation length: 73 hinge angles and velocities, 2 heights, 9 z
/// projections, 3 velocities, 9 inertial readings, 12 forces, 4 touches and
/// 38 activations.
const OBS_DIM: usize = 223;

/// dm_control's `make_model(floor_size, remove_ball=True)` for the run task:
/// a floor big enough for the episode at run speed, and no ball, target,
/// walls or ball/head cameras.
pub fn edit_run_xml(xml: &str) -> Result<String> {
    // dm_control writes `str(move_speed * time_limit)` of Python ints.
    let floor = format!("{}", (RUN_SPEED * DEFAULT_TIME_LIMIT) as i64);
    let mut xml = xml.to_string();
    let mut edit = || -> std::result::Result<(), String> {
        mjcf::set_attribute(&mut xml, "geom", "floor", "size", &format!("{floor} {floor} .1"))?;
        mjcf::remove_element(&mut xml, "body", "ball")?;
        mjcf::remove_element(&mut xml, "geom", "target")?;
        mjcf::remove_element(&mut xml, "camera", "ball")?;
        mjcf::remove_element(&mut xml, "camera", "head")?;
        for wall in ["px", "nx", "py", "ny"] {
            mjcf::remove_element(&mut xml, "geom", &format!("wall_{wall}"))?;
        }
        Ok(())
    };
    edit().map_err(|message| Error::ModelMismatch { task: NAME, message: format!("dog.xml: {message}") })?;
    Ok(xml)
}

/// Dog run (dm_control `dog.Move`, `move_speed = 9`).
#[derive(Debug)]
pub struct Dog {
    /// `qpos` / `qvel` addresses of the hinge joints, in joint order.
    hinge_qpos: Vec<usize>,
    hinge_dof: Vec<usize>,
    root_qpos: usize,
    torso: usize,
    pelvis: usize,
    skull: usize,
    /// Torso and pelvis heights that earn the full standing reward.
    stand_height: [f64; 2],
    /// Weight of the dog, the touch force that earns the full touch reward.
    body_weight: f64,
    torso_linvel: Sensor,
    /// accelerometer, velocimeter, gyro (dm_control's order).
    inertial: [Sensor; 3],
    /// foot_L, foot_R, hand_L, hand_R.
    forces: [Sensor; 4],
    /// palm_L, palm_R, sole_L, sole_R.
    touches: [Sensor; 4],
}

/// `dog-run`.
pub fn run(model: &MjModel) -> Result<Box<dyn Task>> {
    check_model(model, NAME, 80, 79, 38)?;
    if model.na() != model.nu() {
        return Err(Error::ModelMismatch { task: NAME, message: "expected one activation per actuator".into() });
    }
    let hinges: Vec<usize> =
        (0..model.njnt() as usize).filter(|&j| model.jnt_type()[j] == MjtJoint::mjJNT_HINGE).collect();
    let sensor = |name| Sensor::find(model, NAME, name);
    let mut dog = Dog {
        hinge_qpos: hinges.iter().map(|&j| model.jnt_qposadr()[j] as usize).collect(),
        hinge_dof: hinges.iter().map(|&j| model.jnt_dofadr()[j] as usize).collect(),
        root_qpos: model.jnt_qposadr()[joint_id(model, NAME, "root")?] as usize,
        torso: body_id(model, NAME, "torso")?,
        pelvis: body_id(model, NAME, "pelvis")?,
        skull: body_id(model, NAME, "skull")?,
        stand_height: [0.0; 2],
        // dm_control: -gravity_z · subtree mass of the torso.
        body_weight: -model.opt().gravity[2] * model.body_subtreemass()[body_id(model, NAME, "torso")?],
        torso_linvel: sensor("torso_linvel")?,
        inertial: [sensor("accelerometer")?, sensor("velocimeter")?, sensor("gyro")?],
        forces: [sensor("foot_L")?, sensor("foot_R")?, sensor("hand_L")?, sensor("hand_R")?],
        touches: [sensor("palm_L")?, sensor("palm_R")?, sensor("sole_L")?, sensor("sole_R")?],
    };
    if 2 * dog.hinge_qpos.len() + 2 + 9 + 3 + 9 + 12 + 4 + model.na() as usize != OBS_DIM {
        return Err(Error::ModelMismatch { task: NAME, message: format!("{} hinge joints", dog.hinge_qpos.len()) });
    }
    // dm_control measures the heights every episode right after
    // `mj_resetData` + `mj_forward`, i.e. in the default pose: a model
    // constant, taken here once so replays from a saved state have it too.
    let mut data = MjData::new(model);
    data.forward();
    let heights = dog.torso_pelvis_height(data.xpos());
    dog.stand_height = heights.map(|h| h * STAND_HEIGHT_FRACTION);
    Ok(Box::new(dog))
}

impl Dog {
    fn torso_pelvis_height(&self, xpos: &[[f64; 3]]) -> [f64; 2] {
        [xpos[self.torso][2], xpos[self.pelvis][2]]
    }

    /// Centre-of-mass velocity in the torso frame (row vector times the
    /// torso's rotation matrix, as dm_control's `v.dot(xmat)`).
    fn torso_com_velocity(&self, physics: &Physics) -> [f64; 3] {
        let v = self.torso_linvel.read(physics);
        let r = physics.xmat(self.torso);
        std::array::from_fn(|j| v[0] * r[j] + v[1] * r[3 + j] + v[2] * r[6 + j])
    }
}

impl Task for Dog {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observation_dim(&self) -> usize {
        OBS_DIM
    }

    fn initialize_episode(&mut self, physics: &mut Physics, rng: &mut TaskRng) -> Result<(), PhysicsWarning> {
        // dm_control resets the physics again here; the environment has just
        // done so, so the state is already the default pose.
        let azimuth = uniform(rng, 0.0, 2.0 * std::f64::consts::PI);
        let (s, c) = (azimuth / 2.0).sin_cos();
        let d = physics.data_mut();
        d.qpos_mut()[self.root_qpos + 3..self.root_qpos + 7].copy_from_slice(&[c, 0.0, 0.0, s]);
        for dof in [0, 1, 5] {
            d.qvel_mut()[dof] = 2.0 * randn(rng);
        }
        let ranges: Vec<[f64; 2]> = d.model().actuator_ctrlrange().to_vec();
        for (a, [lo, hi]) in d.act_mut().iter_mut().zip(ranges) {
            *a = uniform(rng, lo, hi);
        }
        Ok(())
    }

    fn observe(&self, physics: &Physics, out: &mut ObsWriter<'_>) {
        let d = physics.data();
        let (qpos, qvel) = (d.qpos(), d.qvel());
        for &adr in &self.hinge_qpos {
            out.push(qpos[adr]);
        }
        for &adr in &self.hinge_dof {
            out.push(qvel[adr]);
        }
        out.extend(&self.torso_pelvis_height(d.xpos()));
        for body in [self.skull, self.torso, self.pelvis] {
            let r = physics.xmat(body);
            out.extend(&[r[mat::ZX], r[mat::ZY], r[mat::ZZ]]);
        }
        out.extend(&self.torso_com_velocity(physics));
        for s in self.inertial.iter().chain(&self.forces).chain(&self.touches) {
            out.extend(s.read(physics));
        }
        out.extend(d.act());
    }

    fn reward(&self, physics: &Physics) -> f64 {
        let min_upright_cosine = MAX_UPRIGHT_ANGLE_DEG.to_radians().cos();
        let [h_torso, h_pelvis] = self.torso_pelvis_height(physics.data().xpos());
        let [sh_torso, sh_pelvis] = self.stand_height;
        let g = Sigmoid::Gaussian;
        let torso = tolerance(h_torso, (sh_torso, f64::INFINITY), sh_torso, g, DEFAULT_VALUE_AT_MARGIN);
        let pelvis = tolerance(h_pelvis, (sh_pelvis, f64::INFINITY), sh_pelvis, g, DEFAULT_VALUE_AT_MARGIN);
        let upright = [self.skull, self.torso, self.pelvis].map(|b| {
            let zz = physics.xmat(b)[mat::ZZ];
            tolerance(zz, (min_upright_cosine, f64::INFINITY), min_upright_cosine + 1.0, Sigmoid::Linear, 0.0)
        });
        let touch_sum = np_sum(&self.touches.map(|s| s.read(physics)[0]));
        let touch = tolerance(touch_sum, (self.body_weight, f64::INFINITY), self.body_weight, Sigmoid::Linear, 0.9);
        let speed_margin = RUN_SPEED.max(1.0);
        let forward = tolerance(
            self.torso_com_velocity(physics)[0],
            (RUN_SPEED, 2.0 * RUN_SPEED),
            speed_margin,
            Sigmoid::Linear,
            0.0,
        );
        let forward = (4.0 * forward + 1.0) / 5.0;
        // np.prod over the stacked factors multiplies left to right.
        [torso, pelvis, upright[0], upright[1], upright[2], touch, forward].iter().product()
    }
}
