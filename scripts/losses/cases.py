#!/usr/bin/env python3
"""Reference values for r2vpo's policy losses, computed by verl's and TRL's own loss code (and AReaL's M2PO mask).

Reads one JSON object on stdin:

    {"cases": [{"name": "...", "impl": "verl" | "trl" | "areal", "loss": "<name>", "params": {...},
                "logp": [[...]], "old_logp": [[...]], "advantages": [[...]], "mask": [[...]],
                "rollout_logp": [[...]] (optional), "ref_logp": [[...]] (optional, TRL beta != 0)}]}

and prints one JSON line per case, in order:

    {"name": ..., "loss": float, "grad": [[...]] (d loss / d logp), "metrics": {...}}
    or {"name": ..., "error": "..."} when upstream rejects the case.

Everything is float64 on the CPU. Non-finite floats are printed as null.

verl (verl.trainer.ppo.core_algos, verl 0.9.1): `loss` is a POLICY_LOSS_REGISTRY name ('vanilla', 'gspo',
'sapo', 'cispo', 'clip_cov', 'kl_cov', 'geo_mean', 'gpg', 'dppo_tv', 'dppo_kl', 'dro', 'bypass_mode'). The
function is called the way verl's actor loss (verl/workers/utils/losses.py::ppo_loss) calls it: mask as
bool, an ActorConfig (strategy fsdp, rollout_n 1, micro batch 1) built from `params`, and
config.global_batch_info = {dp_size: 1, batch_num_tokens: mask.sum(), global_batch_size: B,
loss_scale_factor} (override with params.global_batch_info; {} gives agg_loss's local fallback).
  params: ActorConfig fields (clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode,
  loss_scale_factor, tau_pos, tau_neg), PolicyLossConfig fields (clip_cov_ratio, clip_cov_lb, clip_cov_ub,
  kl_cov_ratio, ppo_kl_coef, dro_beta), RolloutCorrectionConfig fields (rollout_is, rollout_is_threshold,
  rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold, loss_type; unset ones take the trainer
  YAML defaults: rollout_is null, threshold 2.0, rs null, loss_type ppo_clip), seed (torch seed before
  the call; clip_cov draws torch.randperm).
  rollout_logp (decoupled mode): IS weights and the rejection mask come from
  rollout_corr_helper.compute_rollout_correction_and_rejection_mask(old_logp, rollout_logp, ...), as
  ray_trainer does once per batch, and are passed as rollout_is_weights / the response mask.
  'bypass_mode': old_logp is the rollout policy (verl sets old_log_probs = rollout_log_probs); the
  rollout-correction params go to config.policy_loss.rollout_correction.

TRL (trl.trainer.grpo_trainer.GRPOTrainer._compute_loss, trl 1.16.0): `loss` is GRPOConfig.loss_type
('grpo', 'dapo', 'bnpo', 'dr_grpo', 'cispo', 'sapo', 'luspo', 'vespo'); `params` are GRPOConfig fields
(epsilon, epsilon_high, delta, importance_sampling_level, sapo_temperature_pos/neg, max_completion_length,
beta, off_policy_mask_threshold, vllm_importance_sampling_*, vespo_*, ...) plus num_items_in_batch
(default mask.sum(); normalizer of dapo/cispo/vespo) and current_gradient_accumulation_steps (default 1).
_compute_loss runs unmodified on an uninitialised GRPOTrainer whose attributes are set as
GRPOTrainer.__init__ sets them and whose _get_per_token_logps_and_entropies returns `logp`. Advantages
go in as (B,) when constant over each row's masked tokens (TRL's shape), else as (B, T).
  rollout_logp: use_vllm is turned on and inputs["importance_sampling_ratio"] is computed by executing
  the vLLM importance-sampling block of GRPOTrainer._generate_and_score_completions, cut out of TRL's
  source at run time (old_logp = the trainer's recomputed logps, rollout_logp = vLLM's).

Import shims (neither touches loss code): verl/__init__ imports verl.protocol, which needs `ray` only for a
`ray.ObjectRef` annotation, so a stub `ray` is in sys.modules while verl imports if Ray is absent; and
sys.modules["vllm"] = None hides the vLLM in venv-vllm from TRL (it would import it, ~10 s, unused).
"""

