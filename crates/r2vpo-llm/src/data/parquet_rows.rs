//! Parquet reading for [`super::load_parquet`]: the `parquet` crate's row API
//! (no arrow), projected to the columns a [`RecordLayout`] needs; each row
//! becomes a JSON object so that JSONL and Parquet share one field mapping.

use std::cell::Cell;
use std::fs::File;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use parquet::schema::types::Type;
use serde_json::{Map, Number, Value};

use super::{file_stem, record_to_problem, DataError, FieldError, Position, RecordLayout, Sink};

/// Why a codec cannot be read by this build, or `None` if it can.
fn codec_hint(codec: &Compression) -> Option<(&'static str, &'static str)> {
    const RESAVE: &str =
        "re-save the file with snappy, e.g. pyarrow.parquet.write_table(table, path, compression=\"snappy\")";
    match codec {
        Compression::UNCOMPRESSED
        | Compression::SNAPPY
        | Compression::GZIP(_)
        | Compression::LZ4
        | Compression::LZ4_RAW => None,
        Compression::ZSTD(_) if cfg!(feature = "parquet-zstd") => None,
        Compression::ZSTD(_) => Some((
            "ZSTD",
            "build with the `parquet-zstd` feature of r2vpo-llm (e.g. `cargo build --features r2vpo-llm/parquet-zstd`), or re-save the file with snappy, e.g. pyarrow.parquet.write_table(table, path, compression=\"snappy\")",
        )),
        Compression::BROTLI(_) => Some(("BROTLI", RESAVE)),
        Compression::LZO => Some(("LZO", RESAVE)),
    }
}

/// Reads `path` row by row, mapping each row with `layout` and handing the
/// problems to `sink` until it breaks or the file ends.
///
/// The `parquet` crate can panic on corrupt input (e.g. bit-packed runs
/// whose lengths lie); such a panic is caught and returned as
/// [`DataError::ParquetRow`] (or [`DataError::NotParquet`] if it happens
/// before the first row), so a bad file never takes the process down.
pub(super) fn read_parquet(path: &Path, layout: &RecordLayout, sink: &mut Sink<'_>) -> Result<(), DataError> {
    let row = Cell::new(0usize);
    match panic::catch_unwind(AssertUnwindSafe(|| read_rows(path, layout, sink, &row))) {
        Ok(result) => result,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            let message = format!("the Parquet decoder panicked (corrupt file?): {what}");
            Err(match row.get() {
                0 => DataError::NotParquet { path: path.to_path_buf(), message },
                n => DataError::ParquetRow { path: path.to_path_buf(), row: n, message },
            })
        }
    }
}

