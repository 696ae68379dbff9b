//! The PackSequences op: tokenised documents, each followed by EOS, concatenated in batch order
//! and cut into rows of `seq_len` tokens, with the document boundaries beside them.
//!
//! The rule (a batch must be a pure function of its samples, so nothing carries over between
//! batches):
//! - the batch's documents are laid end to end in plan order, each followed by `eos_id`;
//! - the stream fills row 0, then row 1, ...; a document may run on from one row to the next;
//! - tokens past the last row are dropped (counted in [`PackSummary::dropped_tokens`]);
//! - when the documents run out, the rest of that row and every row after it is `pad_id` (B
//!   documents much shorter than `seq_len` leave whole rows of padding);
//! - `position_ids` count from 0 at each document start **and at each row start** (a document
//!   continued from the row before is a new sequence for attention, which never crosses rows),
//!   so they stay below `seq_len`; padding has position 0;
//! - `document_ids` hold the document's position in the batch (0..batch), -1 on padding: tokens
//!   may attend to each other when their document ids are equal (a block-diagonal mask).

/// Packing parameters, checked by the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackSpec {
    /// Tokens per row.
    pub seq_len: u32,
    /// The id written after each document.
    pub eos_id: u32,
    /// The id written after the last document of a row that is not full.
    pub pad_id: u32,
}

/// The three int32 tensors of a packed batch, as little-endian bytes of `rows * seq_len`
/// elements each.
pub struct PackedRowsMut<'a> {
    /// Token ids.
    pub input_ids: &'a mut [u8],
    /// Position of each token in its (row-local) sequence.
    pub position_ids: &'a mut [u8],
    /// Document of each token in the batch, -1 for padding.
    pub document_ids: &'a mut [u8],
}

/// What packing one batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PackSummary {
    /// Document tokens (EOS included) written.
    pub tokens: u64,
    /// Document tokens (EOS included) that did not fit in the rows.
    pub dropped_tokens: u64,
    /// Padding tokens written.
    pub padding: u64,
}

/// Whether [`warn_once_of_waste`] said each of its two things yet (per loader).
#[derive(Debug, Default)]
pub struct WasteSaid {
    dropped: std::sync::atomic::AtomicBool,
    padded: std::sync::atomic::AtomicBool,
}

/// Says once per `said` that a batch's packing dropped over a quarter of its documents'
/// tokens (documents much longer than the batch's rows hold: most of them never reach a
/// row), or filled over half its positions with padding (documents much shorter than
/// `seq_len`), with what to do; both are the rule, and easy to miss in a loss curve.
pub fn warn_once_of_waste(summary: &PackSummary, seq_len: u32, said: &WasteSaid) {
    use std::sync::atomic::Ordering;
    let offered = summary.tokens + summary.dropped_tokens;
    if summary.dropped_tokens * 4 > offered && !said.dropped.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            dropped = summary.dropped_tokens,
            of = offered,
            seq_len,
            "PackSequences dropped {} of the {offered} tokens of a batch: a batch of B \
             documents fills B rows of seq_len tokens and drops the rest, so documents much \
             longer than seq_len lose most of their tokens (stats()[\"tokens_dropped\"] counts \
             them); raise seq_len, or write the tokens to a token file and read it with \
             TokenWindows (said once)",
            summary.dropped_tokens
        );
    }
    let positions = summary.tokens + summary.padding;
    if summary.padding * 2 > positions && !said.padded.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            padding = summary.padding,
            of = positions,
            seq_len,
            "PackSequences padded {} of the {positions} positions of a batch: its documents \
             are much shorter than seq_len; mask the loss where document_ids == -1 (pad_id is \
             a real token id), or lower seq_len (said once)",
            summary.padding
        );
    }
}

fn put(bytes: &mut [u8], at: usize, value: i32) {
    bytes[at * 4..at * 4 + 4].copy_from_slice(&value.to_le_bytes());
}