import importlib.util
import inspect
import json
import math
import sys
import textwrap
import types
from collections import defaultdict

import torch

DTYPE = torch.float64

_VERL = None
_TRL = None


def _verl():
    global _VERL
    if _VERL is None:
        stub = "ray" not in sys.modules and importlib.util.find_spec("ray") is None
        if stub:
            ray = types.ModuleType("ray")
            ray.ObjectRef = type("ObjectRef", (), {})
            sys.modules["ray"] = ray
        try:
            from verl.trainer.config.algorithm import RolloutCorrectionConfig
            from verl.trainer.ppo import core_algos, rollout_corr_helper
            from verl.workers.config.actor import ActorConfig, PolicyLossConfig
        finally:
            if stub:
                del sys.modules["ray"]
        _VERL = types.SimpleNamespace(
            core_algos=core_algos,
            rch=rollout_corr_helper,
            ActorConfig=ActorConfig,
            PolicyLossConfig=PolicyLossConfig,
            RolloutCorrectionConfig=RolloutCorrectionConfig,
        )
    return _VERL


ACTOR_KEYS = {"clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode",
              "loss_scale_factor", "tau_pos", "tau_neg"}
POLICY_KEYS = {"clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta"}
# verl/trainer/config/algorithm/rollout_correction.yaml (the dataclass default for rollout_is is "sequence",
# but the trainer config that reaches the actor is the YAML one).
RC_DEFAULTS = {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
               "rollout_rs": None, "rollout_rs_threshold": None, "bypass_mode": False, "loss_type": "ppo_clip"}


def run_verl(case, logp, old, adv, mask, rollout):
    v = _verl()
    params = dict(case.get("params") or {})
    unknown = set(params) - ACTOR_KEYS - POLICY_KEYS - set(RC_DEFAULTS) - {"seed", "global_batch_info"}
    if unknown:
        raise ValueError(f"unknown verl params {sorted(unknown)}")
    rc = v.RolloutCorrectionConfig(**{k: params.get(k, d) for k, d in RC_DEFAULTS.items()})
    policy = v.PolicyLossConfig(loss_mode=case["loss"], rollout_correction=rc,
                                **{k: params[k] for k in POLICY_KEYS & set(params)})
    actor = {k: params[k] for k in ACTOR_KEYS & set(params)}

    metrics = {}
    weights = None
    response_mask = mask
    if rollout is not None:
        if case["loss"] == "bypass_mode":
            raise ValueError("bypass_mode takes the rollout log-probs as old_logp; leave rollout_logp out")
        proto, response_mask, rc_metrics = v.rch.compute_rollout_correction_and_rejection_mask(
            old_log_prob=old, rollout_log_prob=rollout, response_mask=mask,
            rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
            rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
            rollout_rs=rc.rollout_rs, rollout_rs_threshold=rc.rollout_rs_threshold)
        weights = proto.batch["rollout_is_weights"] if proto is not None else None
        metrics.update(rc_metrics)
    bool_mask = response_mask.to(bool)

    gbi = params.get("global_batch_info")
    if gbi is None:  # what ppo_loss puts there for one data-parallel rank holding the whole mini-batch
        gbi = {"dp_size": 1, "batch_num_tokens": int(bool_mask.sum().item()),
               "global_batch_size": int(mask.shape[0]), "loss_scale_factor": actor.get("loss_scale_factor")}
    config = v.ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy,
                           global_batch_info=dict(gbi), **actor)

    fn = v.core_algos.get_policy_loss_fn(case["loss"])
    torch.manual_seed(int(params.get("seed", 0)))
    loss, pg_metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=bool_mask,
                          loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=weights)
    metrics.update(pg_metrics)
    if rollout is not None:
        metrics["response_mask"] = response_mask.tolist()
        if weights is not None:
            metrics["rollout_is_weights"] = weights.tolist()
    return loss, metrics