/// [`read_parquet`] without the panic guard; `row` tracks the 1-based row
/// being decoded (0 while reading metadata).
fn read_rows(path: &Path, layout: &RecordLayout, sink: &mut Sink<'_>, row: &Cell<usize>) -> Result<(), DataError> {
    let file = File::open(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    let not_parquet =
        |e: parquet::errors::ParquetError| DataError::NotParquet { path: path.to_path_buf(), message: e.to_string() };
    let reader = SerializedFileReader::new(file).map_err(not_parquet)?;
    let metadata = reader.metadata();
    let root = metadata.file_metadata().schema();

    // Project to the layout's top-level columns; a missing required one is
    // reported before any row is read.
    let mut fields = Vec::new();
    for (name, required) in layout.columns() {
        match root.get_fields().iter().find(|f| f.name() == name) {
            Some(f) => fields.push(Arc::clone(f)),
            None if required => {
                let available = root.get_fields().iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
                return Err(DataError::MissingColumn { path: path.to_path_buf(), column: name.to_string(), available });
            }
            None => {}
        }
    }
    let wanted: Vec<&str> = fields.iter().map(|f| f.name()).collect();
    for row_group in metadata.row_groups() {
        for column in row_group.columns() {
            let top = column.column_path().parts().first().map(String::as_str).unwrap_or("");
            if !wanted.contains(&top) {
                continue;
            }
            if let Some((codec, hint)) = codec_hint(&column.compression()) {
                return Err(DataError::UnsupportedCodec {
                    path: path.to_path_buf(),
                    column: column.column_path().string(),
                    codec: codec.to_string(),
                    hint: hint.to_string(),
                });
            }
        }
    }
    let projection = Type::group_type_builder(root.name()).with_fields(fields).build().map_err(not_parquet)?;
    let rows = reader.get_row_iter(Some(projection)).map_err(not_parquet)?;

    let stem = file_stem(path, "parquet");
    // The iterator decodes row `n` inside `next()`, so the counter runs one
    // ahead of the loop body.
    row.set(1);
    for (i, decoded) in rows.enumerate() {
        let n = i + 1;
        row.set(n);
        let decoded =
            decoded.map_err(|e| DataError::ParquetRow { path: path.to_path_buf(), row: n, message: e.to_string() })?;
        let record = row_to_json(decoded).map_err(|e| e.at(path, Position::Row(n)))?;
        let problem = record_to_problem(&record, layout, &stem, format!("{stem}:{n}"))
            .map_err(|e| e.at(path, Position::Row(n)))?;
        if sink(problem).is_break() {
            break;
        }
        row.set(n + 1);
    }
    Ok(())
}

fn row_to_json(row: Row) -> Result<Map<String, Value>, FieldError> {
    let mut out = Map::new();
    for (name, field) in row.into_columns() {
        let value = field_to_json(field, &name)?;
        out.insert(name, value);
    }
    Ok(out)
}

fn float(x: f64) -> Value {
    Number::from_f64(x).map(Value::Number).unwrap_or_else(|| Value::String(x.to_string()))
}

/// Converts one Parquet value to JSON, moving strings out of the row.
/// `key` is the field path, for the one conversion that can fail
/// (binary data that is not UTF-8).
fn field_to_json(field: Field, key: &str) -> Result<Value, FieldError> {
    Ok(match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(b),
        Field::Byte(x) => x.into(),
        Field::Short(x) => x.into(),
        Field::Int(x) => x.into(),
        Field::Long(x) => x.into(),
        Field::UByte(x) => x.into(),
        Field::UShort(x) => x.into(),
        Field::UInt(x) => x.into(),
        Field::ULong(x) => x.into(),
        Field::Float16(x) => float(x.to_f64()),
        Field::Float(x) => float(f64::from(x)),
        Field::Double(x) => float(x),
        Field::Str(s) => Value::String(s),
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => {
                return Err(FieldError::Bad {
                    key: key.to_string(),
                    expected: "UTF-8 text",
                    found: "binary data that is not UTF-8".to_string(),
                })
            }
        },
        // Decimals, dates and times keep their textual form (`3.14`,
        // `2024-01-31`), which is what an answer compared as text needs.
        f @ (Field::Decimal(_)
        | Field::Date(_)
        | Field::TimeMillis(_)
        | Field::TimeMicros(_)
        | Field::TimestampMillis(_)
        | Field::TimestampMicros(_)) => Value::String(f.to_string()),
        Field::Group(row) => {
            let mut out = Map::new();
            for (name, f) in row.into_columns() {
                let value = field_to_json(f, &format!("{key}.{name}"))?;
                out.insert(name, value);
            }
            Value::Object(out)
        }
        Field::ListInternal(list) => Value::Array(
            list.elements()
                .iter()
                .enumerate()
                .map(|(i, f)| field_to_json(f.clone(), &format!("{key}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Field::MapInternal(map) => {
            let mut out = Map::new();
            for (k, v) in map.entries() {
                let k = match k {
                    Field::Str(s) => s.clone(),
                    other => other.to_string(),
                };
                let value = field_to_json(v.clone(), &format!("{key}.{k}"))?;
                out.insert(k, value);
            }
            Value::Object(out)
        }
    })
}
