//! Low-rank adapters on the candle backend: B = 0 is the base model bit
//! for bit, adapter gradients against finite differences, a frozen base,
//! merging, PEFT folders, and the trainer with `[model.lora]` (resume,
//! checkpointing, export, refusals).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

use candle_core::{DType, Device, Tensor, Var};
use r2vpo_llm::backend::candle::{KvCache, Transformer};
use r2vpo_llm::model::lora::{self, AdapterInit, LoraConfig, LoraTarget};
use r2vpo_llm::model::source::NamedTensors;
use r2vpo_llm::model::{Architecture, ModelConfig, TensorSource};
use r2vpo_llm::train::{checkpoint, Outcome, TrainConfig, TrainError, Trainer};

mod common;

use common::train::{comparable, read_metrics, run, EvenTokens};

fn cfg() -> ModelConfig {
    // Qwen2 has q/k/v biases: the adapters must sit beside them.
    ModelConfig::tiny(Architecture::Qwen2, 64, 32, 48, 2, 4, 2, false)
}

fn batch(dtype: DType) -> (Tensor, Tensor, Tensor) {
    let ids: Vec<u32> = (0..2 * 7).map(|i| (i * 37 + 5) % 64).collect();
    let ids = Tensor::from_vec(ids, (2, 7), &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(vec![0u8, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], (2, 7), &Device::Cpu).unwrap();
    let targets = Tensor::cat(&[ids.narrow(1, 1, 6).unwrap(), ids.narrow(1, 6, 1).unwrap()], 1).unwrap();
    let _ = dtype;
    (ids, mask, targets)
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
}

/// Adapters with B = 0 (the initialisation) leave every path of the model
/// exactly as the base computes it: training and scoring log-probs and a
/// cached decode step's logits, bit for bit.
#[test]
fn adapters_at_zero_are_the_base_model_bit_for_bit() {
    let base = Transformer::new_random_with_std(cfg(), 3, 0.3, DType::F32, &Device::Cpu).unwrap();
    let lora = LoraConfig::default();
    let adapted = Transformer::new_random_with_std(cfg(), 3, 0.3, DType::F32, &Device::Cpu)
        .unwrap()
        .with_adapters(&lora, &AdapterInit::new(&cfg(), &lora))
        .unwrap();
    let (ids, mask, targets) = batch(DType::F32);
    assert_eq!(
        flat(&base.forward_logprobs(&ids, &mask, &targets).unwrap()),
        flat(&adapted.forward_logprobs(&ids, &mask, &targets).unwrap())
    );
    assert_eq!(
        flat(&base.score_logprobs(&ids, &mask, &targets).unwrap()),
        flat(&adapted.score_logprobs(&ids, &mask, &targets).unwrap())
    );
    let step = |m: &Transformer| {
        let mut cache = KvCache::new(m, 2);
        m.forward_step(&ids, &mask, &mut cache).unwrap();
        let next = Tensor::from_vec(vec![3u32, 9], (2, 1), &Device::Cpu).unwrap();
        let one = Tensor::ones((2, 1), DType::U8, &Device::Cpu).unwrap();
        flat(&m.forward_step(&next, &one, &mut cache).unwrap())
    };
    assert_eq!(step(&base), step(&adapted));
    // The adapted model learns its adapters only.
    let names: Vec<String> = adapted.trainable_vars().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * 7 * 2);
    assert!(names.iter().all(|n| n.starts_with("base_model.model.model.layers.") && n.contains(".lora_")));
}

