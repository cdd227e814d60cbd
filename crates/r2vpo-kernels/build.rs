//! Compiles the AVX2 product kernel (`src/avx2.c`) on x86-64 Linux. The C
//! file turns its AVX2 code on per function (`target` attributes), so the
//! library runs on any x86-64 and asks the CPU at run time.

fn main() {
    println!("cargo:rerun-if-changed=src/avx2.c");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os == "linux" && arch == "x86_64" {
        println!("cargo:rustc-cfg=r2vpo_avx2_c");
        cc::Build::new().file("src/avx2.c").opt_level(3).flag("-std=gnu11").compile("r2vpo_avx2");
    }
    println!("cargo::rustc-check-cfg=cfg(r2vpo_avx2_c)");
}