/// Packs `documents` (token ids without EOS) into `out`; see the module docs for the rule.
/// Ids are written as int32: the pipeline checks that every id fits.
pub fn pack_documents(
    spec: &PackSpec,
    documents: &[Vec<u32>],
    out: PackedRowsMut<'_>,
) -> PackSummary {
    let seq_len = spec.seq_len as usize;
    let capacity = out.input_ids.len() / 4;
    debug_assert_eq!(capacity % seq_len.max(1), 0);
    debug_assert_eq!(out.position_ids.len(), out.input_ids.len());
    debug_assert_eq!(out.document_ids.len(), out.input_ids.len());
    let mut summary = PackSummary::default();
    let mut at = 0usize;
    for (document, ids) in documents.iter().enumerate() {
        let tokens = ids.iter().copied().chain(std::iter::once(spec.eos_id));
        let mut position = 0i32;
        for (written, id) in tokens.enumerate() {
            if at == capacity {
                summary.dropped_tokens += (ids.len() + 1 - written) as u64;
                break;
            }
            if at % seq_len == 0 {
                position = 0;
            }
            put(out.input_ids, at, id as i32);
            put(out.position_ids, at, position);
            put(out.document_ids, at, document as i32);
            position += 1;
            at += 1;
            summary.tokens += 1;
        }
    }
    summary.padding = (capacity - at) as u64;
    for at in at..capacity {
        put(out.input_ids, at, spec.pad_id as i32);
        put(out.position_ids, at, 0);
        put(out.document_ids, at, -1);
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Packed {
        ids: Vec<i32>,
        positions: Vec<i32>,
        documents: Vec<i32>,
        summary: PackSummary,
    }

    fn ints(bytes: &[u8]) -> Vec<i32> {
        bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn pack(seq_len: u32, rows: usize, documents: &[Vec<u32>]) -> Packed {
        let spec = PackSpec {
            seq_len,
            eos_id: 99,
            pad_id: 7,
        };
        let len = rows * seq_len as usize * 4;
        let (mut ids, mut positions, mut doc_ids) =
            (vec![0xAB; len], vec![0xAB; len], vec![0xAB; len]);
        let summary = pack_documents(
            &spec,
            documents,
            PackedRowsMut {
                input_ids: &mut ids,
                position_ids: &mut positions,
                document_ids: &mut doc_ids,
            },
        );
        Packed {
            ids: ints(&ids),
            positions: ints(&positions),
            documents: ints(&doc_ids),
            summary,
        }
    }

    #[test]
    fn documents_run_on_across_rows_with_eos_and_row_local_positions() {
        let packed = pack(4, 2, &[vec![1, 2], vec![3, 4, 5, 6]]);
        // Stream: 1 2 EOS | 3 4 5 6 EOS -> rows [1 2 99 3] [4 5 6 99].
        assert_eq!(packed.ids, [1, 2, 99, 3, 4, 5, 6, 99]);
        assert_eq!(packed.positions, [0, 1, 2, 0, 0, 1, 2, 3]);
        assert_eq!(packed.documents, [0, 0, 0, 1, 1, 1, 1, 1]);
        assert_eq!(
            packed.summary,
            PackSummary {
                tokens: 8,
                dropped_tokens: 0,
                padding: 0
            }
        );
    }

    #[test]
    fn a_short_last_row_is_padded() {
        let packed = pack(4, 2, &[vec![1], vec![2, 3]]);
        assert_eq!(packed.ids, [1, 99, 2, 3, 99, 7, 7, 7]);
        // Document 1's EOS opens row 1: a continued document restarts its positions there.
        assert_eq!(packed.positions, [0, 1, 0, 1, 0, 0, 0, 0]);
        assert_eq!(packed.documents, [0, 0, 1, 1, 1, -1, -1, -1]);
        assert_eq!(packed.summary.padding, 3);
        assert_eq!(packed.summary.tokens, 5);
    }

    #[test]
    fn tokens_past_the_last_row_are_dropped_and_counted() {
        let packed = pack(3, 1, &[vec![1, 2], vec![3, 4, 5], vec![6]]);
        assert_eq!(packed.ids, [1, 2, 99]);
        assert_eq!(packed.documents, [0, 0, 0]);
        // Document 1 (3 ids + EOS) and document 2 (1 id + EOS) did not fit.
        assert_eq!(packed.summary.dropped_tokens, 6);
        let cut = pack(3, 1, &[vec![1, 2, 3, 4]]);
        assert_eq!(cut.ids, [1, 2, 3]);
        assert_eq!(cut.summary.dropped_tokens, 2);
    }

    #[test]
    fn empty_documents_still_get_their_eos_and_no_documents_is_all_padding() {
        let packed = pack(3, 1, &[vec![], vec![5]]);
        assert_eq!(packed.ids, [99, 5, 99]);
        assert_eq!(packed.documents, [0, 1, 1]);
        assert_eq!(packed.positions, [0, 0, 1]);
        let none = pack(2, 2, &[]);
        assert_eq!(none.ids, [7; 4]);
        assert_eq!(none.documents, [-1; 4]);
        assert_eq!(none.summary.padding, 4);
    }

    #[test]
    fn packing_is_a_pure_function_of_the_documents() {
        let documents: Vec<Vec<u32>> = (0..50u32).map(|d| (0..d * 7 % 23).collect()).collect();
        let a = pack(16, 10, &documents);
        let b = pack(16, 10, &documents);
        assert_eq!(
            (a.ids, a.positions, a.documents),
            (b.ids, b.positions, b.documents)
        );
        assert_eq!(a.summary.tokens + a.summary.padding, 160);
        let total: u64 = documents.iter().map(|d| d.len() as u64 + 1).sum();
        assert_eq!(a.summary.tokens + a.summary.dropped_tokens, total);
    }
}
