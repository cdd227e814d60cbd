#!/usr/bin/env python3
"""Records golden DM Control trajectories for r2vpo-control's parity test.

For each task it resets dm_control (1.0.50, MuJoCo 3.17.0), records the
physics state after the reset (qpos, qvel, act, qacc_warmstart, time), the
per-episode model edits the Rust port keeps outside the model (reacher and
finger-turn targets; dog's XML edits are constant and redone in Rust), a
fixed sequence of pseudo-random actions, and every observation and reward.
`crates/r2vpo-control/tests/golden.rs` restores that state and replays the
actions.

Run from the repository root:  python3 scripts/dmc_golden.py [TASK ...]
It creates a throw-away virtualenv under /tmp (pip installs dm-control and
mujoco from PyPI) and re-runs itself inside it. Floats are written with
repr() so they round-trip exactly.
"""

import argparse
import os
import subprocess
import sys

DM_CONTROL = "1.0.50"
MUJOCO = "3.17.0"
VENV = os.environ.get("R2VPO_GOLDEN_VENV", "/tmp/r2vpo-dmc-golden-venv")
INSIDE = "R2VPO_GOLDEN_INSIDE_VENV"

# Registry name -> (dm_control domain, task).
TASKS = {
    "cartpole-balance": ("cartpole", "balance"),
    "cartpole-balance_sparse": ("cartpole", "balance_sparse"),
    "cartpole-swingup": ("cartpole", "swingup"),
    "cartpole-swingup_sparse": ("cartpole", "swingup_sparse"),
    "pendulum-swingup": ("pendulum", "swingup"),
    "acrobot-swingup": ("acrobot", "swingup"),
    "ball_in_cup-catch": ("ball_in_cup", "catch"),
    "cheetah-run": ("cheetah", "run"),
    "walker-stand": ("walker", "stand"),
    "walker-walk": ("walker", "walk"),
    "walker-run": ("walker", "run"),
    "hopper-stand": ("hopper", "stand"),
    "hopper-hop": ("hopper", "hop"),
    "finger-spin": ("finger", "spin"),
    "finger-turn_easy": ("finger", "turn_easy"),
    "finger-turn_hard": ("finger", "turn_hard"),
    "reacher-easy": ("reacher", "easy"),
    "reacher-hard": ("reacher", "hard"),
    "humanoid-run": ("humanoid", "run"),
    "dog-run": ("dog", "run"),
}

# Seeds whose 50-step random-action trajectory earns a non-zero reward, so the
# sparse rewards' positive branch is compared too (found by scanning 7..59;
# cartpole-swingup_sparse has none, its reward is cartpole-balance_sparse's).
SEEDS = {
    "hopper-stand": 14, "hopper-hop": 14, "finger-spin": 28,
    "finger-turn_easy": 21, "finger-turn_hard": 42, "ball_in_cup-catch": 14,
    "pendulum-swingup": 14, "reacher-hard": 41,
}


# Steps recorded per task unless --steps is given. Dog's 223-dim observation
# makes each step ~5 kB of JSON, so it records fewer to keep the file small.
DEFAULT_STEPS = 50
STEPS = {"dog-run": 16}


def ensure_venv():
    """Re-executes this script inside a virtualenv with the pinned packages."""
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    check = subprocess.run(
        [py, "-c", "import dm_control, mujoco; assert mujoco.__version__ == %r" % MUJOCO],
        capture_output=True)
    if check.returncode != 0:
        subprocess.check_call([py, "-m", "pip", "install", "-q",
                               "dm-control==" + DM_CONTROL, "mujoco==" + MUJOCO])
    env = dict(os.environ, **{INSIDE: "1"})
    os.execve(py, [py] + sys.argv, env)


def fmt(x):
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("non-finite value in golden data")
    return repr(x)


def fmt_list(xs):
    return "[" + ",".join(fmt(x) for x in xs) + "]"


def flatten(obs):
    import numpy as np
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in obs.values()])


def record(name, steps, seed, out_dir):
    import numpy as np
    from dm_control import suite

    domain, task = TASKS[name]
    env = suite.load(domain, task, task_kwargs={"random": seed})
    ts = env.reset()
    physics = env.physics
    d, m = physics.data, physics.model
    state = {
        "qpos": d.qpos.copy(), "qvel": d.qvel.copy(), "act": d.act.copy(),
        "qacc_warmstart": d.qacc_warmstart.copy(), "time": float(d.time),
    }
    if domain == "reacher":
        params = list(physics.named.model.geom_pos["target", ["x", "y"]])
    elif name.startswith("finger-turn"):
        params = list(physics.named.model.site_pos["target", ["x", "z"]])
    else:
        params = []
    rng = np.random.RandomState(seed + 1000)
    actions = rng.uniform(-1.0, 1.0, size=(steps, m.nu))
    observations = [flatten(ts.observation)]
    rewards = []
    for a in actions:
        ts = env.step(a)
        observations.append(flatten(ts.observation))
        rewards.append(ts.reward)

    lines = ["{"]
    lines.append('"task": "%s",' % name)
    lines.append('"dm_control": "%s", "mujoco": "%s", "seed": %d,' % (DM_CONTROL, MUJOCO, seed))
    lines.append('"n_sub_steps": %d, "step_limit": %s,' % (env._n_sub_steps, fmt(env._step_limit)))
    lines.append('"state": {"qpos": %s, "qvel": %s, "act": %s, "qacc_warmstart": %s, "time": %s},' % (
        fmt_list(state["qpos"]), fmt_list(state["qvel"]), fmt_list(state["act"]),
        fmt_list(state["qacc_warmstart"]), fmt(state["time"])))
    lines.append('"episode_params": %s,' % fmt_list(params))
    lines.append('"actions": [\n' + ",\n".join(fmt_list(a) for a in actions) + "],")
    lines.append('"observations": [\n' + ",\n".join(fmt_list(o) for o in observations) + "],")
    lines.append('"rewards": %s' % fmt_list(rewards))
    lines.append("}")
    path = os.path.join(out_dir, name + ".json")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%-26s %3d steps  return %.4f  -> %s" % (name, steps, sum(rewards), path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="steps for every task (default: %d, fewer for some tasks)" % DEFAULT_STEPS)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seed-all", action="store_true",
                        help="use --seed for every task, ignoring the per-task seeds")
    parser.add_argument("--out", default="crates/r2vpo-control/golden")
    parser.add_argument("tasks", nargs="*", help="registry names (default: all)")
    args = parser.parse_args()
    if os.environ.get(INSIDE) != "1":
        ensure_venv()
    os.makedirs(args.out, exist_ok=True)
    for name in args.tasks or TASKS:
        seed = args.seed if args.seed_all else SEEDS.get(name, args.seed)
        steps = args.steps if args.steps is not None else STEPS.get(name, DEFAULT_STEPS)
        record(name, steps, seed, args.out)


if __name__ == "__main__":
    main()
