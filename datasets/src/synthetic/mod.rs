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

use crate::error::{Error, Result};
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
/// Measured (release, 2 cores), seed 0:
/// - 500 images: mean file 111.5 KB, mean decoded size 401 x 348;
/// - 5,000 images: mean file 111.0 KB, mean size 402 x 350, generated in 21 s.
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
        return Err(Error::OutputHoldsOtherDataset {
            path: out.to_path_buf(),
            found: manifest.spec.describe(),
        });
    }
    if let Some(in_progress) = read_record::<SpecRecord>(&out.join(IN_PROGRESS_NAME))? {
        if in_progress == *record {
            return Ok(OutputState::Resume);
        }
        return Err(Error::OutputHoldsOtherDataset {
            path: out.to_path_buf(),
            found: format!("{} (incomplete)", in_progress.describe()),
        });
    }
    let mut entries = std::fs::read_dir(out).map_err(|source| Error::io(out, source))?;
    if entries.next().is_some() {
        return Err(Error::OutputNotEmpty(out.to_path_buf()));
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
                    Error::JpegEncode {
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
            .map_err(|source| Error::JpegEncode {
                path: path.clone(),
                source,
            })?
        }
        Encoding::Png => encode_png(&plan, &pixels).map_err(|source| Error::PngEncode {
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
    temporary.push(".partial");
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

#[cfg(test)]
mod tuning {
    use super::*;
    #[test]
    #[ignore]
    fn measure() {
        let count: u64 = std::env::var("TUNE_COUNT")
            .map(|v| v.parse().unwrap())
            .unwrap_or(500);
        let temp_dir = tempfile::tempdir().unwrap();
        let keep = std::env::var("TUNE_OUT").ok().map(PathBuf::from);
        let temp = keep.unwrap_or(temp_dir.path().to_path_buf());
        let temp: &Path = &temp;
        let spec = SyntheticImageNetSpec {
            count,
            seed: 0,
            classes: 10,
        };
        let started = Instant::now();
        let generated = generate_imagenet_like(temp, &spec, &|_| {}).unwrap();
        let elapsed = started.elapsed();
        let folder = crate::ImageFolder::open(temp).unwrap();
        let report = crate::inspect_image_folder(&folder, 1 << 24).unwrap();
        let mut by_quality = std::collections::BTreeMap::new();
        for i in 0..count {
            let plan = ImagePlan::for_index(0, i);
            let ext = if plan.encoding == Encoding::Png { "png" } else { "jpg" };
            let bytes = std::fs::metadata(FileLayout::new(temp, &spec).image_path(i, ext)).unwrap().len();
            let px = (plan.width * plan.height) as f64;
            let key = match plan.encoding {
                Encoding::Jpeg { quality, .. } => quality / 5 * 5,
                Encoding::Png => 0,
            };
            let e = by_quality.entry(key).or_insert((0.0, 0.0, 0));
            e.0 += bytes as f64;
            e.1 += px;
            e.2 += 1;
        }
        for i in 0..3u64 {
            let mut plan = ImagePlan::for_index(0, i);
            plan.style.grayscale = false;
            let mut rng = Pcg64Mcg::new(plan.paint_seed);
            let pixels = paint_photo(plan.width, plan.height, plan.style, &mut rng);
            let w = plan.width * 3;
            let mut acc = 0.0f64; let mut n = 0.0;
            for y in 1..plan.height-1 { for x in 1..plan.width-1 { let c = |xx: usize, yy: usize| pixels[yy*w + xx*3] as f64;
                let d = c(x,y) - (c(x-1,y)+c(x+1,y)+c(x,y-1)+c(x,y+1))/4.0; acc += d*d; n += 1.0; } }
            println!("highpass rms {:.2}", (acc/n).sqrt());
            let jpeg = turbojpeg::compress(turbojpeg::Image { pixels: &pixels[..], width: plan.width, pitch: w, height: plan.height, format: turbojpeg::PixelFormat::RGB }, 90, turbojpeg::Subsamp::Sub2x2).unwrap();
            let gray = turbojpeg::compress(turbojpeg::Image { pixels: &pixels[..], width: plan.width, pitch: w, height: plan.height, format: turbojpeg::PixelFormat::RGB }, 90, turbojpeg::Subsamp::Gray).unwrap();
            println!("q90 420 bpp {:.3} luma-only {:.3}", jpeg.len() as f64 / (plan.width*plan.height) as f64, gray.len() as f64 / (plan.width*plan.height) as f64);
            let sat = pixels.iter().filter(|v| **v == 0 || **v == 255).count() as f64
                / pixels.len() as f64;
            println!(
                "img {i} {}x{} detail {:.2} saturated {:.3}",
                plan.width, plan.height, plan.style.detail, sat
            );
            std::fs::write(
                temp.join(format!("preview_{i}.png")),
                encode_png(&plan, &pixels).unwrap(),
            )
            .unwrap();
        }
        for (q, (b, p, n)) in by_quality {
            println!("q{q}: n={n} bpp={:.3}", b / p);
        }
        println!(
            "elapsed {:?} mean KB {:.1} w {:?} h {:?} bytes {:?} formats {:?}",
            elapsed,
            generated.total_bytes as f64 / count as f64 / 1000.0,
            report.width,
            report.height,
            report.file_bytes,
            report.formats
        );
    }
}
#[cfg(test)]
mod sanity {
    #[test]
    #[ignore]
    fn white_noise_jpeg() {
        use rand_core::Rng;
        let mut rng = rand_pcg::Pcg64Mcg::new(5);
        for sigma in [5.0f32, 10.0, 20.0, 60.0] {
            let (w, h) = (400usize, 352usize);
            let mut px = vec![0u8; w * h * 3];
            for p in px.iter_mut() {
                let a = (rng.next_u32() >> 8) as f32 / 16777216.0;
                let b = (rng.next_u32() >> 8) as f32 / 16777216.0;
                *p = (128.0 + (a + b - 1.0) * sigma * 2.449).clamp(0.0, 255.0) as u8;
            }
            for (q, s) in [(90, turbojpeg::Subsamp::Sub2x2), (90, turbojpeg::Subsamp::None), (75, turbojpeg::Subsamp::Sub2x2)] {
                let jpeg = turbojpeg::compress(turbojpeg::Image { pixels: &px[..], width: w, pitch: w * 3, height: h, format: turbojpeg::PixelFormat::RGB }, q, s).unwrap();
                let dec = turbojpeg::decompress(&jpeg, turbojpeg::PixelFormat::RGB).unwrap();
                let mse: f64 = px.iter().zip(dec.pixels.iter()).map(|(a, b)| { let d = *a as f64 - *b as f64; d * d }).sum::<f64>() / px.len() as f64;
                let hdr = turbojpeg::read_header(&jpeg).unwrap();
                println!("sigma {sigma} q{q} {s:?} bpp {:.3} rmse {:.2} hdr {:?} len {}", jpeg.len() as f64 / (w * h) as f64, mse.sqrt(), hdr, jpeg.len());
            }
        }
    }
}
