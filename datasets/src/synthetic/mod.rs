//! Generating an ImageNet-like image folder for benchmarks and tests, so no data set has to be
//! downloaded to measure a loader (`stoker make-dataset`).

mod image_plan;
mod manifest;
mod photo_painter;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;
use serde::Serialize;
use tracing::info;

use crate::error::{Error, Result, WriteError};
use image_plan::{Encoding, ImagePlan};
use manifest::{read_record, write_record, Manifest, SpecRecord, IN_PROGRESS_NAME, MANIFEST_NAME};
use photo_painter::paint_photo;

/// What to generate: `count` images over `classes` class folders, all drawn from `seed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyntheticImageNetSpec {
    /// Number of images.
    pub count: u64,
    /// Seed of every random choice; the same spec gives byte-identical files.
    pub seed: u64,
    /// Number of class folders; image `i` goes to class `i % classes`.
    pub classes: u32,
}

impl SyntheticImageNetSpec {
    /// The class count used when none is given.
    pub const DEFAULT_CLASSES: u32 = 10;
}

impl Default for SyntheticImageNetSpec {
    /// A thousand images, seed 0, ten classes.
    fn default() -> Self {
        SyntheticImageNetSpec {
            count: 1000,
            seed: 0,
            classes: SyntheticImageNetSpec::DEFAULT_CLASSES,
        }
    }
}

/// A generated set on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GeneratedDataset {
    /// The folder holding the class folders (open it with [`ImageFolder`](crate::ImageFolder)).
    pub root: PathBuf,
    /// Number of image files.
    pub files: u64,
    /// Sum of the image files' sizes in bytes.
    pub total_bytes: u64,
}

