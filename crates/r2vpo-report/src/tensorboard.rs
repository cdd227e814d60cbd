//! A minimal TensorBoard event-file writer for scalar curves, so runs can be
//! watched with `tensorboard --logdir runs/` without any Python in r2vpo.
//!
//! The format is TFRecord framing around `tensorflow.Event` protocol buffers:
//! each record is `u64 length | u32 masked_crc32c(length) | data |
//! u32 masked_crc32c(data)`, little-endian. Only the handful of protobuf
//! fields a scalar needs are encoded, by hand: pulling in a protobuf stack for
//! five fields would cost more than it saves.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::ReportError;

/// Appends scalar summaries to `events.out.tfevents.<time>.<host>.r2vpo`.
pub struct TensorBoardWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl TensorBoardWriter {
    /// Creates a new event file in `dir` (created if needed) and writes the
    /// file-version header event TensorBoard expects first.
    pub fn create(dir: &Path) -> Result<Self, ReportError> {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Io { path: dir.to_path_buf(), source })?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let path = dir.join(format!("events.out.tfevents.{now}.r2vpo.{}", std::process::id()));
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| ReportError::Io { path: path.clone(), source })?;
        let mut w = Self { path, out: BufWriter::new(f) };
        let mut ev = Vec::new();
        put_double(&mut ev, 1, wall_time());
        put_bytes(&mut ev, 3, b"brain.Event:2");
        w.record(&ev)?;
        Ok(w)
    }

    /// Writes one scalar `value` for `tag` at `step` and flushes.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f64) -> Result<(), ReportError> {
        self.scalars(step, &[(tag, value)])
    }

    /// Writes several scalars for one step in a single event and flushes.
    pub fn scalars(&mut self, step: i64, values: &[(&str, f64)]) -> Result<(), ReportError> {
        let mut summary = Vec::new();
        for (tag, v) in values {
            let mut value = Vec::new();
            put_bytes(&mut value, 1, tag.as_bytes());
            // simple_value is a float field; TensorBoard reads nothing wider.
            put_fixed32(&mut value, 2, (*v as f32).to_bits());
            put_bytes(&mut summary, 1, &value);
        }
        let mut ev = Vec::new();
        put_double(&mut ev, 1, wall_time());
        put_varint_field(&mut ev, 2, step as u64);
        put_bytes(&mut ev, 5, &summary);
        self.record(&ev)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, data: &[u8]) -> Result<(), ReportError> {
        let len = (data.len() as u64).to_le_bytes();
        let io = |source| ReportError::Io { path: self.path.clone(), source };
        self.out.write_all(&len).map_err(io)?;
        self.out.write_all(&masked_crc32c(&len).to_le_bytes()).map_err(io)?;
        self.out.write_all(data).map_err(io)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes()).map_err(io)?;
        self.out.flush().map_err(io)
    }
}

/// Drops every event with a step greater than `step` from the event files
/// in `dir` (each rewritten atomically; headers and step-less events stay).
///
/// A resumed run replays the steps after its checkpoint; without this,
/// TensorBoard would show two points for each of them (its purge-on-restart
/// is not implemented by every backend, so the files themselves are cut).
/// Only files this writer produced (`*.r2vpo.*`) are touched.
pub fn truncate_events_after(dir: &Path, step: i64) -> Result<(), ReportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Io { path, source }
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ReportError::Io { path: dir.to_path_buf(), source }),
    };
    for entry in entries {
        let path = entry.map_err(io(dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("events.out.tfevents.") && name.contains(".r2vpo.")) {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let mut kept = Vec::with_capacity(bytes.len());
        let mut at = 0usize;
        // Records are framed `len | crc(len) | data | crc(data)`; a torn
        // record at the end (a killed writer) ends the scan.
        while at + 12 <= bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
            let end = match at.checked_add(12 + len + 4) {
                Some(e) if e <= bytes.len() => e,
                _ => break,
            };
            let data = &bytes[at + 12..at + 12 + len];
            if event_step(data).is_none_or(|s| s <= step) {
                kept.extend_from_slice(&bytes[at..end]);
            }
            at = end;
        }
        if kept.len() != bytes.len() {
            crate::atomic_write(&path, &kept)?;
        }
    }
    Ok(())
}

/// Every scalar in the event files this writer produced in `dir`, as
/// `(tag, step, value)` in file order (for tests and tools that check what
/// TensorBoard will draw). A torn record at a file's end is ignored.
pub fn read_scalars(dir: &Path) -> Result<Vec<(String, i64, f32)>, ReportError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|source| ReportError::Io { path: dir.to_path_buf(), source })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.starts_with("events.out.tfevents.") && n.contains(".r2vpo.")
        })
        .collect();
    files.sort();
    for path in files {
        let bytes = std::fs::read(&path).map_err(|source| ReportError::Io { path: path.clone(), source })?;
        let mut at = 0usize;
        while at + 12 <= bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
            let Some(end) = at.checked_add(16 + len).filter(|&e| e <= bytes.len()) else { break };
            let data = &bytes[at + 12..at + 12 + len];
            if let Some(step) = event_step(data) {
                for (tag, v) in fields(data, 5).iter().flat_map(|summary| fields(summary, 1)).filter_map(|value| {
                    let tag = fields(&value, 1).into_iter().next()?;
                    let bits = fixed32(&value, 2)?;
                    Some((String::from_utf8_lossy(&tag).into_owned(), f32::from_bits(bits)))
                }) {
                    out.push((tag, step, v));
                }
            }
            at = end;
        }
    }
    Ok(out)
}

