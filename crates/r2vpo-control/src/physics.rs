//! MuJoCo model loading and dm_control's "legacy" stepping.
//!
//! dm_control (1.0.50) advances `n` physics steps per control step with
//! `mj_step2; mj_step × (n−1); mj_step1` for Euler models and
//! `mj_step × n; mj_step1` for RK4 models, and reads observations after the
//! trailing `mj_step1`. Position/velocity quantities therefore describe the new
//! state while acceleration-stage sensors (touch) come from the last
//! `mj_step2`. Plain `mj_step` loops give observations that lag one physics
//! step, so exact parity needs this sequence.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};

use mujoco_rs::prelude::*;
use mujoco_rs::wrappers::mj_auxiliary::MjVfs;
use serde::{Deserialize, Serialize};

use crate::error::{Error, PhysicsWarning, Result};

/// Environment variable overriding the suite folder.
pub const SUITE_ENV_VAR: &str = "R2VPO_DMC_SUITE";

/// The suite folder `make deps` fills, relative to the workspace root.
const DEFAULT_SUITE_REL: &str = ".deps/dm_control/suite";

/// Number of MuJoCo warning kinds (`mjNWARNING`).
const N_WARNINGS: usize = 7;

/// Resolves the suite folder: the argument, else `$R2VPO_DMC_SUITE`, else
/// `<workspace>/.deps/dm_control/suite`.
pub fn suite_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(dir) = explicit {
        return dir.to_path_buf();
    }
    if let Some(dir) = std::env::var_os(SUITE_ENV_VAR).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // The crate sits at <workspace>/crates/r2vpo-control.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(DEFAULT_SUITE_REL)
}

static LOGGING: Once = Once::new();

/// MuJoCo warnings about dm_control's own model files that no user can act
/// on, dropped instead of printed on every command: cheetah.xml's
/// `<compiler settotalmass="14"/>` (deprecated in MuJoCo 3.x but still
/// applied, so the model is dm_control's).
const SUITE_DEPRECATIONS: [&str; 1] = ["compiler attribute 'settotalmass' is deprecated"];

/// MuJoCo's messages on stderr, as its console handler prints them (only
/// the unfiltered info topic), less
/// [`SUITE_DEPRECATIONS`]; and none in a `MUJOCO_LOG.TXT` file in the
/// working directory.
fn mujoco_message(m: &MjLogMessage) {
    let subject = m.subject();
    if m.level() == MjtLogLevel::mjLOG_WARNING && SUITE_DEPRECATIONS.iter().any(|d| subject.contains(d)) {
        return;
    }
    let level = match m.level() {
        MjtLogLevel::mjLOG_ERROR => "ERROR",
        MjtLogLevel::mjLOG_WARNING => "WARNING",
        // The hook enables every info topic; MuJoCo's own console shows
        // only the unfiltered ones, and so does this.
        _ if m.topic() != MjtLogTopic::mjTOPIC_NONE => return,
        MjtLogLevel::mjLOG_INFO => "INFO",
        MjtLogLevel::mjLOG_DEBUG => "DEBUG",
    };
    match m.body() {
        Some(body) if !body.is_empty() => eprintln!("{level}: {subject}\n{body}"),
        _ => eprintln!("{level}: {subject}"),
    }
}

/// Routes MuJoCo's messages through `mujoco_message`: to stderr, never
/// to a `MUJOCO_LOG.TXT` file in the working directory, without the
/// suite's known deprecations. Called before every model load, effective
/// once per process.
pub fn quiet_mujoco_log_file() {
    LOGGING.call_once(|| {
        // SAFETY: the log handler is a MuJoCo global. This crate sets it
        // before loading its first model, and `Once` makes concurrent
        // callers wait, so no thread of ours steps or loads a model meanwhile.
        unsafe { set_log_handler(mujoco_message) };
    });
}

/// Loads `<suite>/<domain>.xml` (includes resolve relative to that file, so
/// `common/` must sit beside it).
pub fn load_model(domain: &str, suite: Option<&Path>) -> Result<MjModel> {
    let path = model_path(domain, suite)?;
    quiet_mujoco_log_file();
    MjModel::from_xml(&path).map_err(|e| Error::ModelLoad { path, message: e.to_string() })
}

