//! Replays the committed fuzz inputs of the `batch_stream` target (`fuzz/corpus/batch_stream/`
//! and any crash inputs kept in `fuzz/regressions/batch_stream/`) through the function the
//! libFuzzer target calls, in an ordinary build: a panic fails the test and names the file.
//! `write_seed_corpus` (ignored) writes the seed files from code in this repo.

use stoker_datasets::fuzz_targets::committed_inputs;

use prost::Message;
use stoker_proto::v1 as proto;

type TestResult<T> = Result<T, Box<dyn std::error::Error>>;

#[test]
fn batch_stream_corpus_replays() -> TestResult<()> {
    for file in committed_inputs("batch_stream") {
        eprintln!("replaying {}", file.display());
        stoker_rpc::fuzz_targets::batch_stream(&std::fs::read(&file)?);
    }
    Ok(())
}

/// Writes the seed corpus of the `batch_stream` target into `fuzz/corpus/`; run by hand when the
/// wire changes (`cargo test --release -p stoker-rpc --test it write_seed_corpus -- --ignored`),
/// then commit what changed.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the seeds"]
fn write_seed_corpus() -> TestResult<()> {
    let put = |target: &str, name: &str, data: &[u8]| {
        stoker_datasets::fuzz_targets::write_seed(target, name, data)
    };
    // The batch stream: two control bytes (frame size, landing room), then messages.
    let tensor = |name: &str, len: usize| proto::Tensor {
        name: name.into(),
        dtype: proto::Dtype::Uint8 as i32,
        shape: vec![len as u64],
        data: (0..len).map(|i| (i * 13) as u8).collect::<Vec<u8>>().into(),
    };
    let batch = proto::Batch {
        epoch: 1,
        rank: 2,
        step: 3,
        tensors: vec![tensor("image", 6000), tensor("label", 8)],
        sample_indices: vec![5, 6, 7, 8],
        timings: Some(proto::StageTimings {
            read_ns: 10,
            ..Default::default()
        }),
        bad_samples: vec![proto::BadSample {
            sample_index: 6,
            path: "x.jpg".into(),
            reason: "truncated".into(),
            substitute_index: 7,
        }],
        dropped_tokens: 3,
    };
    let ours: Vec<u8> = stoker_rpc::batch_wire::encode_batch(batch.clone(), 1 << 20)?
        .iter()
        .flat_map(|chunk| chunk.iter().copied())
        .collect();
    let mut prost_framed = vec![0u8];
    prost_framed.extend((batch.encoded_len() as u32).to_be_bytes());
    prost_framed.extend(batch.encode_to_vec());
    for (name, control, message) in [
        ("ours_small_frames_landed", [3u8, 4u8], &ours),
        ("ours_one_frame_no_room", [255, 0], &ours),
        ("prost_framing_landed", [40, 2], &prost_framed),
    ] {
        let mut input = control.to_vec();
        input.extend(message);
        input.extend(message);
        put("batch_stream", name, &input)?;
    }

    Ok(())
}
