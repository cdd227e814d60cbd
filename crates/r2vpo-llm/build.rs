//! With the `torch` feature, compiles the torch backend's fused-AdamW
//! shim (`src/backend/fused_adamw.cpp`) against libtorch's headers, found
//! as torch-sys finds them (`LIBTORCH`, or `LIBTORCH_INCLUDE`).

fn main() {
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() {
        torch_shim();
    }
}

fn torch_shim() {
    println!("cargo:rerun-if-changed=src/backend/fused_adamw.cpp");
    for v in ["LIBTORCH", "LIBTORCH_INCLUDE", "LIBTORCH_CXX11_ABI"] {
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
}