/// Loads `<suite>/<domain>.xml` after rewriting its text with `edit`, as
/// dm_control does for tasks that edit their MJCF before compiling it.
///
/// The edited text goes into a MuJoCo virtual file system under the original
/// file's path. MuJoCo looks files up in the VFS first and falls back to the
/// disk, so the edited text shadows the file while its includes and mesh
/// assets still resolve relative to the suite folder.
pub fn load_edited_model(
    domain: &str,
    suite: Option<&Path>,
    edit: impl FnOnce(&str) -> Result<String>,
) -> Result<MjModel> {
    let path = model_path(domain, suite)?;
    let load_err = |message: String| Error::ModelLoad { path: path.clone(), message };
    let text = std::fs::read_to_string(&path).map_err(|e| load_err(e.to_string()))?;
    let edited = edit(&text)?;
    let name = path.to_str().ok_or_else(|| load_err("path is not valid UTF-8".into()))?;
    let mut vfs = MjVfs::new();
    vfs.add_from_buffer(name, edited.as_bytes()).map_err(|e| load_err(format!("VFS: {e}")))?;
    quiet_mujoco_log_file();
    MjModel::from_xml_vfs(name, &vfs).map_err(|e| load_err(e.to_string()))
}

fn model_path(domain: &str, suite: Option<&Path>) -> Result<PathBuf> {
    let dir = suite_dir(suite);
    let path = dir.join(format!("{domain}.xml"));
    if !path.is_file() {
        return Err(Error::SuiteMissing { dir, path });
    }
    Ok(path)
}

/// The MuJoCo state that determines the future bit-exactly (dm_control
/// parity): positions, velocities, activations, solver warm start and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhysicsState {
    /// `qpos` (nq).
    pub qpos: Vec<f64>,
    /// `qvel` (nv).
    pub qvel: Vec<f64>,
    /// `act` (na).
    pub act: Vec<f64>,
    /// `qacc_warmstart` (nv).
    pub qacc_warmstart: Vec<f64>,
    /// Simulation time.
    pub time: f64,
}

/// One simulation: an `MjData` over a shared model plus the control-step
/// settings of its task.
pub struct Physics {
    data: MjData<Arc<MjModel>>,
    n_sub_steps: usize,
    rk4: bool,
    /// `ctrl` and `act` saved across [`Physics::forward_unactuated`].
    saved_inputs: Vec<f64>,
}

impl std::fmt::Debug for Physics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Physics")
            .field("n_sub_steps", &self.n_sub_steps)
            .field("rk4", &self.rk4)
            .field("time", &self.data.time())
            .finish_non_exhaustive()
    }
}

impl Physics {
    /// A fresh `MjData` for `model`, advancing `n_sub_steps` physics steps per
    /// control step.
    pub fn new(model: Arc<MjModel>, n_sub_steps: usize) -> Self {
        let rk4 = model.opt().integrator == MjtIntegrator::mjINT_RK4 as i32;
        let saved_inputs = Vec::with_capacity((model.nu() + model.na()) as usize);
        let data = MjData::new(model);
        Self { data, n_sub_steps: n_sub_steps.max(1), rk4, saved_inputs }
    }

    /// The model.
    pub fn model(&self) -> &MjModel {
        self.data.model()
    }

    /// The MuJoCo data (read-only).
    pub fn data(&self) -> &MjData<Arc<MjModel>> {
        &self.data
    }

    /// The MuJoCo data (mutable), for task initialisation.
    pub fn data_mut(&mut self) -> &mut MjData<Arc<MjModel>> {
        &mut self.data
    }

    /// Physics steps per control step.
    pub fn n_sub_steps(&self) -> usize {
        self.n_sub_steps
    }

    /// Control timestep in seconds.
    pub fn control_timestep(&self) -> f64 {
        self.model().opt().timestep * self.n_sub_steps as f64
    }

    fn warning_counts(&self) -> [i32; N_WARNINGS] {
        let w = self.data.warning();
        std::array::from_fn(|i| w[i].number)
    }

    fn check(&self, before: [i32; N_WARNINGS]) -> Result<(), PhysicsWarning> {
        let after = self.warning_counts();
        let kinds = (0..N_WARNINGS).filter(|&i| after[i] > before[i]).fold(0u32, |k, i| k | (1 << i));
        if kinds == 0 {
            Ok(())
        } else {
            Err(PhysicsWarning { kinds })
        }
    }

    /// `mj_resetData` followed by `mj_forward` with actuation disabled, like
    /// dm_control's `Physics.reset` (whose errors dm_control ignores too).
    pub fn reset(&mut self) {
        self.data.reset();
        self.forward_unactuated();
    }

    /// `mj_forward` with actuation disabled (dm_control's `after_reset`),
    /// reporting new MuJoCo warnings.
    pub fn forward(&mut self) -> Result<(), PhysicsWarning> {
        let before = self.warning_counts();
        self.forward_unactuated();
        self.check(before)
    }