def _trl():
    global _TRL
    if _TRL is None:
        sys.modules.setdefault("vllm", None)  # see the module docstring
        from accelerate import Accelerator
        from trl import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

        # The vLLM importance-sampling block of _generate_and_score_completions, verbatim.
        src = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
        head = "if self.use_vllm and self.vllm_importance_sampling_correction:"
        starts = [i for i, line in enumerate(src) if line.strip() == head
                  and src[i + 1].strip().startswith("mask = completion_mask if tool_mask is None")]
        if len(starts) != 1:
            raise RuntimeError("TRL's vLLM importance-sampling block was not found; update cases.py")
        indent = len(src[starts[0]]) - len(src[starts[0]].lstrip())
        body = []
        for line in src[starts[0] + 1:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
        is_block = compile(textwrap.dedent("\n".join(body)), "<trl vllm IS block>", "exec")
        _TRL = types.SimpleNamespace(GRPOConfig=GRPOConfig, GRPOTrainer=GRPOTrainer, Accelerator=Accelerator,
                                     is_block=is_block)
    return _TRL


def run_trl(case, logp, old, adv, mask, rollout, ref):
    t = _trl()
    params = dict(case.get("params") or {})
    num_items = params.pop("num_items_in_batch", None)
    accum = params.pop("current_gradient_accumulation_steps", 1)
    args = t.GRPOConfig(output_dir="/tmp/r2vpo-losses-unused", report_to=[], use_cpu=True,
                        loss_type=case["loss"], **params)

    self = t.GRPOTrainer.__new__(t.GRPOTrainer)
    # The attributes _compute_loss reads, set as GRPOTrainer.__init__ sets them.
    self.args = args
    self.loss_type = args.loss_type
    self.importance_sampling_level = args.importance_sampling_level
    self.off_policy_mask_threshold = args.off_policy_mask_threshold
    self.top_entropy_quantile = args.top_entropy_quantile
    self.epsilon_low = args.epsilon
    self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    self.beta = args.beta
    self.max_completion_length = args.max_completion_length
    self.use_vllm = rollout is not None
    self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    self.vllm_importance_sampling_mode = args.vllm_importance_sampling_mode
    self.vllm_importance_sampling_clip_max = args.vllm_importance_sampling_clip_max
    self.vllm_importance_sampling_clip_min = args.vllm_importance_sampling_clip_min
    self.entropy_coef = args.entropy_coef
    self.use_adaptive_entropy = args.use_adaptive_entropy
    self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
    if self._entropy_bonus_enabled or self.top_entropy_quantile < 1.0:
        raise ValueError("entropy terms need the model's entropies, which these cases do not carry")
    self.aux_loss_enabled = False
    self.accelerator = t.Accelerator(cpu=True)  # after GRPOConfig, which resets accelerate's shared state
    self.model = torch.nn.Module()  # .training is True: the "train" branch
    self.current_gradient_accumulation_steps = accum
    self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    self._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)

    b, n = logp.shape
    completion_mask = mask.to(torch.long)  # TRL pads completion masks as long
    inputs = {
        "prompt_ids": torch.zeros(b, 0, dtype=torch.long), "prompt_mask": torch.zeros(b, 0, dtype=torch.long),
        "completion_ids": torch.zeros(b, n, dtype=torch.long), "completion_mask": completion_mask,
        "old_per_token_logps": old,
        "num_items_in_batch": completion_mask.sum() if num_items is None else torch.tensor(num_items),
    }
    on = mask > 0
    rows_const = all(bool((adv[i][on[i]] == adv[i][on[i]][0]).all()) for i in range(b) if on[i].any())
    inputs["advantages"] = (torch.stack([adv[i][on[i]][0] if on[i].any() else adv[i][0] for i in range(b)])
                            if rows_const else adv)
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if rollout is not None:
        inputs["sampling_per_token_logps"] = rollout
        if self.vllm_importance_sampling_correction:
            scope = {"self": self, "torch": torch, "math": math, "completion_mask": completion_mask,
                     "tool_mask": None, "old_per_token_logps": old, "sampling_per_token_logps": rollout}
            exec(t.is_block, scope)
            inputs["importance_sampling_ratio"] = scope["vllm_importance_sampling_ratio"]

    loss = t.GRPOTrainer._compute_loss(self, self.model, inputs)
    metrics = {k: v[-1] for k, v in self._metrics["train"].items() if v}
    if "importance_sampling_ratio" in inputs:
        metrics["importance_sampling_ratio"] = inputs["importance_sampling_ratio"].tolist()
    return loss, metrics