/// The adapters' gradients equal central differences of the loss (f64,
/// B ≠ 0 so that A's gradient is not zero), and no base weight gets one.
#[test]
fn adapter_gradients_match_finite_differences_and_the_base_gets_none() {
    let lora = LoraConfig { rank: 3, alpha: 6.0, targets: LoraTarget::ALL.to_vec(), rslora: false, seed: 5 };
    let init = AdapterInit::new(&cfg(), &lora).in_f64();
    let mut tensors = HashMap::new();
    for n in init.names() {
        let t = init.tensor(&n).unwrap();
        // B from a second draw of A-like values, scaled down.
        let t = if n.ends_with("lora_B.weight") {
            let k = t.elem_count();
            let v: Vec<f64> = (0..k).map(|i| 0.3 * (((i * 7919 + n.len() * 31) % 97) as f64 / 97.0 - 0.5)).collect();
            Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap()
        } else {
            t
        };
        tensors.insert(n, t);
    }
    let m = Transformer::new_random_with_std(cfg(), 11, 0.3, DType::F64, &Device::Cpu)
        .unwrap()
        .with_adapters(&lora, &NamedTensors::new("adapter", tensors))
        .unwrap();
    let (ids, mask, targets) = batch(DType::F64);
    let weights =
        Tensor::from_vec((0..14).map(|i| ((i % 5) as f64 - 2.0) * 0.3).collect::<Vec<f64>>(), (2, 7), &Device::Cpu)
            .unwrap()
            .mul(&mask.to_dtype(DType::F64).unwrap())
            .unwrap();
    let loss = |m: &Transformer| -> Tensor {
        (m.forward_logprobs(&ids, &mask, &targets).unwrap() * &weights).unwrap().sum_all().unwrap()
    };
    let g = loss(&m).backward().unwrap();
    for (n, v) in m.named_vars() {
        assert!(g.get(v.as_tensor()).is_none(), "the frozen base weight {n} has a gradient");
    }
    let vars: HashMap<String, Var> = m.trainable_vars().into_iter().collect();
    let mut checked = 0;
    for name in [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight",
        "base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight",
        "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight",
        "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight",
        "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight",
    ] {
        let v = &vars[name];
        let analytic = g.get(v.as_tensor()).unwrap_or_else(|| panic!("{name}: no gradient"));
        let analytic = analytic.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let orig = v.as_tensor().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        for idx in [0, orig.len() / 2, orig.len() - 1] {
            let eps = 1e-6;
            let at = |d: f64| {
                let mut x = orig.clone();
                x[idx] += d;
                v.set(&Tensor::from_vec(x, v.as_tensor().dims(), &Device::Cpu).unwrap()).unwrap();
                loss(&m).to_scalar::<f64>().unwrap()
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            v.set(&Tensor::from_vec(orig.clone(), v.as_tensor().dims(), &Device::Cpu).unwrap()).unwrap();
            let tol = 1e-6 * fd.abs().max(1e-3);
            assert!((analytic[idx] - fd).abs() <= tol, "{name}[{idx}]: analytic {} vs fd {fd}", analytic[idx]);
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}

/// In f32 on the CPU each adapted projection is one fused op
/// (`ops::lora_linear`); its log-probs and adapter gradients equal the
/// composite ops' (a CUDA device's path, and the f64 path checked against
/// finite differences above) to f32 rounding.
#[test]
fn the_fused_lora_projection_matches_the_composite_ops() {
    let lora = LoraConfig { rank: 4, alpha: 8.0, targets: LoraTarget::ALL.to_vec(), rslora: false, seed: 9 };
    let tensors = common::adapters_with_b(&cfg(), &lora, 0.2);
    let m = Transformer::new_random_with_std(cfg(), 12, 0.3, DType::F32, &Device::Cpu)
        .unwrap()
        .with_adapters(&lora, &NamedTensors::new("adapter", tensors))
        .unwrap();
    let (ids, mask, targets) = batch(DType::F32);
    let pass = || {
        let lp = m.forward_logprobs(&ids, &mask, &targets).unwrap();
        let g = (&lp * mask.to_dtype(DType::F32).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
        let grads: Vec<Vec<f32>> = m
            .trainable_vars()
            .iter()
            .map(|(n, v)| flat(g.get(v.as_tensor()).unwrap_or_else(|| panic!("{n}"))))
            .collect();
        (flat(&lp), grads)
    };
    let (lp, grads) = pass();
    let (lp_c, grads_c) = r2vpo_llm::pool::with_composites(pass);
    for (a, b) in lp.iter().zip(&lp_c) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "log-prob {a} vs {b}");
    }
    for ((n, _), (g, gc)) in m.trainable_vars().iter().zip(grads.iter().zip(&grads_c)) {
        let scale = gc.iter().fold(0f32, |s, x| s.max(x.abs()));
        assert!(scale > 0.0, "{n}: zero gradient");
        let diff = g.iter().zip(gc).fold(0f32, |s, (a, b)| s.max((a - b).abs()));
        assert!(diff <= 1e-4 * scale, "{n}: max diff {diff} against max |g| {scale}");
    }
}

/// The merged weights compute what the adapted model computes, whether
/// merged by the model ([`Transformer::merged_tensors`], what `export`
/// pushes) or from a PEFT folder on disk ([`lora::MergedSource`], what
/// `llm merge` writes); projections without an adapter pass through bit
/// for bit.
#[test]
fn merging_equals_the_adapted_model() {
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: vec![LoraTarget::QProj, LoraTarget::UpProj, LoraTarget::DownProj],
        rslora: true,
        seed: 2,
    };
    let tensors = common::adapters_with_b(&cfg(), &lora, 0.1);
    let base = Transformer::new_random_with_std(cfg(), 4, 0.3, DType::F32, &Device::Cpu).unwrap();
    let base_w = base.merged_tensors().unwrap();
    let adapted = Transformer::new_random_with_std(cfg(), 4, 0.3, DType::F32, &Device::Cpu)
        .unwrap()
        .with_adapters(&lora, &NamedTensors::new("adapter", tensors.clone()))
        .unwrap();
    let merged = adapted.merged_tensors().unwrap();
    for (n, w) in &merged {
        let same = flat(w) == flat(&base_w[n]);
        let adapted_here = ["q_proj.weight", "up_proj.weight", "down_proj.weight"].iter().any(|s| n.ends_with(s));
        assert_eq!(same, !adapted_here, "{n}");
    }
    let (ids, mask, targets) = batch(DType::F32);
    let want = flat(&adapted.score_logprobs(&ids, &mask, &targets).unwrap());
    let close = |got: Vec<f32>, what: &str| {
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{what}: {a} vs {b}");
        }
    };
    let m = Transformer::from_tensors(cfg(), merged, DType::F32, &Device::Cpu, "merged".as_ref()).unwrap();
    close(flat(&m.score_logprobs(&ids, &mask, &targets).unwrap()), "merged by the model");
    let dir = tempfile::tempdir().unwrap();
    lora::save_peft(dir.path(), &lora, None, &tensors).unwrap();
    let (read, files) = lora::open_peft(dir.path()).unwrap();
    let base_src = Box::new(NamedTensors::new("base", base_w));
    let src = lora::MergedSource::new(&cfg(), base_src, &read, Box::new(files)).unwrap();
    let m = Transformer::from_source(cfg(), &src, DType::F32, &Device::Cpu).unwrap();
    close(flat(&m.score_logprobs(&ids, &mask, &targets).unwrap()), "merged from the PEFT folder");
}

