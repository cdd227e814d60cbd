"""Brax's own PPO loss on seeded random cases, for r2vpo's differential test
(crates/r2vpo-control/tests/brax.rs): prints one JSON object per case with
the networks' parameters, the minibatch, the entropy draws, Brax's loss
terms and the gradient of every parameter; and the same for R²VPO's policy
term (the paper's Eq. primal_dual, negated, without its constant λδ) put in
place of the clipped surrogate inside Brax's loss. Also Brax's running
observation statistics after two updates.

Run with the pinned venv that `make deps` makes (scripts/brax/venv.sh):
    .deps/venv-brax/bin/python scripts/brax/loss_cases.py
"""

import contextlib
import json
import sys

# Brax's imports print notices (MuJoCo Warp's absence) on stdout, which
# carries the cases.
with contextlib.redirect_stdout(sys.stderr):
    import jax
    import jax.numpy as jnp
    from brax.training.acme import running_statistics
    from brax.training.agents.ppo import losses as ppo_losses
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training import types

OBS, ACT = 5, 3
POLICY_HIDDEN, VALUE_HIDDEN = (8, 6), (7,)
T, B = 4, 3
KW = dict(
    entropy_cost=1e-2,
    discounting=0.97,
    reward_scaling=10.0,
    gae_lambda=0.95,
    clipping_epsilon=0.3,
    normalize_advantage=True,
    vf_coefficient=0.5,
)
LAMBDA = 0.06


def flat(x):
    return [float(v) for v in jnp.ravel(x)]


def layers(params, n):
    out = []
    for i in range(n):
        layer = params["params"][f"hidden_{i}"]
        out.append({"kernel": flat(layer["kernel"]), "bias": flat(layer["bias"])})
    return out


def r2vpo_loss(params, normalizer_params, data, rng, network):
    """Brax's loss with R²VPO's per-sample −ρÂ + λ(ρ−1)² as the policy term."""
    total, metrics = ppo_losses.compute_ppo_loss(params, normalizer_params, data, rng, network, **KW)
    dist = network.parametric_action_distribution
    d = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), data)
    logits = network.policy_network.apply(normalizer_params, params.policy, d.observation)
    baseline = network.value_network.apply(normalizer_params, params.value, d.observation)
    bootstrap = network.value_network.apply(normalizer_params, params.value, d.next_observation[-1])
    truncation = d.extras["state_extras"]["truncation"]
    termination = (1 - d.discount) * (1 - truncation)
    _, adv = ppo_losses.compute_gae(
        truncation=truncation,
        termination=termination,
        rewards=d.reward * KW["reward_scaling"],
        values=baseline,
        bootstrap_value=bootstrap,
        lambda_=KW["gae_lambda"],
        discount=KW["discounting"],
    )
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    rho = jnp.exp(dist.log_prob(logits, d.extras["policy_extras"]["raw_action"]) - d.extras["policy_extras"]["log_prob"])
    r2vpo = jnp.mean(-rho * adv + LAMBDA * jnp.square(rho - 1.0))
    return total - metrics["policy_loss"] + r2vpo, dict(metrics, policy_loss=r2vpo)


