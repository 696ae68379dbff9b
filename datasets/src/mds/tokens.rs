//! Token windows from an MDS dataset's integer `ndarray` column (LLM Foundry writes its
//! pretokenized corpora so, as `tokens`): every sample's ids, in sample order, written once
//! into the cache tier as a flat token file and cut into windows as a token file is, each
//! sample one document when document boundaries are asked for.

use std::io::Write;

use super::columns::{ndarray_integers, pick_token_column, Encoding, IntType, NdDtype};
use super::{mds_error, MdsDataset};
use crate::error::{Error, Result};
use crate::storage::{derived_copy, ObjectCacheOptions};
use crate::token_dtype::TokenDtype;
use crate::TokenFile;

/// How an MDS dataset's token column is cut ([`MdsDataset::token_windows`]).
#[derive(Debug, Clone, Default)]
pub struct MdsTokenWindows {
    /// The column holding the ids (`None`: `tokens`, else `input_ids`, else the first integer
    /// `ndarray` column).
    pub column: Option<String>,
    /// The ids' type in the windows (`None`: `uint16` when the column's values are integers of
    /// 16 bits or fewer, else `uint32`).
    pub dtype: Option<TokenDtype>,
    /// Tokens per window minus one.
    pub seq_len: u32,
    /// Whether each sample's first token starts a document ([`TokenFile::with_document_starts`]).
    pub document_boundaries: bool,
}

impl MdsDataset {
    /// The dataset's token column cut into windows of `seq_len + 1` tokens. The flat token file
    /// (and the documents' starts) is written into the cache tier of `cache` on the first call
    /// and reused while `index.json` and the shards are unchanged. An id the dtype cannot hold
    /// (negative, or over `uint16`'s range when that is asked for), a float array or a damaged
    /// one is an error naming the shard and sample.
    pub fn token_windows(
        &self,
        windows: &MdsTokenWindows,
        cache: &ObjectCacheOptions,
    ) -> Result<TokenFile> {
        let index_name = self.root.join(super::MDS_INDEX_FILE);
        let column = pick_token_column(&self.columns, windows.column.as_deref(), &index_name)?;
        let dtype = match windows.dtype {
            Some(dtype) => dtype,
            None => match self.values_type(column)? {
                int if int.size <= 2 => TokenDtype::Uint16,
                _ => TokenDtype::Uint32,
            },
        };
        let shards = self.shards_version()?;
        let copy = derived_copy(
            cache,
            &self.index_file,
            &format!("tokens-{column}-{}-{shards:08x}", dtype.name()),
            &|_, out| self.write_tokens(column, dtype, out),
        )?;
        let name = self
            .root
            .join(format!("{}.tokens", self.columns[column].name));
        let tokens = TokenFile::over_copy(name, copy, dtype, windows.seq_len)?;
        if !windows.document_boundaries {
            return Ok(tokens);
        }
        let starts = derived_copy(
            cache,
            &self.index_file,
            &format!("document-starts-{column}-{shards:08x}"),
            &|_, out| self.write_document_starts(column, out),
        )?;
        let bytes = std::fs::read(starts.path()).map_err(|error| Error::io(&index_name, error))?;
        let starts = bytes
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
            .collect();
        tokens.with_document_starts(starts)
    }

    /// The version of the shards' bytes the copies are made from: a checksum of each shard's
    /// version (its local file, size and modification time; see `Shard::version`: an object's
    /// copy in the cache tier is written anew when the object changes, a compressed shard's
    /// copy is named by its file's version). Shards rewritten under an unchanged `index.json`
    /// (samples of one size, as a fixed-length token conversion writes them; only the shards
    /// uploaded again) make new copies, never the old tokens.
    fn shards_version(&self) -> Result<u32> {
        let mut checksum = crc32fast::Hasher::new();
        for shard in &self.shards {
            let (file, len, modified) = shard.version()?;
            checksum.update(file.as_os_str().as_encoded_bytes());
            checksum.update(&len.to_le_bytes());
            checksum.update(&modified.to_le_bytes());
        }
        Ok(checksum.finalize())
    }

    /// The integer type of column `column`'s values: the encoding's, else the first sample's.
    fn values_type(&self, column: usize) -> Result<IntType> {
        match self.columns[column].encoding {
            Encoding::NdArray {
                dtype: Some(NdDtype::Int(int)),
                ..
            } => Ok(int),
            _ => self.sample_ids(0, column).map(|(int, _)| int),
        }
    }

    /// The ids of sample `index`'s column `column`: their type and bytes.
    fn sample_ids(&self, index: u64, column: usize) -> Result<(IntType, Vec<u8>)> {
        let (bytes, shard, local) = self.column_bytes(index, column)?;
        let Encoding::NdArray {
            dtype,
            static_shape,
        } = self.columns[column].encoding
        else {
            return Err(mds_error(&shard.path, "the token column is no ndarray"));
        };
        match ndarray_integers(&bytes, dtype, static_shape) {
            Ok(array) => Ok((array.int, array.values.to_vec())),
            Err(problem) => Err(mds_error(
                &shard.path,
                format!(
                    "sample {local}: column {}: {problem}",
                    self.columns[column].name
                ),
            )),
        }
    }

    /// Writes every sample's ids of column `column` to `out` as little-endian `dtype`.
    fn write_tokens(&self, column: usize, dtype: TokenDtype, out: &mut dyn Write) -> Result<()> {
        let max: i128 = match dtype {
            TokenDtype::Uint16 => i128::from(u16::MAX),
            TokenDtype::Uint32 => i128::from(u32::MAX),
        };
        let mut buffer = Vec::new();
        for index in 0..self.len {
            let (int, values) = self.sample_ids(index, column)?;
            buffer.clear();
            for value in values.chunks_exact(int.size) {
                let id = int.value(value);
                if !(0..=max).contains(&id) {
                    return Err(mds_error(
                        &self.shard_path(index),
                        format!(
                            "{}: token {id} does not fit {}",
                            self.describe_sample(index),
                            dtype.name()
                        ),
                    ));
                }
                match dtype {
                    TokenDtype::Uint16 => buffer.extend_from_slice(&(id as u16).to_le_bytes()),
                    TokenDtype::Uint32 => buffer.extend_from_slice(&(id as u32).to_le_bytes()),
                }
            }
            out.write_all(&buffer)
                .map_err(|error| Error::io(&self.root, error))?;
        }
        Ok(())
    }

    /// Writes the token offset of every sample's first id of column `column` to `out`, as
    /// little-endian `u64`.
    fn write_document_starts(&self, column: usize, out: &mut dyn Write) -> Result<()> {
        let mut start = 0u64;
        for index in 0..self.len {
            out.write_all(&start.to_le_bytes())
                .map_err(|error| Error::io(&self.root, error))?;
            let (int, values) = self.sample_ids(index, column)?;
            start += (values.len() / int.size) as u64;
        }
        Ok(())
    }

    /// The shard file sample `index` lies in.
    fn shard_path(&self, index: u64) -> std::path::PathBuf {
        self.locate(index)
            .map(|(shard, _, _)| shard.path.clone())
            .unwrap_or_else(|| self.root.clone())
    }

    /// `sample N` of its shard.
    fn describe_sample(&self, index: u64) -> String {
        self.locate(index)
            .map(|(_, local, _)| format!("sample {local}"))
            .unwrap_or_else(|| format!("sample {index}"))
    }
}