_AREAL = None


def _areal():
    """AReaL's M2PO mask (areal 1.0.4, areal/trainer/ppo/actor.py): the two functions, taken verbatim from the
    installed file by `ast` and run with torch, because importing the module pulls in AReaL's whole training
    service (ray, sglang, ...), none of which the mask uses."""
    global _AREAL
    if _AREAL is None:
        import ast

        spec = importlib.util.find_spec("areal")
        path = f"{spec.submodule_search_locations[0]}/trainer/ppo/actor.py"
        tree = ast.parse(open(path).read())
        want = {"_apply_m2po_masking", "_get_m2po_loss_mask"}
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in want]
        if {f.name for f in funcs} != want:
            raise RuntimeError(f"{path} no longer defines {sorted(want)}; update cases.py")
        ns = {"torch": torch}
        exec(compile(ast.Module(body=funcs, type_ignores=[]), path, "exec"), ns)
        _AREAL = types.SimpleNamespace(**{name: ns[name] for name in want})
    return _AREAL


def run_areal(case, logp, old, adv, mask):
    """`loss = "m2po"`: AReaL's keep-mask over Δ = log π_θ − log π_old (AReaL's Δ is behaviour minus proximal;
    the mask depends on Δ² only), then the M2PO paper's unclipped token-mean objective on the kept tokens with
    the masked ones left in the normaliser, written here. params: m2_threshold (default 0.04)."""
    a = _areal()
    tau = float((case.get("params") or {}).get("m2_threshold", 0.04))
    keep = a._apply_m2po_masking(old, logp.detach(), mask.to(bool), tau)
    ratio = torch.exp(logp - old)
    loss = -(ratio * adv * keep * mask).sum() / mask.sum()
    return loss, {"keep": keep.to(DTYPE).tolist()}


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, torch.Tensor):
        return _finite(x.tolist())
    return x


def run_case(case):
    def t(key):
        return None if case.get(key) is None else torch.tensor(case[key], dtype=DTYPE)

    logp = t("logp").requires_grad_(True)
    old, adv, mask, rollout, ref = t("old_logp"), t("advantages"), t("mask"), t("rollout_logp"), t("ref_logp")
    for name, x in (("old_logp", old), ("advantages", adv), ("mask", mask), ("rollout_logp", rollout),
                    ("ref_logp", ref)):
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{name} has shape {list(x.shape)}, logp {list(logp.shape)}")
    if case["impl"] == "verl":
        loss, metrics = run_verl(case, logp, old, adv, mask, rollout)
    elif case["impl"] == "trl":
        loss, metrics = run_trl(case, logp, old, adv, mask, rollout, ref)
    elif case["impl"] == "areal":
        loss, metrics = run_areal(case, logp, old, adv, mask)
    else:
        raise ValueError(f"unknown impl {case['impl']!r}")
    if loss.dtype != DTYPE:
        raise RuntimeError(f"upstream returned a {loss.dtype} loss")
    loss.backward()
    grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
    return {"name": case.get("name"), "loss": loss.item(), "grad": grad.tolist(), "metrics": metrics}


def main():
    for case in json.load(sys.stdin)["cases"]:
        try:
            out = run_case(case)
        except Exception as e:  # one bad case must not hide the others
            out = {"name": case.get("name"), "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(_finite(out), allow_nan=False), flush=True)


if __name__ == "__main__":
    main()
