//! Writing MDS shards byte for byte as Streaming's `MDSWriter` lays them out (see the module doc
//! of `mds`): what the tests, the fuzz seeds and a migration's round trip write.

use std::path::Path;

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// A column to write: its name, its MDS encoding (`jpeg`, `bytes`, `int`, `str`...) and its
/// fixed size, when every sample's is the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdsColumn {
    /// The column's name.
    pub name: String,
    /// The MDS encoding name.
    pub encoding: String,
    /// The size every sample's bytes have, or `None`.
    pub size: Option<u32>,
}

/// Writes `samples` (each one byte string per column, already encoded) as MDS shards of up to
/// `per_shard` samples in `dir`, with its `index.json`; `compression` (`"zstd"` or `"gz"`, a
/// `:level` suffix ignored) writes each shard compressed only, as the writer does. Returns the
/// shard count.
pub fn write_mds(
    dir: &Path,
    columns: &[MdsColumn],
    samples: &[Vec<Vec<u8>>],
    per_shard: usize,
    compression: Option<&str>,
) -> Result<usize> {
    std::fs::create_dir_all(dir).map_err(|error| Error::io(dir, error))?;
    let invalid = |problem: String| Error::InvalidArgument(problem);
    let config = json!({"columns": columns.iter().map(|c| (c.name.clone(), Value::from(c.encoding.clone()))).collect::<serde_json::Map<String, Value>>(), "compression": compression});
    let config = config.to_string().into_bytes();
    let mut shards = Vec::new();
    for (number, chunk) in samples.chunks(per_shard.max(1)).enumerate() {
        let mut encoded = Vec::with_capacity(chunk.len());
        for sample in chunk {
            if sample.len() != columns.len() {
                return Err(invalid(format!(
                    "a sample has {} values for {} columns",
                    sample.len(),
                    columns.len()
                )));
            }
            let mut head = Vec::new();
            let mut body = Vec::new();
            for (value, column) in sample.iter().zip(columns) {
                match column.size {
                    Some(size) if value.len() != size as usize => {
                        return Err(invalid(format!(
                            "column {} holds {} bytes, not its fixed {size}",
                            column.name,
                            value.len()
                        )))
                    }
                    Some(_) => {}
                    None => head.extend_from_slice(&(value.len() as u32).to_le_bytes()),
                }
                body.extend_from_slice(value);
            }
            head.extend_from_slice(&body);
            encoded.push(head);
        }
        let count = encoded.len() as u32;
        let header = 4 + 4 * (encoded.len() + 1) + config.len();
        let mut data = count.to_le_bytes().to_vec();
        let mut offset = header;
        data.extend_from_slice(&(offset as u32).to_le_bytes());
        for sample in &encoded {
            offset += sample.len();
            let offset =
                u32::try_from(offset).map_err(|_| invalid("a shard past 4 GiB".to_string()))?;
            data.extend_from_slice(&offset.to_le_bytes());
        }
        data.extend_from_slice(&config);
        for sample in &encoded {
            data.extend_from_slice(sample);
        }
        let raw = format!("shard.{number:05}.mds");
        let raw_info = json!({"basename": raw, "bytes": data.len(), "hashes": {}});
        let zip_info = match compression {
            None => {
                std::fs::write(dir.join(&raw), &data).map_err(|error| Error::io(dir, error))?;
                Value::Null
            }
            Some(algorithm) => {
                let extension = algorithm.split(':').next().unwrap_or_default();
                let zipped = match extension {
                    "zstd" => zstd::stream::encode_all(data.as_slice(), 3)
                        .map_err(|error| Error::io(dir, error))?,
                    "gz" => {
                        use std::io::Write;
                        let mut encoder = flate2::write::GzEncoder::new(
                            Vec::new(),
                            flate2::Compression::default(),
                        );
                        encoder
                            .write_all(&data)
                            .and_then(|()| encoder.finish())
                            .map_err(|error| Error::io(dir, error))?
                    }
                    other => return Err(invalid(format!("compression {other:?} is not written"))),
                };
                let name = format!("{raw}.{extension}");
                std::fs::write(dir.join(&name), &zipped).map_err(|error| Error::io(dir, error))?;
                json!({"basename": name, "bytes": zipped.len(), "hashes": {}})
            }
        };
        shards.push(json!({
            "column_encodings": columns.iter().map(|c| c.encoding.clone()).collect::<Vec<_>>(),
            "column_names": columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            "column_sizes": columns.iter().map(|c| c.size).collect::<Vec<_>>(),
            "compression": compression,
            "format": "mds",
            "hashes": [],
            "raw_data": raw_info,
            "samples": count,
            "size_limit": 67108864,
            "version": 2,
            "zip_data": zip_info,
        }));
    }
    let index = json!({"shards": shards, "version": 2});
    let path = dir.join(super::MDS_INDEX_FILE);
    std::fs::write(&path, index.to_string()).map_err(|error| Error::io(&path, error))?;
    Ok(shards.len())
}
