//! Dataset statistics from image headers alone (`stoker inspect`): formats, sizes and pixel
//! counts, to size decode buffers and choose a pixel limit before training.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;
use tracing::{debug, info};

use crate::error::Result;
use crate::image_folder::ImageFolder;
use crate::image_format::{sniff_format, ImageFormat};
use crate::sample_source::SampleSource;

/// Statistics of an image folder, read from file headers only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DatasetReport {
    /// Number of samples.
    pub samples: u64,
    /// Each class name with its number of samples, in label order.
    pub classes: Vec<(String, u64)>,
    /// Sample count per format: the formats Stoker decodes by their [`ImageFormat::name`]
    /// (`"jpeg"`, `"png"`, `"webp"`, `"bmp"`, `"tiff"`, `"pnm"`, `"gif"`), `"other:EXT"` (by
    /// lowercased extension, for files whose size could be read but that are none of those),
    /// and `"unreadable"` (missing, truncated or unknown headers). Most frequent first.
    pub formats: Vec<(String, u64)>,
    /// Widths in pixels, over readable samples.
    pub width: Summary,
    /// Heights in pixels, over readable samples.
    pub height: Summary,
    /// File sizes in bytes, over readable samples.
    pub file_bytes: Summary,
    /// Readable samples with more than `pixel_limit` pixels (width x height).
    pub pixels_over_limit: u64,
    /// The first [`UNREADABLE_NAMED`] unreadable samples, as the source names them (a path,
    /// `file:row N`), in index order.
    pub unreadable: Vec<String>,
    /// Samples whose label is no class's (negative, or past the class names), where the source
    /// has class names: a job reads them, a classifier's loss does not take them.
    pub labels_outside_classes: u64,
}

/// How many unreadable samples a report names.
pub const UNREADABLE_NAMED: usize = 20;

/// Minimum, mean, maximum and median of a quantity; all zero when there is no value.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Summary {
    /// Smallest value.
    pub min: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Largest value.
    pub max: f64,
    /// Median (the mean of the two middle values when their number is even).
    pub p50: f64,
}

