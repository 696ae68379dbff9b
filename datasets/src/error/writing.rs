//! What can go wrong writing a dataset (the sample-set generator, `stoker convert`'s tar
//! shards and Parquet files): one variant of the crate's [`super::Error`], `Error::Write`.

use std::path::PathBuf;

/// A dataset that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The generator's output folder holds files that are not a generated dataset.
    #[error(
        "{0} is not empty and is not a stoker-generated dataset; \
         choose an empty or new folder"
    )]
    OutputNotEmpty(PathBuf),

    /// The generator's output folder holds a generated dataset made from another spec.
    #[error(
        "{path} already holds a generated dataset with {found}; \
         delete it or choose another folder"
    )]
    OutputHoldsOtherDataset {
        /// The output folder.
        path: PathBuf,
        /// The spec of the set found there, in words.
        found: String,
    },

    /// libjpeg-turbo failed to encode a generated image.
    #[error("jpeg encoding failed for {path}: {source}")]
    JpegEncode {
        /// The file being written.
        path: PathBuf,
        /// What libjpeg-turbo reported.
        source: turbojpeg::Error,
    },

    /// The PNG encoder failed on a generated image.
    #[error("png encoding failed for {path}: {source}")]
    PngEncode {
        /// The file being written.
        path: PathBuf,
        /// What the encoder reported.
        source: png::EncodingError,
    },

    /// A dataset folder holds a file a write left under its temporary name: the write (a
    /// `stoker convert`) stopped before it named every file, so the set may be short.
    #[error(
        "{folder} holds {file}, left by a write (stoker convert) that did not finish: files of \
         the set may be missing; write it again into an empty folder"
    )]
    UnfinishedWrite {
        /// The dataset folder.
        folder: PathBuf,
        /// The file under its temporary name.
        file: String,
    },

    /// The folder tar shards were to be written to already holds files.
    #[error("{0} is not empty; write tar shards to an empty or new folder")]
    ShardOutputNotEmpty(PathBuf),

    /// A sample to be written to a tar shard is in no image format Stoker decodes.
    #[error(
        "cannot put {sample} in a tar shard: it is not a JPEG, PNG, WebP, BMP, TIFF, PBM/PGM/PPM \
         or GIF image (by its bytes or its file name), the formats tar shards hold"
    )]
    UnsupportedShardImage {
        /// The sample, as its source describes it.
        sample: String,
    },

    /// Writing a Parquet file failed.
    #[error("cannot write the parquet file {path}: {source}")]
    ParquetWrite {
        /// The file being written.
        path: PathBuf,
        /// What the Parquet writer reported.
        source: parquet::errors::ParquetError,
    },

    /// The folder Parquet files were to be written to already holds files.
    #[error("{0} is not empty; write parquet files to an empty or new folder")]
    ParquetOutputNotEmpty(PathBuf),
}