    /// `mj_forward` as if `mjDSBL_ACTUATION` were set.
    ///
    /// Setting the flag would mutate the model all environments share, so
    /// the actuators' inputs are zeroed for the pass instead: `ctrl` and the
    /// activations `act`, restored afterwards. For the actuator kinds the
    /// tasks admit (see `tasks::check_model`), the forces are then exactly
    /// zero, as with actuation disabled; on dog-run (MuJoCo 3.17) every float
    /// array of `mjData` then equals the flag-set pass bit-for-bit.
    fn forward_unactuated(&mut self) {
        let (nu, na) = (self.data.ctrl().len(), self.data.act().len());
        self.saved_inputs.clear();
        self.saved_inputs.extend_from_slice(self.data.ctrl());
        self.saved_inputs.extend_from_slice(self.data.act());
        self.data.ctrl_mut().fill(0.0);
        self.data.act_mut().fill(0.0);
        self.data.forward();
        self.data.ctrl_mut().copy_from_slice(&self.saved_inputs[..nu]);
        self.data.act_mut().copy_from_slice(&self.saved_inputs[nu..nu + na]);
    }

    /// Writes the action into `ctrl` unchanged, as dm_control does (MuJoCo
    /// clamps `ctrllimited` actuators internally; control-cost rewards see the
    /// raw value).
    pub fn set_control(&mut self, action: &[f64]) {
        self.data.ctrl_mut().copy_from_slice(action);
    }

    /// Advances `nstep` physics steps with dm_control's legacy sequence,
    /// reporting new MuJoCo warnings.
    pub fn step_n(&mut self, nstep: usize) -> Result<(), PhysicsWarning> {
        let before = self.warning_counts();
        if self.rk4 {
            for _ in 0..nstep {
                self.data.step();
            }
        } else {
            // Euler/implicit: the previous step1 (or forward) already ran the
            // position/velocity stages for the current state.
            self.data.step2();
            for _ in 1..nstep {
                self.data.step();
            }
        }
        self.data.step1();
        self.check(before)
    }

    /// One control step: `n_sub_steps` physics steps.
    pub fn step(&mut self) -> Result<(), PhysicsWarning> {
        self.step_n(self.n_sub_steps)
    }

    /// The state that determines the future bit-exactly.
    pub fn state(&self) -> PhysicsState {
        PhysicsState {
            qpos: self.data.qpos().to_vec(),
            qvel: self.data.qvel().to_vec(),
            act: self.data.act().to_vec(),
            qacc_warmstart: self.data.qacc_warmstart().to_vec(),
            time: self.data.time(),
        }
    }

    /// Sets `state` after an `mj_resetData` (zero controls and applied forces)
    /// without running `mj_forward`.
    pub fn set_state(&mut self, state: &PhysicsState, task: &'static str) -> Result<()> {
        let m = self.model();
        let checks = [
            ("qpos", state.qpos.len(), m.nq() as usize),
            ("qvel", state.qvel.len(), m.nv() as usize),
            ("act", state.act.len(), m.na() as usize),
            ("qacc_warmstart", state.qacc_warmstart.len(), m.nv() as usize),
        ];
        for (field, got, expected) in checks {
            if got != expected {
                return Err(Error::BadLength { task, field, got, expected });
            }
        }
        self.data.reset();
        self.data.qpos_mut().copy_from_slice(&state.qpos);
        self.data.qvel_mut().copy_from_slice(&state.qvel);
        self.data.act_mut().copy_from_slice(&state.act);
        self.data.qacc_warmstart_mut().copy_from_slice(&state.qacc_warmstart);
        self.data.set_time(state.time);
        Ok(())
    }

    /// Number of active contacts.
    pub fn ncon(&self) -> usize {
        self.data.ncon().max(0) as usize
    }

    /// Row-major body orientation matrix.
    pub fn xmat(&self, body: usize) -> &[f64; 9] {
        &self.data.xmat()[body]
    }

    /// Body frame position.
    pub fn xpos(&self, body: usize) -> &[f64; 3] {
        &self.data.xpos()[body]
    }

    /// Sensor values starting at a sensor address.
    pub fn sensor(&self, adr: usize, dim: usize) -> &[f64] {
        &self.data.sensordata()[adr..adr + dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_suite_names_make_deps() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_model("cartpole", Some(dir.path())).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("make deps"), "{msg}");
        assert!(msg.contains("cartpole.xml"), "{msg}");
    }

    #[test]
    fn warnings_are_detected() {
        let model = Arc::new(load_model("cartpole", None).unwrap());
        let mut p = Physics::new(model, 1);
        p.reset();
        p.data_mut().qvel_mut()[1] = f64::NAN;
        let w = p.step().unwrap_err();
        assert!(w.names().contains(&"mjWARN_BADQVEL"), "{w}");
    }
}
