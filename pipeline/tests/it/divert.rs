//! The image diverter seam: rows a diverter takes are read and planned on the decode threads
//! (the same window and flip the CPU would draw) and left unwritten; rows it gives back are
//! built as if it were not there; a row built later with `Job::image_row` is the row the CPU
//! would have made.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Mutex;

use stoker_datasets::{generate_imagenet_like, SyntheticImageNetSpec};
use stoker_pipeline::{presets, DivertedImage, ImageDiverter, Job, SampleRng};
use stoker_proto::v1::{self as proto, JobSpec};

/// Takes the odd rows, or gives every row back.
struct OddRows {
    take: bool,
    seen: Mutex<Vec<DivertedImage>>,
}

impl ImageDiverter for OddRows {
    fn wants(&self, row: usize) -> bool {
        row % 2 == 1
    }

    fn offer(&self, image: DivertedImage) -> Option<DivertedImage> {
        if self.take {
            self.seen.lock().unwrap().push(image);
            None
        } else {
            Some(image)
        }
    }
}

fn job(root: &std::path::Path) -> Job {
    let spec = JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: root.to_string_lossy().into_owned(),
            ..Default::default()
        }),
        pipeline: presets::imagenet_train(48),
        batch_size: 8,
        seed: 9,
        shuffle: true,
        world_size: 1,
        ..Default::default()
    };
    Job::open(spec).unwrap()
}

#[test]
fn taken_rows_are_planned_as_on_the_cpu_and_left_for_the_taker() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticImageNetSpec {
        count: 16,
        seed: 3,
        classes: 4,
    };
    let generated = generate_imagenet_like(dir.path(), &spec, &|_| {}).unwrap();
    let job = job(&generated.root);
    let plan = job.plan(0).unwrap();
    let bytes = job.batch_bytes(8);
    let row_bytes = bytes / 8;

    let mut plain = vec![0u8; bytes];
    let (expected, indices) = job.assemble_step(&plan, 1, &mut plain, None).unwrap();

    // Given back: the same bytes and labels as without a diverter.
    let back = OddRows {
        take: false,
        seen: Mutex::new(Vec::new()),
    };
    let mut returned = vec![0u8; bytes];
    let (assembled, _) = job
        .assemble_step(&plan, 1, &mut returned, Some(&back))
        .unwrap();
    assert_eq!(returned, plain);
    assert_eq!(assembled.labels, expected.labels);

    // Taken: odd rows untouched (0xAB), even rows as before, labels as before.
    let taker = OddRows {
        take: true,
        seen: Mutex::new(Vec::new()),
    };
    let mut partial = vec![0xABu8; bytes];
    let (assembled, taken_indices) = job
        .assemble_step(&plan, 1, &mut partial, Some(&taker))
        .unwrap();
    assert_eq!(taken_indices, indices);
    assert_eq!(assembled.labels, expected.labels);
    for row in 0..8 {
        let range = row * row_bytes..(row + 1) * row_bytes;
        if row % 2 == 1 {
            assert!(
                partial[range].iter().all(|&b| b == 0xAB),
                "row {row} written"
            );
        } else {
            assert_eq!(partial[range.clone()], plain[range], "row {row}");
        }
    }
    let mut seen = taker.seen.into_inner().unwrap();
    seen.sort_by_key(|image| image.row);
    assert_eq!(seen.iter().map(|i| i.row).collect::<Vec<_>>(), [1, 3, 5, 7]);
    let pipeline = job.image_pipeline().unwrap();
    for image in &seen {
        assert_eq!(image.sample, indices[image.row]);
        assert_eq!(image.read, indices[image.row]);
        // The window and flip are the sample's own draws, as the CPU makes them.
        let mut rng = SampleRng::new(9, 0, image.sample);
        assert_eq!(
            pipeline.plan(&image.header, &mut rng).unwrap(),
            (image.window, image.flip)
        );
        // Built later on the CPU, the row is the one the CPU made.
        let mut row = vec![0u8; row_bytes];
        let (label, bad) = job.image_row(0, image.sample, &mut row).unwrap();
        assert_eq!(label, expected.labels[image.row]);
        assert!(bad.is_none());
        assert_eq!(
            row,
            plain[image.row * row_bytes..(image.row + 1) * row_bytes]
        );
    }
}
