//! The body of the fuzz target for the RPC layer's parser of untrusted bytes (the batch
//! stream), as a plain function: `fuzz/` (libFuzzer, see its README) and the corpus replay in
//! `tests/it/fuzz_replay.rs` call it, so every seed and every crash input kept as a regression
//! case is replayed by the ordinary test run. It returns normally whatever the input; a panic
//! (or an abort, a hang, an out-of-memory) is a bug.

/// The client's reader of the batch stream (`batch_wire::BatchReader`): the first two bytes set
/// the size of the frames the rest is cut into (1 to 1,048,816 bytes, just past the
/// transport's 1 MiB frames) and the landing's room (a
/// multiple of 4 KiB, 0 for none); the messages are read until the stream ends or fails. Each
/// batch read is checked: its landed tensors lie inside the landing, and encoding it again
/// (`encode_batch`) and reading that gives the same batch.
pub fn batch_stream(data: &[u8]) {
    const MAX_MESSAGE: usize = 1 << 20;
    let [frame_seed, room_seed, rest @ ..] = data else {
        return;
    };
    let frame = 1 + usize::from(*frame_seed) * 4113;
    let room = usize::from(*room_seed) * 4096;
    let read = |chunks: std::collections::VecDeque<bytes::Bytes>, room: usize| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let body = crate::batch_wire::ChunkBody::ok(chunks);
            let mut reader = crate::batch_wire::BatchReader::new(body, MAX_MESSAGE);
            let mut batches = Vec::new();
            loop {
                let mut landing = crate::batch_wire::BufferLanding::new(room);
                match reader.next_batch(&mut landing).await {
                    Ok(Some(wire)) => {
                        let mut batch = wire.batch;
                        assert_eq!(batch.tensors.len(), wire.landed.len());
                        for (tensor, place) in batch.tensors.iter_mut().zip(wire.landed) {
                            if let Some(range) = place {
                                assert!(range.end <= landing.used && landing.used <= room);
                                tensor.data = bytes::Bytes::copy_from_slice(&landing.buffer[range]);
                            }
                        }
                        batches.push(batch);
                    }
                    Ok(None) | Err(_) => return batches,
                }
            }
        })
    };
    let whole = bytes::Bytes::copy_from_slice(rest);
    let chunks = (0..whole.len())
        .step_by(frame)
        .map(|at| whole.slice(at..(at + frame).min(whole.len())))
        .collect();
    for batch in read(chunks, room) {
        let Ok(encoded) = crate::batch_wire::encode_batch(batch.clone(), MAX_MESSAGE) else {
            continue;
        };
        let again = read(encoded.into_iter().collect(), MAX_MESSAGE);
        assert_eq!(
            again,
            vec![batch],
            "a batch read does not read back the same"
        );
    }
}