def case(seed):
    key = jax.random.PRNGKey(seed)
    ks = jax.random.split(key, 16)
    # Observations away from 0 and 1 so that the normaliser matters.
    scale = 1.0 + jnp.arange(OBS)
    shift = jnp.linspace(-2.0, 3.0, OBS)

    def obs(k, shape):
        return jax.random.normal(k, shape + (OBS,)) * scale + shift

    norm = running_statistics.init_state(jnp.zeros((OBS,)))
    norm_batches = [obs(ks[0], (40,)), obs(ks[1], (25,))]
    for batch in norm_batches:
        norm = running_statistics.update(norm, batch)

    network = ppo_networks.make_ppo_networks(
        OBS,
        ACT,
        preprocess_observations_fn=running_statistics.normalize,
        policy_hidden_layer_sizes=POLICY_HIDDEN,
        value_hidden_layer_sizes=VALUE_HIDDEN,
    )
    policy = network.policy_network.init(ks[2])
    value = network.value_network.init(ks[3])
    # Perturb every parameter (biases start at 0) so all gradients are tested.
    def perturb(p, k):
        leaves, tree = jax.tree_util.tree_flatten(p)
        keys = jax.random.split(k, len(leaves))
        return jax.tree_util.tree_unflatten(
            tree, [x + 0.3 * jax.random.normal(kk, x.shape) for x, kk in zip(leaves, keys)]
        )
    policy, value = perturb(policy, ks[4]), perturb(value, ks[5])
    params = ppo_losses.PPONetworkParams(policy=policy, value=value)

    observation = obs(ks[6], (B, T))
    next_observation = obs(ks[7], (B, T))
    reward = jax.random.normal(ks[8], (B, T))
    # Sequence 0 is truncated at step 1, sequence 2 terminates at step 2 and
    # is truncated at its last step.
    truncation = jnp.zeros((B, T)).at[0, 1].set(1.0).at[2, T - 1].set(1.0)
    discount = jnp.ones((B, T)).at[2, 2].set(0.0).at[0, 1].set(0.0)
    logits = network.policy_network.apply(norm, policy, observation)
    dist = network.parametric_action_distribution
    raw_action = dist.sample_no_postprocessing(logits, ks[9])
    target_logp = dist.log_prob(logits, raw_action)
    # Behaviour log-probs off by up to ±0.6 nats: ratios in and out of 1 ± ε.
    behaviour_logp = target_logp + jax.random.uniform(ks[10], (B, T), minval=-0.6, maxval=0.6)
    data = types.Transition(
        observation=observation,
        action=jnp.tanh(raw_action),
        reward=reward,
        discount=discount,
        next_observation=next_observation,
        extras={
            "state_extras": {"truncation": truncation},
            "policy_extras": {"raw_action": raw_action, "log_prob": behaviour_logp, "distribution_params": logits},
        },
    )
    rng = ks[11]
    # What the entropy estimate draws: ParametricDistribution.entropy samples
    # the (T, B, A) time-major normal with this key.
    entropy_noise = jax.random.normal(rng, (T, B, ACT))

    def run(loss_fn):
        (total, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, norm, data, rng, network)
        return {
            "total": float(total),
            "policy_loss": float(metrics["policy_loss"]),
            "v_loss": float(metrics["v_loss"]),
            "entropy_loss": float(metrics["entropy_loss"]),
            "grads": layers(grads.policy, len(POLICY_HIDDEN) + 1) + layers(grads.value, len(VALUE_HIDDEN) + 1),
        }

    def ppo(p, n, d, r, net):
        return ppo_losses.compute_ppo_loss(p, n, d, r, net, **KW)

    tm = lambda x: flat(jnp.swapaxes(x, 0, 1))
    return {
        "seed": seed,
        "obs_dim": OBS,
        "act_dim": ACT,
        "policy_hidden": list(POLICY_HIDDEN),
        "value_hidden": list(VALUE_HIDDEN),
        "unroll": T,
        "seqs": B,
        "settings": KW,
        "lambda": LAMBDA,
        "norm_batches": [flat(b) for b in norm_batches],
        "norm": {
            "mean": flat(norm.mean),
            "summed_variance": flat(norm.summed_variance),
            "std": flat(norm.std),
        },
        "params": layers(policy, len(POLICY_HIDDEN) + 1) + layers(value, len(VALUE_HIDDEN) + 1),
        # The minibatch time-major, as r2vpo holds it (row t·B + b).
        "obs": tm(observation),
        "bootstrap_obs": flat(next_observation[:, -1]),
        "actions": tm(raw_action),
        "target_logp": tm(target_logp),
        "behaviour_logp": tm(behaviour_logp),
        "rewards": tm(reward),
        "truncation": [bool(v) for v in jnp.ravel(jnp.swapaxes(truncation, 0, 1))],
        "termination": [bool(v) for v in jnp.ravel(jnp.swapaxes((1 - discount) * (1 - truncation), 0, 1))],
        "entropy_noise": flat(entropy_noise),
        "ppo": run(ppo),
        "r2vpo": run(r2vpo_loss),
    }


if __name__ == "__main__":
    seeds = [int(s) for s in sys.argv[1:]] or [0, 1, 2]
    for s in seeds:
        print(json.dumps(case(s)))
