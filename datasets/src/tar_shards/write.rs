//! Writing any [`SampleSource`] as tar shards in the WebDataset layout.
//!
//! Sample `i` becomes members `<i:08>.<ext>` (the image bytes, unchanged) and `<i:08>.cls`
//! (its label), in index order, so sample `i` of the written set is sample `i` of the source.
//! Shards are named `shard-000000.tar`, ... and hold whole samples; a shard is closed before it
//! would pass the size limit (a sample larger than the limit gets a shard of its own). Each
//! file is written under a temporary name and renamed when complete, and the output is
//! byte-for-byte the same from run to run (fixed mtime, owner and mode).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tracing::info;

use super::CLASSES_FILE;
use crate::error::{Error, Result, WriteError};
use crate::files::{name_written_set, remove_written_set};
use crate::image_format::{sniff_format, ImageFormat};
use crate::sample_source::SampleSource;

const BLOCK: u64 = 512;

/// Options of [`write_tar_shards`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TarShardsWriterOptions {
    /// Close a shard before it grows past this many bytes (it always holds one sample at
    /// least).
    pub shard_bytes: u64,
}

impl Default for TarShardsWriterOptions {
    /// 256 MB shards, a common WebDataset size: large enough for sequential reads, small
    /// enough to spread over workers.
    fn default() -> Self {
        TarShardsWriterOptions {
            shard_bytes: 256_000_000,
        }
    }
}

/// What [`write_tar_shards`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarShardsWritten {
    /// The shard files, in sample order.
    pub shards: Vec<PathBuf>,
    /// Samples written.
    pub samples: u64,
    /// Total size of the shard files in bytes.
    pub bytes: u64,
}

/// The member extension for an image: by its bytes, else by the name its source gives it.
fn image_extension(bytes: &[u8], described: &str) -> Result<&'static str> {
    let lower = described.to_ascii_lowercase();
    match sniff_format(bytes) {
        ImageFormat::Jpeg => return Ok("jpg"),
        ImageFormat::Png => return Ok("png"),
        ImageFormat::WebP => return Ok("webp"),
        ImageFormat::Bmp => return Ok("bmp"),
        ImageFormat::Tiff => return Ok("tiff"),
        ImageFormat::Gif => return Ok("gif"),
        // PBM, PGM and PPM share a decoder; the file's own name is kept when it is one of them.
        ImageFormat::Pnm => {
            return Ok(["pbm", "pgm", "ppm"]
                .into_iter()
                .find(|extension| lower.ends_with(&format!(".{extension}")))
                .unwrap_or("pnm"))
        }
        ImageFormat::Other => {}
    }
    // Damaged files keep their declared type, so the decoder's bad-sample policy treats them
    // the same way in both formats.
    let by_name = [
        (".jpg", "jpg"),
        (".jpeg", "jpg"),
        (".png", "png"),
        (".webp", "webp"),
        (".bmp", "bmp"),
        (".tif", "tiff"),
        (".tiff", "tiff"),
        (".gif", "gif"),
        (".pbm", "pbm"),
        (".pgm", "pgm"),
        (".ppm", "ppm"),
        (".pnm", "pnm"),
    ];
    by_name
        .into_iter()
        .find(|(suffix, _)| lower.ends_with(suffix))
        .map(|(_, extension)| extension)
        .ok_or_else(|| {
            WriteError::UnsupportedShardImage {
                sample: described.to_string(),
            }
            .into()
        })
}

/// Bytes a member of `size` bytes takes in a tar file: header plus padded data.
fn member_bytes(size: u64) -> u64 {
    BLOCK + size.div_ceil(BLOCK) * BLOCK
}

/// Writes `name` -> `bytes` as a regular file member with fixed metadata.
fn append_member(
    builder: &mut tar::Builder<BufWriter<File>>,
    name: &str,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    builder.append_data(&mut header, name, bytes)
}

/// The shard being written: its temporary file and final name.
struct OpenShard {
    builder: tar::Builder<BufWriter<File>>,
    temporary: PathBuf,
    path: PathBuf,
    bytes: u64,
}

impl OpenShard {
    fn create(out: &Path, number: usize) -> Result<OpenShard> {
        let path = out.join(format!("shard-{number:06}.tar"));
        let temporary = out.join(format!("shard-{number:06}.tar.partial"));
        let file = File::create(&temporary).map_err(|source| Error::io(&temporary, source))?;
        Ok(OpenShard {
            builder: tar::Builder::new(BufWriter::new(file)),
            temporary,
            path,
            bytes: 0,
        })
    }

    /// Ends the archive and flushes it, still under its temporary name (every shard is given
    /// its final name once the whole set is written: a run stopped midway leaves no shard a
    /// reader would take for the set).
    fn finish(self) -> Result<((PathBuf, PathBuf), u64)> {
        let temporary = self.temporary;
        let io = |source| Error::io(&temporary, source);
        let mut writer = self.builder.into_inner().map_err(io)?;
        writer.flush().map_err(io)?;
        let file = writer
            .into_inner()
            .map_err(|error| io(error.into_error()))?;
        file.sync_all().map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        Ok(((temporary, self.path), bytes))
    }
}

