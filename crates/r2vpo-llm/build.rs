//! With the `torch` feature, compiles the torch backend's fused-AdamW
//! shim (`src/backend/fused_adamw.cpp`) and the distributed learner's c10d
//! shim (`src/parallel/c10d.cpp`) against libtorch's headers, found as
//! torch-sys finds them (`LIBTORCH`, or `LIBTORCH_INCLUDE`); the c10d shim
//! also needs Gloo's headers (`GLOO_INCLUDE`, by default `gloo/include`
//! beside `LIBTORCH`: deps-torch.toml puts them in `.deps/gloo`). With
//! the `nccl` feature the c10d shim also gets ProcessGroupNCCL, which needs
//! `nccl.h` and CUDA's headers (`CUDA_ROOT`, by default `cuda` beside
//! `LIBTORCH`: deps-gpu.toml puts them in `.deps/cuda`).

fn main() {
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() {
        torch_shim();
    }
}

fn torch_shim() {
    println!("cargo:rerun-if-changed=src/backend/fused_adamw.cpp");
    println!("cargo:rerun-if-changed=src/parallel/c10d.cpp");
    for v in ["LIBTORCH", "LIBTORCH_INCLUDE", "LIBTORCH_CXX11_ABI", "GLOO_INCLUDE", "CUDA_ROOT"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let root = std::env::var("LIBTORCH_INCLUDE")
        .or_else(|_| std::env::var("LIBTORCH"))
        .expect("the torch feature needs LIBTORCH (make build-torch sets it: .deps/libtorch from deps-torch.toml)");
    let inc = std::path::Path::new(&root).join("include");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .file("src/backend/fused_adamw.cpp")
        .include(&inc)
        .include(inc.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .warnings(false)
        .opt_level(2)
        .compile("r2vpo_fused_adamw");

    let gloo = std::env::var("GLOO_INCLUDE").map(std::path::PathBuf::from).unwrap_or_else(|_| {
        std::path::Path::new(&std::env::var("LIBTORCH").unwrap_or(root.clone())).join("../gloo/include")
    });
    if !gloo.join("gloo/context.h").exists() {
        panic!(
            "the torch feature needs Gloo's headers in {} (`python3 scripts/deps.py --manifest deps-torch.toml` \
             fetches them into .deps/gloo; or set GLOO_INCLUDE)",
            gloo.display()
        );
    }
    // The compile definitions libtorch_cpu's CMake target exports
    // (Caffe2Targets.cmake), without which c10d's headers hide Gloo.
    let mut c10d = cc::Build::new();
    c10d.cpp(true)
        .file("src/parallel/c10d.cpp")
        .include(&inc)
        .include(inc.join("torch/csrc/api/include"))
        .include(&gloo)
        .define("USE_DISTRIBUTED", None)
        .define("USE_C10D_GLOO", None);
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        let cuda = std::env::var("CUDA_ROOT").map(std::path::PathBuf::from).unwrap_or_else(|_| {
            std::path::Path::new(&std::env::var("LIBTORCH").unwrap_or(root.clone())).join("../cuda")
        });
        if !cuda.join("include/nccl.h").exists() || !cuda.join("include/cusparse.h").exists() {
            panic!(
                "the nccl feature needs nccl.h and CUDA's headers in {}/include (`python3 scripts/deps.py \
                 --manifest deps-gpu.toml` fetches them into .deps/cuda; or set CUDA_ROOT)",
                cuda.display()
            );
        }
        // libtorch_cuda's exported definitions, which ProcessGroupNCCL.hpp
        // is guarded by.
        c10d.include(cuda.join("include"))
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("R2VPO_NCCL", None);
    }
    c10d.flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .warnings(false)
        .opt_level(2)
        .compile("r2vpo_c10d");
}