/// Writes an ImageNet-like image folder: `out/class_XX/img_XXXXXXX.jpg` (and a few `.png`).
///
/// The set imitates the ImageNet-1k training set as a JPEG decoder sees it: mean size about
/// 400x350 (mostly 4:3 and 3:4, some 1:1, 3:2, 16:9 and odd shapes; sides from 100 to 1000,
/// a long side of 500 being the most common), quality 75..96 centred on 90, mostly 4:2:0 chroma
/// with 14% 4:4:4 and 4% 4:2:2, 3% progressive, 1.6% grayscale JPEGs, 0.5% PNGs, and
/// photo-like content so that files average about 110 KB.
///
/// Measured (release build, 2 cores shared with other work), seed 0, 10 classes:
/// - 500 images: mean file 109.5 KB, mean decoded size 394 x 338;
/// - 5,000 images: mean file 114.5 KB, mean decoded size 405 x 349, 25 PNGs, in 18.5 s.
///
/// Deterministic in `(count, seed, classes)`: pixels come from an RNG seeded by
/// `(seed, image index)`, so threads and scheduling never change a byte. Images are made in
/// parallel on the current rayon pool; `progress` gets the number of files done so far as
/// files complete. Each file is written under a temporary name and renamed, so a killed run
/// never leaves a partial file under a final name.
///
/// `out` may be missing or empty. If it holds a complete set of the same spec (its
/// `stoker-dataset.json` manifest, written last, says so), that set is returned untouched; an
/// interrupted run of the same spec is resumed. Any other non-empty folder is refused.
pub fn generate_imagenet_like(
    out: &Path,
    spec: &SyntheticImageNetSpec,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GeneratedDataset> {
    if spec.count == 0 {
        return Err(Error::InvalidSpec("count must be at least 1".to_owned()));
    }
    if spec.classes == 0 {
        return Err(Error::InvalidSpec("classes must be at least 1".to_owned()));
    }
    let record = SpecRecord::new(spec.count, spec.seed, spec.classes);
    match prepare_output(out, &record)? {
        OutputState::Complete(manifest) => {
            info!(
                out = %out.display(),
                files = manifest.files,
                total_bytes = manifest.total_bytes,
                "reusing generated dataset"
            );
            return Ok(GeneratedDataset {
                root: out.to_path_buf(),
                files: manifest.files,
                total_bytes: manifest.total_bytes,
            });
        }
        OutputState::Fresh => write_record(&out.join(IN_PROGRESS_NAME), &record)?,
        OutputState::Resume => info!(out = %out.display(), "resuming interrupted generation"),
    }

    let started = Instant::now();
    info!(
        out = %out.display(),
        count = spec.count,
        seed = spec.seed,
        classes = spec.classes,
        "generating imagenet-like dataset"
    );
    let layout = FileLayout::new(out, spec);
    for class in 0..u64::from(spec.classes).min(spec.count) {
        let folder = layout.class_folder(class);
        std::fs::create_dir_all(&folder).map_err(|source| Error::io(folder, source))?;
    }

    let files_done = AtomicU64::new(0);
    let total_bytes = AtomicU64::new(0);
    (0..spec.count).into_par_iter().try_for_each_init(
        || None,
        |compressor: &mut Option<turbojpeg::Compressor>, index| {
            let bytes = make_image(&layout, spec.seed, index, compressor)?;
            total_bytes.fetch_add(bytes, Ordering::Relaxed);
            progress(files_done.fetch_add(1, Ordering::Relaxed) + 1);
            Ok::<(), Error>(())
        },
    )?;

    let manifest = Manifest {
        spec: record,
        files: spec.count,
        total_bytes: total_bytes.into_inner(),
    };
    write_record(&out.join(MANIFEST_NAME), &manifest)?;
    let marker = out.join(IN_PROGRESS_NAME);
    std::fs::remove_file(&marker).map_err(|source| Error::io(marker, source))?;
    info!(
        out = %out.display(),
        files = manifest.files,
        total_bytes = manifest.total_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "generated imagenet-like dataset"
    );
    Ok(GeneratedDataset {
        root: out.to_path_buf(),
        files: manifest.files,
        total_bytes: manifest.total_bytes,
    })
}

/// Appended to a file's name while it is being written.
const TEMPORARY_SUFFIX: &str = ".partial";

/// What the output folder holds before a run.
enum OutputState {
    /// Nothing yet: generate everything.
    Fresh,
    /// An interrupted run of the same spec: keep the files already finished.
    Resume,
    /// A finished set of the same spec.
    Complete(Manifest),
}

fn prepare_output(out: &Path, record: &SpecRecord) -> Result<OutputState> {
    match std::fs::metadata(out) {
        Ok(metadata) if !metadata.is_dir() => return Err(Error::NotADirectory(out.to_path_buf())),
        Ok(_) => {}
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(out).map_err(|source| Error::io(out, source))?;
            return Ok(OutputState::Fresh);
        }
        Err(source) => return Err(Error::io(out, source)),
    }
    if let Some(manifest) = read_record::<Manifest>(&out.join(MANIFEST_NAME))? {
        if manifest.spec == *record {
            return Ok(OutputState::Complete(manifest));
        }
        return Err(WriteError::OutputHoldsOtherDataset {
            path: out.to_path_buf(),
            found: manifest.spec.describe(),
        }
        .into());
    }
    if let Some(in_progress) = read_record::<SpecRecord>(&out.join(IN_PROGRESS_NAME))? {
        if in_progress == *record {
            return Ok(OutputState::Resume);
        }
        return Err(WriteError::OutputHoldsOtherDataset {
            path: out.to_path_buf(),
            found: format!("{} (incomplete)", in_progress.describe()),
        }
        .into());
    }
    // Temporary files are all a run killed before writing its marker can have left.
    for entry in std::fs::read_dir(out).map_err(|source| Error::io(out, source))? {
        let entry = entry.map_err(|source| Error::io(out, source))?;
        if !entry
            .file_name()
            .to_string_lossy()
            .ends_with(TEMPORARY_SUFFIX)
        {
            return Err(WriteError::OutputNotEmpty(out.to_path_buf()).into());
        }
    }
    Ok(OutputState::Fresh)
}

/// Where each image of a set goes. Zero-padded numbers keep string order equal to number
/// order, so `ImageFolder` labels and indices follow the generator's.
struct FileLayout {
    out: PathBuf,
    classes: u64,
    class_digits: usize,
    image_digits: usize,
}

impl FileLayout {
    fn new(out: &Path, spec: &SyntheticImageNetSpec) -> FileLayout {
        FileLayout {
            out: out.to_path_buf(),
            classes: u64::from(spec.classes),
            class_digits: decimal_digits(u64::from(spec.classes) - 1).max(2),
            image_digits: decimal_digits(spec.count - 1).max(7),
        }
    }

    fn class_folder(&self, class: u64) -> PathBuf {
        self.out
            .join(format!("class_{class:0width$}", width = self.class_digits))
    }

    fn image_path(&self, index: u64, extension: &str) -> PathBuf {
        self.class_folder(index % self.classes).join(format!(
            "img_{index:0width$}.{extension}",
            width = self.image_digits
        ))
    }
}

