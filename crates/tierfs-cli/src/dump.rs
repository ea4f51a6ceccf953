//! `tierfs dump` and `tierfs load`: the metadata of a filesystem as a portable file (JSON
//! lines), so a filesystem started on the embedded default can move to another engine.
//!
//! Format: a header line `{"tierfs_dump":1,"schema_version":N,"name":...}`, then one line per
//! row: `{"table":"inodes","row":{"ino":1,...}}`; blobs are `{"hex":"..."}`. File data stays on
//! the storage targets: the dump records which targets (URLs) hold it.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Map, Value};
use tierfs_meta::{open_engine, DumpRow, DumpValue, MetaError};

use crate::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Metadata URL of the filesystem to dump.
    #[arg(long)]
    pub meta: String,
    /// Output file (default: standard output).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Metadata URL of a freshly formatted, empty filesystem to load into.
    #[arg(long)]
    pub meta: String,
    /// A file written by `tierfs dump`.
    pub input: PathBuf,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn to_json(v: &DumpValue) -> Value {
    match v {
        DumpValue::Null => Value::Null,
        DumpValue::Int(n) => json!(n),
        DumpValue::Real(f) => json!(f),
        DumpValue::Text(t) => json!(t),
        DumpValue::Blob(b) => json!({ "hex": hex(b) }),
    }
}

fn from_json(v: &Value) -> Option<DumpValue> {
    Some(match v {
        Value::Null => DumpValue::Null,
        Value::Number(n) if n.is_i64() => DumpValue::Int(n.as_i64()?),
        Value::Number(n) => DumpValue::Real(n.as_f64()?),
        Value::String(s) => DumpValue::Text(s.clone()),
        Value::Object(o) => DumpValue::Blob(unhex(o.get("hex")?.as_str()?)?),
        _ => return None,
    })
}

pub fn dump(a: DumpArgs) -> Result<()> {
    let engine = open_engine(&a.meta)?;
    let info = engine.info()?;
    let out: Box<dyn Write> = match &a.output {
        Some(p) => Box::new(
            std::fs::File::create(p).map_err(|e| CliError::Io(p.display().to_string(), e))?,
        ),
        None => Box::new(std::io::stdout()),
    };
    let mut out = BufWriter::new(out);
    let io = |e: std::io::Error| MetaError::Db(format!("writing the dump: {e}"));
    let header = json!({"tierfs_dump": 1, "schema_version": info.schema_version, "name": info.name, "uuid": info.uuid});
    writeln!(out, "{header}").map_err(io)?;
    let mut rows = 0u64;
    engine.export_rows(&mut |(table, cols)| {
        let mut m = Map::new();
        for (c, v) in &cols {
            m.insert(c.clone(), to_json(v));
        }
        writeln!(out, "{}", json!({"table": table, "row": m})).map_err(io)?;
        rows += 1;
        Ok(())
    })?;
    out.flush().map_err(io)?;
    eprintln!("dumped {} ({rows} rows)", info.name);
    Ok(())
}

pub fn load(a: LoadArgs) -> Result<()> {
    let shown = a.input.display().to_string();
    let f = std::fs::File::open(&a.input).map_err(|e| CliError::Io(shown.clone(), e))?;
    let mut lines = BufReader::new(f).lines();
    let header: Value = match lines.next() {
        Some(Ok(l)) => serde_json::from_str(&l)
            .map_err(|e| CliError::Usage(format!("{shown}: not a tierfs dump ({e})")))?,
        _ => {
            return Err(CliError::Usage(format!(
                "{shown}: empty file, not a tierfs dump"
            )))
        }
    };
    if header.get("tierfs_dump").and_then(|v| v.as_i64()) != Some(1) {
        return Err(CliError::Usage(format!("{shown}: not a tierfs dump")));
    }
    let engine = open_engine(&a.meta)?;
    let ours = engine.info()?.schema_version;
    let theirs = header
        .get("schema_version")
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    if theirs != ours {
        return Err(CliError::Usage(format!(
            "{shown}: dump of schema version {theirs}, this tierfs writes {ours}; load it with the matching version"
        )));
    }
    let mut lineno = 1usize;
    let mut rows = lines.map(|l| -> std::result::Result<DumpRow, MetaError> {
        lineno += 1;
        let bad = |why: &str| MetaError::Invalid(format!("{shown} line {lineno}: {why}"));
        let l = l.map_err(|e| bad(&e.to_string()))?;
        let v: Value = serde_json::from_str(&l).map_err(|e| bad(&e.to_string()))?;
        let table = v
            .get("table")
            .and_then(|t| t.as_str())
            .ok_or_else(|| bad("no table"))?;
        let row = v
            .get("row")
            .and_then(|r| r.as_object())
            .ok_or_else(|| bad("no row"))?;
        let mut cols = Vec::with_capacity(row.len());
        for (k, val) in row {
            cols.push((k.clone(), from_json(val).ok_or_else(|| bad("bad value"))?));
        }
        Ok((table.to_string(), cols))
    });
    let n = engine.import_rows(&mut rows)?;
    eprintln!("loaded {n} rows into {}", a.meta);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_json() {
        for v in [
            DumpValue::Null,
            DumpValue::Int(-5),
            DumpValue::Int(i64::MAX),
            DumpValue::Real(1.5),
            DumpValue::Text("a\"b".into()),
            DumpValue::Blob(vec![0, 1, 255]),
        ] {
            assert_eq!(from_json(&to_json(&v)), Some(v));
        }
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }
}