impl Summary {
    /// Summarises `values`, reordering them.
    pub(crate) fn of(values: &mut [u64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_unstable();
        let count = values.len();
        let total: u128 = values.iter().map(|value| u128::from(*value)).sum();
        let middle = count / 2;
        let p50 = if count % 2 == 1 {
            values[middle] as f64
        } else {
            (values[middle - 1] as f64 + values[middle] as f64) / 2.0
        };
        Summary {
            min: values[0] as f64,
            mean: total as f64 / count as f64,
            max: values[count - 1] as f64,
            p50,
        }
    }
}

/// What one file's header said.
enum HeaderFacts {
    Readable {
        format: ImageFormat,
        width: u64,
        height: u64,
        file_bytes: u64,
    },
    Unreadable,
}

/// Reads every sample's header in parallel and summarises formats and sizes.
///
/// A file that is missing or whose header cannot be parsed counts as `"unreadable"`; it never
/// fails the report. `pixel_limit` is the decode limit to check against (see
/// [`DatasetReport::pixels_over_limit`]).
pub fn inspect_image_folder(folder: &ImageFolder, pixel_limit: u64) -> Result<DatasetReport> {
    let started = std::time::Instant::now();
    let facts: Vec<(HeaderFacts, Option<String>)> = (0..folder.len())
        .into_par_iter()
        .map(|index| {
            let Some(path) = folder.path(index) else {
                return (HeaderFacts::Unreadable, None);
            };
            let facts = read_header_facts(&path);
            let extension = match facts {
                HeaderFacts::Readable {
                    format: ImageFormat::Other,
                    ..
                } => Some(lowercase_extension(&path)),
                _ => None,
            };
            (facts, extension)
        })
        .collect();

    let labels = (0..folder.len()).map(|index| folder.label(index));
    let report = summarise(
        folder.len(),
        (folder.class_names(), labels),
        facts,
        &|index| folder.describe(index),
        pixel_limit,
    );
    info!(
        root = %folder.root().display(),
        samples = report.samples,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "inspected image folder"
    );
    Ok(report)
}

/// Counts classes and formats and summarises sizes. `facts` holds each sample's header facts
/// with, for readable samples of no format Stoker decodes, the extension to report (empty:
/// none known); `describe` names a sample by its index.
fn summarise(
    samples: u64,
    (class_names, labels): (&[String], impl Iterator<Item = i64>),
    facts: Vec<(HeaderFacts, Option<String>)>,
    describe: &dyn Fn(u64) -> String,
    pixel_limit: u64,
) -> DatasetReport {
    let mut class_counts = vec![0u64; class_names.len()];
    let mut labels_outside_classes = 0;
    for label in labels {
        match usize::try_from(label)
            .ok()
            .and_then(|label| class_counts.get_mut(label))
        {
            Some(count) => *count += 1,
            None if !class_names.is_empty() => labels_outside_classes += 1,
            None => {}
        }
    }
    let unreadable: Vec<String> = facts
        .iter()
        .enumerate()
        .filter(|(_, (facts, _))| matches!(facts, HeaderFacts::Unreadable))
        .take(UNREADABLE_NAMED)
        .map(|(index, _)| describe(index as u64))
        .collect();

    let mut format_counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut widths = Vec::with_capacity(facts.len());
    let mut heights = Vec::with_capacity(facts.len());
    let mut file_sizes = Vec::with_capacity(facts.len());
    let mut pixels_over_limit = 0;
    for (facts, extension) in facts {
        let format_name = match (&facts, extension) {
            (HeaderFacts::Unreadable, _) => "unreadable".to_owned(),
            (_, Some(extension)) if extension.is_empty() => "other".to_owned(),
            (_, Some(extension)) => format!("other:{extension}"),
            (HeaderFacts::Readable { format, .. }, None) => format.name().to_owned(),
        };
        *format_counts.entry(format_name).or_default() += 1;
        if let HeaderFacts::Readable {
            width,
            height,
            file_bytes,
            ..
        } = facts
        {
            widths.push(width);
            heights.push(height);
            file_sizes.push(file_bytes);
            if width.saturating_mul(height) > pixel_limit {
                pixels_over_limit += 1;
            }
        }
    }
    let mut formats: Vec<(String, u64)> = format_counts.into_iter().collect();
    formats.sort_by(|left, right| right.1.cmp(&left.1).then_with(|| left.0.cmp(&right.0)));

    DatasetReport {
        samples,
        classes: class_names.iter().cloned().zip(class_counts).collect(),
        formats,
        width: Summary::of(&mut widths),
        height: Summary::of(&mut heights),
        file_bytes: Summary::of(&mut file_sizes),
        pixels_over_limit,
        unreadable,
        labels_outside_classes,
    }
}

/// Like [`inspect_image_folder`] for any source, from each sample's bytes (read through
/// [`SampleSource::read`], in index order per thread so sources read by block, such as
/// Parquet row groups, decode each block once). Formats are named as in
/// [`DatasetReport::formats`], but `"other"` carries no extension, and `"unreadable"` means the
/// read failed or the header did not parse; sizes are the samples' byte counts.
pub fn inspect_samples(source: &dyn SampleSource, pixel_limit: u64) -> Result<DatasetReport> {
    const RUN: u64 = 256;
    let started = std::time::Instant::now();
    let runs = source.len().div_ceil(RUN);
    let facts: Vec<HeaderFacts> = (0..runs)
        .into_par_iter()
        .flat_map_iter(|run| {
            let end = ((run + 1) * RUN).min(source.len());
            (run * RUN..end).map(|index| match source.read(index) {
                Ok(bytes) => bytes_header_facts(&bytes),
                Err(error) => {
                    debug!(sample = %source.describe(index), %error, "cannot read sample");
                    HeaderFacts::Unreadable
                }
            })
        })
        .collect();
    let facts = facts
        .into_iter()
        .map(|facts| {
            let extension = match facts {
                HeaderFacts::Readable {
                    format: ImageFormat::Other,
                    ..
                } => Some(String::new()),
                _ => None,
            };
            (facts, extension)
        })
        .collect();
    let labels = (0..source.len()).map(|index| source.label(index));
    let report = summarise(
        source.len(),
        (source.class_names(), labels),
        facts,
        &|index| source.describe(index),
        pixel_limit,
    );
    info!(
        samples = report.samples,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "inspected samples"
    );
    Ok(report)
}

fn bytes_header_facts(bytes: &[u8]) -> HeaderFacts {
    match imagesize::blob_size(bytes) {
        Ok(size) => HeaderFacts::Readable {
            format: sniff_format(bytes),
            width: size.width as u64,
            height: size.height as u64,
            file_bytes: bytes.len() as u64,
        },
        Err(error) => {
            debug!(%error, "cannot parse image header");
            HeaderFacts::Unreadable
        }
    }
}

/// The header facts of the image file at `path`; a named pipe (or anything but a regular file)
/// is opened without waiting for a writer and counted unreadable, as the loader refuses it.
fn read_header_facts(path: &Path) -> HeaderFacts {
    let (file, file_bytes) = match crate::files::open_regular_file(path) {
        Ok((file, metadata)) => (file, metadata.len()),
        Err(error) => {
            debug!(path = %path.display(), %error, "cannot open sample");
            return HeaderFacts::Unreadable;
        }
    };
    let mut reader = BufReader::new(file);
    // Peeking through the buffer leaves the reader at offset 0 for the size parser.
    let format = match reader.fill_buf() {
        Ok(head) => sniff_format(head),
        Err(error) => {
            debug!(path = %path.display(), %error, "cannot read sample");
            return HeaderFacts::Unreadable;
        }
    };
    match imagesize::reader_size(reader) {
        Ok(size) => HeaderFacts::Readable {
            format,
            width: size.width as u64,
            height: size.height as u64,
            file_bytes,
        },
        Err(error) => {
            debug!(path = %path.display(), %error, "cannot parse image header");
            HeaderFacts::Unreadable
        }
    }
}

fn lowercase_extension(path: &Path) -> String {
    path.extension()
        .map(|extension| extension.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_odd_and_even_counts() {
        let odd = Summary::of(&mut [5, 1, 3]);
        assert_eq!(
            odd,
            Summary {
                min: 1.0,
                mean: 3.0,
                max: 5.0,
                p50: 3.0
            }
        );
        let even = Summary::of(&mut [4, 1, 3, 2]);
        assert_eq!(even.p50, 2.5);
        assert_eq!(even.mean, 2.5);
        assert_eq!(Summary::of(&mut []), Summary::default());
    }

    /// `inspect` counted labels past the class names nowhere, and named no unreadable file
    /// (only `-vv` logged them).
    #[test]
    fn unreadable_samples_are_named_and_labels_outside_the_classes_counted() {
        let classes = ["a".to_string(), "b".to_string()];
        let readable = || HeaderFacts::Readable {
            format: ImageFormat::Jpeg,
            width: 4,
            height: 4,
            file_bytes: 10,
        };
        let facts = vec![
            (readable(), None),
            (HeaderFacts::Unreadable, None),
            (readable(), None),
            (HeaderFacts::Unreadable, None),
        ];
        let report = summarise(
            4,
            (&classes, [0i64, 1, 5, -1].into_iter()),
            facts,
            &|index| format!("file {index}"),
            u64::MAX,
        );
        assert_eq!(report.unreadable, ["file 1", "file 3"]);
        assert_eq!(report.labels_outside_classes, 2);
        assert_eq!(report.classes, [("a".to_string(), 1), ("b".to_string(), 1)]);
        // Without class names a label is no class's by design: nothing to count.
        let report = summarise(
            1,
            (&[], [7i64].into_iter()),
            vec![(readable(), None)],
            &|_| String::new(),
            0,
        );
        assert_eq!(report.labels_outside_classes, 0);
    }

    /// A class folder's link to a named pipe made `stoker inspect` wait for a writer for good.
    #[test]
    fn a_named_pipe_is_unreadable_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("p.jpg");
        let name = std::ffi::CString::new(pipe.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path, and a mode.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(matches!(read_header_facts(&pipe), HeaderFacts::Unreadable));
        });
        let unreadable = finished.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(unreadable, Ok(true));
    }
}