fn decimal_digits(value: u64) -> usize {
    value.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// Paints, encodes and writes image `index`; returns its size in bytes. An image already in
/// place (from an interrupted run of the same spec) is kept.
fn make_image(
    layout: &FileLayout,
    seed: u64,
    index: u64,
    compressor: &mut Option<turbojpeg::Compressor>,
) -> Result<u64> {
    let plan = ImagePlan::for_index(seed, index);
    let extension = match plan.encoding {
        Encoding::Jpeg { .. } => "jpg",
        Encoding::Png => "png",
    };
    let path = layout.image_path(index, extension);
    if let Ok(metadata) = std::fs::metadata(&path) {
        return Ok(metadata.len());
    }

    let mut rng = Pcg64Mcg::new(plan.paint_seed);
    let pixels = paint_photo(plan.width, plan.height, plan.style, &mut rng);
    let encoded = match plan.encoding {
        Encoding::Jpeg {
            quality,
            subsampling,
            progressive,
        } => {
            let compressor = match compressor {
                Some(compressor) => compressor,
                None => compressor.insert(turbojpeg::Compressor::new().map_err(|source| {
                    WriteError::JpegEncode {
                        path: path.clone(),
                        source,
                    }
                })?),
            };
            encode_jpeg(
                compressor,
                &plan,
                &pixels,
                quality,
                subsampling,
                progressive,
            )
            .map_err(|source| WriteError::JpegEncode {
                path: path.clone(),
                source,
            })?
        }
        Encoding::Png => encode_png(&plan, &pixels).map_err(|source| WriteError::PngEncode {
            path: path.clone(),
            source,
        })?,
    };
    write_atomically(&path, &encoded)?;
    Ok(encoded.len() as u64)
}

fn encode_jpeg(
    compressor: &mut turbojpeg::Compressor,
    plan: &ImagePlan,
    pixels: &[u8],
    quality: i32,
    subsampling: turbojpeg::Subsamp,
    progressive: bool,
) -> turbojpeg::Result<Vec<u8>> {
    let (format, channels) = if plan.style.grayscale {
        (turbojpeg::PixelFormat::GRAY, 1)
    } else {
        (turbojpeg::PixelFormat::RGB, 3)
    };
    compressor.set_quality(quality)?;
    compressor.set_subsamp(subsampling)?;
    compressor.set_progressive(progressive)?;
    compressor.compress_to_vec(turbojpeg::Image {
        pixels,
        width: plan.width,
        pitch: plan.width * channels,
        height: plan.height,
        format,
    })
}

fn encode_png(plan: &ImagePlan, pixels: &[u8]) -> std::result::Result<Vec<u8>, png::EncodingError> {
    let mut encoded = Vec::new();
    // Plans never exceed 1000 pixels a side, so the conversions cannot truncate.
    let mut encoder = png::Encoder::new(&mut encoded, plan.width as u32, plan.height as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(pixels)?;
    writer.finish()?;
    Ok(encoded)
}

/// Writes `bytes` to a temporary sibling of `path`, then renames it into place, so `path`
/// either does not exist or is complete. The temporary name ends in `.partial`, which no
/// image reader takes for an image.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(TEMPORARY_SUFFIX);
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, bytes).map_err(|source| Error::io(&temporary, source))?;
    std::fs::rename(&temporary, path).map_err(|source| Error::io(path, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pad_so_string_order_is_number_order() {
        let spec = SyntheticImageNetSpec {
            count: 12_345_678,
            seed: 0,
            classes: 1000,
        };
        let layout = FileLayout::new(Path::new("/out"), &spec);
        assert_eq!(
            layout.image_path(1001, "jpg"),
            Path::new("/out/class_001/img_00001001.jpg")
        );
        let small = FileLayout::new(Path::new("o"), &SyntheticImageNetSpec::default());
        assert_eq!(
            small.image_path(13, "png"),
            Path::new("o/class_03/img_0000013.png")
        );
    }

    #[test]
    fn decimal_digits_counts_digits() {
        assert_eq!(decimal_digits(0), 1);
        assert_eq!(decimal_digits(9), 1);
        assert_eq!(decimal_digits(10), 2);
        assert_eq!(decimal_digits(999_999), 6);
    }

    #[test]
    fn leftover_temporary_files_do_not_block_a_fresh_run() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(
            temp.path().join("stoker-dataset.in-progress.json.partial"),
            b"{",
        )
        .unwrap();
        let record = SpecRecord::new(3, 0, 1);
        assert!(matches!(
            prepare_output(temp.path(), &record),
            Ok(OutputState::Fresh)
        ));
        std::fs::write(temp.path().join("notes.txt"), b"mine").unwrap();
        assert!(matches!(
            prepare_output(temp.path(), &record),
            Err(Error::Write(WriteError::OutputNotEmpty(_)))
        ));
    }

    #[test]
    fn empty_specs_are_refused() {
        let temp = tempfile::tempdir().unwrap();
        let spec = SyntheticImageNetSpec {
            count: 0,
            ..SyntheticImageNetSpec::default()
        };
        let error = generate_imagenet_like(temp.path(), &spec, &|_| {}).unwrap_err();
        assert!(matches!(error, Error::InvalidSpec(_)), "{error}");
    }
}