fn tiny_lora(iterations: usize) -> TrainConfig {
    let mut c = TrainConfig { checkpoint_every: 1, ..common::train::tiny(iterations) };
    c.model.lora = Some(LoraConfig { rank: 4, alpha: 8.0, ..LoraConfig::default() });
    // LoRA takes a larger learning rate than full fine-tuning (B starts at
    // zero and its updates are scaled by α/r).
    c.optim.lr = 2e-2;
    c
}

/// A LoRA run trains, checkpoints its adapter alone in PEFT's layout,
/// resumes exactly, leaves every base weight as it was, and exports a PEFT
/// folder whose adapter folded into the base is the trained policy.
#[test]
fn a_lora_run_trains_the_adapter_only_resumes_exactly_and_exports_peft() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = tiny_lora(3);
    let full = run(cfg.clone(), a.path());
    assert!(full.iter().all(|m| m.skipped_steps == 0 && m.grad_norm > 0.0 && m.loss.is_finite()));

    let mut t = Trainer::with_reward(cfg.clone(), b.path(), Box::new(EvenTokens)).unwrap();
    assert_eq!(t.run(&AtomicBool::new(true), &mut |_| {}).unwrap(), Outcome::Stopped);
    drop(t);
    let ck = checkpoint::latest(b.path()).unwrap().unwrap();
    assert!(ck.join("adapter/adapter_config.json").exists() && ck.join("adapter/adapter_model.safetensors").exists());
    assert!(!ck.join("model.safetensors").exists(), "a LoRA checkpoint holds no copy of the base");
    let mut t = Trainer::resume_with_reward(cfg.clone(), b.path(), Box::new(EvenTokens)).unwrap();
    assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
    assert_eq!(comparable(&read_metrics(b.path())), comparable(&full), "resumed metrics differ");

    // The base is frozen: every tensor the adapters do not touch is the
    // initial model's, bit for bit; the adapted ones moved.
    let (mcfg, init, _) = r2vpo_llm::train::load_policy(&cfg.model).unwrap();
    let policy = t.policy().export(0).unwrap();
    let mut moved = 0;
    for (n, w) in policy.tensors.iter() {
        let same = flat(w) == flat(&init.tensor(n).unwrap());
        if n.ends_with("_proj.weight") {
            moved += usize::from(!same);
        } else {
            assert!(same, "{n} changed");
        }
    }
    assert_eq!(moved, 2 * 7, "every adapted projection moved");

    let out = b.path().join("adapter-export");
    t.export(&out).unwrap();
    let (read, files) = lora::open_peft(&out).unwrap();
    assert_eq!((read.rank, read.alpha), (4, 8.0));
    assert!(out.join("tokenizer.json").exists());
    let merged = lora::MergedSource::new(&mcfg, init, &read, Box::new(files)).unwrap();
    for (n, w) in policy.tensors.iter() {
        let got = flat(&merged.tensor(n).unwrap());
        for (x, y) in got.iter().zip(flat(w)) {
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{n}: {x} vs {y}");
        }
    }

    // A checkpoint of another adapter shape is refused by name.
    let mut other = cfg.clone();
    other.model.lora.as_mut().unwrap().rank = 8;
    let err = Trainer::resume_with_reward(other, b.path(), Box::new(EvenTokens)).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("rank 4") && err.to_string().contains("rank 8"), "{err}");
}

