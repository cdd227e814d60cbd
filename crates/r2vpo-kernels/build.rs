//! Compiles the AVX2 and AMX product kernels (`src/avx2.c`, `src/amx.c`)
//! on x86-64 Linux. The C files turn their AVX2, AVX-512 and AMX code on
//! per function (`target` attributes), so the library runs on any x86-64
//! and asks the CPU at run time.

fn main() {
    println!("cargo:rerun-if-changed=src/avx2.c");
    println!("cargo:rerun-if-changed=src/amx.c");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os == "linux" && arch == "x86_64" {
        println!("cargo:rustc-cfg=r2vpo_avx2_c");
        cc::Build::new().file("src/avx2.c").opt_level(3).flag("-std=gnu11").compile("r2vpo_avx2");
        println!("cargo:rustc-cfg=r2vpo_amx");
        cc::Build::new().file("src/amx.c").opt_level(3).flag("-std=gnu11").compile("r2vpo_amx");
    }
    println!("cargo::rustc-check-cfg=cfg(r2vpo_avx2_c)");
    println!("cargo::rustc-check-cfg=cfg(r2vpo_amx)");
}