/// One field's value as read off the wire.
enum Wire<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire types 1, 2 and 5: the raw bytes.
    Bytes(&'a [u8]),
}

/// Reads a base-128 varint off the front of `d`.
fn read_varint(d: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = d.split_first()?;
        *d = rest;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Walks the fields of an encoded message, calling `visit(field, wire,
/// value)`; stops at the first malformed field.
fn walk<'a>(mut data: &'a [u8], mut visit: impl FnMut(u64, u64, Wire<'a>)) {
    while !data.is_empty() {
        let Some(key) = read_varint(&mut data) else { return };
        let (field, wire) = (key >> 3, key & 7);
        let len = match wire {
            0 => {
                let Some(v) = read_varint(&mut data) else { return };
                visit(field, wire, Wire::Varint(v));
                continue;
            }
            1 => 8,
            2 => match read_varint(&mut data) {
                Some(n) => n as usize,
                None => return,
            },
            5 => 4,
            _ => return,
        };
        let Some(payload) = data.get(..len) else { return };
        data = &data[len..];
        visit(field, wire, Wire::Bytes(payload));
    }
}

/// The length-delimited payloads of `field`.
fn fields(data: &[u8], field: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    walk(data, |f, w, v| {
        if let (true, 2, Wire::Bytes(p)) = (f == field, w, v) {
            out.push(p.to_vec());
        }
    });
    out
}

/// The fixed32 value of `field`.
fn fixed32(data: &[u8], field: u64) -> Option<u32> {
    let mut out = None;
    walk(data, |f, w, v| {
        if let (true, 5, Wire::Bytes(p)) = (f == field, w, v) {
            out = Some(u32::from_le_bytes(p.try_into().expect("4 bytes")));
        }
    });
    out
}

/// The `step` field (2, varint) of an encoded `Event`, if present.
fn event_step(data: &[u8]) -> Option<i64> {
    let mut step = None;
    walk(data, |f, w, v| {
        if let (2, 0, Wire::Varint(x)) = (f, w, v) {
            step = Some(x as i64);
        }
    });
    step
}

fn wall_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_varint_field(buf: &mut Vec<u8>, field: u32, v: u64) {
    put_varint(buf, u64::from(field << 3));
    put_varint(buf, v);
}

fn put_double(buf: &mut Vec<u8>, field: u32, v: f64) {
    put_varint(buf, u64::from(field << 3 | 1));
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_fixed32(buf: &mut Vec<u8>, field: u32, bits: u32) {
    put_varint(buf, u64::from(field << 3 | 5));
    buf.extend_from_slice(&bits.to_le_bytes());
}

fn put_bytes(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(buf, u64::from(field << 3 | 2));
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// CRC-32C (Castagnoli), the checksum TFRecord frames carry.
fn crc32c(data: &[u8]) -> u32 {
    const POLY: u32 = 0x82F6_3B78;
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    !data.iter().fold(!0u32, |c, &b| table[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8))
}

fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xA282_EAD8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_drops_the_replayed_steps_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TensorBoardWriter::create(dir.path()).unwrap();
        for step in 0..6 {
            w.scalar("loss", step, step as f64).unwrap();
        }
        drop(w);
        truncate_events_after(dir.path(), 3).unwrap();
        let bytes = std::fs::read(std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path()).unwrap();
        let mut steps = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            steps.push(event_step(&bytes[at + 12..at + 12 + len]));
            at += 16 + len;
        }
        assert_eq!(steps, [None, Some(0), Some(1), Some(2), Some(3)]);
        let scalars = read_scalars(dir.path()).unwrap();
        assert_eq!(scalars, (0..4).map(|s| ("loss".to_string(), s, s as f32)).collect::<Vec<_>>());
    }

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// Reads the file back frame by frame, verifying both checksums, and
    /// decodes the scalar event by hand.
    #[test]
    fn frames_and_scalar_event_decode() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TensorBoardWriter::create(dir.path()).unwrap();
        w.scalar("reward", 7, 0.5).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let mut records = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc32c(len_bytes));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            records.push(data.to_vec());
            at += 16 + len;
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].windows(13).any(|w| w == b"brain.Event:2"));
        let ev = &records[1];
        // wall_time (field 1, double), then step = 7 (field 2 varint).
        assert_eq!(ev[0], 0x09);
        assert_eq!(&ev[9..11], &[0x10, 7]);
        // summary (field 5) → value (field 1) → tag "reward", simple_value 0.5f32.
        let mut want = vec![0x2a, 15, 0x0a, 13, 0x0a, 6];
        want.extend_from_slice(b"reward");
        want.push(0x15);
        want.extend_from_slice(&0.5f32.to_bits().to_le_bytes());
        assert_eq!(&ev[11..], &want[..]);
    }
}
