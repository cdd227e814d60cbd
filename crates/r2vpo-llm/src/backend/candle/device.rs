//! The candle backend's devices ([`open_device`]).

use crate::model::cuda_ordinal;

/// Opens the device `name` names ([`cuda_ordinal`]). CUDA needs a binary
/// built with the `cuda` feature (`make build-gpu`) and a GPU; the error
/// says which is missing.
///
/// A GPU is opened once per process, on one CUDA stream that every thread
/// shares; opening it again returns the same device. (candle's own
/// `Device::new_cuda` gives each host thread its own stream, and nothing
/// orders one thread's kernels after another's: the trainer's gradients on
/// a GPU were read before they were written.)
pub fn open_device(name: &str) -> std::result::Result<candle_core::Device, String> {
    let Some(ordinal) = cuda_ordinal(name)? else { return Ok(candle_core::Device::Cpu) };
    if !cfg!(feature = "cuda") {
        return Err(format!("`{name}`: this binary was built without CUDA; build one with `make build-gpu`"));
    }
    static OPEN: std::sync::Mutex<Vec<(usize, candle_core::Device)>> = std::sync::Mutex::new(Vec::new());
    let mut open = OPEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, d)) = open.iter().find(|(o, _)| *o == ordinal) {
        return Ok(d.clone());
    }
    let dev = open_cuda(ordinal).map_err(|e| format!("`{name}`: {e}"))?;
    open.push((ordinal, dev.clone()));
    Ok(dev)
}

/// GPU `ordinal` on one explicit CUDA stream.
///
/// candle's `Device::new_cuda` launches on the *per-thread* default stream,
/// a different stream for every host thread, with nothing ordering one
/// thread's kernels after another's. Our passes run on rayon's pool
/// ([`crate::pool::on_pool`]) while the caller packs inputs, reads losses and adds
/// gradients on its own thread, and the engine's decode steps land on
/// whichever pool thread is free: on a GPU that read gradients before they
/// were written and reused memory another stream was still using. The
/// trainer's gradient norms on an H200 came out 1e2–1e13 times the CPU's
/// (`results/gpu/2026-11-26-nvidia-h200-run2/grad-norms.txt`) while `bench step --check`, which
/// ran on one thread, matched. One stream orders every launch by the host
/// order of the calls, whichever thread makes them.
#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> candle_core::Result<candle_core::Device> {
    let dev = candle_core::Device::new_cuda_with_stream(ordinal)?;
    // SAFETY: cudarc records an event on every buffer's every use once a
    // context has a stream of its own, to order uses across streams. This
    // device's work all goes to its one stream (kernels, copies, cuBLAS and
    // cuRAND are bound to it), and `open_device` opens each GPU once, so
    // stream order already orders every use and the events are pure cost.
    unsafe { dev.as_cuda_device()?.cuda_stream().context().disable_event_tracking() };
    Ok(dev)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> candle_core::Result<candle_core::Device> {
    unreachable!("open_device refuses CUDA in a binary built without it")
}
