//! Bakes an rpath to the project's MuJoCo library into the `r2vpo` binary and
//! its tests, so they run without `LD_LIBRARY_PATH` (the library's SONAME is
//! `libmujoco.so.3.17.0`, fetched by `make deps` into `.deps/mujoco/lib`).
fn main() {
    println!("cargo::rerun-if-env-changed=MUJOCO_DYNAMIC_LINK_DIR");
    if let Ok(dir) = std::env::var("MUJOCO_DYNAMIC_LINK_DIR") {
        println!("cargo::rustc-link-arg=-Wl,-rpath,{dir}");
    }
    // Relocatable installs: a copy of the .so beside the binary is found too.
    println!("cargo::rustc-link-arg=-Wl,-rpath,$ORIGIN");
}