/// Writes every sample of `source` as tar shards into `out` (created; it must be empty), plus
/// a `classes.txt` with the class names. `progress` is called with the number of samples
/// written so far. The shards are written as `.partial` files and take their names only once
/// every sample is written, so a run stopped midway (or failing on a sample) leaves no set a
/// reader would open as whole.
pub fn write_tar_shards(
    source: &dyn SampleSource,
    out: &Path,
    options: &TarShardsWriterOptions,
    progress: &dyn Fn(u64),
) -> Result<TarShardsWritten> {
    std::fs::create_dir_all(out).map_err(|source| Error::io(out, source))?;
    let mut entries = std::fs::read_dir(out).map_err(|source| Error::io(out, source))?;
    if entries.next().is_some() {
        return Err(WriteError::ShardOutputNotEmpty(out.to_path_buf()).into());
    }

    let mut written = TarShardsWritten {
        shards: Vec::new(),
        samples: 0,
        bytes: 0,
    };
    if let Some(name) = source
        .class_names()
        .iter()
        .find(|name| name.contains(['\n', '\r']))
    {
        return Err(Error::InvalidArgument(format!(
            "class name {name:?} holds a line break, which classes.txt (one name per line) \
             cannot hold"
        )));
    }
    let mut current: Option<OpenShard> = None;
    let mut placeholders = crate::files::Placeholders::default();
    // Shards written whole: (temporary name, final name).
    let mut finished: Vec<(PathBuf, PathBuf)> = Vec::new();
    let result = (|| -> Result<()> {
        for index in 0..source.len() {
            let image = placeholders.read(source, index)?;
            let described = source.describe(index);
            let extension = image_extension(&image, &described)?;
            let label = source.label(index).to_string();
            let sample_bytes = member_bytes(image.len() as u64) + member_bytes(label.len() as u64);
            let full = current.as_ref().is_some_and(|shard| {
                shard.bytes > 0 && shard.bytes + sample_bytes > options.shard_bytes
            });
            if full {
                if let Some(shard) = current.take() {
                    let (shard, bytes) = shard.finish()?;
                    finished.push(shard);
                    written.bytes += bytes;
                }
            }
            let shard = match current.as_mut() {
                Some(shard) => shard,
                None => current.insert(OpenShard::create(out, finished.len())?),
            };
            let io = |source| Error::io(&shard.temporary, source);
            append_member(
                &mut shard.builder,
                &format!("{index:08}.{extension}"),
                &image,
            )
            .map_err(io)?;
            append_member(
                &mut shard.builder,
                &format!("{index:08}.cls"),
                label.as_bytes(),
            )
            .map_err(io)?;
            shard.bytes += sample_bytes;
            written.samples += 1;
            progress(written.samples);
        }
        if let Some(shard) = current.take() {
            let (shard, bytes) = shard.finish()?;
            finished.push(shard);
            written.bytes += bytes;
        }
        placeholders.finish(source.len())
    })();
    if let Err(error) = result {
        remove_written_set(&finished, current.as_ref().map(|s| s.temporary.as_path()));
        return Err(error);
    }
    let classes = out.join(CLASSES_FILE);
    let temporary = out.join(format!("{CLASSES_FILE}.partial"));
    let mut text = source.class_names().join("\n");
    text.push('\n');
    std::fs::write(&temporary, text).map_err(|source| Error::io(&temporary, source))?;
    std::fs::rename(&temporary, &classes).map_err(|source| Error::io(&classes, source))?;
    written.shards = name_written_set(finished)?;

    info!(
        out = %out.display(),
        shards = written.shards.len(),
        samples = written.samples,
        bytes = written.bytes,
        "wrote tar shards"
    );
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_come_from_bytes_then_names() {
        assert_eq!(
            image_extension(&[0xFF, 0xD8, 0xFF, 0], "a.png").unwrap(),
            "jpg"
        );
        assert_eq!(image_extension(b"junk", "x/a.JPEG").unwrap(), "jpg");
        assert_eq!(image_extension(b"junk", "x/a.png").unwrap(), "png");
        assert_eq!(image_extension(b"junk", "x/a.TIF").unwrap(), "tiff");
        assert_eq!(
            image_extension(b"RIFF\0\0\0\0WEBP", "a.jpg").unwrap(),
            "webp"
        );
        assert_eq!(
            image_extension(b"P5\n1 1\n255\n\0", "x/a.pgm").unwrap(),
            "pgm"
        );
        assert_eq!(image_extension(b"P6\n1 1\n255\n", "x/a").unwrap(), "pnm");
        assert!(matches!(
            image_extension(b"junk", "x/a.heic"),
            Err(Error::Write(WriteError::UnsupportedShardImage { .. }))
        ));
    }

    #[test]
    fn member_sizes_round_up_to_blocks() {
        assert_eq!(member_bytes(0), 512);
        assert_eq!(member_bytes(1), 1024);
        assert_eq!(member_bytes(512), 1024);
        assert_eq!(member_bytes(513), 1536);
    }
}
