//! Compiles the AMX kernel (`src/model/amx.c`) on x86-64 Linux (the AVX2
//! one lives in `r2vpo-kernels`, shared with the control networks). The C
//! file turns its AMX and AVX-512 code on per function (`target`
//! attributes), so the library runs on any x86-64 and asks the CPU at run
//! time.

fn main() {
    println!("cargo:rerun-if-changed=src/model/amx.c");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os == "linux" && arch == "x86_64" {
        println!("cargo:rustc-cfg=r2vpo_amx");
        cc::Build::new().file("src/model/amx.c").opt_level(3).flag("-std=gnu11").compile("r2vpo_amx");
    }
    println!("cargo::rustc-check-cfg=cfg(r2vpo_amx)");
}