/// Gradient checkpointing trains adapters as the full graph does.
#[test]
fn lora_with_activation_checkpointing_matches_the_full_graph() {
    let base = TrainConfig { share_prompt_prefix: false, minibatch_size: 16, checkpoint_every: 0, ..tiny_lora(1) };
    let dir = tempfile::tempdir().unwrap();
    let plain = run(base.clone(), &dir.path().join("plain"));
    let ck = run(TrainConfig { activation_checkpointing: true, ..base }, &dir.path().join("ck"));
    let (a, b) = (&plain[0], &ck[0]);
    for (x, y, what) in [(a.loss, b.loss, "loss"), (a.grad_norm, b.grad_norm, "grad_norm")] {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-3), "{what}: {x} vs {y}");
    }
    assert!(a.grad_norm > 0.0);
}

/// Bad `[model.lora]` values are refused naming the field.
#[test]
fn bad_lora_settings_name_the_field() {
    for (edit, field) in [
        (Box::new(|l: &mut LoraConfig| l.rank = 0) as Box<dyn Fn(&mut LoraConfig)>, "model.lora.rank"),
        (Box::new(|l: &mut LoraConfig| l.alpha = f64::NAN), "model.lora.alpha"),
        (Box::new(|l: &mut LoraConfig| l.targets.clear()), "model.lora.targets"),
        (Box::new(|l: &mut LoraConfig| l.targets = vec![LoraTarget::QProj, LoraTarget::QProj]), "model.lora.targets"),
    ] {
        let mut cfg = tiny_lora(1);
        edit(cfg.model.lora.as_mut().unwrap());
        match cfg.validate_values() {
            Err(TrainError::Config { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// Adapter weights meet a policy without adapters, or with others: a clear
/// refusal, and the policy computes what it did.
#[test]
fn adapter_weights_for_another_policy_are_refused() {
    use r2vpo_llm::backend::Policy;
    use r2vpo_llm::weights::Weights;
    let lora = LoraConfig { rank: 4, ..LoraConfig::default() };
    let init = AdapterInit::new(&cfg(), &lora);
    let tensors: HashMap<String, Tensor> =
        init.names().into_iter().map(|n| (n.clone(), init.tensor(&n).unwrap())).collect();
    let w = Weights::of_adapter(3, lora.clone(), tensors);
    let plain = Transformer::new_random(cfg(), 1, DType::F32, &Device::Cpu).unwrap();
    let (ids, mask, targets) = batch(DType::F32);
    let before = flat(&plain.score_logprobs(&ids, &mask, &targets).unwrap());
    let e = plain.apply_weights(&w).unwrap_err().to_string();
    assert!(e.contains("weight version 3 holds adapters of rank 4"), "{e}");
    let other = LoraConfig { rank: 8, ..LoraConfig::default() };
    let m = Transformer::new_random(cfg(), 1, DType::F32, &Device::Cpu)
        .unwrap()
        .with_adapters(&other, &AdapterInit::new(&cfg(), &other))
        .unwrap();
    assert!(m.apply_weights(&w).is_err());
    assert_eq!(flat(&plain.score_logprobs(&ids, &mask, &targets).unwrap()), before);
    assert!(Policy::lora(&m).is_some());
}
